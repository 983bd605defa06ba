"""The one place where a run's cluster environment and launcher are chosen: ``launch``.
``train_multi_gpu``, ``train_ddp_worker``, the group scheduler (replicates, sweeps) and
``gears-ddp train`` all start their runs here.

Runs started by torchrun or Slurm (one process per device, many nodes): each process runs
``gears-ddp train --config run.yaml`` (``python -m gears_ddp train``; ``python -m
gears_ddp.launch`` is the same), which finds the launcher's environment here.

    torchrun --standalone --nproc_per_node=4 -m gears_ddp train --config run.yaml
    srun python -m gears_ddp train --config run.yaml

Each process reads its place from its environment (``environments``), prepares the data
itself (the ranks of one machine take turns, so it is built once per machine), uses the GPU
of its local rank (or the CPU with gloo when there is none, with its share of the machine's
cores), and runs the same rank as ``train_multi_gpu``.

Restarts and preemption: a restarted torchrun attempt and a requeued Slurm job continue
from the latest checkpoint in ``save_path`` unless ``resume_from`` says otherwise
(``launchers.continued_after_restart``). On SIGTERM or SIGUSR1 every rank stops at the next
optimiser step after rank 0 wrote a checkpoint, and exits with status 75; under Slurm,
SIGUSR1 (``sbatch --signal=USR1@90``) also requeues the job
(``SlurmEnvironment.requeue_on``), which then continues with ``resume_from: "auto"``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch

from gears_ddp._logging import LIBRARY_LOGGER_NAME, enable_console_logging
from gears_ddp.configuration.run_options import RunOptions
from gears_ddp.launching.environments import ClusterEnvironment, pick_environment
from gears_ddp.launching.launchers import Launcher, RankInThisProcess, SpawnedRanks, ThisRank, open_and_start
from gears_ddp.launching.rank_training import place, progress_bars_without_semaphores
from gears_ddp.runtime.devices import launched_rank_device, located_devices
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, TrainingInterrupted
from gears_ddp.runtime.threads import OPENMP_WAITING


def launch(
    run: RunOptions,
    environment: ClusterEnvironment | None = None,
    launcher: Launcher | None = None,
    spawn: bool = False,
) -> Any:
    """Train ``run`` (checked options) and return what its launcher returns: rank 0's report
    (None on the other ranks of a launched run; a group's running workers for
    ``GroupOfRanks``).

    The launcher is ``launcher`` when given (the group scheduler's ``GroupOfRanks``), else
    chosen by the cluster environment: ``environment`` when given (``train_ddp_worker``'s
    rank), else the one the launcher's variables describe (``pick_environment``), unless
    ``spawn`` (``train_multi_gpu``, which a script may call inside a Slurm batch job):

    - none (a plain start): ``SpawnedRanks``, one process per device of the run, or
      ``RankInThisProcess`` when the run has one device;
    - torchrun or Slurm: ``ThisRank`` on the GPU of its local rank (else the CPU); a stop
      signal exits with status 75, after Slurm's requeue on SIGUSR1;
    - a local rank started by a script: ``ThisRank`` on the CPU with ``cpu_processes``,
      else on GPU ``rank``; its rank 0 shows the library's log on the console, as the seed
      guide's rank 0 prints, unless the process has logging configured (a process that
      ``mp.spawn`` started has none, whatever its parent set).
    """
    if launcher is not None:
        return open_and_start(run, launcher)
    if environment is None and not spawn:
        environment = pick_environment()
    if environment is None:
        devices = located_devices(run.n_gpus, run.gpu_ids, run.args.cpu_processes)
        return open_and_start(run, RankInThisProcess(devices[0]) if len(devices) == 1 else SpawnedRanks(devices))
    if not environment.started_by_a_launcher:
        if environment.rank == 0 and not logging.getLogger(LIBRARY_LOGGER_NAME).hasHandlers():
            enable_console_logging()
        device = (
            torch.device("cpu") if run.args.cpu_processes is not None else launched_rank_device(environment.local_rank)
        )
        return open_and_start(run, ThisRank(place(environment, device)))
    return _launched_rank(run, environment)


def _launched_rank(run: RunOptions, environment: ClusterEnvironment) -> dict | None:
    """This process as the rank of a torchrun or srun job; rank 0 writes the run folder's
    ``config.yaml`` and returns the report (None on the other ranks). A stop signal exits
    with status 75 (after the scheduler's requeue, where it has one)."""
    progress_bars_without_semaphores()
    if environment.rank == 0:
        enable_console_logging()
    device = launched_rank_device(environment.local_rank)
    if device.type == "cpu" and environment.rank == 0 and not any(name in os.environ for name in OPENMP_WAITING):
        logging.getLogger(LIBRARY_LOGGER_NAME).warning(
            "training on CPU with OpenMP threads that spin while they wait: on a node shared with other work, "
            "export OMP_WAIT_POLICY=PASSIVE before torchrun or srun (docs/distributed.md)"
        )
    try:
        return open_and_start(run, ThisRank(place(environment, device)))
    except TrainingInterrupted as stop:
        if environment.rank == 0:
            logging.getLogger(LIBRARY_LOGGER_NAME).warning("%s", stop)
            environment.requeue_on(stop.signal_name)
        sys.exit(EXIT_INTERRUPTED)


def refuse_replicates_under_a_launcher() -> None:
    """Replicates run on one machine, started by ``gears-ddp train`` or ``train_replicates``
    itself: refused in a process torchrun or srun started."""
    environment = pick_environment()
    if environment is not None:
        raise ValueError(
            f"replicates run on one machine, started by gears-ddp train itself, not under "
            f"{environment.name}: start it without the launcher"
        )
