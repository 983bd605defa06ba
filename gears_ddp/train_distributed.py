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
  group (``distributed.process_group``).

Runs over several machines start the same ranks with torchrun or srun through ``gears-ddp
train --config run.yaml`` (``distributed.launch``).
"""
from __future__ import annotations


import torch

from gears_ddp._logging import get_logger
from gears_ddp.data.preparation import prepare_data
from gears_ddp.distributed.before_spawn import checked_run, local_placements, rendezvous_port, shared_data
from gears_ddp.distributed.config import SplitConfig, TrainingArgs
from gears_ddp.distributed.messages import RunDiverged, RunInterrupted, RunReport
from gears_ddp.distributed.process_group import cleanup_ddp, guide_rendezvous_port, setup_ddp
from gears_ddp.distributed.rank import Placement, run_rank, spawned_rank
from gears_ddp.distributed.run_config import resolved_config, write_run_config
from gears_ddp.distributed.supervisor import DistributedTrainingError, spawn_workers
from gears_ddp.runtime.devices import launched_rank_device
from gears_ddp.runtime.stopping import TrainingInterrupted
from gears_ddp.training.checkpoint import resolve_resume
from gears_ddp.training.finite_loss import NonFiniteLoss
from gears_ddp.training.options import check_save_path

__all__ = ["train_multi_gpu", "train_ddp_worker", "setup_ddp", "cleanup_ddp", "DistributedTrainingError"]

logger = get_logger(__name__)


def train_multi_gpu(pert_data_path, dataset_name: str, split_config: dict, args: dict, n_gpus: int | None = None,
                    gpu_ids=None) -> dict:
    """Train GEARS with one process per device and return rank 0's report: test metrics of
    the model and the baselines (``'model'``, ``'baselines'``), ``'model_path'``,
    ``'best_epoch'`` and the per-epoch ``'history'``.

    ``gpu_ids`` picks CUDA devices (rank r uses ``gpu_ids[r]``); ``n_gpus=None`` uses every
    visible GPU; ``args['cpu_processes'] = N`` runs N CPU processes with gloo instead.

    The parent checks every option, the devices and the save folder, loads the data once,
    prepares the split and the graphs, moves the expression to shared memory and starts the
    workers; it does not train. A worker that fails stops the others, and the parent raises
    ``DistributedTrainingError`` with that rank's traceback. A stop signal raises
    ``TrainingInterrupted`` (after a checkpoint), a non-finite loss ``NonFiniteLoss``.
    """
    run = checked_run("train_multi_gpu", split_config, args, n_gpus, gpu_ids)
    options, devices = run.options, run.devices
    if options.resume_from not in (None, "auto"):
        resolve_resume(options.resume_from, options.save_path)  # an unreadable checkpoint fails before any worker
    if options.save_path is not None:
        check_save_path(options.save_path)
        write_run_config(options.save_path, resolved_config(str(pert_data_path), dataset_name, run.split, options,
                                                            n_gpus, gpu_ids))
    pert_data = shared_data(pert_data_path, dataset_name, run.split, options)
    placements = local_placements(devices, rendezvous_port())
    logger.info("starting %d %s process(es): %s", len(devices), devices[0].type, [str(d) for d in devices])
    messages = spawn_workers(spawned_rank, (placements, pert_data, options), len(devices))
    for message in messages:
        if isinstance(message, RunInterrupted):
            raise TrainingInterrupted(message.message, message.signal_name, message.checkpoint)
        if isinstance(message, RunDiverged):
            raise NonFiniteLoss(message.message)
    return next(message.report for message in messages if isinstance(message, RunReport))


def train_ddp_worker(rank: int, world_size: int, pert_data_path, dataset_name: str, split_config: dict, args: dict,
                     master_addr: str = "127.0.0.1", master_port: int | None = None) -> dict | None:
    """Train as rank ``rank`` of ``world_size``, as the guide's worker does: load the data
    (``args`` as ``train_multi_gpu`` takes it), join the process group at ``master_addr``
    and ``master_port`` (``MASTER_PORT``, else the guide's 12355), train, leave the group.
    The device is the CPU with ``args['cpu_processes']``, else GPU ``rank`` (the guide's
    ``cuda:rank``; the CPU on a machine without one). Returns the report on rank 0, None
    elsewhere. ``torch.multiprocessing.spawn(train_ddp_worker, args=(world_size, ...),
    nprocs=world_size)`` runs a job on one machine."""
    options, split = TrainingArgs.from_dict(args), SplitConfig.from_dict(split_config)
    device = torch.device("cpu") if options.cpu_processes is not None else launched_rank_device(rank)
    port = guide_rendezvous_port(master_port)
    pert_data = prepare_data(pert_data_path, dataset_name, split.options, options.model_config,
                             **options.pert_data_options())
    return run_rank(Placement(rank, world_size, rank, world_size, device, master_addr, port), pert_data, options)
