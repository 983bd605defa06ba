"""What a run of spawned workers checks and prepares before any process starts
(``train_multi_gpu``, ``train_replicates``): the options and the devices, checked so that a
mistake fails at once with a message naming it; then the data, loaded and prepared once in
the parent and shared with the workers; then each worker's place.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from gears_ddp.data.preparation import prepare_data
from gears_ddp.distributed.config import SplitConfig, TrainingArgs
from gears_ddp.distributed.main_guard import check_main_guard
from gears_ddp.distributed.process_group import find_free_port
from gears_ddp.distributed.rank import Placement
from gears_ddp.runtime.devices import resolve_devices

LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class CheckedRun:
    """The checked options of a spawned run and the device of each of its ranks."""

    split: SplitConfig
    options: TrainingArgs
    devices: list[torch.device]


def checked_run(caller: str, split_config: dict, args: dict, n_gpus: int | None, gpu_ids) -> CheckedRun:
    """Check what ``caller`` (``train_multi_gpu``, ``train_replicates``) was given: that it
    is called under the main guard, the split and training options, and the devices."""
    check_main_guard(caller)
    split = SplitConfig.from_dict(split_config)
    options = TrainingArgs.from_dict(args)
    return CheckedRun(split, options, resolve_devices(n_gpus, gpu_ids, options.cpu_processes))


def shared_data(pert_data_path, dataset_name: str, split: SplitConfig, options: TrainingArgs):
    """The dataset with its split and graphs prepared, its tensors in shared memory, so that
    spawned workers receive it without a copy."""
    return prepare_data(pert_data_path, dataset_name, split.options, options.model_config,
                        **options.pert_data_options()).share_memory_()


def rendezvous_port() -> int:
    """The port a run's spawned ranks meet at: ``MASTER_PORT`` when set, else a free one."""
    return int(os.environ.get("MASTER_PORT") or find_free_port())


def local_placements(devices: list[torch.device], port: int, first_local_rank: int = 0,
                     local_world_size: int | None = None) -> list[Placement]:
    """The places of ranks spawned on this machine, one per device in rank order, meeting at
    ``port``. ``first_local_rank`` and ``local_world_size`` place them among other ranks
    sharing the machine's cores (several replicates at once)."""
    machine = len(devices) if local_world_size is None else local_world_size
    return [Placement(rank, len(devices), first_local_rank + rank, machine, device, LOCAL_HOST, port)
            for rank, device in enumerate(devices)]
