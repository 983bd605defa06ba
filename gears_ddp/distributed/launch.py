"""Entry point for runs started by torchrun or Slurm (one process per device, many nodes).

    torchrun --standalone --nproc_per_node=4 -m gears_ddp.launch --data-path ./data --dataset norman \\
        --args-json '{"epochs": 20, "batch_size": 32}'
    srun python -m gears_ddp.launch --data-path ./data --dataset norman ...

Each process reads its place from the environment (torchrun's RANK / WORLD_SIZE /
LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT, else Slurm's SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE / SLURM_JOB_NODELIST), loads the
data itself, uses the GPU of its local rank (or the CPU with gloo when there is none, with
its share of the machine's cores), and runs the same worker as ``train_multi_gpu``. Rank 0
prints the report (``train_multi_gpu``'s) as JSON on the last line.

Restarts and preemption: a torchrun restart (``TORCHELASTIC_RESTART_COUNT`` above 0) continues
from the latest checkpoint in ``save_path`` unless ``resume_from`` says otherwise. On SIGTERM
or SIGUSR1 every rank stops at the next optimiser step after rank 0 wrote a checkpoint, and
exits with status 75; under Slurm, SIGUSR1 (``sbatch --signal=USR1@90``) also requeues the
job (``scontrol requeue``), which then continues with ``resume_from: "auto"``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

import torch

from gears_ddp._logging import LIBRARY_LOGGER_NAME, enable_console_logging
from gears_ddp.distributed.config import SplitConfig, TrainingArgs
from gears_ddp.distributed.runtime import launch_environment
from gears_ddp.distributed.worker import Placement, progress_bars_without_semaphores, train_ddp_worker
from gears_ddp.training.options import check_save_path
from gears_ddp.distributed.run_config import resolved_config, write_run_config
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, TrainingInterrupted
from gears_ddp.runtime.threads import OPENMP_WAITING
from gears_ddp.distributed.spawn import prepare_data


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gears_ddp.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-path", required=True, help="folder of the datasets and GO files")
    parser.add_argument("--dataset", required=True, help="a published dataset name or a folder under --data-path")
    parser.add_argument("--split", default="simulation")
    parser.add_argument("--seed", type=int, default=1, help="split seed")
    parser.add_argument("--train-gene-set-size", type=float, default=0.75)
    parser.add_argument("--args-json", default="{}", help="train_multi_gpu's args as JSON")
    return parser.parse_args(argv)


def main(argv=None) -> dict | None:
    options = parse_arguments(argv)
    environment = launch_environment()
    if environment is None:
        sys.exit("python -m gears_ddp.launch must be started by torchrun or srun (no RANK or SLURM_PROCID in the "
                 "environment); on one machine, call gears_ddp.train_multi_gpu instead")
    try:
        given = json.loads(options.args_json)
    except json.JSONDecodeError as err:
        sys.exit(f"--args-json is not valid JSON: {err}")
    split = {"split": options.split, "seed": options.seed, "train_gene_set_size": options.train_gene_set_size}
    report = run_launched_rank(options.data_path, options.dataset, split, given, environment)
    if report is not None:
        print(json.dumps(report, default=float))
    return report


def run_launched_rank(pert_data_path, dataset_name: str, split_config: dict, args: dict, environment) -> dict | None:
    """Train as the rank of a torchrun or srun job that ``environment`` describes
    (``runtime.launch_environment()``), with ``train_multi_gpu``'s parameters; rank 0 writes
    the run folder's ``config.yaml`` and returns the report (None on the other ranks). A stop
    signal exits with status 75 (after a requeue under Slurm on SIGUSR1)."""
    progress_bars_without_semaphores()
    given = dict(args)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0 and given.get("resume_from") is None:
        given["resume_from"] = "auto"  # a restarted worker continues from the latest checkpoint
    args = TrainingArgs.from_dict(given)
    split = SplitConfig.from_dict(split_config)
    if environment.rank == 0:
        enable_console_logging()
        if args.save_path is not None:
            check_save_path(args.save_path)
            write_run_config(args.save_path, resolved_config(str(pert_data_path), dataset_name, split, args))
    if torch.cuda.is_available():
        device = torch.device(f"cuda:{environment.local_rank % torch.cuda.device_count()}")
    else:
        device = torch.device("cpu")
        if environment.rank == 0 and not any(name in os.environ for name in OPENMP_WAITING):
            logging.getLogger(LIBRARY_LOGGER_NAME).warning(
                "training on CPU with OpenMP threads that spin while they wait: on a node shared with other "
                "work, export OMP_WAIT_POLICY=PASSIVE before torchrun or srun (README, 'Long runs')")
    pert_data = prepare_data(pert_data_path, dataset_name, split, args)
    placement = Placement(environment.rank, environment.world_size, environment.local_rank,
                          environment.local_world_size, device, environment.master_addr, environment.master_port)
    try:
        report = train_ddp_worker(placement, pert_data, args)
    except TrainingInterrupted as stop:
        if environment.rank == 0:
            logging.getLogger(LIBRARY_LOGGER_NAME).warning("%s", stop)
            if stop.signal_name == "SIGUSR1" and environment.source == "slurm":
                requeue_slurm_job()
        sys.exit(EXIT_INTERRUPTED)
    return report


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


