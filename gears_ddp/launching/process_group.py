"""The ``torch.distributed`` process group of a run: joining it (``setup_ddp``), leaving it
(``cleanup_ddp``) and its backend. Only these two functions touch the process group; where
the ranks meet is the cluster environment's (``environments``).
"""

from __future__ import annotations

import gc
from datetime import timedelta

import torch
import torch.distributed as dist

from gears_ddp._logging import get_logger
from gears_ddp.launching.environments import (
    DEFAULT_RENDEZVOUS_PORT,
    LocalEnvironment,
    TorchrunEnvironment,
    publish_rendezvous_address,
)
from gears_ddp.runtime.devices import launched_rank_device

logger = get_logger(__name__)


def backend_for(device: torch.device) -> str:
    """The collective backend for a device: NCCL for CUDA, gloo for everything else."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def setup_ddp(
    rank: int,
    world_size: int,
    device: torch.device | str | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout_s: float = 600.0,
) -> None:
    """Join the default process group as ``rank`` of ``world_size`` on ``device``.

    ``setup_ddp(rank, world_size)`` does what the seed guide's does: GPU ``rank`` with NCCL
    (the CPU with gloo on a machine without a GPU), the launcher's rendezvous port if one is
    set, else 12355 (``LocalEnvironment.rendezvous_port``). Publishes the address for the
    ``env://`` rendezvous (``environments.publish_rendezvous_address``), selects the CUDA
    device first (so NCCL binds to the right GPU) and initialises NCCL for CUDA or gloo
    otherwise.
    ``timeout_s`` bounds both the rendezvous and later collectives: a rank that never joins
    becomes a clear RuntimeError rather than a silent hang.

    Under torchrun the ranks meet in the agent's store, which outlives a restart of the
    workers; the keys of each attempt (``TorchrunEnvironment.restart_attempt``) get a prefix
    of their own, so restarted ranks never read the addresses the previous attempt left there.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size={world_size})")
    if dist.is_initialized():
        raise RuntimeError(f"rank {rank}: a process group is already initialised; call cleanup_ddp() first")
    device = launched_rank_device(rank) if device is None else torch.device(device)
    port = LocalEnvironment.rendezvous_port(master_port, default=DEFAULT_RENDEZVOUS_PORT)
    publish_rendezvous_address(master_addr, port)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = backend_for(device)
    logger.debug(
        "rank %d/%d joining %s process group at %s:%d on %s",
        rank,
        world_size,
        backend,
        master_addr,
        port,
        device,
    )
    timeout = timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        attempt = TorchrunEnvironment.restart_attempt()
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"gears_ddp/attempt_{attempt}", store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
    except (RuntimeError, TimeoutError, OSError) as error:
        raise RuntimeError(
            f"rank {rank} of world size {world_size} could not initialise the {backend} process "
            f"group at {master_addr}:{port} within the {timeout_s:g} s timeout: some rank did not "
            f"join (check that all {world_size} processes started and agree on the master "
            f"address and port) [{type(error).__name__}: {error}]"
        ) from error


def cleanup_ddp() -> None:
    """Destroy the default process group if there is one (safe to call more than once).

    Unreachable objects are collected first, while Python still runs: a DDP model, which
    lives in reference cycles, is otherwise collected during interpreter shutdown, where
    releasing its collectives can make a gloo thread wait for the interpreter lock that
    shutdown has given up, and the process aborts after its work is done.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
