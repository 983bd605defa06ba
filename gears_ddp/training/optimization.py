"""The optimiser and learning-rate schedule of the published GEARS (Adam, the rate halved
every epoch), and the linear warmup added here for large effective batches."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def make_optimizer(model: nn.Module, lr: float, weight_decay: float):
    """Adam and the per-epoch halving schedule of the reference. Adam runs fused (one kernel
    for all parameters instead of a Python loop of small operations; the same update)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


class Warmup:
    """Linear learning-rate warmup: over the first ``steps`` optimiser steps, of which
    ``steps_done`` are behind (a resumed run), the learning rate is scaled from
    ``1 / steps`` to 1.

    ``scaled(optimizer)`` wraps one optimiser step: the scale is applied to the learning rates
    on entry and undone on exit, so the per-epoch schedule is unaffected. It wraps the whole
    step, not ``optimizer.step`` alone (as a hook would), so that a step replayed from a CUDA
    graph, which runs no Python, reads the scaled rate as an eager step does
    (``cuda_graphs.CapturedStep``)."""

    def __init__(self, steps: int, steps_done: int = 0):
        self.steps, self.done = steps, steps_done

    @contextlib.contextmanager
    def scaled(self, optimizer):
        scheduled = None
        if self.done < self.steps:
            scheduled = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] *= (self.done + 1) / self.steps
        try:
            yield
        finally:
            if scheduled is not None:
                for group, lr in zip(optimizer.param_groups, scheduled):
                    group["lr"] = lr
            self.done += 1
