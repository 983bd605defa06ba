"""Per-cell results as the published package keeps them, reduced to this package's
per-condition inputs, so that the published functions which read them are computed by
``metrics``.

The published ``gears.inference.evaluate`` returns a dict of per-cell arrays: ``pert_cat``
(each cell's condition), ``pred`` and ``truth`` (cells x genes), ``pred_de`` and
``truth_de`` (cells x 20: the values at the condition's DE genes) and, in uncertainty mode,
``logvar``; its ``compute_metrics``, ``deeper_analysis`` and ``non_dropout_analysis`` read
that dict (the last two with the dataset's AnnData). Each of their metrics depends on a
condition's mean prediction and mean truth, apart from the in-range and sigma metrics,
which read the spread of the cells' truth at 20 DE genes: the dict is reduced here to
exactly those (``CellResults``), and ``metrics`` gives the published values from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd
import torch

from gears_ddp.data.cells import N_DE_GENES
from gears_ddp.data.conditions import coded_conditions
from gears_ddp.data.grouped import condition_means
from gears_ddp.data.processing import top_de_positions
from gears_ddp.evaluation.metrics import EvaluationResult, MetricContext, condition_metrics, non_dropout_de_table
from gears_ddp.evaluation.truth_spread import gene_values, spread

CELL_KEYS = ("pert_cat", "pred", "truth", "pred_de", "truth_de")  # evaluate's keys; 'logvar' with uncertainty
CELL_RESULTS_HINT = "the dict gears_ddp.inference.evaluate(loader, model, uncertainty, device) returns"


@dataclass
class CellResults:
    """Per-cell results (``CELL_KEYS``) grouped by condition: ``conditions`` in sorted order
    (as the published functions visit them), ``codes`` each cell's position among them."""

    arrays: dict[str, np.ndarray]
    conditions: list[str]
    codes: np.ndarray

    @classmethod
    def of(cls, test_res) -> "CellResults":
        """Checked: a mapping holding every key of ``CELL_KEYS``, as many cells in each, two
        dimensions for the expression arrays; else an error naming the key."""
        if not isinstance(test_res, Mapping):
            raise TypeError(f"test_res must be {CELL_RESULTS_HINT}, got a {type(test_res).__name__}")
        missing = [key for key in CELL_KEYS if key not in test_res]
        if missing:
            raise ValueError(f"test_res lacks {missing}: it must be {CELL_RESULTS_HINT}")
        arrays = {key: np.asarray(value) for key, value in test_res.items() if key in (*CELL_KEYS, "logvar")}
        n_cells = len(arrays["pert_cat"])
        for key, values in arrays.items():
            if key != "pert_cat" and (values.ndim != 2 or len(values) != n_cells):
                raise ValueError(
                    f"test_res['{key}'] has shape {values.shape}; it needs one row per cell of "
                    f"test_res['pert_cat'] ({n_cells} cells)"
                )
        conditions, codes = np.unique(arrays["pert_cat"].astype(str), return_inverse=True)
        return cls(arrays, conditions.tolist(), codes.reshape(-1))

    def means(self, key: str) -> np.ndarray:
        """(conditions x columns) float64 means of ``arrays[key]`` per condition."""
        return condition_means(self.arrays[key], self.codes, len(self.conditions))

    def metrics(self) -> tuple[dict, dict]:
        """The published ``compute_metrics`` of these cells (``metrics.condition_metrics``)."""
        return condition_metrics(
            self.conditions, self.means("pred"), self.means("truth"), self.means("pred_de"), self.means("truth_de")
        )

    def spreads(self, tables: Mapping[str, np.ndarray]) -> dict[str, dict[str, dict]]:
        """``MetricContext.spreads`` of these cells: for each table (conditions x 20 gene
        positions, -1 padded, rows in ``conditions`` order), the spread of each condition's
        cells' truth at its row's genes (``truth_spread.spread``; NaN where padded)."""
        truth = torch.from_numpy(np.ascontiguousarray(self.arrays["truth"]))
        out: dict[str, dict[str, dict]] = {name: {} for name in tables}
        for row, condition in enumerate(self.conditions):
            cells = torch.from_numpy(np.flatnonzero(self.codes == row))
            for name, table in tables.items():
                out[name][condition] = spread(gene_values(truth, cells, torch.as_tensor(table[row])))
        return out


def analysis_inputs(adata, test_res, most_variable_genes=None) -> tuple[MetricContext, EvaluationResult]:
    """What ``metrics.deeper_analysis`` and ``metrics.non_dropout_analysis`` take, from the
    published functions' inputs: the dataset's AnnData (``obs['condition']`` and
    ``obs['condition_name']``, the DE ranking and gene sets in ``uns``; every condition's
    mean expression is read from ``X``) and per-cell results. A condition of the results
    that the AnnData does not hold is an error naming it."""
    cells = CellResults.of(test_res)
    for column in ("condition", "condition_name"):
        if column not in adata.obs:
            raise ValueError(f"adata.obs has no '{column}' column: pass the processed dataset (gears_model.adata)")
    conditions, codes = coded_conditions(adata.obs["condition"], "adata.obs['condition']")
    first_cells = pd.Series(np.arange(len(codes))).groupby(codes).first().to_numpy()
    names = dict(zip(conditions, adata.obs["condition_name"].astype(str).to_numpy()[first_cells]))
    unknown = [c for c in cells.conditions if c not in names]
    if unknown:
        raise ValueError(f"test_res['pert_cat'] names conditions the AnnData does not hold: {unknown[:10]}")
    var_names = adata.var.index
    de_idx = np.full((len(cells.conditions), N_DE_GENES), -1, dtype=np.int64)
    for row, condition in enumerate(cells.conditions):
        top = top_de_positions(adata.uns, var_names, names[condition])
        de_idx[row, : len(top)] = top
    tested_names = [names[c] for c in cells.conditions]
    non_dropout_de_idx = non_dropout_de_table(adata.uns, var_names, tested_names).numpy()
    result = EvaluationResult(
        conditions=cells.conditions,
        n_cells=np.bincount(cells.codes, minlength=len(cells.conditions)),
        pred_mean=cells.means("pred"),
        truth_mean=cells.means("truth"),
        logvar_mean=cells.means("logvar") if "logvar" in cells.arrays else None,
        de_idx=de_idx,
        non_dropout_de_idx=non_dropout_de_idx,
    )
    spreads = cells.spreads({"de": de_idx, "non_dropout_de": non_dropout_de_idx})
    means = condition_means(adata.X, codes, len(conditions))
    context = MetricContext.from_tables(adata.uns, var_names, names, means, spreads, most_variable_genes)
    return context, result
