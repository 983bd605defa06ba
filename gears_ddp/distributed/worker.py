"""One process of a distributed run: joins the process group, checks that every rank holds
the same data, trains with ``DistributedDataParallel`` through the shared recipe, and (rank
0 only) writes checkpoints and the final model.

The single-process path is this path with one rank: the same ``GEARS`` model set-up, the
same ``recipe.run_training``, the same evaluation, with the cross-rank pieces plugged in
(``no_sync``, summed losses, gathered evaluation states, a barrier after each save).
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import os
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gears_ddp._logging import LIBRARY_LOGGER_NAME, get_logger
from gears_ddp.distributed.checkpoint import CHECKPOINT_FILE, load_training_checkpoint, \
    restore_rng_states, save_training_checkpoint
from gears_ddp.distributed.config import TrainingArgs
from gears_ddp.distributed.runtime import barrier, cleanup_ddp, setup_ddp
from gears_ddp.engine import Precision
from gears_ddp.gears import GEARS
from gears_ddp.metrics import merge_states
from gears_ddp.recipe import add_warmup, make_optimizer, run_training
from gears_ddp.weighted_norm import WeightedBatchNorm1d

logger = get_logger(__name__)


def data_fingerprint(pert_data) -> str:
    """A digest of the processed data and the split (expression, conditions, sets)."""
    digest = hashlib.blake2b(digest_size=16)
    cells = pert_data.cells
    digest.update(np.ascontiguousarray(cells.expression.numpy()).data)
    digest.update(cells.condition_codes.numpy().tobytes())
    digest.update(repr((cells.conditions, sorted((k, list(v)) for k, v in pert_data.set2conditions.items()))).encode())
    return digest.hexdigest()


def check_same_data(pert_data, world_size: int) -> None:
    """Stop every rank, naming the ranks that differ, unless all hold the same data and split."""
    fingerprints = [None] * world_size
    dist.all_gather_object(fingerprints, data_fingerprint(pert_data))
    if len(set(fingerprints)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, fingerprint in enumerate(fingerprints):
            groups.setdefault(fingerprint, []).append(rank)
        described = "; ".join(f"ranks {ranks} hold data {fp[:8]}" for fp, ranks in groups.items())
        raise RuntimeError(f"ranks do not hold the same processed data and split ({described}); every rank "
                           "must load the same dataset files with the same split options")


def parameter_digest(model: torch.nn.Module) -> str:
    """A digest of the model's parameters and buffers (equal on ranks holding equal weights)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).data)
    return digest.hexdigest()


# Buffers are not broadcast before every forward pass: the graphs are the same on every rank, and
# rank 0's BatchNorm running statistics are broadcast before each evaluation (broadcast_buffers).
# Newer torch names the option forward_sync_buffers (and deprecates broadcast_buffers).
NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                          else {"broadcast_buffers": False})


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Give every rank rank 0's checkpointed buffers (BatchNorm running statistics): each
    rank's training forward passes updated its own, and evaluation must use one set
    everywhere. The graphs' non-persistent buffers are the same on every rank already."""
    checkpointed = model.state_dict(keep_vars=True)
    for name, buffer in model.named_buffers():
        if name in checkpointed:
            dist.broadcast(buffer, src=0)


def gather_evaluation_state(state: dict) -> dict:
    """All ranks' evaluation accumulator states, merged (every rank gets the same)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, {part: {k: t.cpu() for k, t in values.items()} for part, values in state.items()})
    return merge_states(states)


def mean_loss_over_ranks(loss_sum: torch.Tensor, steps: int) -> float:
    """The mean step loss over all ranks' steps."""
    totals = torch.stack([loss_sum.detach().double().cpu(), torch.tensor(float(steps), dtype=torch.float64)])
    if dist.get_backend() == "nccl":
        totals = totals.to(loss_sum.device)
    dist.all_reduce(totals)
    return float(totals[0] / totals[1].clamp(min=1))


def train_ddp_worker(local_rank: int, world_size: int, pert_data, args: TrainingArgs, devices: list,
                     master_addr: str, master_port: int, results=None, rank_offset: int = 0) -> dict | None:
    """Train as rank ``rank_offset + local_rank`` of ``world_size`` on ``devices[local_rank]``.

    ``pert_data`` has its split prepared. Rank 0 puts ``("report", report)`` in ``results``
    (a :class:`~gears_ddp.distributed.messages.WorkerMessages`, when given) and returns the
    report; other ranks return None. A rank that fails puts ``("error", time, rank,
    traceback)`` there first, so the parent can tell the first failure from the ranks that
    failed because a peer went away.
    """
    rank = rank_offset + local_rank
    device = torch.device(devices[local_rank])
    if rank != 0:
        logging.getLogger(LIBRARY_LOGGER_NAME).setLevel(logging.WARNING)
    try:
        _share_cores(device, len(devices))
        setup_ddp(rank, world_size, device, master_addr, master_port, args.timeout_s)
        check_same_data(pert_data, world_size)
        report = _train(rank, world_size, device, pert_data, args)
    except BaseException:
        if results is not None:
            results.put(("error", time.time(), rank, traceback.format_exc()))
        raise
    finally:
        cleanup_ddp()
    if rank == 0 and results is not None:
        results.put(("report", report))
    return report if rank == 0 else None


def _share_cores(device: torch.device, local_processes: int) -> None:
    """On CPU, give each of the node's processes its share of the cores (torch's default is
    every core per process, which oversubscribes them), unless OMP_NUM_THREADS says otherwise."""
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_processes))


def _train(rank: int, world_size: int, device: torch.device, pert_data, args: TrainingArgs) -> dict:
    torch.manual_seed(args.seed)
    pert_data.get_dataloader_distributed(args.batch_size, args.test_batch_size, world_size, rank, args.num_workers,
                                         pin_memory=device.type == "cuda", seed=args.seed,
                                         resample_controls=args.resample_controls)
    wandb = args.wandb if rank == 0 and args.wandb else None
    gears = GEARS(pert_data, device=str(device), weight_bias_track=wandb is not None,
                  **({"proj_name": wandb.get("project", "GEARS"), "exp_name": wandb.get("name", "GEARS")}
                     if wandb else {}))
    gears.model_initialize(**args.model_config)
    if args.sync_batchnorm:
        for module in gears.model.modules():
            if isinstance(module, WeightedBatchNorm1d):
                module.synchronize = True
    precision = Precision.for_mode(args.amp, device)
    optimizer, scheduler = make_optimizer(gears.model, args.scaled_lr(world_size), args.weight_decay)
    add_warmup(optimizer, args.warmup_steps)
    start_epoch, previous = 0, None
    if args.resume_from:
        start_epoch, previous = _resume(args.resume_from, gears.model, optimizer, scheduler, precision, world_size)
    model = DistributedDataParallel(gears.model, device_ids=[device.index] if device.type == "cuda" else None,
                                    find_unused_parameters=args.find_unused_parameters, **NO_FORWARD_BUFFER_SYNC)
    save_path = Path(args.save_path)

    def checkpoint(epoch: int, outcome) -> None:
        if args.checkpoint_every and (epoch + 1) % args.checkpoint_every == 0:
            if rank == 0:
                save_training_checkpoint(save_path / CHECKPOINT_FILE, next_epoch=epoch + 1, model=gears.model,
                                         optimizer=optimizer, scheduler=scheduler, scaler=precision.scaler,
                                         outcome=outcome, args=args.as_dict(), world_size=world_size)
                logger.info("checkpoint after epoch %d written to %s", epoch + 1, save_path / CHECKPOINT_FILE)
            barrier()

    outcome = run_training(model, pert_data.dataloader, args.epochs, optimizer, scheduler, gears.loss_context(),
                           gears.new_accumulator, gears.config["uncertainty"], device, precision,
                           args.grad_accum_steps, no_sync=model.no_sync, reduce_state=gather_evaluation_state,
                           reduce_loss=mean_loss_over_ranks, is_main=rank == 0, start_epoch=start_epoch,
                           previous=previous, on_epoch_end=checkpoint,
                           before_evaluation=lambda: broadcast_buffers(gears.model))
    digests = [None] * world_size
    dist.all_gather_object(digests, parameter_digest(gears.model))  # the last epoch's weights, per rank
    gears.history = outcome.history
    gears.best_model = gears.model  # the network inside DDP; its weights become the best ones
    gears.best_model.load_state_dict(outcome.best_state)
    report = gears.test(reduce_state=gather_evaluation_state) if "test_loader" in pert_data.dataloader else {}
    if rank == 0:
        gears.save_model(save_path)
        logger.info("model (best epoch %d) saved to %s", outcome.best_epoch + 1, save_path)
    barrier()
    return {**report, "model_path": str(save_path), "best_epoch": outcome.best_epoch + 1,
            "history": outcome.history, "world_size": world_size, "parameter_digests": digests}


def _resume(path, model, optimizer, scheduler, precision: Precision, world_size: int):
    """Load a training checkpoint into the model, optimizer, scheduler and scaler; returns
    (next epoch, outcome so far)."""
    state = load_training_checkpoint(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if precision.scaler is not None and state["scaler"] is not None:
        precision.scaler.load_state_dict(state["scaler"])
    restore_rng_states(state["rng"])
    if state["world_size"] != world_size:
        logger.warning("resuming a run of %d ranks with %d: the data order differs from the original run",
                       state["world_size"], world_size)
    logger.info("resuming from %s at epoch %d", path, state["next_epoch"] + 1)
    return state["next_epoch"], state["outcome"]
