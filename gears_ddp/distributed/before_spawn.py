"""What a run of spawned workers prepares before any process starts (``train_multi_gpu``,
``train_replicates``; their options and devices are checked before, once, by
``run_config.RunOptions``): the data, loaded and prepared once in the parent and shared
with the workers, the port they meet at, and each worker's place.
"""

from __future__ import annotations

import os

import torch

from gears_ddp.data.preparation import prepare_data
from gears_ddp.distributed.config import SplitConfig, TrainingArgs
from gears_ddp.distributed.process_group import find_free_port
from gears_ddp.distributed.rank import Placement

LOCAL_HOST = "127.0.0.1"


def shared_data(pert_data_path, dataset_name: str, split: SplitConfig, options: TrainingArgs):
    """The dataset with its split and graphs prepared, its tensors in shared memory, so that
    spawned workers receive it without a copy."""
    return prepare_data(
        pert_data_path, dataset_name, split.options, options.model_config, **options.pert_data_options()
    ).share_memory_()


def rendezvous_port() -> int:
    """The port a run's spawned ranks meet at: ``MASTER_PORT`` when set, else a free one."""
    return int(os.environ.get("MASTER_PORT") or find_free_port())


def local_placements(
    devices: list[torch.device], port: int, first_local_rank: int = 0, local_world_size: int | None = None
) -> list[Placement]:
    """The places of ranks spawned on this machine, one per device in rank order, meeting at
    ``port``. ``first_local_rank`` and ``local_world_size`` place them among other ranks
    sharing the machine's cores (several replicates at once)."""
    machine = len(devices) if local_world_size is None else local_world_size
    return [
        Placement(rank, len(devices), first_local_rank + rank, machine, device, LOCAL_HOST, port)
        for rank, device in enumerate(devices)
    ]
