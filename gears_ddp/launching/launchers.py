"""The launchers: each starts a run's ranks one way, after the opening every run shares.

A run's options come in checked once (``run_options.RunOptions``). The opening, done once by
``open_and_start`` for every launcher: the save folder taken and checked (by the process that
writes the run folder, which holds it until the ranks end: ``training.save_folder``), the
resume checkpoint read, the configuration written there, and the data prepared. It then
hands the checked options, the data and the checkpoint to the launcher, whose ranks each end
in ``rank_training.run_rank``:

- ``SpawnedRanks``: one process per device of this machine (``train_multi_gpu``); the
  parent prepares the data once (``shared_data``) and shares it;
- ``ThisRank``: this process as one rank of a run something else started: a script's
  ``mp.spawn`` (``train_ddp_worker``), torchrun or srun;
- ``GroupOfRanks``: a run's ranks on a group of devices, left running for the group
  scheduler (``distributed.group_runs``) to watch (replicates, sweeps).

Which launcher a run gets is chosen in one place (``choose.launch``). As Lightning's launchers
do, each only starts processes; what crosses ranks is ``runtime.ranks`` and where the ranks
come from the cluster environment (``environments``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import yaml

from gears_ddp._logging import get_logger
from gears_ddp.configuration.run_options import RunOptions, write_run_config
from gears_ddp.configuration.sections import SplitConfig, TrainingArgs
from gears_ddp.data.preparation import prepare_data
from gears_ddp.launching.environments import LocalEnvironment, find_free_port, is_restart, this_job
from gears_ddp.launching.rank_training import Placement, place, run_rank, spawned_rank, train_rank
from gears_ddp.launching.supervisor import SpawnedWorkers, spawn_workers
from gears_ddp.launching.worker_messages import RunDiverged, RunInterrupted, RunReport
from gears_ddp.report.run_files import CONFIG_FILE, read_settings
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.ranks import SINGLE_PROCESS
from gears_ddp.runtime.stopping import TrainingInterrupted
from gears_ddp.runtime.threads import cpu_threads, torch_threads
from gears_ddp.training.checkpoint import refuse_other_training_options, resolve_resume, run_folder_of
from gears_ddp.training.finite_loss import NonFiniteLoss
from gears_ddp.training.save_folder import held_save_path

logger = get_logger(__name__)


@dataclass
class Opening:
    """What the opening hands the ranks: the prepared data, the checkpoint to continue from
    (``checkpoint.resolve_resume``'s path and state; None: a fresh start) and ``held``, the
    run folder this process holds for the run (a launcher that leaves its ranks running takes it
    over with ``held.pop_all()`` and releases it when they end)."""

    pert_data: object
    resume: tuple[Path, dict] | None
    held: contextlib.ExitStack


class Launcher(Protocol):
    """A way of starting a run's ranks. ``writes_run_folder``: whether this process writes,
    and so holds, the save folder; ``checks_save_path``: False where the folder lies in one
    checked before; ``holder``: what holds the folder, as a refused run reads it;
    ``config(run)``: what ``config.yaml`` holds; ``data(run)``: the prepared dataset;
    ``start(run, opening)``: the ranks started, with what they return."""

    writes_run_folder: bool
    checks_save_path: bool
    holder: str

    def config(self, run: RunOptions) -> dict: ...

    def data(self, run: RunOptions) -> Any: ...

    def start(self, run: RunOptions, opening: Opening) -> Any: ...


def open_and_start(run: RunOptions, launcher: Launcher) -> Any:
    """The opening of ``run`` (checked options; continued after a restart of its scheduler
    job), then its ranks started by ``launcher``; returns what the launcher returns. The run
    folder is held until the ranks end (or, for a launcher that leaves them running, until
    it releases it)."""
    run = continued_after_restart(run)
    with contextlib.ExitStack() as held:
        return launcher.start(run, opening(run, launcher, held))


def opening(run: RunOptions, launcher: Launcher, held: contextlib.ExitStack) -> Opening:
    """Take the save folder (``save_folder.held_save_path``: refused when another run holds
    it or an earlier run would be overwritten unasked; kept in ``held``), read the resume
    checkpoint (an unreadable one, or one written with other model or training options, fails
    before any rank starts and before the configuration is written), prepare the data, and
    write the configuration (after the data, so that a dataset refused leaves none behind)."""
    args = run.args
    writes = launcher.writes_run_folder and args.save_path is not None
    if writes:
        held.enter_context(
            held_save_path(
                args.save_path,
                launcher.holder,
                args.resume_from,
                args.overwrite_save_path,
                check=launcher.checks_save_path,
            )
        )
    resume = resolve_resume(args.resume_from, args.save_path)
    if resume is not None:
        refuse_other_model_options(resume[0], run)
        refuse_other_training_options(*resume, args)
    data = launcher.data(run)
    if writes:
        write_run_config(args.save_path, launcher.config(run))
    return Opening(data, resume, held)


def refuse_other_model_options(checkpoint: Path, run: RunOptions) -> None:
    """Refuse to continue from ``checkpoint`` a run whose model options (``args.model_config``)
    differ from those of the run that wrote it (its folder's ``config.yaml``, when it has
    one): its weights would not fit this run's model. Checked here, before any rank starts,
    from the options; each rank checks the weights themselves too (``recipe.refuse_other_weights``,
    which ``GEARS.train`` relies on)."""
    folder = run_folder_of(checkpoint)
    try:
        written = read_settings(folder).get("args", {}).get("model_config")
    except (OSError, yaml.YAMLError, AttributeError):  # no readable configuration: nothing to compare
        return
    ours = run.config()["args"]["model_config"]
    if not isinstance(written, dict):
        return
    differing = [
        f"{key}: {written[key]!r} there, {ours[key]!r} here"
        for key in sorted(ours)
        if key in written and written[key] != ours[key]
    ]
    if differing:
        raise ValueError(
            f"resume_from: {checkpoint} was written by a run of another model ({'; '.join(differing)}; "
            f"{folder / CONFIG_FILE}): give args.model_config as it had it, or start afresh (overwrite_save_path=True; "
            "gears-ddp train --overwrite)"
        )


def continued_after_restart(run: RunOptions) -> RunOptions:
    """``run`` as a restarted scheduler job runs it (a torchrun restart, a requeued Slurm
    job: ``environments.is_restart``): it continues its own folder from the
    newest checkpoint (``resume_from='auto'``, never an overwrite) unless ``resume_from``
    names another checkpoint; without a save_path, or with no checkpoint, it starts afresh."""
    job = this_job()
    if job is None or not is_restart(job) or run.args.resume_from is not None or run.args.save_path is None:
        return run
    logger.info(
        "%s job %s restarted (attempt %s): continuing from the newest checkpoint in %s",
        job["scheduler"],
        job["id"],
        job["attempt"],
        run.args.save_path,
    )
    return dataclasses.replace(run, args=dataclasses.replace(run.args, resume_from="auto", overwrite_save_path=False))


def with_cpu_threads(config: dict, device: torch.device, local_ranks: int, requested: int | None) -> dict:
    """``config`` with, where the ranks train on the CPU, ``args.cpu_threads`` set to the
    threads each of them uses (``threads.cpu_threads``: ``requested``, else shared among the
    ``local_ranks`` ranks training on this machine at once): a CPU's sums, and so the run's
    figures, follow the count, and ``config.yaml`` repeats the run bit for bit only with it
    (a sweep's trial, trained beside others, repeated alone). On a GPU it is left as given."""
    if device.type == "cpu":
        config["args"]["cpu_threads"] = cpu_threads(local_ranks, requested)
    return config


class TrainMultiGpuLaunch:
    """What the launchers of ``train_multi_gpu`` (and ``gears-ddp train`` without a
    launcher) share: this process writes and holds the run folder, checked here, and writes
    the run's own configuration there, with the threads of its CPU ranks (``with_cpu_threads``;
    all of them on this machine, ``local_devices``)."""

    writes_run_folder = True
    checks_save_path = True
    holder = "train_multi_gpu"

    @property
    def local_devices(self) -> list[torch.device]:
        """The devices of the run's ranks, all on this machine."""
        raise NotImplementedError

    def config(self, run: RunOptions) -> dict:
        return with_cpu_threads(run.config(), self.local_devices[0], len(self.local_devices), run.args.cpu_threads)


class SpawnedRanks(TrainMultiGpuLaunch):
    """One rank per device of ``devices``, spawned on this machine; the parent prepares the
    data once and shares it with them, and raises what stopped them
    (``TrainingInterrupted``, ``NonFiniteLoss``, ``DistributedTrainingError``)."""

    def __init__(self, devices: list[torch.device]):
        self.devices = devices

    @property
    def local_devices(self) -> list[torch.device]:
        return self.devices

    @staticmethod
    def data(run: RunOptions):
        return shared_data(run.pert_data_path, run.dataset_name, run.split, run.args)

    def start(self, run: RunOptions, opening: Opening) -> dict:
        """Rank 0's report, once every rank ended."""
        placements = local_placements(self.devices, LocalEnvironment.rendezvous_port())
        logger.info(
            "starting %d %s process(es): %s",
            len(self.devices),
            self.devices[0].type,
            [str(device) for device in self.devices],
        )
        messages = spawn_workers(
            functools.partial(spawned_rank, resume=opening.resume, spawned_at=time.time()),
            (placements, opening.pert_data, run.args),
            len(self.devices),
        )
        for message in messages:
            if isinstance(message, RunInterrupted):
                raise TrainingInterrupted(message.message, message.signal_name, message.checkpoint)
            if isinstance(message, RunDiverged):
                raise NonFiniteLoss(message.message)
        return next(message.report for message in messages if isinstance(message, RunReport))


class RankInThisProcess(TrainMultiGpuLaunch):
    """The one rank of a run on one ``device``, trained in this process: no process to start
    (a spawned rank imports torch and the package again and is handed the data: seconds
    before its first step) and no process group, so nothing crosses ranks
    (``ranks.SINGLE_PROCESS``). It trains as ``GEARS.train`` trains and as a spawned rank of
    one would, from the same options, loaders and model (``rank_training.train_rank``); on
    the CPU with the threads a spawned rank would get, on a GPU with that GPU current. What
    stops it (``TrainingInterrupted``, ``NonFiniteLoss``) or fails in it is raised here as
    it is."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    @property
    def local_devices(self) -> list[torch.device]:
        return [self.device]

    @staticmethod
    def data(run: RunOptions):
        return prepared_data(run.pert_data_path, run.dataset_name, run.split, run.args)

    def start(self, run: RunOptions, opening: Opening) -> dict:
        """The run's report."""
        with contextlib.ExitStack() as placed:
            if self.device.type == "cuda":
                placed.enter_context(torch.cuda.device(self.device))
            elif self.device.type == "cpu":
                placed.enter_context(torch_threads(cpu_threads(1, run.args.cpu_threads)))
            logger.info("1 rank, in this process, on %s with %d thread(s)", self.device, torch.get_num_threads())
            return train_rank(opening.pert_data, run.args, self.device, SINGLE_PROCESS, PhaseClock(), opening.resume)


class ThisRank:
    """This process as the rank ``placement`` describes, in a run something else started: it
    prepares its own data and reads the checkpoint itself, once; rank 0 writes the run
    folder."""

    checks_save_path = True

    def __init__(self, placement: Placement):
        self.placement = placement
        self.writes_run_folder = placement.rank == 0
        self.holder = f"rank 0 of {placement.world_size}"

    def config(self, run: RunOptions) -> dict:
        """The run's configuration; on the CPU it records the ranks as ``cpu_processes``
        (torchrun or srun started them, or a script, on a machine without a GPU), so that
        ``gears-ddp train --config`` on one machine repeats the run with as many ranks rather
        than asking for a GPU. A launcher that starts the ranks again ignores the option."""
        config = run.config()
        if self.placement.device.type == "cpu" and run.args.cpu_processes is None:
            config["args"]["cpu_processes"] = self.placement.world_size
        device, local_ranks = torch.device(self.placement.device), self.placement.local_world_size
        return with_cpu_threads(config, device, local_ranks, run.args.cpu_threads)

    @staticmethod
    def data(run: RunOptions):
        return prepared_data(run.pert_data_path, run.dataset_name, run.split, run.args)

    def start(self, run: RunOptions, opening: Opening) -> dict | None:
        """The report on rank 0, None elsewhere."""
        return run_rank(self.placement, opening.pert_data, run.args, resume=opening.resume)


class GroupOfRanks:
    """Starts a run on one group of ``devices``, the ranks ``first_local_rank`` on of the
    ``local_world_size`` sharing this machine: its ranks started and left running for the
    group scheduler to watch (``SpawnedWorkers``, which hold the run's folder until they are
    closed), meeting at a free port of their own. Its configuration is given (``config``),
    its data comes prepared from the scheduler (``prepared``), and its folder lies in one the
    scheduler's caller checked before."""

    writes_run_folder = True
    checks_save_path = False

    def __init__(
        self,
        devices: list[torch.device],
        first_local_rank: int,
        local_world_size: int,
        config: dict,
        prepared: Callable[[RunOptions], Any],
        log_prefix: str,
        holder: str,
    ):
        self.devices, self.first_local_rank, self.local_world_size = devices, first_local_rank, local_world_size
        self.written, self.prepared, self.log_prefix, self.holder = config, prepared, log_prefix, holder

    def config(self, run: RunOptions) -> dict:
        """The configuration the scheduler gave, with the threads of the group's CPU ranks,
        which share the machine with every group's (``with_cpu_threads``)."""
        written = {**self.written, "args": dict(self.written["args"])}
        return with_cpu_threads(written, self.devices[0], self.local_world_size, run.args.cpu_threads)

    def data(self, run: RunOptions):
        return self.prepared(run)

    def start(self, run: RunOptions, opening: Opening) -> SpawnedWorkers:
        placements = local_placements(self.devices, find_free_port(), self.first_local_rank, self.local_world_size)
        workers = SpawnedWorkers(
            functools.partial(spawned_rank, resume=opening.resume, spawned_at=time.time()),
            (placements, opening.pert_data, run.args),
            len(placements),
            log_prefix=self.log_prefix,
            ranks_on_machine=self.local_world_size,
        )
        workers.holding = opening.held.pop_all()  # the run's folder, released when its workers are closed
        return workers


def prepared_data(pert_data_path, dataset_name: str, split: SplitConfig, options: TrainingArgs):
    """The dataset with its split and graphs prepared as the run's options say."""
    return prepare_data(
        pert_data_path, dataset_name, split.options, options.model_config, **options.pert_data_options()
    )


def shared_data(pert_data_path, dataset_name: str, split: SplitConfig, options: TrainingArgs):
    """``prepared_data`` with its tensors in shared memory, so that spawned workers receive it
    without a copy."""
    return prepared_data(pert_data_path, dataset_name, split, options).share_memory_()


def local_placements(
    devices: list[torch.device], port: int, first_local_rank: int = 0, local_world_size: int | None = None
) -> list[Placement]:
    """The places of ranks spawned on this machine (``LocalEnvironment.spawned``), one per
    device in rank order, meeting at ``port``."""
    environments = LocalEnvironment.spawned(len(devices), port, first_local_rank, local_world_size)
    return [place(environment, device) for environment, device in zip(environments, devices)]
