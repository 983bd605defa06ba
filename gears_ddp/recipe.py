"""The GEARS training recipe: epochs, per-epoch evaluation, best-model choice, final test.

As in the published GEARS: Adam, ``StepLR(step_size=1, gamma=0.5)`` stepped every epoch,
gradient values clipped at 1.0; after every epoch the model is evaluated on train and val,
and the model with the lowest val ``mse_de`` is kept; the kept model is scored on test at
the end. ``run_training`` is used unchanged by ``GEARS.train`` (one process) and the
distributed workers (``reduce_state`` / ``no_sync`` / ``is_main`` given), so every rank
takes the same best-model decision from the same all-rank metrics.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from gears_ddp._logging import get_logger
from gears_ddp.engine import Precision, evaluate, train_epoch, unwrapped
from gears_ddp.host_memory import retained_host_memory
from gears_ddp.losses import LossContext
from gears_ddp.metrics import EvaluationAccumulator, compute_metrics

logger = get_logger(__name__)


@dataclass
class TrainingOutcome:
    """What training produced: the best model's state dict (on CPU), its epoch (0-based) and
    val ``mse_de``, and the per-epoch history. Also what a resumed run starts from."""

    best_state: dict | None = None
    best_epoch: int = -1
    best_value: float = math.inf
    history: list[dict] = field(default_factory=list)


def make_optimizer(model: nn.Module, lr: float, weight_decay: float):
    """Adam and the per-epoch halving schedule of the reference. Adam runs fused (one kernel
    for all parameters instead of a Python loop of small operations; the same update)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def add_warmup(optimizer, warmup_steps: int) -> None:
    """Scale the learning rate linearly from ``1 / warmup_steps`` to 1 over the first
    ``warmup_steps`` optimiser steps. The scale is applied just before each step and undone
    just after, so the per-epoch schedule is unaffected (a resumed run restarts the count)."""
    if warmup_steps <= 0:
        return
    state = {"step": 0, "scheduled": None}

    def before_step(opt, *_):
        if state["step"] < warmup_steps:
            state["scheduled"] = [group["lr"] for group in opt.param_groups]
            for group in opt.param_groups:
                group["lr"] *= (state["step"] + 1) / warmup_steps

    def after_step(opt, *_):
        if state["scheduled"] is not None:
            for group, lr in zip(opt.param_groups, state["scheduled"]):
                group["lr"] = lr
            state["scheduled"] = None
        state["step"] += 1

    optimizer.register_step_pre_hook(before_step)
    optimizer.register_step_post_hook(after_step)


def run_training(model: nn.Module, loaders: dict, epochs: int, optimizer, scheduler, context: LossContext,
                 accumulator_factory: Callable[[], EvaluationAccumulator], uncertainty: bool,
                 device: torch.device, precision: Precision = Precision(), accumulation_steps: int = 1,
                 no_sync=None, reduce_state=None, reduce_loss: Callable[[torch.Tensor, int], float] | None = None,
                 is_main: bool = True, start_epoch: int = 0, previous: TrainingOutcome | None = None,
                 on_epoch_end: Callable[[int, "TrainingOutcome"], None] | None = None,
                 before_evaluation: Callable[[], None] | None = None) -> TrainingOutcome:
    """Train epochs ``start_epoch`` .. ``epochs - 1``; returns the best model (lowest val mse_de).

    ``previous``: the outcome so far of a resumed run. ``reduce_loss(loss_sum, steps)`` turns
    this rank's summed loss into the mean over ranks (default: this process's mean).
    ``on_epoch_end(epoch, outcome)`` runs after each epoch (checkpoints);
    ``before_evaluation()`` before each evaluation (distributed: give every rank rank 0's
    BatchNorm running statistics, which DDP only does inside its own forward). Only
    ``is_main`` logs.
    """
    outcome = copy.deepcopy(previous) if previous is not None else TrainingOutcome()
    train_eval_loader = loaders.get("train_eval_loader", loaders["train_loader"])
    with retained_host_memory() if device.type == "cpu" else contextlib.nullcontext():
        for epoch in range(start_epoch, epochs):
            tick = time.perf_counter()
            loss_sum, steps = train_epoch(model, loaders["train_loader"], optimizer, context, uncertainty, device,
                                          epoch, precision, accumulation_steps, no_sync, show_progress=is_main)
            scheduler.step()
            train_loss = reduce_loss(loss_sum, steps) if reduce_loss else float(loss_sum) / max(steps, 1)
            if before_evaluation is not None:
                before_evaluation()
            train_metrics, _ = compute_metrics(evaluate(model, train_eval_loader, accumulator_factory(), uncertainty,
                                                        device, precision, reduce_state))
            val_metrics, _ = compute_metrics(evaluate(model, loaders["val_loader"], accumulator_factory(),
                                                      uncertainty, device, precision, reduce_state))
            record = {"epoch": epoch + 1, "train_loss": train_loss, "seconds": time.perf_counter() - tick,
                      **{f"train_{k}": v for k, v in train_metrics.items()},
                      **{f"val_{k}": v for k, v in val_metrics.items()}}
            outcome.history.append(record)
            if is_main:
                logger.info("epoch %d: train loss %.4f, train mse %.4f / mse_de %.4f, val mse %.4f / mse_de %.4f "
                            "(%.1f s)", epoch + 1, train_loss, train_metrics["mse"], train_metrics["mse_de"],
                            val_metrics["mse"], val_metrics["mse_de"], record["seconds"])
            if val_metrics["mse_de"] < outcome.best_value:
                outcome.best_value, outcome.best_epoch = val_metrics["mse_de"], epoch
                outcome.best_state = _cpu_state(unwrapped(model))
            if on_epoch_end is not None:
                on_epoch_end(epoch, outcome)
    if outcome.best_state is None:  # no epoch ran, or val mse_de was NaN: keep the current weights
        outcome.best_state = _cpu_state(unwrapped(model))
    return outcome


def _cpu_state(model: nn.Module) -> dict:
    """A copy of the model's state dict on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
