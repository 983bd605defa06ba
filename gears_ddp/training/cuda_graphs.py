"""An optimiser step replayed from a CUDA graph: the whole step in one launch.

A GEARS training step at batch 32 is about 440 small operators. Launched one by one, each
costs the host tens of microseconds, so the GPU waits for the host whatever the work: a
step took 12.5 ms on an H200 at 299 genes and at 5,000 alike. ``CapturedStep`` records
``engine.training_step`` itself (forward, loss, backward, gradient clipping, the gradients'
all-reduce across ranks by ``DistributedDataParallel``, the fp16 gradient scaler and fused
Adam) once in a CUDA graph, and replays the graph for every later step: one launch a step,
plus the copies of the batch into the graph's input tensors and the learning rate.

What capture needs, and where it is met:

- The same shapes every step: the loaders pad each batch's perturbation sets to a fixed
  number (``epoch_perturbation_sets(pad_to=...)``) and drop the short last batch; a step of other
  shapes (the short last group of ``grad_accum_steps``) runs eagerly.
- No host synchronisation inside the step (``tests/test_device_work.py`` counts them).
- The same memory every replay: the batch is copied into static tensors on the device
  (``StaticBatches``), and the learning rate, which the schedule and the warmup change, is a
  device tensor the graph reads (Adam's tensor learning rate, filled before each replay).
  Adam runs with ``capturable=True`` while capturing; autocast without its cast cache.
- Warm-up before capture: the first steps (3; 11 with ``DistributedDataParallel``, as its
  documentation asks) run eagerly on a side stream, where the optimiser's state, cuBLAS's
  workspaces and DDP's buckets are made. They are ordinary training steps, so no batch is
  trained twice or skipped; the step captured is then replayed for its own batch. DDP itself
  is built on that side stream (``side_stream``).

The replayed step runs the kernels of the eager step in the same order, so it computes the
same function; one difference: Adam reads a tensor learning rate in float32 where an eager
step's float is a double, so graphed and eager runs differ by that rounding (about 5e-8 of
each update) unless the rate is a float32 value. If capture fails (an operation the graph
cannot hold), the run says why and continues eagerly.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Sequence

import torch
from torch import nn

from gears_ddp._logging import get_logger
from gears_ddp.data.cells import PertBatch
from gears_ddp.model.losses import LossContext
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.training.engine import GRAD_CLIP_VALUE, Precision, training_step

logger = get_logger(__name__)

WARMUP_STEPS = 3
WARMUP_STEPS_DISTRIBUTED = 11  # DistributedDataParallel's eager iterations before a capture (PyTorch's CUDA notes)


def use_cuda_graphs(cuda_graphs: bool, compile: bool, device: torch.device) -> bool:
    """Whether training steps replay a CUDA graph: asked for (the default), on a CUDA device,
    and not ``torch.compile``d (which has graphs of its own)."""
    return cuda_graphs and not compile and device.type == "cuda"


class StaticBatches:
    """The device tensors a captured step reads: one ``PertBatch`` per micro-batch, whose
    tensors keep their addresses; ``load`` copies a step's batches into them."""

    def __init__(self, micro_batches: Sequence[PertBatch], device: torch.device):
        self.batches = [batch.to(device, copy=True) for batch in micro_batches]
        self.shapes = [_shape(batch) for batch in self.batches]  # fixed: the tensors never change shape

    def fits(self, micro_batches: Sequence[PertBatch]) -> bool:
        """Whether ``micro_batches`` have the shapes of these tensors."""
        return [_shape(batch) for batch in micro_batches] == self.shapes

    def load(self, micro_batches: Sequence[PertBatch]) -> None:
        """Copy ``micro_batches`` (on the host, pinned, or on the device) into the tensors."""
        for static, batch in zip(self.batches, micro_batches):
            for name in PertBatch._TENSORS:
                getattr(static, name).copy_(getattr(batch, name), non_blocking=True)
            static.sets.packed.copy_(batch.sets.packed, non_blocking=True)


def _shape(batch: PertBatch) -> tuple:
    """What a captured graph fixes of a batch: its tensors' shapes and its sets' host integers."""
    sets = batch.sets
    set_integers = None if sets is None else (sets.n_sets, sets.n_columns, sets.n_cells, sets.n_unperturbed,
                                              sets.unperturbed_cells, sets.padded, tuple(sets.packed.shape))
    return tuple(tuple(getattr(batch, name).shape) for name in PertBatch._TENSORS) + (set_integers,)


class CudaGraph:
    """``torch.cuda.CUDAGraph``: ``capture(step)`` records what ``step()`` launches and returns
    its output (a tensor the replays overwrite); ``replay()`` launches it again."""

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        # thread_local: other threads (the loaders' pinning, NCCL's watchdog) may use CUDA meanwhile
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            return step()

    def replay(self) -> None:
        self.graph.replay()


class CapturedStep:
    """``engine.training_step``, eager for the first ``warmup_steps`` steps, then captured once
    and replayed (see the module docstring). Called as ``training_step`` is called.

    Steps of ``micro_batches`` padded batches (``grad_accum_steps``) are captured and
    replayed; any other step (the short last group of an epoch) runs eagerly.
    ``graph_factory`` makes the graph (``CudaGraph``); a test can give one that replays by
    running the step again, to check on a CPU what surrounds the graph.
    """

    def __init__(self, device: torch.device, warmup_steps: int = WARMUP_STEPS, micro_batches: int = 1,
                 graph_factory: Callable[[], CudaGraph] = CudaGraph):
        self.device, self.warmup_steps, self.graph_factory = device, warmup_steps, graph_factory
        self.micro_batches = micro_batches
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.steps_done = 0
        self.graph = None
        self.failed = False
        self._static: StaticBatches | None = None
        self._loss: torch.Tensor | None = None
        self._learning_rates: list[torch.Tensor] = []

    @classmethod
    def for_ranks(cls, device: torch.device, ranks: SingleProcess, micro_batches: int = 1) -> "CapturedStep":
        """The step for ``ranks``, whose optimiser steps take ``micro_batches`` batches each."""
        return cls(device, WARMUP_STEPS_DISTRIBUTED if ranks.world_size > 1 else WARMUP_STEPS, micro_batches)

    @property
    def replaying(self) -> bool:
        """Whether steps now replay the captured graph."""
        return self.graph is not None

    def side_stream(self) -> contextlib.AbstractContextManager:
        """The stream the eager warm-up steps run on (and DistributedDataParallel is built on)."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def __call__(self, model: nn.Module, micro_batches: Sequence[PertBatch], optimizer: torch.optim.Optimizer,
                 context: LossContext, uncertainty: bool, device: torch.device, precision: Precision = Precision(),
                 ranks: SingleProcess = SINGLE_PROCESS, clip_value: float | None = GRAD_CLIP_VALUE) -> torch.Tensor:
        def step(batches: Sequence[PertBatch], step_precision: Precision = precision) -> torch.Tensor:
            return training_step(model, batches, optimizer, context, uncertainty, device, step_precision, ranks,
                                 clip_value)

        padded = all(batch.sets is not None and batch.sets.padded for batch in micro_batches)
        whole = len(micro_batches) == self.micro_batches
        if self.failed or not padded or not whole or (self._static is not None and not self._static.fits(micro_batches)):
            return step(micro_batches)
        self.steps_done += 1
        if self.steps_done <= self.warmup_steps:
            return self._on_side_stream(lambda: self._with_learning_rates(
                optimizer, lambda: step(micro_batches, _without_cast_cache(precision)), fill=True))
        if self.graph is None:
            self._static = StaticBatches(micro_batches, device)
            try:
                self._capture(optimizer, lambda: step(self._static.batches, _without_cast_cache(precision)))
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the eager step, which works
                self.failed, self.graph, self._static = True, None, None
                if precision.scaler is not None:  # a step cut short left the scaler's per-step record half done
                    precision.scaler._per_optimizer_states.clear()
                logger.warning("training steps could not be captured in a CUDA graph (%s: %s); they run eagerly "
                               "(cuda_graphs=False skips the attempt)", type(err).__name__, err)
                return step(micro_batches)
            logger.info("training steps replay a CUDA graph from optimiser step %d on", self.steps_done)
        else:
            self._static.load(micro_batches)
        for rate, group in zip(self._learning_rates, optimizer.param_groups):
            rate.fill_(group["lr"])
        self.graph.replay()
        return self._loss.clone()

    def _capture(self, optimizer: torch.optim.Optimizer, step: Callable[[], torch.Tensor]) -> None:
        """Capture ``step`` (on the static batches), reading the learning rates from device tensors."""
        graph = self.graph_factory()
        self._loss = graph.capture(lambda: self._with_learning_rates(optimizer, step, fill=False))
        self.graph = graph

    def _with_learning_rates(self, optimizer: torch.optim.Optimizer, step: Callable[[], torch.Tensor],
                             fill: bool) -> torch.Tensor:
        """``step()`` with each parameter group's learning rate a device tensor (filled from the
        group's float when ``fill``) and Adam capturable; the floats and flags back after."""
        groups = optimizer.param_groups
        if not self._learning_rates:
            self._learning_rates = [torch.zeros((), dtype=torch.float32, device=self.device) for _ in groups]
        saved = [(group["lr"], group.get("capturable", False)) for group in groups]
        if fill:
            for rate, group in zip(self._learning_rates, groups):
                rate.fill_(group["lr"])
        try:
            for rate, group in zip(self._learning_rates, groups):
                group["lr"], group["capturable"] = rate, True
            return step()
        finally:
            for group, (lr, capturable) in zip(groups, saved):
                group["lr"], group["capturable"] = lr, capturable

    def _on_side_stream(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``step()`` on the side stream, ordered after and before the current stream's work."""
        if self.stream is None:
            return step()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            loss = step()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return loss


def _without_cast_cache(precision: Precision) -> Precision:
    return dataclasses.replace(precision, cache_casts=False) if precision.cache_casts else precision
