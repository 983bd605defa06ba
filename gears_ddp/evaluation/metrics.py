"""GEARS evaluation metrics from per-condition sums, with the published package's definitions.

The reference (``gears.inference``) keeps every cell's prediction and truth (cells x genes)
and loops over conditions and cells. Apart from the spread of the cells' truth at 20 DE
genes (for the in-range and sigma metrics), every one of its metrics depends only on each
condition's MEAN prediction and MEAN truth. So evaluation here keeps per-condition sums of
prediction, truth (and log-variance) in float64, plus cell counts, accumulated batch by
batch with ``index_add_`` (``EvaluationAccumulator``); they reduce across ranks by a sum,
so distributed evaluation gives the single-process result, and nothing is kept per cell.
The truth's spread depends on the data alone: ``MetricContext`` reads it from the dataset
(``truth_spread``). The metric functions then work on (conditions x genes) arrays with
row-wise, masked operations: ``compute_metrics``, ``deeper_analysis`` and
``non_dropout_analysis`` return the reference's keys and values (quirks included; each is
marked ``Reference quirk``), and ``subgroup_metrics`` averages them per test subgroup.

Where the reference raises (a condition without a DE ranking such as ``ctrl``, every DE
gene with zero spread, fewer than 20 DE genes), the functions here skip the condition,
give NaN, or use the genes that exist; these are the only intended differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from gears_ddp._logging import get_logger
from gears_ddp.data.cells import N_DE_GENES
from gears_ddp.data.conditions import CONTROL
from gears_ddp.data.grouped import condition_means
from gears_ddp.data.processing import RANK_KEY
from gears_ddp.evaluation.truth_spread import QUANTILE_BANDS, SPREAD_STATISTICS, Spread, condition_spreads
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess

logger = get_logger(__name__)

NON_DROPOUT_DE_KEY = "top_non_dropout_de_20"
NON_ZERO_GENES_KEY = "non_zeros_gene_idx"
NON_DROPOUT_GENES_KEY = "non_dropout_gene_idx"
TOP_DE_SIZES = (20, 50, 100, 200)
N_VARIABLE_GENES = 200
MIN_FOLD_CHANGE_EXPRESSION = 0.5  # genes with a lower mean truth have no fold change
FOLD_CHANGE_GAPS = {  # key -> which fold changes (> 0 after the reference's zeroing) it covers
    "fold_change_gap_all": lambda fc: fc > 0,
    "fold_change_gap_downreg_0.33": lambda fc: (fc > 0) & (fc < 0.333),  # Reference quirk: 0.333, not 1/3
    "fold_change_gap_downreg_0.1": lambda fc: (fc > 0) & (fc < 0.1),
    "fold_change_gap_upreg_3": lambda fc: fc > 3,
    "fold_change_gap_upreg_10": lambda fc: fc > 10,
}


# ---------------------------------------------------------------------------- tables
def _gene_positions(var_names: pd.Index, gene_ids) -> np.ndarray:
    """Positions of ``gene_ids`` in ``var_names``, in the given order."""
    positions = pd.Index(var_names).get_indexer(list(gene_ids))
    if (positions < 0).any():
        missing = [g for g, p in zip(gene_ids, positions) if p < 0][:10]
        raise ValueError(f"DE gene ids {missing} are not in adata.var_names; the uns entries do not match the data")
    return positions


def non_dropout_de_table(uns: Mapping, var_names: pd.Index, condition_names: Sequence[str]) -> torch.Tensor:
    """(conditions x 20) positions of each condition's ``uns['top_non_dropout_de_20']`` genes, in
    rank order, -1 padded (all -1 for conditions without an entry, such as control).

    Row ``code`` belongs to the condition whose ``condition_name`` is ``condition_names[code]``
    (``CellTable.condition_names``), so the table is indexed by condition codes like
    ``CellTable.condition_de_idx``.
    """
    top = uns.get(NON_DROPOUT_DE_KEY, {})
    table = torch.full((len(condition_names), N_DE_GENES), -1, dtype=torch.long)
    for code, name in enumerate(condition_names):
        genes = top.get(name)
        if genes is not None:
            positions = _gene_positions(var_names, list(genes)[:N_DE_GENES])
            table[code, : len(positions)] = torch.from_numpy(positions)
    return table


# ---------------------------------------------------------------------------- accumulation
@dataclass
class EvaluationResult:
    """Everything the metrics need, for the conditions that had cells (in condition-code order).

    ``de_idx`` (conditions x 20, -1 padded) are the DE gene positions of each condition in
    gene order (the reference's ``batch.de_idx``); ``non_dropout_de_idx`` those of
    ``uns['top_non_dropout_de_20']`` in rank order.
    """

    conditions: list[str]
    n_cells: np.ndarray  # (C,)
    pred_mean: np.ndarray  # (C, G) float64
    truth_mean: np.ndarray  # (C, G) float64
    logvar_mean: np.ndarray | None  # (C, G) float64, with uncertainty
    de_idx: np.ndarray  # (C, 20)
    non_dropout_de_idx: np.ndarray  # (C, 20)


class ConditionEffects:
    """Conditions' predicted effects (and log-variances), each times the condition's number
    of cells ``counts``, summed per condition: what a model in evaluation mode adds to the
    summed inputs (``EvaluationAccumulator.add_inputs``). Kept apart from the accumulator so
    that ranks can compute the effects of different conditions and add up their ``state()``."""

    def __init__(self, counts: torch.Tensor, n_genes: int, uncertainty: bool, dtype: torch.dtype):
        self.counts, self.uncertainty, self.dtype = counts, uncertainty, dtype
        names = ("pred", "logvar") if uncertainty else ("pred",)
        self._sums = {name: torch.zeros(len(counts), n_genes, dtype=dtype, device=counts.device) for name in names}

    def add(self, codes: torch.Tensor, effect: torch.Tensor, logvar: torch.Tensor | None = None) -> None:
        """``effect`` / ``logvar`` (K x G) of the conditions ``codes`` (K,), once per cell."""
        if (logvar is not None) != self.uncertainty:
            raise ValueError(
                f"this accumulator was built with uncertainty={self.uncertainty}; "
                f"logvar must be {'given' if self.uncertainty else 'None'}"
            )
        codes = codes.to(self.counts.device, torch.long)
        cells = self.counts[codes].to(self.dtype).unsqueeze(1)
        self._sums["pred"].index_add_(0, codes, cells * effect.detach().to(self.counts.device, self.dtype))
        if logvar is not None:
            self._sums["logvar"].index_add_(0, codes, cells * logvar.detach().to(self.counts.device, self.dtype))

    def state(self) -> dict[str, torch.Tensor]:
        """The sums, which add up across ranks."""
        return dict(self._sums)


class EvaluationAccumulator:
    """Per-condition sums of predictions and truth, fed batch by batch.

    ``add`` takes a batch's condition codes (B,), predictions and truth (B x G) and, with
    ``uncertainty``, the predicted log-variance. Sums are float64 on ``device`` (float32 on
    Apple silicon's MPS, which has no float64; pass the model's device to avoid copying B x G
    predictions to the host every batch).

    Distributed evaluation: each rank accumulates its cells, then the ranks add up the
    tensors of ``state()`` (``SingleProcess.merge_evaluation``; with ``torch.distributed``, an
    ``all_reduce`` of each) and ``load_state`` the sums.
    """

    def __init__(
        self,
        condition_names: Sequence[str],
        n_genes: int,
        de_idx_table: torch.Tensor,
        non_dropout_de_table: torch.Tensor,
        uncertainty: bool = False,
        device="cpu",
    ):
        self.condition_names = list(condition_names)
        self.n_genes = n_genes
        self.uncertainty = uncertainty
        self.device = torch.device(device)
        self.dtype = torch.float32 if self.device.type == "mps" else torch.float64  # MPS has no float64
        # the DE tables are read only by ``result``, on the host: they stay there
        self.tables = {
            "de": de_idx_table.to("cpu", torch.long).numpy(),
            "non_dropout_de": non_dropout_de_table.to("cpu", torch.long).numpy(),
        }
        n_conditions = len(self.condition_names)
        for name, table in self.tables.items():
            if table.shape != (n_conditions, N_DE_GENES):
                raise ValueError(
                    f"the {name} gene table has shape {tuple(table.shape)}, expected ({n_conditions}, {N_DE_GENES})"
                )
        sums = {
            "pred": torch.zeros(n_conditions, n_genes, dtype=self.dtype, device=self.device),
            "truth": torch.zeros(n_conditions, n_genes, dtype=self.dtype, device=self.device),
            "count": torch.zeros(n_conditions, dtype=torch.long, device=self.device),
        }
        if uncertainty:
            sums["logvar"] = torch.zeros(n_conditions, n_genes, dtype=self.dtype, device=self.device)
        self._sums = sums

    @classmethod
    def from_pert_data(cls, pert_data, uncertainty: bool = False, device="cpu") -> "EvaluationAccumulator":
        """An accumulator for the conditions, genes and DE tables of a loaded ``PertData``."""
        cells = pert_data.cells
        return cls(
            cells.conditions,
            cells.expression.shape[1],
            cells.condition_de_idx,
            non_dropout_de_table(pert_data.uns, pert_data.var.index, cells.condition_names),
            uncertainty,
            device,
        )

    def add(
        self, codes: torch.Tensor, pred: torch.Tensor, truth: torch.Tensor, logvar: torch.Tensor | None = None
    ) -> None:
        """Add a batch: condition codes (B,), predictions and truth (B x G), log-variance (B x G)."""
        if (logvar is not None) != self.uncertainty:
            raise ValueError(
                f"this accumulator was built with uncertainty={self.uncertainty}; "
                f"logvar must be {'given' if self.uncertainty else 'None'}"
            )
        codes = self._add_cells(codes, pred, truth)
        if logvar is not None:
            self._sums["logvar"].index_add_(0, codes, logvar.detach().to(self.device, self.dtype))

    def add_inputs(self, codes: torch.Tensor, inputs: torch.Tensor, truth: torch.Tensor) -> None:
        """Add a batch of cells whose prediction is ``input + effect(condition)`` (a model in
        evaluation mode): the inputs are summed now; the effects, summed in ``empty_effects()``
        once after the last batch, come in with ``add_effects``."""
        self._add_cells(codes, inputs, truth)

    def cell_counts(self) -> torch.Tensor:
        """The number of cells added so far, per condition."""
        return self._sums["count"]

    def empty_effects(self) -> "ConditionEffects":
        """Where to sum the effects that complete ``add_inputs`` (``ConditionEffects``): each
        condition's effect counts once for every cell of it added so far."""
        return ConditionEffects(self._sums["count"], self.n_genes, self.uncertainty, self.dtype)

    def add_effects(self, state: Mapping[str, torch.Tensor]) -> None:
        """Add the ``ConditionEffects.state()`` of this accumulator's cells (summed over the
        ranks that computed parts of it) to the prediction and log-variance sums."""
        for name, sums in state.items():
            self._sums[name] += sums.to(self.device)

    def _add_cells(self, codes: torch.Tensor, pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        """Count the cells, sum predictions and truth; returns the codes."""
        codes = codes.to(self.device, torch.long)
        self._sums["count"].index_add_(0, codes, torch.ones_like(codes))
        self._sums["pred"].index_add_(0, codes, pred.detach().to(self.device, self.dtype))
        self._sums["truth"].index_add_(0, codes, truth.detach().to(self.device, self.dtype))
        return codes

    def state(self) -> dict[str, torch.Tensor]:
        """Copies of the sums this accumulator holds (cell counts, prediction, truth and
        log-variance sums per condition), which add up across ranks."""
        return {name: t.clone() for name, t in self._sums.items()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Replace the sums with ``state`` (typically the sum of every rank's ``state()``)."""
        self._sums = {name: t.to(self.device) for name, t in state.items()}

    def result(self) -> EvaluationResult:
        """Means per condition that had cells, as numpy arrays. The sums come back to the host
        in one copy (on a GPU, one wait for the device)."""
        names = [name for name in ("pred", "truth", "logvar") if name in self._sums]
        counts = self._sums["count"].to(self.dtype).unsqueeze(1)  # exact: far fewer cells than 2**24
        together = torch.cat([counts] + [self._sums[name] for name in names], 1).cpu().numpy()
        present = np.flatnonzero(together[:, 0])
        n_cells = together[present, 0].astype(np.int64)
        mean = {
            name: together[present, 1 + i * self.n_genes : 1 + (i + 1) * self.n_genes] / n_cells[:, None]
            for i, name in enumerate(names)
        }
        return EvaluationResult(
            conditions=[self.condition_names[code] for code in present],
            n_cells=n_cells,
            pred_mean=mean["pred"],
            truth_mean=mean["truth"],
            logvar_mean=mean.get("logvar"),
            de_idx=self.tables["de"][present],
            non_dropout_de_idx=self.tables["non_dropout_de"][present],
        )


# ---------------------------------------------------------------------------- row-wise statistics
def _masked_mean(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Mean of each row over the entries of ``mask`` (all if None); NaN for an empty row."""
    if mask is None:
        return x.mean(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mask, x, 0.0).sum(1) / mask.sum(1)


def _masked_std(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Population standard deviation (``np.std``) of each row over ``mask``; NaN if empty."""
    return np.sqrt(_masked_mean((x - _masked_mean(x, mask)[:, None]) ** 2, mask))


def _mse_rows(x: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Mean squared error of each row pair over ``mask`` (sklearn's ``mean_squared_error``)."""
    return _masked_mean((x - y) ** 2, mask)


def _is_constant(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rows whose masked entries are all equal (scipy's constant-input case)."""
    return np.where(mask, x, -np.inf).max(1) == np.where(mask, x, np.inf).min(1)


def pearson_rows(x: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Pearson correlation of each row of ``x`` with the same row of ``y`` over ``mask`` (all
    entries if None), as ``scipy.stats.pearsonr``; where that is NaN (a constant input, NaN
    values, fewer than two entries) the value is 0, as the reference sets it."""
    mask = np.ones(x.shape, dtype=bool) if mask is None else mask
    with np.errstate(invalid="ignore", divide="ignore"):
        xc = np.where(mask, x - _masked_mean(x, mask)[:, None], 0.0)
        yc = np.where(mask, y - _masked_mean(y, mask)[:, None], 0.0)
        r = np.clip((xc * yc).sum(1) / np.sqrt((xc**2).sum(1) * (yc**2).sum(1)), -1.0, 1.0)
    undefined = np.isnan(r) | _is_constant(x, mask) | _is_constant(y, mask)
    return np.where(undefined, 0.0, r)


def _fraction(flags: np.ndarray, mask: np.ndarray, denominator=None) -> np.ndarray:
    """Per row, the number of masked entries where ``flags`` holds, over ``denominator``
    (default: the number of masked entries); NaN where that is 0 (the reference raises)."""
    denominator = mask.sum(1) if denominator is None else denominator
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (flags & mask).sum(1) / np.maximum(denominator, 1), np.nan)


def _direction_change(pred: np.ndarray, truth: np.ndarray, control: np.ndarray) -> np.ndarray:
    """|sign(pred - control) - sign(truth - control)|: 0 same direction, 2 opposite, 1 one is zero."""
    return np.abs(np.sign(pred - control) - np.sign(truth - control))


def _direction_fractions(change: np.ndarray, mask: np.ndarray, suffix: str) -> dict:
    """The reference's correct / opposite / 0-1 direction fractions over the masked genes."""
    return {
        f"frac_correct_direction_{suffix}": _fraction(change == 0, mask),
        f"frac_opposite_direction_{suffix}": _fraction(change == 2, mask),
        f"frac_0/1_direction_{suffix}": _fraction(change == 1, mask),
    }


def _gather(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``values[row, idx[row]]`` for a (rows x G) or (G,) array; NaN where ``idx`` is -1."""
    values = np.broadcast_to(values, (idx.shape[0], values.shape[-1]))
    return np.where(idx >= 0, np.take_along_axis(values, np.maximum(idx, 0), axis=1), np.nan)


def _index_mask(index_lists: Sequence[np.ndarray], n_genes: int) -> np.ndarray:
    """(rows x G) boolean mask with row i True at the positions ``index_lists[i]``."""
    mask = np.zeros((len(index_lists), n_genes), dtype=bool)
    if index_lists:
        rows = np.repeat(np.arange(len(index_lists)), [len(idx) for idx in index_lists])
        mask[rows, np.concatenate(index_lists).astype(np.int64)] = True
    return mask


def _padded(index_lists: Sequence[np.ndarray], width: int) -> np.ndarray:
    """(rows x width) table of the first ``width`` positions of each list, -1 padded."""
    table = np.full((len(index_lists), width), -1, dtype=np.int64)
    for row, idx in enumerate(index_lists):
        table[row, : min(len(idx), width)] = idx[:width]
    return table


def _stacked_spread(spreads: Mapping[str, dict], conditions: Sequence[str]) -> Spread:
    """``{statistic: (conditions x 20)}`` from per-condition spreads (``MetricContext.spreads``)."""
    missing = [c for c in conditions if c not in spreads]
    if missing:
        raise ValueError(
            f"the metric context has no truth spread for conditions {missing[:10]}: build it with "
            "MetricContext.from_pert_data(pert_data, conditions) for the evaluated conditions"
        )
    if not conditions:
        return {name: np.empty((0, N_DE_GENES)) for name in SPREAD_STATISTICS}
    return {name: np.stack([spreads[c][name] for c in conditions]) for name in SPREAD_STATISTICS}


def _spread_metrics(
    pred: np.ndarray, mean: np.ndarray, spread: dict, valid: np.ndarray, suffix: str
) -> tuple[dict, np.ndarray]:
    """The reference's in-range and sigma metrics of the mean prediction against the per-cell
    truth spread at 20 DE genes, and the mask of DE genes they cover: those not 0 in every cell.
    The metrics exist only for conditions where that mask is not empty.

    ``pred`` / ``mean`` / ``spread`` columns must be aligned (the same gene per column).
    """
    nonzero = valid & ~((spread["min"] == 0) & (spread["max"] == 0))
    metrics = {f"frac_in_range{suffix}": _fraction((pred >= spread["min"]) & (pred <= spread["max"]), nonzero)}
    for name, (low, high) in QUANTILE_BANDS.items():
        metrics[f"frac_in_range_{name}{suffix}"] = _fraction((pred >= spread[low]) & (pred <= spread[high]), nonzero)
    spread_out = spread["std"] > 0  # NaN (padding) compares False
    with np.errstate(invalid="ignore", divide="ignore"):
        sigma = np.abs(pred - mean) / spread["std"]
    metrics[f"mean_sigma{suffix}"] = _masked_mean(sigma, spread_out)
    metrics[f"std_sigma{suffix}"] = _masked_std(sigma, spread_out)
    for limit in (1, 2):
        metrics[f"frac_sigma_below_{limit}{suffix}"] = 1 - _fraction(sigma > limit, spread_out)
    return metrics, nonzero


def _fold_change_gaps(pred: np.ndarray, truth: np.ndarray, control: np.ndarray) -> dict:
    """Mean |pred/ctrl - truth/ctrl| over the genes of each fold-change band of the truth,
    as ``(values, present)``: a band's key exists only for conditions with genes in it.

    Reference quirk: fold changes that are NaN or infinite, or whose mean truth is below
    0.5, are set to 0 and so belong to no band.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        fold = truth / control
        gap = np.abs(pred / control - truth / control)
    fold[~np.isfinite(fold) | (truth < MIN_FOLD_CHANGE_EXPRESSION)] = 0
    out = {}
    for key, band in FOLD_CHANGE_GAPS.items():
        members = band(fold)
        out[key] = (_masked_mean(gap, members), members.any(1))
    return out


def _per_condition(conditions: Sequence[str], columns: Mapping[str, tuple]) -> dict[str, dict]:
    """``{condition: {key: value}}`` from ``key -> (values, present)`` columns; a key is left out
    of a condition's dict where ``present`` is False (``present`` None: always there)."""
    return {
        condition: {
            key: float(values[row]) for key, (values, present) in columns.items() if present is None or present[row]
        }
        for row, condition in enumerate(conditions)
    }


# ---------------------------------------------------------------------------- metrics
def compute_metrics(result: EvaluationResult) -> tuple[dict, dict]:
    """The reference's ``compute_metrics``: per condition ``mse`` / ``pearson`` of the mean
    prediction against the mean truth over all genes, ``mse_de`` / ``pearson_de`` over the
    condition's 20 DE genes; overall values are means over conditions.

    Reference quirks kept: control's DE metrics are 0 and left out of the ``_de`` means; an
    undefined Pearson correlation counts as 0.
    """
    pred, truth = result.pred_mean, result.truth_mean
    return condition_metrics(
        result.conditions, pred, truth, _gather(pred, result.de_idx), _gather(truth, result.de_idx), result.de_idx >= 0
    )


def condition_metrics(
    conditions: Sequence[str],
    pred: np.ndarray,
    truth: np.ndarray,
    pred_de: np.ndarray,
    truth_de: np.ndarray,
    valid: np.ndarray | None = None,
) -> tuple[dict, dict]:
    """``compute_metrics`` from each condition's mean prediction and truth (conditions x G)
    and their values at its DE genes (conditions x 20; ``valid`` marks the genes that
    exist, None: all): what the published ``compute_metrics`` computes from per-cell
    ``pred_de`` / ``truth_de``, whose means these are."""
    valid = np.ones(pred_de.shape, dtype=bool) if valid is None else valid
    control = np.array([c == CONTROL for c in conditions], dtype=bool)
    columns = {
        "mse": _mse_rows(pred, truth),
        "pearson": pearson_rows(pred, truth),
        "mse_de": np.where(control, 0.0, _mse_rows(pred_de, truth_de, valid)),
        "pearson_de": np.where(control, 0.0, pearson_rows(pred_de, truth_de, valid)),
    }
    metrics_pert = _per_condition(conditions, {k: (v, None) for k, v in columns.items()})
    metrics = {}
    for name in ("mse", "pearson"):
        metrics[name] = _mean_or_nan(columns[name])
        metrics[f"{name}_de"] = _mean_or_nan(columns[f"{name}_de"][~control])
    return metrics, metrics_pert


def _mean_or_nan(values: np.ndarray) -> float:
    """Mean of ``values``; NaN, without numpy's empty-slice warning, when there are none."""
    return float(values.mean()) if len(values) else float("nan")


@dataclass
class MetricContext:
    """What the deeper analyses need from the dataset, computed once from the loaded data.

    ``control_mean``: mean expression of ALL control cells of the dataset (not only the
    evaluated ones) and ``most_variable_genes``: the 200 genes with the largest std of the
    mean expression across all conditions, both as the reference computes them.
    ``ranked_de``: per condition, positions of its top-200 ranked DE genes in rank order;
    ``non_zero_genes`` / ``non_dropout_genes``: the ``uns`` gene index sets. ``spreads``:
    ``{"de" | "non_dropout_de": {condition: truth_spread.spread}}``, the spread of the
    condition's cells at its DE genes in gene order (``EvaluationResult.de_idx``) and at its
    top non-dropout DE genes (``non_dropout_de_idx``).
    """

    n_genes: int
    control_mean: np.ndarray
    most_variable_genes: np.ndarray
    ranked_de: dict[str, np.ndarray]
    non_zero_genes: dict[str, np.ndarray]
    non_dropout_genes: dict[str, np.ndarray]
    spreads: dict[str, dict[str, dict]]

    @classmethod
    def from_pert_data(
        cls, pert_data, conditions: Sequence[str] | None = None, ranks: SingleProcess = SINGLE_PROCESS
    ) -> "MetricContext":
        """Build from a loaded ``PertData`` (DE ranking and gene sets in its ``uns``); the
        per-condition means are summed over the cell table a block of cells at a time. The
        truth spreads are read for ``conditions`` (the evaluated ones; None: every condition
        the analyses cover), a share on each of ``ranks``."""
        uns, cells = pert_data.uns, pert_data.cells
        check_analysis_entries(uns)
        means = condition_means(cells.expression, cells.condition_codes.numpy(), len(cells.conditions))
        names = dict(zip(cells.conditions, cells.condition_names))
        if conditions is None:
            conditions = [c for c, n in names.items() if n in uns[RANK_KEY] or n in uns[NON_DROPOUT_GENES_KEY]]
        tables = {
            "de": cells.condition_de_idx,
            "non_dropout_de": non_dropout_de_table(uns, pert_data.var.index, cells.condition_names),
        }
        return cls.from_tables(
            uns, pert_data.var.index, names, means, condition_spreads(cells, conditions, tables, ranks)
        )

    @classmethod
    def from_tables(
        cls,
        uns: Mapping,
        var_names: pd.Index,
        condition_names: Mapping[str, str],
        means: np.ndarray,
        spreads: dict[str, dict[str, dict]],
        most_variable_genes=None,
    ) -> "MetricContext":
        """Build from the dataset's ``uns`` gene sets, its ``var_names``, each condition's
        ``condition_name`` (in the order of the rows of ``means``, the conditions' mean
        expression, ``'ctrl'`` among them) and the truth ``spreads``; ``most_variable_genes``
        (positions) replaces the 200 genes whose means vary most across the conditions, as
        the published ``deeper_analysis`` lets it."""
        check_analysis_entries(uns)
        conditions = list(condition_names)
        if CONTROL not in conditions:
            raise ValueError("the dataset has no control cells; the analyses compare with control")
        ranked = uns[RANK_KEY]
        if most_variable_genes is None:
            most_variable_genes = np.argsort(np.std(means, axis=0))[-N_VARIABLE_GENES:]
        return cls(
            n_genes=len(var_names),
            control_mean=means[conditions.index(CONTROL)],
            most_variable_genes=np.asarray(most_variable_genes, dtype=np.int64),
            ranked_de={
                c: _gene_positions(var_names, list(ranked[n])[: max(TOP_DE_SIZES)])
                for c, n in condition_names.items()
                if n in ranked
            },
            non_zero_genes={
                c: np.asarray(uns[NON_ZERO_GENES_KEY][n], dtype=np.int64)
                for c, n in condition_names.items()
                if n in uns[NON_ZERO_GENES_KEY]
            },
            non_dropout_genes={
                c: np.asarray(uns[NON_DROPOUT_GENES_KEY][n], dtype=np.int64)
                for c, n in condition_names.items()
                if n in uns[NON_DROPOUT_GENES_KEY]
            },
            spreads=spreads,
        )


def check_analysis_entries(uns: Mapping) -> None:
    """An error naming the ``uns`` entries the deeper analyses need and the data lacks."""
    missing = [k for k in (RANK_KEY, NON_ZERO_GENES_KEY, NON_DROPOUT_GENES_KEY) if k not in uns]
    if missing:
        raise ValueError(
            f"the dataset's uns lacks {missing}: the deeper analyses need DE genes "
            "(process the data without skip_calc_de)"
        )


def _analysed_rows(result: EvaluationResult, available: Mapping, what: str) -> np.ndarray:
    """Rows of ``result`` whose condition has ``what`` in ``adata.uns`` (others are logged and
    skipped: the reference raises ``KeyError`` for them, e.g. for control)."""
    rows = np.array([i for i, c in enumerate(result.conditions) if c in available], dtype=np.int64)
    skipped = [c for c in result.conditions if c not in available]
    if skipped:
        logger.warning("no %s for conditions %s; they are left out of the analysis", what, skipped)
    return rows


def deeper_analysis(context: MetricContext, result: EvaluationResult) -> dict[str, dict]:
    """The reference's ``deeper_analysis``: direction, in-range, sigma, delta-correlation,
    fold-change, top-200 HVG and top 20/50/100/200 DE metrics per condition.

    Reference quirks kept: ``frac_correct_direction_{k}`` divides by k even when fewer genes
    exist; ``frac_correct_direction_20_nonzero`` compares the mean prediction / truth at the
    DE genes in GENE order (as ``truth_de`` is stored) with the control at the DE genes in
    RANK order; ``mse_top{k}_de`` is computed on deltas from control while ``mse_top200_hvg``
    is not; ``pearson_delta_de`` equals ``pearson_delta_top20_de``.
    """
    rows = _analysed_rows(result, context.ranked_de, "DE gene ranking")
    conditions = [result.conditions[i] for i in rows]
    pred, truth, control = result.pred_mean[rows], result.truth_mean[rows], context.control_mean
    pred_delta, truth_delta = pred - control, truth - control
    ranked = [context.ranked_de[c] for c in conditions]
    top = {k: _index_mask([r[:k] for r in ranked], context.n_genes) for k in TOP_DE_SIZES}
    same_direction = _direction_change(pred, truth, control) == 0
    everywhere = np.ones(pred.shape, dtype=bool)

    fractions = {"frac_correct_direction_all": _fraction(same_direction, everywhere)}
    for k in TOP_DE_SIZES:
        fractions[f"frac_correct_direction_{k}"] = _fraction(same_direction, top[k], denominator=k)

    de_idx = result.de_idx[rows]
    pred_de, truth_de = _gather(pred, de_idx), _gather(truth, de_idx)
    spread = _stacked_spread(context.spreads["de"], conditions)
    spread_columns, nonzero = _spread_metrics(pred_de, truth_de, spread, de_idx >= 0, "")
    # Reference quirk: gene-order columns compared with the control at the rank-order DE genes.
    control_rank_order = _gather(control, _padded(ranked, N_DE_GENES))
    spread_columns = {
        "frac_correct_direction_20_nonzero": _fraction(
            _direction_change(pred_de, truth_de, control_rank_order) == 0, nonzero
        ),
        **spread_columns,
    }
    # each column's values, and the conditions it is defined for (None: all)
    columns: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        key: (values, None) for key, values in fractions.items()
    }
    columns.update({key: (values, nonzero.any(1)) for key, values in spread_columns.items()})

    delta_pearson_top = {k: pearson_rows(pred_delta, truth_delta, top[k]) for k in TOP_DE_SIZES}
    columns["pearson_delta"] = (pearson_rows(pred_delta, truth_delta), None)
    columns["pearson_delta_de"] = (delta_pearson_top[20], None)
    columns.update(_fold_change_gaps(pred, truth, control))
    hvg = np.zeros(pred.shape, dtype=bool)
    hvg[:, context.most_variable_genes] = True
    columns["pearson_delta_top200_hvg"] = (pearson_rows(pred_delta, truth_delta, hvg), None)
    columns["pearson_top200_hvg"] = (pearson_rows(pred, truth, hvg), None)
    columns["mse_top200_hvg"] = (_mse_rows(pred, truth, hvg), None)
    for k in (20, 200, 100, 50):  # the reference's order
        columns[f"pearson_delta_top{k}_de"] = (delta_pearson_top[k], None)
        columns[f"pearson_top{k}_de"] = (pearson_rows(pred, truth, top[k]), None)
        columns[f"mse_top{k}_de"] = (_mse_rows(pred_delta, truth_delta, top[k]), None)
    return _per_condition(conditions, columns)


def non_dropout_analysis(context: MetricContext, result: EvaluationResult) -> dict[str, dict]:
    """The reference's ``non_dropout_analysis``: direction fractions over the top-20
    non-dropout DE genes and the non-zero / non-dropout gene sets, in-range and sigma metrics
    of the per-cell truth at the top-20 non-dropout DE genes, and their delta Pearson,
    Pearson and delta MSE."""
    rows = _analysed_rows(result, context.non_dropout_genes, "non-dropout genes")
    conditions = [result.conditions[i] for i in rows]
    pred, truth, control = result.pred_mean[rows], result.truth_mean[rows], context.control_mean
    de_idx = result.non_dropout_de_idx[rows]
    valid = de_idx >= 0
    pred_de, truth_de, control_de = _gather(pred, de_idx), _gather(truth, de_idx), _gather(control, de_idx)
    change = _direction_change(pred, truth, control)

    columns = _direction_fractions(_direction_change(pred_de, truth_de, control_de), valid, "top20_non_dropout")
    columns.update(
        _direction_fractions(
            change, _index_mask([context.non_zero_genes[c] for c in conditions], context.n_genes), "non_zero"
        )
    )
    columns.update(
        _direction_fractions(
            change, _index_mask([context.non_dropout_genes[c] for c in conditions], context.n_genes), "non_dropout"
        )
    )
    columns = {key: (values, None) for key, values in columns.items()}
    spread = _stacked_spread(context.spreads["non_dropout_de"], conditions)
    spread_columns, nonzero = _spread_metrics(pred_de, truth_de, spread, valid, "_non_dropout")
    columns.update({key: (values, nonzero.any(1)) for key, values in spread_columns.items()})
    columns["pearson_delta_top20_de_non_dropout"] = (
        pearson_rows(pred_de - control_de, truth_de - control_de, valid),
        None,
    )
    columns["pearson_top20_de_non_dropout"] = (pearson_rows(pred_de, truth_de, valid), None)
    columns["mse_top20_de_non_dropout"] = (_mse_rows(pred_de - control_de, truth_de - control_de, valid), None)
    return _per_condition(conditions, columns)


def subgroup_metrics(
    metrics_pert: Mapping[str, Mapping[str, float]],
    subgroup_conditions: Mapping[str, Sequence[str]],
    prefix: str = "test_",
) -> dict[str, float]:
    """Mean of each metric over the conditions of each subgroup that have it, keyed
    ``{prefix}{subgroup}_{metric}`` as the reference logs them; subgroups with no evaluated
    condition are left out (the reference logs NaN for them)."""
    out = {}
    for name, conditions in subgroup_conditions.items():
        members = [metrics_pert[c] for c in conditions if c in metrics_pert]
        for metric in dict.fromkeys(key for m in members for key in m):
            out[f"{prefix}{name}_{metric}"] = float(np.mean([m[metric] for m in members if metric in m]))
    return out
