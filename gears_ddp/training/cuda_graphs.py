"""An optimiser step replayed from CUDA graphs: the whole step in one launch (three with several ranks).

A GEARS training step is a few hundred small operators; launched one by one, the GPU waits
for the host whatever the work. ``CapturedStep`` records the parts of
``engine.training_step`` (forward, loss, backward, the gradients' average across ranks,
gradient clipping, the fp16 gradient scaler and fused Adam) once in CUDA graphs, after a
few eager warm-up steps, and replays them for every later step: one launch a step in one
process, plus the copies of the batch into the graphs' static input tensors and the
learning rate. No collective is captured: with several ranks the step is two graphs around
one eagerly launched all-reduce of the flat gradient buffer. A step of other shapes runs
eagerly; so does every step if capture fails, and the run says why.

docs/performance.md ("How a step is captured in CUDA graphs") says what capture needs and
where it is met, and how a replayed step differs from an eager one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch
from torch import nn

from gears_ddp._logging import get_logger
from gears_ddp.data.cells import PertBatch
from gears_ddp.model.losses import LossContext
from gears_ddp.runtime.gradient_average import NO_AVERAGE, GradientAverage
from gears_ddp.training.engine import (
    FULL_PRECISION,
    GRAD_CLIP_VALUE,
    Precision,
    apply_gradients,
    backward_passes,
    training_step,
)

logger = get_logger(__name__)

WARMUP_STEPS = 3


def use_cuda_graphs(cuda_graphs: bool, device: torch.device, collective_in_forward: bool = False) -> bool:
    """Whether training steps replay CUDA graphs: asked for (the default), on a CUDA device,
    and no collective inside the forward pass (``sync_batchnorm`` with several ranks). A
    ``torch.compile``d network is captured too: inductor's fused kernels, launched from the
    graph (compiled during the eager warm-up steps)."""
    return cuda_graphs and device.type == "cuda" and not collective_in_forward


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
            assert static.sets is not None and batch.sets is not None  # captured batches are padded: they have sets
            static.sets.packed.copy_(batch.sets.packed, non_blocking=True)


def _shape(batch: PertBatch) -> tuple:
    """What a captured graph fixes of a batch: its tensors' shapes and its sets' host integers."""
    sets = batch.sets
    set_integers = (
        None
        if sets is None
        else (
            sets.n_sets,
            sets.n_columns,
            sets.n_cells,
            sets.n_unperturbed,
            sets.unperturbed_cells,
            sets.padded,
            tuple(sets.packed.shape),
        )
    )
    return tuple(tuple(getattr(batch, name).shape) for name in PertBatch._TENSORS) + (set_integers,)


class CudaGraph:
    """``torch.cuda.CUDAGraph``: ``capture(step)`` records what ``step()`` launches and returns
    its output (tensors the replays overwrite); ``replay()`` launches it again. A graph
    captured with ``shares_pool_with`` another takes its memory from that graph's pool (the
    graphs replay in the order they were captured, as PyTorch's ``make_graphed_callables``
    arranges them)."""

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, step: Callable[[], object], shares_pool_with: "CudaGraph | None" = None):
        pool = shares_pool_with.graph.pool() if shares_pool_with is not None else None
        # thread_local: other threads (the loaders' pinning, NCCL's watchdog) may use CUDA meanwhile
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            return step()

    def replay(self) -> None:
        self.graph.replay()


class CapturedStep:
    """``engine.training_step``, eager for the first ``warmup_steps`` steps, then captured once
    and replayed (see the module docstring). Called as ``training_step`` is called.

    Steps of ``micro_batches`` padded batches (``grad_accum_steps``) are captured and
    replayed; any other step (the short last group of an epoch) runs eagerly.
    ``graph_factory`` makes a graph (``CudaGraph``); a test can give one that replays by
    running the step again, to check on a CPU what surrounds the graphs.
    """

    def __init__(
        self,
        device: torch.device,
        warmup_steps: int = WARMUP_STEPS,
        micro_batches: int = 1,
        graph_factory: Callable[[], CudaGraph] = CudaGraph,
    ):
        self.device, self.warmup_steps, self.graph_factory = device, warmup_steps, graph_factory
        self.micro_batches = micro_batches
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.steps_done = 0
        self.graphs: list[CudaGraph] = []
        self.failed = False
        self._static: StaticBatches | None = None
        self._loss: torch.Tensor | None = None
        self._learning_rates: list[torch.Tensor] = []

    @property
    def replaying(self) -> bool:
        """Whether steps now replay the captured graphs."""
        return bool(self.graphs)

    def __call__(
        self,
        model: nn.Module,
        micro_batches: Sequence[PertBatch],
        optimizer: torch.optim.Optimizer,
        context: LossContext,
        uncertainty: bool,
        device: torch.device,
        precision: Precision = FULL_PRECISION,
        gradients: GradientAverage = NO_AVERAGE,
        clip_value: float | None = GRAD_CLIP_VALUE,
    ) -> torch.Tensor:
        def step(batches: Sequence[PertBatch], step_precision: Precision = precision) -> torch.Tensor:
            return training_step(
                model, batches, optimizer, context, uncertainty, device, step_precision, gradients, clip_value
            )

        padded = all(batch.sets is not None and batch.sets.padded for batch in micro_batches)
        whole = len(micro_batches) == self.micro_batches
        if (
            self.failed
            or not padded
            or not whole
            or (self._static is not None and not self._static.fits(micro_batches))
        ):
            return step(micro_batches)
        self.steps_done += 1
        if self.steps_done <= self.warmup_steps:
            return self._on_side_stream(
                lambda: self._with_learning_rates(
                    optimizer, lambda: step(micro_batches, _without_cast_cache(precision)), fill=True
                )
            )
        if not self.graphs:
            static = self._static = StaticBatches(micro_batches, device)
            captured = _without_cast_cache(precision)

            def gradients_of_step() -> torch.Tensor:
                loss = backward_passes(model, static.batches, optimizer, context, uncertainty, device, captured)
                gradients.pack()
                return loss

            def update() -> None:
                gradients.unpack()
                apply_gradients(model, optimizer, captured, clip_value)

            try:
                self._capture(optimizer, gradients_of_step, update, gradients.crosses_ranks)
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the eager step, which works
                self.failed, self.graphs, self._static = True, [], None
                if precision.scaler is not None:  # a step cut short left the scaler's per-step record half done
                    precision.scaler._per_optimizer_states.clear()
                logger.warning(
                    "training steps could not be captured in a CUDA graph (%s: %s); they run eagerly "
                    "(cuda_graphs=False skips the attempt)",
                    type(err).__name__,
                    err,
                )
                return step(micro_batches)
            logger.info(
                "training steps replay %s from optimiser step %d on",
                "two CUDA graphs around one all-reduce of the gradients" if len(self.graphs) == 2 else "a CUDA graph",
                self.steps_done,
            )
        else:
            assert self._static is not None  # made with the graphs
            self._static.load(micro_batches)
        for rate, group in zip(self._learning_rates, optimizer.param_groups):
            rate.fill_(group["lr"])
        self.graphs[0].replay()
        if len(self.graphs) == 2:
            gradients.reduce()  # the step's one collective, between the graphs
            self.graphs[1].replay()
        assert self._loss is not None  # the captured step's loss, made with the graphs
        return self._loss.clone()

    def _capture(
        self,
        optimizer: torch.optim.Optimizer,
        gradients_of_step: Callable[[], torch.Tensor],
        update: Callable[[], None],
        collective_between: bool,
    ) -> None:
        """Capture the step (on the static batches), reading the learning rates from device
        tensors: one graph, or, with a collective between its parts, one graph for each."""

        def whole() -> torch.Tensor:
            loss = gradients_of_step()
            update()
            return loss

        def capture_all() -> None:
            first = self.graph_factory()
            if not collective_between:
                self._loss = first.capture(whole)
                self.graphs = [first]
                return
            self._loss = first.capture(gradients_of_step)
            second = self.graph_factory()
            second.capture(update, shares_pool_with=first)
            self.graphs = [first, second]

        self._with_learning_rates(optimizer, capture_all, fill=False)

    def _with_learning_rates(self, optimizer: torch.optim.Optimizer, step: Callable[[], object], fill: bool):
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
