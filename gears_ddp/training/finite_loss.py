"""Stopping training at a non-finite loss.

A loss that is NaN or infinite means the weights are no longer usable: every later step,
evaluation and checkpoint would carry them, and the "best" model could be a NaN one. The
recipe records each optimiser step's loss here on the device (no host synchronisation per
step) and checks on the host every few steps and before anything is evaluated or saved, on
every rank at the same steps: when any rank's loss was not finite, every rank raises
``NonFiniteLoss`` naming the first such step, so no checkpoint or model is written from
those weights and the last checkpoint stays the last good one.

With float16 and its gradient scaler, a non-finite loss is the scaler's business while
its scale is at least ``MIN_LOSS_SCALE``: the scaler skips that step (the weights stay as
they were) and lowers the scale. A loss that stays non-finite makes the scaler halve the
scale at every step; once it has fallen below ``MIN_LOSS_SCALE`` the cause is not the
scaling of float16 gradients, and the run stops as in full precision.
"""

from __future__ import annotations

import torch

MIN_LOSS_SCALE = 1.0


class NonFiniteLoss(RuntimeError):
    """Training stopped because a loss was NaN or infinite; the message names the epoch
    and step."""


class LossWatch:
    """The first optimiser step whose loss was not finite, kept on ``device``.

    ``scaler``: the float16 gradient scaler, if any (see the module docstring);
    ``steps_done``: the optimiser steps done before this watch started (a resumed run).
    """

    def __init__(self, device: torch.device, scaler: torch.amp.GradScaler | None = None, steps_done: int = 0):
        self.scaler = scaler
        self.steps = torch.full((), steps_done, dtype=torch.long, device=device)
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=device)

    def record(self, loss: torch.Tensor) -> None:
        """Count an optimiser step and remember it if its ``loss`` is not finite."""
        self.steps += 1
        bad = ~torch.isfinite(loss)
        scale = None if self.scaler is None else self.scaler._get_scale_async()
        if scale is not None:  # None without a scaler, or before its first scaled loss
            bad &= scale < MIN_LOSS_SCALE
        self.first_bad_step = torch.where(bad & (self.first_bad_step < 0), self.steps, self.first_bad_step)

    def check(self, ranks, position) -> None:
        """Raise ``NonFiniteLoss`` on every rank when any rank recorded a non-finite loss
        (a collective: every rank calls it at the same steps). ``position`` is the recipe's
        ``TrainingPosition``, to name the epoch and its step."""
        mine = int(self.first_bad_step.item())
        if not ranks.largest(int(mine >= 0)):
            return
        bad = {rank: step for rank, step in enumerate(ranks.gather(mine)) if step >= 0}
        first = min(bad.values())
        step_in_epoch = first - (position.global_step - position.step_in_epoch)
        raise NonFiniteLoss(
            f"the training loss is not finite (NaN or infinite) at optimiser step {step_in_epoch} of epoch "
            f"{position.epoch + 1} ({first} in all) on rank(s) {sorted(bad)}: training stopped, and nothing was "
            "saved from those weights (the last checkpoint, if any, is from before). Lower the learning rate (lr), "
            "or check the data for NaN or very large values"
        )
