"""Runs started by torchrun or Slurm (one process per device, many nodes): each process runs
``gears-ddp train --config run.yaml`` (``python -m gears_ddp train``; ``python -m
gears_ddp.launch`` is the same), which finds the launcher's variables and comes here.

    torchrun --standalone --nproc_per_node=4 -m gears_ddp train --config run.yaml
    srun python -m gears_ddp train --config run.yaml

Each process reads its place from the environment (``launch_environment``: torchrun's RANK /
WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT, else Slurm's
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE /
SLURM_JOB_NODELIST), prepares the data itself (the ranks of one machine take turns, so it is
built once per machine), uses the GPU of its local rank (or the CPU with gloo when there is
none, with its share of the machine's cores), and runs the same rank as ``train_multi_gpu``.

Restarts and preemption: a torchrun restart (``TORCHELASTIC_RESTART_COUNT`` above 0) and a
requeued Slurm job (``SLURM_RESTART_COUNT`` above 0) continue from the latest checkpoint in
``save_path`` unless ``resume_from`` says otherwise (``launcher.continued_after_restart``). On SIGTERM
or SIGUSR1 every rank stops at the next optimiser step after rank 0 wrote a checkpoint, and
exits with status 75; under Slurm, SIGUSR1 (``sbatch --signal=USR1@90``) also requeues the
job (``scontrol requeue``), which then continues with ``resume_from: "auto"``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from gears_ddp._logging import LIBRARY_LOGGER_NAME, enable_console_logging
from gears_ddp.distributed.launch_environment import LaunchEnvironment
from gears_ddp.distributed.launcher import Launcher, ThisRank
from gears_ddp.distributed.rank import Placement, progress_bars_without_semaphores
from gears_ddp.distributed.run_config import RunOptions
from gears_ddp.runtime.devices import launched_rank_device
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, TrainingInterrupted
from gears_ddp.runtime.threads import OPENMP_WAITING


def run_launched_rank(
    pert_data_path, dataset_name: str, split_config: dict, args: dict, environment: LaunchEnvironment
) -> dict | None:
    """Train as the rank of a torchrun or srun job that ``environment`` describes
    (``launch_environment()``), with ``train_multi_gpu``'s parameters; rank 0 writes
    the run folder's ``config.yaml`` and returns the report (None on the other ranks). A stop
    signal exits with status 75 (after a requeue under Slurm on SIGUSR1)."""
    return train_launched(RunOptions.checked(pert_data_path, dataset_name, split_config, args), environment)


def train_launched(run: RunOptions, environment: LaunchEnvironment) -> dict | None:
    """``run_launched_rank`` of options checked before (``gears-ddp train --config`` under
    torchrun or srun)."""
    progress_bars_without_semaphores()
    if environment.rank == 0:
        enable_console_logging()
    device = launched_rank_device(environment.local_rank)
    if device.type == "cpu" and environment.rank == 0 and not any(name in os.environ for name in OPENMP_WAITING):
        logging.getLogger(LIBRARY_LOGGER_NAME).warning(
            "training on CPU with OpenMP threads that spin while they wait: on a node shared with other work, "
            "export OMP_WAIT_POLICY=PASSIVE before torchrun or srun (docs/long-runs.md)"
        )
    placement = Placement(
        environment.rank,
        environment.world_size,
        environment.local_rank,
        environment.local_world_size,
        device,
        environment.master_addr,
        environment.master_port,
    )
    try:
        return Launcher(run, ThisRank(placement)).launch()
    except TrainingInterrupted as stop:
        if environment.rank == 0:
            logging.getLogger(LIBRARY_LOGGER_NAME).warning("%s", stop)
            if stop.signal_name == "SIGUSR1" and environment.source == "slurm":
                requeue_slurm_job()
        sys.exit(EXIT_INTERRUPTED)


def requeue_slurm_job() -> None:
    """Put this Slurm job back in the queue (it must have been submitted with ``--requeue``)."""
    log = logging.getLogger(LIBRARY_LOGGER_NAME)
    job = os.environ.get("SLURM_JOB_ID")
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        problem = done.stderr.strip() if done.returncode else None
    except (OSError, subprocess.SubprocessError, TypeError) as err:  # no scontrol, no job id
        problem = f"{type(err).__name__}: {err}"
    if problem:
        log.warning("could not requeue Slurm job %s (%s); resubmit it to continue from the checkpoint", job, problem)
    else:
        log.warning("Slurm job %s requeued", job)
