"""The ``torch.distributed`` process group of a run: joining it (``setup_ddp``), leaving it
(``cleanup_ddp``) and its backend. Only these two functions touch the process group; where
the ranks meet is the cluster environment's (``environments``).
"""

from __future__ import annotations

import gc
import time
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

# how often rank 0 says how many ranks have joined while it waits for the others
JOIN_NOTICE_EVERY_S = 30.0
# how often a rank looks whether all have joined
JOIN_POLL_S = 0.05


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
    set, else 12355 (``LocalEnvironment.rendezvous_port``). Publishes the address as torch's
    ``env://`` reads it (``environments.publish_rendezvous_address``, for code of the process
    that joins more groups), selects the CUDA device first (so NCCL binds to the right GPU),
    waits for every rank at the meeting store (``_wait_for_ranks``: rank 0 says how many have
    joined while it waits) and initialises NCCL for CUDA or gloo otherwise.
    ``timeout_s`` bounds both the rendezvous and later collectives: a rank that never joins
    becomes a clear RuntimeError, with how many did, rather than a silent hang.

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
        store = dist.PrefixStore(
            f"gears_ddp/attempt_{TorchrunEnvironment.restart_attempt()}",
            _meeting_store(master_addr, port, rank, world_size, timeout),
        )
        _wait_for_ranks(store, rank, world_size, f"{master_addr}:{port}", timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, TimeoutError, OSError) as error:
        reason = (
            str(error)
            if isinstance(error, TimeoutError)
            else f"some rank did not join (check that all {world_size} processes started and agree on the "
            f"master address and port) [{type(error).__name__}: {error}]"
        )
        raise RuntimeError(
            f"rank {rank} of world size {world_size} could not initialise the {backend} process "
            f"group at {master_addr}:{port} within the {timeout_s:g} s timeout: {reason}"
        ) from error


def _meeting_store(master_addr: str, port: int, rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The key-value store the ranks meet in, as ``dist.rendezvous('env://')`` makes it: under
    torchrun every rank is a client of the agent's store, which outlives a restart of the
    workers; otherwise rank 0 serves it. Unlike torch's, rank 0's store does not wait in its
    constructor for the others, so that the wait is ``_wait_for_ranks``'s, which says how
    many have joined."""
    serves = rank == 0 and not TorchrunEnvironment.agent_serves_the_store()
    return dist.TCPStore(
        master_addr, port, world_size, is_master=serves, timeout=timeout, wait_for_workers=False, multi_tenant=serves
    )


def _wait_for_ranks(store: dist.Store, rank: int, world_size: int, where: str, timeout_s: float) -> None:
    """Count this rank in at the meeting store and wait until all ``world_size`` ranks have.

    A launch that starts fewer processes than its world size (``mp.spawn`` with ``nprocs``
    below the ``world_size`` its workers are given) would otherwise wait the whole timeout
    without a word: rank 0 says every ``JOIN_NOTICE_EVERY_S`` seconds how many ranks have
    joined, and at the timeout every waiting rank raises a TimeoutError with that count.
    The last rank to count itself in sets a key the others look for every
    ``JOIN_POLL_S`` (``store.check``: a blocking ``store.wait`` that times out makes torch
    log socket warnings).
    """
    if store.add("joined", 1) >= world_size:
        store.set("all joined", "yes")
        return
    start = time.monotonic()
    next_notice = JOIN_NOTICE_EVERY_S
    while (waited := time.monotonic() - start) < timeout_s:
        if store.check(["all joined"]):
            return
        if rank == 0 and waited >= next_notice:
            logger.info(
                "waiting for the ranks to join at %s: %d of %d have after %.0f s (the timeout is %g s)",
                where,
                store.add("joined", 0),
                world_size,
                waited,
                timeout_s,
            )
            next_notice += JOIN_NOTICE_EVERY_S
        time.sleep(JOIN_POLL_S)
    raise TimeoutError(
        f"{store.add('joined', 0)} of the {world_size} ranks joined, the others did not: start as many "
        f"processes as the world size (mp.spawn's nprocs, torchrun's --nnodes x --nproc-per-node), or set "
        f"world_size to the number of processes started"
    )


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
