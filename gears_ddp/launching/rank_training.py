"""One rank of a distributed run: join the process group, check that every rank holds the
same data, build this rank's loaders and model, and train as ``GEARS.train`` trains
(``GEARS.train_with``, the recipe with this rank's ``ProcessGroupRanks``).

``run_rank`` is what every rank runs, whoever started it: ``train_multi_gpu`` spawns one
per device (``spawned_rank``), torchrun and srun start them through ``gears-ddp train``
(``choose.launch``). Where it runs is its ``Placement``: its cluster environment's rank and
rendezvous address (``environments``) and its device.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from gears_ddp._logging import LIBRARY_LOGGER_NAME, get_logger
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.gears import GEARS
from gears_ddp.launching.environments import ClusterEnvironment
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.worker_messages import RunDiverged, RunInterrupted, RunReport
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.ranks import ProcessGroupRanks, SingleProcess
from gears_ddp.runtime.stopping import TrainingInterrupted
from gears_ddp.runtime.threads import cpu_threads
from gears_ddp.training.finite_loss import NonFiniteLoss
from gears_ddp.training.trainer import READ_FROM_OPTIONS

logger = get_logger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its rank among ``world_size``, its place among the
    ``local_world_size`` ranks of its machine (which share the machine's cores), its device
    and the rendezvous address."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    master_addr: str
    master_port: int


def place(environment: ClusterEnvironment, device: torch.device) -> Placement:
    """The rank ``environment`` describes, on ``device`` (the one function that places a rank)."""
    return Placement(
        environment.rank,
        environment.world_size,
        environment.local_rank,
        environment.local_world_size,
        torch.device(device),
        environment.master_addr,
        environment.master_port,
    )


IDENTITY_PARTS = {
    "expression": "the expression values",
    "cells": "the cells, their conditions and DE genes",
    "split": "the train / val / test conditions",
}


def data_identity(pert_data) -> dict[str, str]:
    """What this rank trains on, by content: a digest each of the expression values, the
    cells (``CellTable.identity``) and the split. Copies of the same dataset files, in any
    folder and with any file times, give the same identity; reading it costs no pass over
    the values (a map's record holds their digest)."""
    split = repr(sorted((name, list(conditions)) for name, conditions in pert_data.set2conditions.items()))
    return {**pert_data.cells.identity(), "split": hashlib.blake2b(split.encode(), digest_size=16).hexdigest()}


def check_same_data(pert_data, ranks: ProcessGroupRanks) -> None:
    """Stop every rank unless all hold the same data and split; the message names the ranks
    that differ, in what, and where each read its data."""
    where = f"{socket.gethostname()}:{Path(pert_data.dataset_path).resolve()}"
    identities = ranks.gather({**data_identity(pert_data), "where": where})
    differences, readers = [], {}
    for part, meaning in IDENTITY_PARTS.items():
        groups: dict[str, list[int]] = {}
        for rank, identity in enumerate(identities):
            groups.setdefault(identity[part], []).append(rank)
        if len(groups) > 1:
            differences.append(
                f"{part} ({meaning}): "
                + ", ".join(f"ranks {members} hold {digest[:8]}" for digest, members in groups.items())
            )
            readers.update({members[0]: identities[members[0]]["where"] for members in groups.values()})
    if differences:
        where = ", ".join(f"rank {rank} read {place}" for rank, place in sorted(readers.items()))
        raise RuntimeError(
            f"ranks do not hold the same data: {'; '.join(differences)} ({where}); every rank must "
            "load the same dataset files (a copy on each machine is fine) with the same split options"
        )


def progress_bars_without_semaphores() -> None:
    """Give tqdm a thread lock in this rank's process (call it where the process starts).

    tqdm's default lock holds a multiprocessing lock too: a named semaphore, which a rank
    killed from outside never unlinks, so when the run ends the resource tracker warns of a
    leaked semaphore after the run's real error. A rank draws its progress bars from one
    process, for which a thread lock is enough."""
    tqdm.set_lock(threading.RLock())


def spawned_rank(
    local_rank: int,
    placements: list[Placement],
    pert_data,
    args: TrainingArgs,
    messages,
    resume=READ_FROM_OPTIONS,
    spawned_at: float | None = None,
) -> None:
    """The ``torch.multiprocessing.spawn`` target: rank ``local_rank`` of ``placements``, with
    ``resume`` the checkpoint its parent read; ``spawned_at``, the parent's ``time.time()``
    when it started the ranks, makes the process's own start (the interpreter, its imports,
    the data it was handed) part of the rank's start-up. Stopping on a signal or at a
    non-finite loss (every rank stops together) is a clean exit: rank 0 tells the parent why
    (``RunInterrupted``, ``RunDiverged``)."""
    process_start = 0.0 if spawned_at is None else max(0.0, time.time() - spawned_at)
    progress_bars_without_semaphores()
    # the ranks receive the checkpoint's tensors in one shared memory: each trains on a copy of its own
    resume = copy.deepcopy(resume)
    try:
        run_rank(placements[local_rank], pert_data, args, messages, resume, process_start)
    except TrainingInterrupted as stop:
        if local_rank == 0:
            messages.put(RunInterrupted(str(stop), stop.signal_name, stop.checkpoint))
    except NonFiniteLoss as stop:
        if local_rank == 0:
            messages.put(RunDiverged(str(stop)))


def run_rank(
    placement: Placement,
    pert_data,
    args: TrainingArgs,
    messages=None,
    resume=READ_FROM_OPTIONS,
    process_start: float = 0.0,
) -> dict | None:
    """Train as one rank; returns the report on rank 0, None elsewhere.

    ``pert_data`` has its split prepared; ``args`` were checked, and the save folder, by
    whoever started the rank (``launchers``), which also read ``resume``, the checkpoint to
    continue from. With ``messages`` (a
    :class:`~gears_ddp.launching.worker_messages.WorkerMessages` from a spawning parent), this
    rank's log records go to the parent (rank 0's from the parent's level, the others'
    warnings and errors), rank 0 puts its ``RunReport`` there, and a rank that fails puts
    a ``WorkerFailed`` there first, so the parent can tell the first failure from the ranks
    that failed because a peer went away. ``process_start``: the seconds this process took
    to start before this call (a spawned rank's), counted in the phase ``rank start-up``.
    """
    rank, device = placement.rank, torch.device(placement.device)
    if messages is not None:
        messages.forward_logs(rank)
    elif rank != 0:  # only rank 0 reports progress
        library_logger = logging.getLogger(LIBRARY_LOGGER_NAME)
        library_logger.setLevel(max(logging.WARNING, library_logger.getEffectiveLevel()))
    clock = PhaseClock()
    clock.add("rank start-up", process_start)
    try:
        with clock.phase("rank start-up"):
            if device.type == "cpu":
                torch.set_num_threads(cpu_threads(placement.local_world_size, args.cpu_threads))
            setup_ddp(rank, placement.world_size, device, placement.master_addr, placement.master_port, args.timeout_s)
            ranks = ProcessGroupRanks()
            check_same_data(pert_data, ranks)
            if rank == 0:
                logger.info(
                    "%d rank(s); rank 0 on %s, one of %d rank(s) on its machine, with %d thread(s)",
                    placement.world_size,
                    device,
                    placement.local_world_size,
                    torch.get_num_threads(),
                )
        report = train_rank(pert_data, args, device, ranks, clock, resume)
    except (TrainingInterrupted, NonFiniteLoss):  # every rank stops there together: not a failure
        raise
    except BaseException:
        if messages is not None:
            messages.put_failure(rank)
        raise
    finally:
        cleanup_ddp()
    if rank == 0 and messages is not None:
        messages.put(RunReport(report))
    return report if rank == 0 else None


def train_rank(
    pert_data, args: TrainingArgs, device: torch.device, ranks: SingleProcess, clock: PhaseClock, resume
) -> dict:
    """This rank's loaders and model, as a single-process user builds them (the seed first,
    then the loaders, then the model; the phase ``rank start-up`` of ``clock``), from options
    checked before, and the training from ``resume``; ``ranks``: a process group's, or
    ``SINGLE_PROCESS`` for a run's one rank in the process that started it."""
    with clock.phase("rank start-up"):
        torch.manual_seed(args.seed)
        pert_data.use_loaders(
            args.batch_size,
            args.test_batch_size,
            ranks.world_size,
            ranks.rank,
            args.num_workers,
            pin_memory=device.type == "cuda",
            seed=args.seed,
            resample_controls=args.resample_controls,
        )
        gears = GEARS(pert_data, device=device)
        gears.build_model(args.model_options())
    return gears.train_with(args, ranks, clock, resume)
