"""Distributed training of GEARS: the module of the seed guide this library implements,
under the guide's names.

- ``train_multi_gpu(pert_data_path, dataset_name, split_config, args, n_gpus=None,
  gpu_ids=None)``: one worker process per device of this machine, started with
  ``torch.multiprocessing.spawn``, training with DDP; returns rank 0's report.
- ``train_ddp_worker(rank, world_size, pert_data_path, dataset_name, split_config, args)``:
  one rank, as the guide's worker: it loads its data, joins the process group, trains and
  leaves the group. ``train_multi_gpu`` does not spawn it (its parent loads the data once
  and shares it with the workers), but a script may, as the guide does.
- ``setup_ddp(rank, world_size, ...)`` and ``cleanup_ddp()``: join and leave the process
  group (``launching.process_group``).

Each starts its ranks through ``launching.choose.launch``, as runs over several machines do,
started by torchrun or srun through ``gears-ddp train --config run.yaml``.
"""

from __future__ import annotations

from gears_ddp.configuration.run_options import RunOptions
from gears_ddp.launching.choose import launch
from gears_ddp.launching.environments import DEFAULT_RENDEZVOUS_PORT, LocalEnvironment
from gears_ddp.launching.main_guard import check_main_guard
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.supervisor import DistributedTrainingError

__all__ = ["train_multi_gpu", "train_ddp_worker", "setup_ddp", "cleanup_ddp", "DistributedTrainingError"]


def train_multi_gpu(
    pert_data_path, dataset_name: str, split_config: dict, args: dict, n_gpus: int | None = None, gpu_ids=None
) -> dict:
    """Train GEARS with one process per device and return rank 0's report: test metrics of
    the model and the baselines (``'model'``, ``'baselines'``), ``'model_path'``,
    ``'best_epoch'`` and the per-epoch ``'history'``.

    ``gpu_ids`` picks CUDA devices (rank r uses ``gpu_ids[r]``); ``n_gpus=None`` uses every
    visible GPU; ``args['cpu_processes'] = N`` runs N CPU processes with gloo instead.

    The parent checks every option, the devices and the save folder, loads the data once,
    prepares the split and the graphs, shares them with the workers (tensors in shared
    memory; the expression, when mapped from its file, by the file's pages) and starts the
    workers; it does not train. A worker that fails stops the others, and the parent raises
    ``DistributedTrainingError`` with that rank's traceback. On one device (one GPU, or
    ``cpu_processes=1``) no worker is started: this process trains the one rank, without a
    process group, and what fails in it is raised as it is. A stop signal raises
    ``TrainingInterrupted`` (after a checkpoint), a non-finite loss ``NonFiniteLoss``.
    """
    check_main_guard("train_multi_gpu")
    run = RunOptions.checked(pert_data_path, dataset_name, split_config, args, n_gpus, gpu_ids)
    return launch(run, spawn=True)


def train_ddp_worker(
    rank: int,
    world_size: int,
    pert_data_path,
    dataset_name: str,
    split_config: dict,
    args: dict,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> dict | None:
    """Train as rank ``rank`` of ``world_size``, as the guide's worker does: load the data
    (``args`` as ``train_multi_gpu`` takes it), join the process group at ``master_addr``
    and ``master_port`` (else the launcher's rendezvous port if one is set, else the guide's
    12355), train, leave the group.
    The device is the CPU with ``args['cpu_processes']``, else GPU ``rank`` (the guide's
    ``cuda:rank``; the CPU on a machine without one). Rank 0 checks the save folder and
    writes the run's configuration there. Returns the report on rank 0, None elsewhere.
    ``torch.multiprocessing.spawn(train_ddp_worker, args=(world_size, ...),
    nprocs=world_size)`` runs a job on one machine."""
    run = RunOptions.checked(pert_data_path, dataset_name, split_config, args)
    port = LocalEnvironment.rendezvous_port(master_port, default=DEFAULT_RENDEZVOUS_PORT)
    return launch(run, LocalEnvironment(rank, world_size, rank, world_size, master_addr, port))
