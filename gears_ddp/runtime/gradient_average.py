"""The gradients of every rank averaged, in one flat buffer, by one all-reduce per optimiser step.

After each rank's backward passes, an optimiser step needs the mean of all ranks' gradients.
``DistributedDataParallel`` computes it with hooks inside the backward pass: bucket by bucket,
on the autograd thread, with host-side bookkeeping in its first iterations. None of that can
sit inside a CUDA graph (a capture with DDP's all-reduce in it was invalidated under
NCCL), and its ``no_sync`` context was the only way to accumulate micro-batches.

``FlatGradientAverage`` does the same arithmetic in three explicit phases, so that a step
replayed from CUDA graphs holds no collective (``training.cuda_graphs``):

- ``pack``: each gradient, times ``1 / world_size``, into its slice of one flat buffer (a
  gradient a rank's backward pass did not reach counts as zeros there);
- ``reduce``: one all-reduce (a sum) of the buffer, the only collective;
- ``unpack``: each slice back into its parameter's gradient.

DDP multiplies each gradient by ``1 / world_size`` into its bucket and sums the buckets over
ranks, so the result is the same, element by element; with two ranks the sum of two numbers
does not depend on the order, and the gradients are equal bit for bit
(``tests/test_gradient_average.py``). ``GradientAverage`` is the one-process case: every phase
does nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable, cast

import torch
from torch import nn


class GradientAverage:
    """One process: the gradients are already the mean; nothing crosses ranks."""

    crosses_ranks = False

    def pack(self) -> None:
        """Gradients into the buffer the collective reads (nothing to do here)."""

    def reduce(self) -> None:
        """The collective (none here)."""

    def unpack(self) -> None:
        """The averaged buffer back into the gradients (nothing to do here)."""

    def average(self) -> None:
        """``pack``, ``reduce`` and ``unpack``: every gradient becomes the mean over ranks."""
        self.pack()
        self.reduce()
        self.unpack()


NO_AVERAGE = GradientAverage()


class FlatGradientAverage(GradientAverage):
    """The mean over ``world_size`` ranks of the gradients of ``parameters`` (those that require
    one), through one flat buffer per dtype and ``all_reduce`` (a sum over ranks, in place).

    Every rank ends a step with a gradient for every such parameter, so all ranks take the
    same optimiser step. The buffers and their slices are made once and keep their addresses,
    as a replayed CUDA graph needs."""

    crosses_ranks = True

    def __init__(
        self, parameters: Iterable[nn.Parameter], world_size: int, all_reduce: Callable[[torch.Tensor], object]
    ):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.scale = 1.0 / world_size
        self.all_reduce = all_reduce
        by_dtype: dict[tuple, list[int]] = {}
        for index, parameter in enumerate(self.parameters):
            by_dtype.setdefault((parameter.dtype, parameter.device), []).append(index)
        self.buffers: list[torch.Tensor] = []
        self.members: list[list[int]] = []
        slices: list[torch.Tensor | None] = [None] * len(self.parameters)
        for (dtype, device), indices in by_dtype.items():
            buffer = torch.zeros(sum(self.parameters[i].numel() for i in indices), dtype=dtype, device=device)
            pieces = buffer.split([self.parameters[i].numel() for i in indices])
            for i, piece in zip(indices, pieces):
                slices[i] = piece.view_as(self.parameters[i])
            self.buffers.append(buffer)
            self.members.append(indices)
        self.slices = cast(list[torch.Tensor], slices)  # every parameter is in one group: none is left None

    def pack(self) -> None:
        for buffer, indices in zip(self.buffers, self.members):
            grads = []
            for i in indices:
                grad = self.parameters[i].grad
                if grad is None:  # not reached by this rank's backward pass
                    grad = self.parameters[i].grad = torch.zeros_like(self.parameters[i])
                grads.append(grad.reshape(-1))
            torch.cat(grads, out=buffer)
            buffer.mul_(self.scale)

    def reduce(self) -> None:
        for buffer in self.buffers:
            self.all_reduce(buffer)

    def unpack(self) -> None:
        grads = cast(list[torch.Tensor], [p.grad for p in self.parameters])  # pack gave each one a gradient
        torch._foreach_copy_(grads, self.slices)
