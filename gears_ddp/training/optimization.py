"""The optimiser and learning-rate schedule of the published GEARS (Adam, the rate halved
every epoch), and the linear warmup added here for large effective batches."""
from __future__ import annotations

import torch
from torch import nn


def make_optimizer(model: nn.Module, lr: float, weight_decay: float):
    """Adam and the per-epoch halving schedule of the reference. Adam runs fused (one kernel
    for all parameters instead of a Python loop of small operations; the same update)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def add_warmup(optimizer, warmup_steps: int, steps_done: int = 0) -> None:
    """Scale the learning rate linearly from ``1 / warmup_steps`` to 1 over the first
    ``warmup_steps`` optimiser steps, of which ``steps_done`` are behind (a resumed run).
    The scale is applied just before each step and undone just after, so the per-epoch
    schedule is unaffected."""
    if warmup_steps <= 0:
        return
    state = {"step": steps_done, "scheduled": None}

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
