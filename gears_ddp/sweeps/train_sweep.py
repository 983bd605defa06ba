"""``train_sweep``: trials of one run with options drawn from a search space, placed over the
devices as replicates are, chosen on validation, resumable, summarised in a report.

The sweep folder is the run file's ``args.save_path``. It holds ``sweep.yaml`` (the run file,
the search space, the storage, the study's name, the sampler's seed and the number of
trials: what ``--join`` reads), the study (``study.journal`` unless ``storage`` names a
database or another journal file), one ordinary run folder per trial (``trial-0003``, whose
``config.yaml`` repeats it) and the report (``sweeps.report``).

Each trial is drawn from Optuna's study (TPE, seeded; ``study.load_or_create_study``) when a
device group is free, and trained as a replicate is (``group_runs.GroupScheduler``). After
every epoch the trial's validation ``mse_de`` (the metric that picks a run's best epoch) is
read from its ``metrics.csv`` and reported to the study, whose median pruner may stop it:
its ranks get SIGTERM and stop at the next optimiser step. A finished trial's value is its
best epoch's validation ``mse_de``; the test set is never used to choose. Several processes
(machines sharing a filesystem and the storage, or ``gears-ddp sweep --join``) draw from one
study, each trial once.

Resuming: the same command after a kill continues the study; finished trials are kept (a
trial whose report is complete counts as complete however its workers ended). A trial left
running by a sweep that is gone (its folder's lock free) is marked failed, its folder says
so, and it is retried once, in its folder, from its newest checkpoint; the retry counts in
its place. Only the devices and the number of trials may change between the processes of a
sweep (``continued_plan``).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import math
import os
import signal
from pathlib import Path
from typing import Iterator

from gears_ddp._logging import get_logger
from gears_ddp.configuration.run_options import (
    DEVICE_SETTINGS,
    RunConfigError,
    RunOptions,
    apply_override,
    checked_run_options,
    load_yaml,
)
from gears_ddp.data.io import file_lock, missing_folders, remove_empty_folders, write_yaml
from gears_ddp.distributed.group_runs import GroupRun, GroupScheduler, RunningGroup
from gears_ddp.launching.main_guard import check_main_guard
from gears_ddp.report.page_builder import flatten_settings
from gears_ddp.report.run_files import CONFIG_FILE, METRICS_FILE, SWEEP_FILE, log_file, write_json
from gears_ddp.runtime.devices import located_devices
from gears_ddp.runtime.folder_lock import FolderInUse, FolderLock
from gears_ddp.runtime.stopping import TrainingInterrupted, described_signal, signal_name
from gears_ddp.sweeps.space import SearchSpace, with_values
from gears_ddp.sweeps.study import SweepError, load_or_create_study, open_storage
from gears_ddp.training.save_folder import earlier_run, finished_report, folder_of_runs, make_save_folder

logger = get_logger(__name__)

TRIAL_FILE = "trial.json"  # in each trial's folder: its number, settings, state and value
DRAW_LOCK_FILE = ".gears_ddp_draw.lock"  # in the sweep folder: held while a process counts the trials and draws one
METRIC = "val_mse_de"  # the validation metric that picks a run's best epoch: lower is better
# Optuna's median pruner: no trial is pruned before 5 have finished, nor in its first epoch
PRUNER = {"name": "median", "startup_trials": 5, "warmup_epochs": 1}


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What a sweep is: the run file (``config``, its ``args.save_path`` the sweep folder),
    the search space, the number of trials, the storage URL (None: the folder's journal),
    the study's name and the sampler's seed."""

    config: dict
    space: SearchSpace
    trials: int
    storage: str | None
    study: str
    seed: int

    @property
    def folder(self) -> Path:
        return Path(self.config["args"]["save_path"])

    def made_by(self) -> dict:
        """What made the study (a study made by another sweep is refused)."""
        return {
            "space": self.space.record(),
            "metric": METRIC,
            "sampler": {"name": "tpe", "seed": self.seed},
            "pruner": PRUNER,
        }

    def record(self) -> dict:
        return {
            "run": self.config,
            "space": self.space.record(),
            "trials": self.trials,
            "storage": self.storage,
            "study": self.study,
            "seed": self.seed,
            "metric": METRIC,
            "pruner": PRUNER,
        }


def plan_sweep(
    config: dict | RunOptions,
    space,
    trials: int,
    storage: str | None = None,
    seed: int = 0,
    source: str = "the run file",
) -> SweepPlan:
    """The checked plan of a sweep of the run ``config`` (a run file's mapping, or its options
    as read: ``read_run_options``, whose resolved ``config()`` no longer says whether it asked
    to overwrite its folder) over ``space`` (a mapping, as the space's YAML holds it): every
    mistake named before any trial starts."""
    run = config if isinstance(config, RunOptions) else checked_run_options(dict(config), source)
    if run.replicates is not None:
        raise SweepError(
            f"{source}: a sweep's trials are single runs; leave replicates out (replicate the best "
            "trial's run.yaml afterwards)"
        )
    if run.args.save_path is None:
        raise SweepError(f"{source}: a sweep needs args.save_path: its folder, with one folder per trial below it")
    if run.args.resume_from is not None or run.args.overwrite_save_path:
        raise SweepError(
            f"{source}: leave args.resume_from and args.overwrite_save_path out: each trial has its "
            "own folder, and running the same sweep again continues it"
        )
    if not (isinstance(trials, int) and not isinstance(trials, bool) and trials >= 1):
        raise SweepError(f"--trials must be a positive integer, got {trials!r}")
    space = space if isinstance(space, SearchSpace) else SearchSpace.from_mapping(space)
    resolved = run.config()
    space.check_against(resolved, lambda candidate: checked_run_options(candidate, source))
    # the study is named after the folder as given, not its last name alone: sweeps in
    # runs/x/sweep and runs/y/sweep of one database are two studies
    return SweepPlan(resolved, space, trials, storage, Path(run.args.save_path).as_posix(), seed)


def read_plan(folder) -> SweepPlan:
    """The plan ``sweep.yaml`` in ``folder`` holds (``--join``)."""
    path = Path(folder) / SWEEP_FILE
    try:
        held = load_yaml(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SweepError(f"--join {folder}: no sweep there ({path}: {err.strerror or err})") from None
    if not isinstance(held, dict) or not {"run", "space", "trials", "study", "seed"} <= set(held):
        raise SweepError(f"{path} is not a sweep's file")
    space = SearchSpace.from_mapping(with_values({}, held["space"]), str(path))  # its dotted keys nested again
    return SweepPlan(held["run"], space, held["trials"], held.get("storage"), held["study"], held["seed"])


def joining_plan(folder, overrides: list[str], trials: int | None = None) -> SweepPlan:
    """The plan of a process joining the sweep in ``folder`` (``--join``): the sweep's run on
    this machine's devices, as the ``overrides`` (``--set key=value``) give them, to
    ``trials`` (default: the sweep's). Devices given replace every device setting of the
    sweep's run, so that GPUs join a sweep started on CPU processes (and the reverse)."""
    plan = read_plan(folder)
    config = copy.deepcopy(plan.config)
    if any(assignment.partition("=")[0].strip() in DEVICE_SETTINGS for assignment in overrides):
        for setting in DEVICE_SETTINGS:
            apply_override(config, f"{setting}=null")
    for assignment in overrides:
        apply_override(config, assignment)
    source = str(Path(folder) / SWEEP_FILE)
    return plan_sweep(config, plan.space, trials or plan.trials, plan.storage, plan.seed, source)


def train_sweep(
    pert_data_path,
    dataset_name: str,
    split_config: dict,
    args: dict,
    space: dict,
    trials: int,
    n_gpus: int | None = None,
    gpu_ids=None,
    storage: str | None = None,
    seed: int = 0,
) -> dict:
    """Run a sweep of ``trials`` trials of the run ``train_multi_gpu``'s parameters describe,
    each drawing the options of ``space`` (as the space's YAML nests them: ``{'args': {'lr':
    {'type': 'float', 'low': 1e-4, 'high': 1e-2, 'log': True}}}``), concurrently over the
    devices given (one trial per GPU, or per CPU process of ``args['cpu_processes']``), in
    ``args['save_path']``; ``storage``: a database URL or a journal file shared with other
    processes. Returns the summary (``report.json`` of the sweep folder)."""
    check_main_guard("train_sweep")
    config = {
        "pert_data_path": str(pert_data_path),
        "dataset_name": dataset_name,
        "split_config": split_config,
        "args": args,
        "n_gpus": n_gpus,
        "gpu_ids": gpu_ids,
    }
    return run_sweep(plan_sweep(config, space, trials, storage, seed, "train_sweep"))


def run_sweep(plan: SweepPlan, joining: bool = False) -> dict:
    """Run ``plan`` (``plan_sweep``'s or, joining another process's sweep, ``read_plan``'s)
    on this machine's devices until the study holds its trials; returns the summary. A
    folder that holds a sweep continues it (``continued_plan``); one that holds a run is
    refused. A sweep refused before it starts (its storage does not answer, its study is
    another sweep's) leaves no folder behind."""
    held = plan.folder / SWEEP_FILE
    if held.exists():
        existing = read_plan(plan.folder)
        plan = continued_plan(existing, plan)
        changed = not joining and plan.trials != existing.trials  # a resumed sweep's new count, which --join reads
        before: int | None = existing.trials
    else:
        refuse_a_run_folder(plan.folder)
        changed, before = True, None
    with _removed_if_refused(plan.folder):
        folder = make_save_folder(plan.folder)
        storage = open_storage(folder, plan.storage)  # a storage that does not answer fails here, before any trial
        study = load_or_create_study(storage, plan.study, plan.made_by(), plan.seed, PRUNER)
    if changed and before is not None:
        _say_the_new_count(plan.trials, before, counted(study))
    if changed:
        write_yaml(plan.record(), held)
    run = checked_run_options(dict(plan.config), str(held))
    groups = [[device] for device in located_devices(run.n_gpus, run.gpu_ids, run.args.cpu_processes)]  # a trial each
    with log_file(folder):
        _retry_abandoned(study, folder)
        trials = _Trials(plan, study)
        _, stop = GroupScheduler(groups, keys_ahead=lambda: {"data"}).run(trials.next_run, trials.watch, trials.settled)
        from gears_ddp.sweeps.report import write_sweep_report

        summary = write_sweep_report(folder, plan, study)
    if stop:
        raise TrainingInterrupted(
            f"the sweep stopped on {described_signal(stop)}; run the same command again to "
            "continue it (an interrupted trial is retried from its checkpoint)",
            signal_name(stop),
            None,
        )
    return summary


def _say_the_new_count(trials: int, before: int, drawn: int) -> None:
    """Say what a continued sweep's other ``--trials`` does, given the count it held
    (``before``) and the trials drawn already: more draws more; fewer than are drawn draws
    none and keeps them all (the report ranks every trial that counts)."""
    if trials > before:
        logger.info("the sweep held %d trials; --trials %d draws %d more", before, trials, trials - drawn)
    elif drawn >= trials:
        logger.warning(
            "the sweep held %d trials, and %d are drawn already: --trials %d draws none more and removes none "
            "(its report ranks all %d); give --trials above %d to train more",
            before,
            drawn,
            trials,
            drawn,
            drawn,
        )
    else:
        logger.info(
            "the sweep held %d trials; --trials %d draws %d more, not %d",
            before,
            trials,
            trials - drawn,
            before - drawn,
        )


def continued_plan(existing: SweepPlan, given: SweepPlan) -> SweepPlan:
    """The plan a process continuing the sweep ``existing`` (its ``sweep.yaml``) runs,
    given ``given``: its run file, its devices and its trial count; the study's name and
    seed stay the sweep's (a process that continues a study seeds its draws afresh:
    ``load_or_create_study``, so another ``--seed`` changes nothing there). Another search
    space, storage or run (an option other than the devices) is refused, naming what
    differs: trials of different runs would be ranked together."""
    folder, held = given.folder, given.folder / SWEEP_FILE
    if existing.space.record() != given.space.record():
        raise SweepError(
            f"{folder} holds a sweep of another search space ({held}): give this sweep another "
            "save_path, or the search space that folder was made by"
        )
    if given.storage != existing.storage:
        raise SweepError(
            f"{folder} holds a sweep whose study is in {existing.storage or 'its folder (study.journal)'} "
            f"({held}), not in {given.storage or 'its folder'}: give the same --storage, or this sweep "
            "another save_path"
        )
    there = dict(flatten_settings(existing.config))
    here = dict(flatten_settings(given.config))
    differing = [
        f"{key}: {there.get(key, 'absent')} there, {here.get(key, 'absent')} here"
        for key in sorted(set(there) | set(here))
        if there.get(key) != here.get(key) and key not in (*DEVICE_SETTINGS, "args.save_path")
    ]
    if differing:
        raise SweepError(
            f"{folder} holds a sweep of another run ({'; '.join(differing)}; {held}): only the devices "
            "and the number of trials may change when a sweep continues; give the run it was made "
            "with, or this sweep another save_path"
        )
    return dataclasses.replace(existing, config=given.config, trials=given.trials)


def refuse_a_run_folder(folder: Path) -> None:
    """Refuse a sweep folder that holds a run (a single run or replicates: its
    ``config.yaml``, a model, a report, checkpoints): the sweep's report would replace the
    run's, and its trials would sit among the run's files."""
    found = folder_of_runs(folder)  # replicates
    if found is None and (folder / CONFIG_FILE).is_file():
        found = f"a single run (its {CONFIG_FILE})"
    found = found or earlier_run(folder)
    if found is not None:
        raise SweepError(
            f"save_path {folder} holds {found}, not a sweep: a sweep cannot be made there (its report "
            "would replace the run's); choose another save_path (--set args.save_path=...)"
        )


@contextlib.contextmanager
def _removed_if_refused(folder: Path) -> Iterator[None]:
    """While active, a ``SweepError`` removes the folders made for the sweep (``folder``
    and those above it that did not exist), left empty: a refused sweep leaves nothing."""
    made = missing_folders([folder])
    try:
        yield
    except SweepError:
        remove_empty_folders(made)
        raise


def counted(study) -> int:
    """The trials that count towards the sweep's number: all but those retried (a retry
    counts in their place)."""
    trials = study.get_trials(deepcopy=False)
    return len(trials) - len({trial.user_attrs["retry_of"] for trial in trials if "retry_of" in trial.user_attrs})


def _queued(study) -> bool:
    """Whether a retry of an interrupted trial waits in the study to be trained."""
    from optuna.trial import TrialState

    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _retry_abandoned(study, folder: Path) -> None:
    """Mark failed each trial a sweep that is gone left running (its folder's lock is free),
    say so in its folder, and queue it once more, in its folder, from its checkpoint; one
    whose folder holds its complete report (the sweep was killed as it ended) is complete."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_folder = Path(trial.user_attrs.get("folder", folder / f"trial-{trial.number:04d}"))
        try:
            with FolderLock(trial_folder, "a sweep's check"):
                pass
        except FolderInUse:  # another process of the sweep is training it
            continue
        except OSError:
            pass
        report = finished_report(trial_folder)
        value = _best_value(report) if report is not None else math.nan
        if math.isfinite(value):  # it finished before its sweep was gone
            study.tell(trial.number, value)
            _write_trial_file(trial_folder, trial.number, trial.params, "complete", value, None)
            logger.warning("trial %d: finished before the sweep that ran it stopped: complete", trial.number)
            continue
        retry = trial.user_attrs.get("attempt", 1) < 2
        note = "interrupted: the sweep that ran it stopped; " + (
            "retried once, in this folder, from its newest checkpoint"
            if retry
            else "not retried again (its retry was interrupted too)"
        )
        study.tell(trial.number, state=TrialState.FAIL)
        _write_trial_file(trial_folder, trial.number, trial.params, "failed", None, note)
        logger.warning("trial %d: %s", trial.number, note)
        if retry:
            study.enqueue_trial(
                trial.params,
                user_attrs={"folder": str(trial_folder), "attempt": 2, "retry_of": trial.number},
                skip_if_exists=False,
            )


def _best_value(report: dict) -> float:
    """A finished run's value: its best epoch's validation mse_de (NaN when no epoch has a
    finite one)."""
    values = [record.get(METRIC) for record in report["history"]]
    return min((v for v in values if v is not None and math.isfinite(v)), default=math.nan)


def _write_trial_file(folder: Path, number: int, params: dict, state: str, value, note: str | None) -> None:
    if folder.is_dir():
        write_json(
            folder / TRIAL_FILE, {"number": number, "params": params, "state": state, "value": value, "note": note}
        )


class _Trials:
    """The trials of one process of a sweep: drawn from the study as groups free up, their
    epochs reported to it while they run, their outcome told when they end."""

    def __init__(self, plan: SweepPlan, study):
        self.plan, self.study = plan, study
        self.active: dict[str, dict] = {}  # trial name -> {'trial', 'reported', 'pruned'}

    def next_run(self) -> GroupRun | None:
        """The next trial: a queued retry of an interrupted trial (which counts in its place,
        so it is drawn even when the sweep holds its trials already: the interrupted trials
        were its last), else a new draw; None when the study holds the sweep's trials and
        no retry waits. A trial whose options the run's checks refuse fails at once, and the
        next is drawn. The processes of a sweep (``--join``) count and draw under one lock in
        its folder (``DRAW_LOCK_FILE``): two that counted at once would both draw the last
        trial, one too many."""
        from optuna.trial import TrialState

        while True:
            with file_lock(self.plan.folder / DRAW_LOCK_FILE):  # the sweep's processes draw one at a time
                if counted(self.study) >= self.plan.trials and not _queued(self.study):
                    return None
                trial = self.study.ask(self.plan.space.distributions())  # a queued retry first
            folder = Path(trial.user_attrs.get("folder") or self.plan.folder / f"trial-{trial.number:04d}")
            trial.set_user_attr("folder", str(folder))
            config = with_values(self.plan.config, trial.params)
            retry = "retry_of" in trial.user_attrs  # continues in the folder of the trial it retries
            config["args"] = {**config["args"], "save_path": str(folder), "resume_from": "auto" if retry else None}
            try:
                options = checked_run_options(config, f"trial {trial.number}")
            except RunConfigError as err:
                trial.set_user_attr("note", str(err))
                self.study.tell(trial, state=TrialState.FAIL)
                logger.error("trial-%04d: failed before it started: %s", trial.number, err)
                continue
            return self._group_run(trial, options)

    def _group_run(self, trial, options: RunOptions) -> GroupRun:
        name = f"trial-{trial.number:04d}"
        self.active[name] = {"trial": trial, "reported": 0, "pruned": None}
        settings = ", ".join(f"{key.split('.')[-1]}={value!r}" for key, value in trial.params.items())
        logger.info("%s: %s", name, settings)
        return GroupRun(
            name,
            options,
            lambda group: _trial_config(options, group),
            f"trial {trial.number} of the sweep in {self.plan.folder}",
            "data",
        )

    def watch(self, running: RunningGroup) -> None:
        """Report the trial's new epochs; stop it (SIGTERM to its ranks) when pruned."""
        state = self.active[running.run.name]
        if state["pruned"] is not None:
            return
        for epoch, value in _epochs(running.run.folder / METRICS_FILE)[state["reported"] :]:
            state["trial"].report(value, epoch)
            state["reported"] = epoch
            if state["trial"].should_prune():
                state["pruned"] = (epoch, value)
                logger.info(
                    "%s: pruned after epoch %d (%s %.4g, behind the median of earlier trials at that "
                    "epoch): stopping it",
                    running.run.name,
                    epoch,
                    METRIC,
                    value,
                )
                for process in running.workers.processes:
                    if process.is_alive():
                        os.kill(process.pid, signal.SIGTERM)
                return

    def settled(self, group_run: GroupRun, outcome: dict, stopping: bool) -> None:
        """Tell the study how a trial ended (before the next is drawn), log one line, and
        write its state in its folder (``trial.json``)."""
        from optuna.trial import TrialState

        name = group_run.name
        state = self.active.pop(name)
        trial, folder = state["trial"], group_run.folder
        origin = (
            f"; a retry of trial {trial.user_attrs['retry_of']}, interrupted when its sweep stopped"
            if "retry_of" in trial.user_attrs
            else ""
        )
        trial.set_user_attr("seconds", outcome.get("seconds"))
        # a complete report counts however the workers ended: a stop signal that reaches a
        # trial after it wrote its report ends its workers as they exit, unreported
        report = finished_report(folder)
        if state["pruned"] is not None:
            epoch, value = state["pruned"]
            note = f"pruned after epoch {epoch}{origin}"
            trial.set_user_attr("note", note)
            self.study.tell(trial, state=TrialState.PRUNED)
            _write_trial_file(folder, trial.number, trial.params, "pruned", value, note)
            logger.info("%s: stopped%s", name, self._progress())
            return
        if report is not None:
            value = _best_value(report)
            if math.isfinite(value):
                self.study.tell(trial, value)
                _write_trial_file(folder, trial.number, trial.params, "complete", value, origin[2:] or None)
                logger.info(
                    "%s: finished, best %s %.4g (epoch %d)%s",
                    name,
                    METRIC,
                    value,
                    report["best_epoch"],
                    self._progress(),
                )
                return
            outcome = {"status": "failed", "error": f"no finite {METRIC} in any epoch"}
        if outcome["status"] == "interrupted" and stopping:  # the sweep was stopped: the trial is retried next time
            retry = trial.user_attrs.get("attempt", 1) < 2
            note = "interrupted by a stop signal; " + (
                "retried once, in this folder, from its checkpoint when the sweep runs again"
                if retry
                else "not retried again"
            )
            trial.set_user_attr("note", note)
            self.study.tell(trial, state=TrialState.FAIL)
            _write_trial_file(folder, trial.number, trial.params, "failed", None, note)
            if retry:
                self.study.enqueue_trial(
                    trial.params, user_attrs={"folder": str(folder), "attempt": 2, "retry_of": trial.number}
                )
            logger.warning("%s: %s", name, note)
            return
        error = str(outcome.get("error") or "failed").strip().splitlines()
        trial.set_user_attr("note", error[-1] if error else "failed")
        self.study.tell(trial, state=TrialState.FAIL)
        _write_trial_file(folder, trial.number, trial.params, "failed", None, "\n".join(error))
        logger.error("%s: failed: %s%s", name, error[-1] if error else "", self._progress())

    def _progress(self) -> str:
        """``' (5 of 12 trials done; best so far: trial 3, 0.412)'``."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
        done = [
            t
            for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and t.number not in retried
        ]
        complete = [t for t in done if t.state == TrialState.COMPLETE]
        best = min(complete, key=lambda t: t.value) if complete else None
        return f" ({len(done)} of {self.plan.trials} trials done" + (
            f"; best so far: trial {best.number}, {best.value:.4g})" if best else ")"
        )


def _trial_config(options: RunOptions, group) -> dict:
    """What a trial's ``config.yaml`` holds on ``group``: its run alone (``gears-ddp train
    --config`` on it repeats the trial)."""
    config = options.config()
    config["args"]["cpu_processes"] = len(group) if group[0].type == "cpu" else None
    config["gpu_ids"] = None if group[0].type == "cpu" else [device.index for device in group]
    config["n_gpus"] = None
    return config


def _epochs(path: Path) -> list[tuple[int, float]]:
    """``(epoch, validation mse_de)`` of each epoch ``metrics.csv`` holds (none while it is
    not there)."""
    try:
        with open(path, newline="", encoding="utf-8") as table:
            rows = list(csv.DictReader(table))
    except OSError:
        return []
    epochs = []
    for row in rows:
        try:
            epochs.append((int(row["epoch"]), float(row[METRIC])))
        except (KeyError, TypeError, ValueError):
            break
    return epochs
