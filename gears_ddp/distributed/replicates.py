"""``train_replicates``: several replicates of one run, trained concurrently over the devices
given, and one summary of them.

A replicate is the run the configuration describes with its own model seed (``args.seed``)
and/or split seed (``split_config.seed``). Each is a complete run in its own folder under
``save_path`` (``seed-1``, ``split-2``, ``split-2-seed-1``), holding everything a run folder
holds; its ``config.yaml`` repeats it alone. Each is trained as ``train_multi_gpu`` trains a
run: workers started by ``supervisor.SpawnedWorkers`` running ``rank_training.spawned_rank``, the
recipe every run uses, on a process group of its own (of one rank or more).

The devices given (``gpu_ids`` / ``n_gpus``, or ``args.cpu_processes``) are cut into groups
of ``replicates.ranks_per_replicate``; each group trains one replicate at a time and takes
the next waiting one when it is done (``group_runs.GroupScheduler``). The parent loads the
data of each split seed once and shares it with the workers, and watches every group at
once: a replicate that fails ends its own workers only, and the others go on.

Re-running the same command continues: a replicate whose report is complete is skipped,
every other one trains with ``resume_from='auto'`` (from its newest checkpoint, when it
wrote one). The summary (``report.replicate_report``) goes to ``save_path`` itself. A stop
signal (SIGTERM, SIGUSR1) reaches every running replicate, which stops with a checkpoint;
no new one starts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from gears_ddp._logging import get_logger
from gears_ddp.configuration.run_options import DEVICE_SETTINGS, RunOptions, write_run_config
from gears_ddp.configuration.sections import ReplicateOptions, SplitConfig, TrainingArgs
from gears_ddp.distributed.group_runs import GroupRun, GroupScheduler
from gears_ddp.launching.choose import refuse_replicates_under_a_launcher
from gears_ddp.launching.main_guard import check_main_guard
from gears_ddp.launching.supervisor import DistributedTrainingError
from gears_ddp.report.page_builder import flatten_settings
from gears_ddp.report.replicate_report import write_replicate_report
from gears_ddp.report.run_files import CONFIG_FILE, REPORT_FILE, log_file, read_settings
from gears_ddp.runtime.devices import located_devices
from gears_ddp.runtime.stopping import TrainingInterrupted, described_signal, signal_name
from gears_ddp.training.save_folder import finished_report, held_save_path

__all__ = ["train_replicates", "ReplicatesFailed"]

logger = get_logger(__name__)
# settings that say where a run trains, not what it computes: a save path may be continued with others
PLACEMENT_SETTINGS = (
    *DEVICE_SETTINGS,
    "args.resume_from",
    "args.save_path",
    "replicates.seeds",
    "replicates.split_seeds",
    "replicates.parallel",
)


class ReplicatesFailed(DistributedTrainingError):
    """Some replicates failed; the message names each with its error, ``summary`` is what
    ``train_replicates`` would have returned (the finished replicates' summary)."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


@dataclass(frozen=True)
class Replicate:
    """One replicate: its name, model seed, split seed and run folder."""

    name: str
    seed: int
    split_seed: int
    folder: Path

    def described(self, status: str, error: str | None = None, seconds: float | None = None) -> dict:
        """As the summary lists it; ``seconds``: its wall time in this run (None when it did not run)."""
        return {
            "name": self.name,
            "seed": self.seed,
            "split_seed": self.split_seed,
            "folder": str(self.folder),
            "status": status,
            "error": error,
            "seconds": seconds,
        }


def plan_replicates(replicates: ReplicateOptions, split: SplitConfig, options: TrainingArgs) -> list[Replicate]:
    """The replicates, in the order given: one per seed, per split seed, or per pair, each in
    its folder under ``options.save_path`` (which a replicated run's check requires)."""
    if options.save_path is None:
        raise ValueError("replicates need args['save_path']: each trains in its own folder under it")
    count = len(replicates.seeds or replicates.split_seeds or [])
    seeds = replicates.seeds or [options.seed] * count
    split_seeds = replicates.split_seeds or [split.options.get("seed", 1)] * count
    runs = []
    for seed, split_seed in zip(seeds, split_seeds):
        if replicates.seeds is not None and replicates.split_seeds is not None:
            name = f"split-{split_seed}-seed-{seed}"
        else:
            name = f"seed-{seed}" if replicates.seeds is not None else f"split-{split_seed}"
        runs.append(Replicate(name, seed, split_seed, Path(options.save_path) / name))
    return runs


def device_groups(devices: list[torch.device], replicates: ReplicateOptions) -> list[list[torch.device]]:
    """The devices cut into the groups that train one replicate each; more groups (or a
    larger group) than the devices make is refused, naming the devices."""
    size = replicates.ranks_per_replicate
    count = replicates.parallel if replicates.parallel is not None else len(devices) // size
    needed = max(count, 1) * size
    if needed > len(devices):
        asked = f"replicates.parallel={count} group(s)" if replicates.parallel is not None else "one group"
        raise ValueError(
            f"{asked} of replicates.ranks_per_replicate={size} device(s) need {needed} devices, but "
            f"{len(devices)} are given ({', '.join(map(str, devices))}): give more devices (gpu_ids, "
            "n_gpus or args.cpu_processes) or ask for fewer"
        )
    groups = [devices[index * size : (index + 1) * size] for index in range(count)]
    idle = devices[count * size :]
    if idle:
        logger.warning(
            "replicates: %s stay idle (%d group(s) of %d device(s) use %d of the %d devices given)",
            ", ".join(map(str, idle)),
            count,
            size,
            count * size,
            len(devices),
        )
    return groups


def replicate_config(config: dict, run: Replicate, group: list[torch.device]) -> dict:
    """The configuration of one replicate alone, on ``group`` (what its ``config.yaml``
    holds: ``gears-ddp train --config`` on it repeats the replicate)."""
    args = {
        **config["args"],
        "seed": run.seed,
        "save_path": str(run.folder),
        "resume_from": "auto",
        "cpu_processes": len(group) if group[0].type == "cpu" else None,
    }
    gpu_ids = None if group[0].type == "cpu" else [device.index for device in group]
    return {
        **{key: value for key, value in config.items() if key != "replicates"},
        "split_config": {**config["split_config"], "seed": run.split_seed},
        "args": args,
        "n_gpus": None,
        "gpu_ids": gpu_ids,
    }


def check_same_configuration(folder: Path, config: dict, what: str) -> None:
    """Refuse ``folder`` when its ``config.yaml`` describes another run than ``config``: a
    single run where replicates go (or the reverse), or different settings, but those that
    only place the run (``PLACEMENT_SETTINGS``)."""
    if not (folder / CONFIG_FILE).exists():
        return
    held = read_settings(folder)
    if not isinstance(held, dict) or ("replicates" in held) != ("replicates" in config):
        kind = "replicates" if isinstance(held, dict) and "replicates" in held else "a single run"
        raise ValueError(
            f"{what} {folder} holds {kind} (its {CONFIG_FILE}), not this configuration: choose another save_path"
        )
    there = {key: value for key, value in flatten_settings(held) if key not in PLACEMENT_SETTINGS}
    here = {key: value for key, value in flatten_settings(config) if key not in PLACEMENT_SETTINGS}
    differing = [
        f"{key}: {there.get(key, 'absent')} there, {here.get(key, 'absent')} here"
        for key in sorted(set(there) | set(here))
        if there.get(key) != here.get(key)
    ]
    if differing:
        raise ValueError(
            f"{what} {folder} holds a run of another configuration ({'; '.join(differing)}): choose "
            "another save_path, or give the configuration it holds to continue it"
        )


def train_replicates(
    pert_data_path,
    dataset_name: str,
    split_config: dict,
    args: dict,
    replicates: dict,
    n_gpus: int | None = None,
    gpu_ids=None,
) -> dict:
    """Train one run per seed (``replicates``: ``{'seeds': [...]}`` and/or ``{'split_seeds':
    [...]}``, see ``ReplicateOptions``) in ``args['save_path']/<name>``, concurrently over
    the devices (as ``train_multi_gpu`` takes them), and summarise them in ``save_path``.

    Returns the summary (``report.json`` of ``save_path``): ``'replicates'`` (each one's
    seeds, folder and status), ``'finished'``, ``'metrics'`` (per metric and subgroup: each
    method's mean and sd, each baseline's paired difference with its 95% bootstrap interval over
    replicates and perturbations, and its verdict), ``'interval_method'`` and ``'report_path'``.
    Raises ``ReplicatesFailed`` (with the summary) when some failed, ``TrainingInterrupted`` when a signal stopped them.
    Every check runs before any process starts.
    """
    check_main_guard("train_replicates")
    if replicates is None:
        ReplicateOptions.from_dict(replicates)  # refused: a replicated run needs its replicates
    return train_checked_replicates(
        RunOptions.checked(pert_data_path, dataset_name, split_config, args, n_gpus, gpu_ids, replicates)
    )


def train_checked_replicates(run: RunOptions) -> dict:
    """``train_replicates`` of options checked before (``gears-ddp train --config`` with
    ``replicates``); refused under torchrun or srun."""
    refuse_replicates_under_a_launcher()
    split, options, plan = run.split, run.args, run.replicates
    assert plan is not None and options.save_path is not None, "RunOptions.checked requires both for replicates"
    groups = device_groups(located_devices(run.n_gpus, run.gpu_ids, options.cpu_processes), plan)
    top = Path(options.save_path)
    config = run.config()
    runs = plan_replicates(plan, split, options)
    with held_save_path(top, "replicates", resume_from="auto", of_runs=True), log_file(top):
        check_same_configuration(top, config, "save_path")
        for replicate in runs:
            check_same_configuration(
                replicate.folder, replicate_config(config, replicate, groups[0]), f"replicate {replicate.name}:"
            )
        write_run_config(top, config)
        _log_layout(runs, groups)
        reports = {replicate.name: finished_report(replicate.folder) for replicate in runs}
        for replicate in runs:
            if reports[replicate.name] is not None:
                logger.info(
                    "%s: finished before (its report is complete in %s), skipped", replicate.name, replicate.folder
                )
        waiting = [replicate for replicate in runs if reports[replicate.name] is None]
        queue = deque(waiting)
        scheduler = GroupScheduler(groups, keys_ahead=lambda: {replicate.split_seed for replicate in queue})
        outcomes, stop = scheduler.run(lambda: _group_run(run, config, queue.popleft()) if queue else None)
        for replicate in waiting:
            if (
                outcomes.get(replicate.name, {}).get("status") == "finished"
            ):  # none for those a stop signal kept waiting
                reports[replicate.name] = finished_report(replicate.folder)
        return _summarise(top, config, runs, reports, outcomes, stop)


def _log_layout(runs: list[Replicate], groups: list[list[torch.device]]) -> None:
    layout = "; ".join(f"group {index + 1}: {', '.join(map(str, group))}" for index, group in enumerate(groups))
    logger.info(
        "%d replicate(s) (%s) on %d device group(s) of %d rank(s), %d training at once: %s",
        len(runs),
        ", ".join(run.name for run in runs),
        len(groups),
        len(groups[0]),
        min(len(groups), len(runs)),
        layout,
    )


def _summarise(top: Path, config: dict, runs: list[Replicate], reports: dict, outcomes: dict, stop: int) -> dict:
    """Write the summary, log the outcome and return the summary, or raise when not all
    finished."""
    described = []
    for run in runs:
        outcome = outcomes.get(run.name, {"status": "finished" if reports[run.name] is not None else "not started"})
        if outcome["status"] == "finished" and reports[run.name] is None:
            outcome = {**outcome, "status": "failed", "error": f"its {REPORT_FILE} cannot be read"}
        described.append(run.described(outcome["status"], outcome.get("error"), outcome.get("seconds")))
    finished = {name: report for name, report in reports.items() if report is not None}
    page = write_replicate_report(top, config, described, finished)
    summary = {**json.loads((top / REPORT_FILE).read_text(encoding="utf-8")), "report_path": str(page)}
    logger.info("replicates: %d of %d finished; summary %s", len(finished), len(runs), page)
    unfinished = [entry for entry in described if entry["status"] != "finished"]
    if stop:
        raise TrainingInterrupted(
            f"replicates stopped on {described_signal(stop)}: {len(finished)} of {len(runs)} "
            "finished; run the same command again to continue the others",
            signal_name(stop),
            None,
        )
    if unfinished:
        failures = "\n".join(f"- {entry['name']} {entry['status']}: {entry['error']}" for entry in unfinished)
        raise ReplicatesFailed(
            f"{len(unfinished)} of {len(runs)} replicates did not finish:\n{failures}\nThe summary "
            f"of the {len(finished)} finished ones: {page}. Run the same command again to retry "
            "them (the finished ones are skipped).",
            summary,
        )
    return summary


def _group_run(run: RunOptions, config: dict, replicate: Replicate) -> GroupRun:
    """The replicate as the group scheduler places it: the run with its seeds, in its folder,
    continuing from its newest checkpoint; its data shared with the replicates of its split
    seed."""
    args = dataclasses.replace(run.args, seed=replicate.seed, save_path=str(replicate.folder), resume_from="auto")
    if args.wandb:
        args.wandb = {**args.wandb, "name": f"{args.wandb.get('name', 'GEARS')}-{replicate.name}"}
    options = dataclasses.replace(
        run, split=SplitConfig({**run.split.options, "seed": replicate.split_seed}), args=args, replicates=None
    )
    return GroupRun(
        replicate.name,
        options,
        functools.partial(replicate_config, config, replicate),
        f"replicate {replicate.name} of the replicates in {replicate.folder.parent}",
        replicate.split_seed,
    )
