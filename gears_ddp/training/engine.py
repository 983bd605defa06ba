"""Training steps and one evaluation pass, as the recipe runs them.

What crosses ranks comes in through two objects (``gears_ddp.runtime``): a step's gradients
are made the mean over ranks by ``gradients`` (``SingleProcess.gradient_average``: one flat
all-reduce after the backward passes, whatever the number of micro-batches), and evaluation
accumulators are combined by ``SingleProcess.merge_evaluation``. With the defaults (``NO_AVERAGE``,
``SINGLE_PROCESS``) each of these does nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence, cast

import torch
from torch import nn
from tqdm import tqdm

from gears_ddp.data.cells import PertBatch
from gears_ddp.data.perturbation_sets import PerturbationSets
from gears_ddp.evaluation.metrics import EvaluationAccumulator, EvaluationResult
from gears_ddp.model.losses import LossContext, gears_loss
from gears_ddp.model.network import GEARSModel
from gears_ddp.runtime.gradient_average import NO_AVERAGE, GradientAverage
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.training.optimization import Warmup

GRAD_CLIP_VALUE = 1.0  # the reference clips gradient values at 1.0


def unwrapped(model: nn.Module) -> GEARSModel:
    """The network itself: ``torch.compile`` keeps what it compiled as ``._orig_mod``. The
    steps train a ``GEARSModel``, compiled or not."""
    return cast(GEARSModel, getattr(model, "_orig_mod", model))


@dataclass
class Precision:
    """Mixed precision of a step: ``dtype`` None (full precision), torch.float16 or torch.bfloat16;
    ``scaler`` a ``torch.amp.GradScaler`` for float16; ``cache_casts``: autocast keeps the
    half-precision copies of the weights for the rest of its block (off for a step captured in
    a CUDA graph, as capture requires)."""

    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    cache_casts: bool = True

    @classmethod
    def for_mode(cls, amp: str, device: torch.device) -> "Precision":
        """The precision of an ``amp`` option (one of ``training_options.AMP_MODES``, as ``TrainingOptions``
        checked it) on ``device``: bfloat16 autocast,
        float16 autocast with a gradient scaler (which scales the loss so that small float16
        gradients do not flush to zero, and skips a step whose gradients overflowed), or none."""
        if amp == "bf16":
            return cls(torch.bfloat16)
        if amp == "fp16":
            return cls(torch.float16, torch.amp.GradScaler(torch.device(device).type))
        return cls()

    def autocast(self, device: torch.device):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype, cache_enabled=self.cache_casts)


FULL_PRECISION = Precision()  # the default of the step functions: no autocast, no scaler


def batch_loss(model: nn.Module, batch: PertBatch, context: LossContext, uncertainty: bool) -> torch.Tensor:
    """Forward pass and GEARS loss of one batch (already on the model's device)."""
    out = model(batch.x, batch.pert_idx, batch.sets)
    if uncertainty:
        pred, logvar = out
        return gears_loss(pred.float(), batch.y, batch.condition, context, logvar.float())
    return gears_loss(out.float(), batch.y, batch.condition, context)


def training_step(
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
    """One optimiser step over ``micro_batches`` (one batch, or several accumulated):
    ``backward_passes``, the gradients averaged over ranks (``gradients.average()``), then
    ``apply_gradients``. Returns the mean loss, detached, on ``device`` (no host
    synchronisation). A step replayed from CUDA graphs runs the same three parts
    (``cuda_graphs.CapturedStep``)."""
    total = backward_passes(model, micro_batches, optimizer, context, uncertainty, device, precision)
    gradients.average()
    apply_gradients(model, optimizer, precision, clip_value)
    return total


def backward_passes(
    model: nn.Module,
    micro_batches: Sequence[PertBatch],
    optimizer: torch.optim.Optimizer,
    context: LossContext,
    uncertainty: bool,
    device: torch.device,
    precision: Precision = FULL_PRECISION,
) -> torch.Tensor:
    """The gradients of a step: each micro-batch's loss, divided by their number, backward,
    so that the gradient is the mean of the micro-batch gradients (scaled by the fp16
    scaler's factor). Returns the mean loss, detached, on ``device``."""
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for batch in micro_batches:
        with precision.autocast(device):
            loss = batch_loss(model, batch.to(device, non_blocking=True), context, uncertainty)
        scaled = loss / len(micro_batches)
        (precision.scaler.scale(scaled) if precision.scaler else scaled).backward()
        total += scaled.detach()
    return total


def apply_gradients(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision = FULL_PRECISION,
    clip_value: float | None = GRAD_CLIP_VALUE,
) -> None:
    """The optimiser step on the (averaged) gradients: unscaled (float16) before value
    clipping, then Adam, which the scaler skips when a gradient overflowed."""
    if precision.scaler:
        precision.scaler.unscale_(optimizer)
    if clip_value is not None:
        nn.utils.clip_grad_value_(model.parameters(), clip_value)
    if precision.scaler:
        precision.scaler.step(optimizer)
        precision.scaler.update()
    else:
        optimizer.step()


def optimizer_steps(
    model: nn.Module,
    batches: Iterable[PertBatch],
    optimizer: torch.optim.Optimizer,
    context: LossContext,
    uncertainty: bool,
    device: torch.device,
    precision: Precision = FULL_PRECISION,
    accumulation_steps: int = 1,
    gradients: GradientAverage = NO_AVERAGE,
    warmup: Warmup | None = None,
    step: Callable[..., torch.Tensor] = training_step,
) -> Iterator[torch.Tensor]:
    """Train on ``batches``, grouped ``accumulation_steps`` at a time into one optimiser step
    (a short last group still steps); yields each step's mean loss, a tensor on ``device``.
    ``warmup`` scales the learning rate of the steps it covers; ``step`` runs one optimiser
    step: ``training_step``, or the same step replayed from a CUDA graph
    (``cuda_graphs.CapturedStep``, which takes the same arguments).

    The caller sees every step boundary: it counts steps, writes checkpoints and stops there.
    """
    model.train()

    def one_step(micro_batches: list[PertBatch]) -> torch.Tensor:
        with warmup.scaled(optimizer) if warmup is not None else contextlib.nullcontext():
            return step(model, micro_batches, optimizer, context, uncertainty, device, precision, gradients)

    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == accumulation_steps:
            yield one_step(group)
            group = []
    if group:
        yield one_step(group)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader,
    accumulator: EvaluationAccumulator,
    uncertainty: bool,
    device: torch.device,
    precision: Precision = FULL_PRECISION,
    ranks: SingleProcess = SINGLE_PROCESS,
    rows_per_pass: int = 16384,
    progress: str | None = None,
) -> EvaluationResult:
    """Score every cell of ``loader`` with the model in evaluation mode; returns the
    per-condition result.

    In evaluation mode a cell's prediction is its control input plus the effect of its
    perturbation set, so the loop only sums inputs and truth per condition, and the network
    runs once per condition at the end: the result equals running it on every cell. A pass
    takes as many conditions as fit in ``rows_per_pass`` (condition, gene) rows, at least
    one, which bounds evaluation memory whatever the number of genes. Each rank scores its
    share of the cells; ``SingleProcess.merge_evaluation`` gives every rank the sums of all. The
    passes are then cut from the conditions of all ranks, as one process cuts them, and
    shared out among the ranks, so each condition's effect comes from the same pass
    whatever the number of ranks (a float32 product's rounding can depend on the other rows
    it runs with) and no rank computes another's.
    ``progress`` names a progress bar the main rank shows (on a terminal).
    """
    network = unwrapped(model)
    network.eval()
    n_conditions = len(accumulator.condition_names)
    perturbation_set = torch.full((n_conditions, 2), -1, dtype=torch.long, device=device)
    hidden = progress is None or not ranks.is_main
    for batch in tqdm(loader, desc=progress, leave=False, disable=True if hidden else None):
        batch = batch.to(device, non_blocking=True)
        accumulator.add_inputs(batch.condition, batch.x, batch.y)
        perturbation_set[batch.condition] = batch.pert_idx
    accumulator.load_state(ranks.merge_evaluation(accumulator.state()))
    perturbation_set = _sets_of_all_ranks(perturbation_set, accumulator.cell_counts(), ranks)
    effects = accumulator.empty_effects()
    network.renormalise_embeddings()  # as every pass does: ranks with no pass change their weights alike
    conditions_per_pass = max(1, rows_per_pass // network.num_genes)
    passes = torch.nonzero(accumulator.cell_counts() > 0).flatten().split(conditions_per_pass)
    for codes in passes[ranks.rank :: ranks.world_size]:
        with precision.autocast(device):
            effect, logvar = network.set_effects(PerturbationSets.each_once(perturbation_set[codes]))
        effects.add(codes, effect.float(), logvar.float() if uncertainty else None)
    accumulator.add_effects(ranks.merge_evaluation(effects.state()))
    return accumulator.result()


def _sets_of_all_ranks(
    perturbation_set: torch.Tensor, cells_of_all_ranks: torch.Tensor, ranks: SingleProcess
) -> torch.Tensor:
    """Each condition's perturbation set (C x 2, -1 padded) as the ranks that had its cells
    saw it: the rows of those ranks are equal, so their sum over ranks divided by how many
    ranks had cells is that row (-1 for a condition no rank had)."""
    if ranks.world_size == 1:
        return perturbation_set
    had_cells = (perturbation_set[:, :1] != -1) | (perturbation_set[:, 1:] != -1)
    merged = ranks.merge_evaluation({"sets": (perturbation_set + 1) * had_cells, "ranks": had_cells.long()})
    sets = merged["sets"] // merged["ranks"].clamp(min=1) - 1
    return torch.where(cells_of_all_ranks.unsqueeze(1) > 0, sets, -1)
