"""One launcher for every way of starting a run's ranks.

A run's options come in checked once (``run_config.RunOptions``). The ``Launcher`` does the
opening every run shares, once: the save folder taken and checked (by the process that
writes the run folder, which holds it until the ranks end: ``training.save_folder``), the
resume checkpoint read, the configuration written there, and the data prepared. It then hands the checked options,
the data and the checkpoint to a way of
starting the ranks, each of which ends in ``rank.run_rank``:

- ``SpawnedRanks``: one process per device of this machine (``train_multi_gpu``); the
  parent prepares the data once and shares it;
- ``ThisRank``: this process as one rank of a run something else started: a script's
  ``mp.spawn`` (``train_ddp_worker``), torchrun or srun (``launch.run_launched_rank``);
- ``group_runs.GroupOfRanks``: a run's ranks on a group of devices, left running for the
  group scheduler to watch (replicates, sweeps).

As Lightning's launchers do, each way only starts processes; the strategy (what crosses
ranks) is ``runtime.ranks`` and the cluster's environment ``launch_environment``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gears_ddp._logging import get_logger
from gears_ddp.data.preparation import prepare_data
from gears_ddp.distributed.before_spawn import local_placements, rendezvous_port, shared_data
from gears_ddp.distributed.messages import RunDiverged, RunInterrupted, RunReport
from gears_ddp.distributed.rank import Placement, run_rank, spawned_rank
from gears_ddp.distributed.run_config import RunOptions, write_run_config
from gears_ddp.distributed.supervisor import spawn_workers
from gears_ddp.runtime.folder_lock import is_restart, this_job
from gears_ddp.runtime.stopping import TrainingInterrupted
from gears_ddp.training.checkpoint import resolve_resume
from gears_ddp.training.finite_loss import NonFiniteLoss
from gears_ddp.training.save_folder import held_save_path

logger = get_logger(__name__)


@dataclass
class Opening:
    """What the opening hands the ranks: the prepared data, the checkpoint to continue from
    (``checkpoint.resolve_resume``'s path and state; None: a fresh start) and ``held``, the
    run folder this process holds for the run (a way that leaves its ranks running takes it
    over with ``held.pop_all()`` and releases it when they end)."""

    pert_data: object
    resume: tuple[Path, dict] | None
    held: contextlib.ExitStack


class Launcher:
    """Runs the ranks of ``run`` (checked options) the way ``way`` starts them, after the
    shared opening. A way of starting has ``writes_run_folder`` (whether this process
    writes, and so holds, the save folder), ``checks_save_path`` (False where the folder lies
    in one checked before), ``holder`` (what holds the folder, as a refused run reads it),
    ``config(run)`` (what ``config.yaml`` holds), ``data(run)`` (the prepared dataset) and
    ``start(run, opening)``."""

    def __init__(self, run: RunOptions, way):
        self.run, self.way = continued_after_restart(run), way

    def launch(self):
        """The opening, then the ranks started; returns what the way returns. The run folder
        is held until the ranks end (or, for a way that leaves them running, until it
        releases it)."""
        with contextlib.ExitStack() as held:
            return self.way.start(self.run, self.opening(held))

    def opening(self, held: contextlib.ExitStack) -> Opening:
        """Take the save folder (``save_folder.held_save_path``: refused when another run
        holds it or an earlier run would be overwritten unasked; kept in ``held``), read the
        resume checkpoint (an unreadable one fails before any rank starts), write the
        configuration, and prepare the data."""
        args = self.run.args
        writes = self.way.writes_run_folder and args.save_path is not None
        if writes:
            held.enter_context(
                held_save_path(
                    args.save_path,
                    self.way.holder,
                    args.resume_from,
                    args.overwrite_save_path,
                    check=self.way.checks_save_path,
                )
            )
        resume = resolve_resume(args.resume_from, args.save_path)
        if writes:
            write_run_config(args.save_path, self.way.config(self.run))
        return Opening(self.way.data(self.run), resume, held)


def continued_after_restart(run: RunOptions) -> RunOptions:
    """``run`` as a restarted scheduler job runs it (a torchrun restart, a requeued Slurm
    job: ``folder_lock.is_restart``): it continues its own folder from the
    newest checkpoint (``resume_from='auto'``, never an overwrite) unless ``resume_from``
    names another checkpoint; without a save_path, or with no checkpoint, it starts afresh."""
    job = this_job()
    if not is_restart(job) or run.args.resume_from is not None or run.args.save_path is None:
        return run
    logger.info(
        "%s job %s restarted (attempt %s): continuing from the newest checkpoint in %s",
        job["scheduler"],
        job["id"],
        job["attempt"],
        run.args.save_path,
    )
    return dataclasses.replace(run, args=dataclasses.replace(run.args, resume_from="auto", overwrite_save_path=False))


class SpawnedRanks:
    """One rank per device of ``devices``, spawned on this machine; the parent prepares the
    data once and shares it with them, and raises what stopped them
    (``TrainingInterrupted``, ``NonFiniteLoss``, ``DistributedTrainingError``)."""

    writes_run_folder = True
    checks_save_path = True
    holder = "train_multi_gpu"

    def __init__(self, devices: list[torch.device]):
        self.devices = devices

    @staticmethod
    def config(run: RunOptions) -> dict:
        return run.config()

    @staticmethod
    def data(run: RunOptions):
        return shared_data(run.pert_data_path, run.dataset_name, run.split, run.args)

    def start(self, run: RunOptions, opening: Opening) -> dict:
        """Rank 0's report, once every rank ended."""
        placements = local_placements(self.devices, rendezvous_port())
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


class ThisRank:
    """This process as the rank ``placement`` describes, in a run something else started: it
    prepares its own data and reads the checkpoint itself, once; rank 0 writes the run
    folder."""

    checks_save_path = True

    def __init__(self, placement: Placement):
        self.placement = placement
        self.writes_run_folder = placement.rank == 0
        self.holder = f"rank 0 of {placement.world_size}"

    @staticmethod
    def config(run: RunOptions) -> dict:
        return run.config()

    @staticmethod
    def data(run: RunOptions):
        return prepare_data(
            run.pert_data_path,
            run.dataset_name,
            run.split.options,
            run.args.model_config,
            **run.args.pert_data_options(),
        )

    def start(self, run: RunOptions, opening: Opening) -> dict | None:
        """The report on rank 0, None elsewhere."""
        return run_rank(self.placement, opening.pert_data, run.args, resume=opening.resume)
