"""One rank of a distributed run: join the process group, check that every rank holds the
same data, build this rank's loaders and model, and run the training recipe
(``recipe.TrainingRecipe``, the code ``GEARS.train`` runs with one rank).

``train_ddp_worker`` is what every rank runs, whoever started it: ``train_multi_gpu``
spawns one per device (``spawned_worker``), torchrun and srun start them through
``python -m gears_ddp.launch``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gears_ddp._logging import LIBRARY_LOGGER_NAME, get_logger
from gears_ddp.distributed.config import TrainingArgs
from gears_ddp.distributed.runtime import cleanup_ddp, setup_ddp
from gears_ddp.gears import GEARS
from gears_ddp.runtime.ranks import ProcessGroupRanks
from gears_ddp.training.recipe import TrainingRecipe
from gears_ddp.runtime.stopping import TrainingInterrupted
from gears_ddp.runtime.threads import cpu_threads

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


def data_fingerprint(pert_data) -> str:
    """A digest of the processed data and the split (expression, conditions, sets). A mapped
    expression is identified by what its map was built from (the h5ad's size and time, the
    cells, the dtype), which every rank reads without reading the values."""
    digest = hashlib.blake2b(digest_size=16)
    cells = pert_data.cells
    if cells.mapped_from is not None:
        record = json.loads(Path(cells.mapped_from).with_suffix(".json").read_text())
        digest.update(json.dumps(record, sort_keys=True).encode())
    else:
        digest.update(np.ascontiguousarray(cells.expression.numpy()).data)
    digest.update(cells.condition_codes.numpy().tobytes())
    digest.update(repr((cells.conditions, sorted((k, list(v)) for k, v in pert_data.set2conditions.items()))).encode())
    return digest.hexdigest()


def check_same_data(pert_data, ranks: ProcessGroupRanks) -> None:
    """Stop every rank, naming the ranks that differ, unless all hold the same data and split."""
    fingerprints = ranks.gather(data_fingerprint(pert_data))
    if len(set(fingerprints)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, fingerprint in enumerate(fingerprints):
            groups.setdefault(fingerprint, []).append(rank)
        described = "; ".join(f"ranks {members} hold data {fp[:8]}" for fp, members in groups.items())
        raise RuntimeError(f"ranks do not hold the same processed data and split ({described}); every rank "
                           "must load the same dataset files with the same split options")


def spawned_worker(local_rank: int, placements: list[Placement], pert_data, args: TrainingArgs,
                   messages) -> None:
    """The ``torch.multiprocessing.spawn`` target: rank ``local_rank`` of ``placements``. A
    stop on a signal is a clean exit: rank 0 tells the parent with ``("interrupted",
    message, signal name, checkpoint)``."""
    try:
        train_ddp_worker(placements[local_rank], pert_data, args, messages)
    except TrainingInterrupted as stop:
        if local_rank == 0:
            messages.put(("interrupted", str(stop), stop.signal_name, stop.checkpoint))


def train_ddp_worker(placement: Placement, pert_data, args: TrainingArgs, messages=None) -> dict | None:
    """Train as one rank; returns the report on rank 0, None elsewhere.

    ``pert_data`` has its split prepared. With ``messages`` (a
    :class:`~gears_ddp.distributed.messages.WorkerMessages` from a spawning parent), this
    rank's log records go to the parent (rank 0's from the parent's level, the others'
    warnings and errors), rank 0 puts ``("report", report)`` there, and a rank that fails
    puts ``("error", time, rank, traceback)`` there first, so the parent can tell the first
    failure from the ranks that failed because a peer went away.
    """
    rank, device = placement.rank, torch.device(placement.device)
    if messages is not None:
        messages.forward_logs(rank)
    elif rank != 0:  # only rank 0 reports progress
        library_logger = logging.getLogger(LIBRARY_LOGGER_NAME)
        library_logger.setLevel(max(logging.WARNING, library_logger.getEffectiveLevel()))
    try:
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads(placement.local_world_size))
        setup_ddp(rank, placement.world_size, device, placement.master_addr, placement.master_port, args.timeout_s)
        ranks = ProcessGroupRanks(args.find_unused_parameters)
        check_same_data(pert_data, ranks)
        if rank == 0:
            logger.info("%d rank(s); rank 0 on %s, one of %d rank(s) on its machine, with %d thread(s)",
                        placement.world_size, device, placement.local_world_size, torch.get_num_threads())
        report = train_rank(pert_data, args, device, ranks)
    except TrainingInterrupted:
        raise
    except BaseException:
        if messages is not None:
            messages.put(("error", time.time(), rank, traceback.format_exc()))
        raise
    finally:
        cleanup_ddp()
    if rank == 0 and messages is not None:
        messages.put(("report", report))
    return report if rank == 0 else None


def train_rank(pert_data, args: TrainingArgs, device: torch.device, ranks: ProcessGroupRanks) -> dict:
    """This rank's loaders and model, as a single-process user builds them (the seed first,
    then the loaders, then the model), and the training recipe on them."""
    torch.manual_seed(args.seed)
    pert_data.get_dataloader_distributed(args.batch_size, args.test_batch_size, ranks.world_size, ranks.rank,
                                         args.num_workers, pin_memory=device.type == "cuda", seed=args.seed,
                                         resample_controls=args.resample_controls)
    gears = GEARS(pert_data, device=str(device))
    gears.model_initialize(**args.model_config)
    return TrainingRecipe(gears, args, ranks).run()
