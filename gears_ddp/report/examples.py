"""The test conditions the report shows in detail, and what its predictions picture needs.

One condition per test subgroup of the simulation split (two-gene combinations first, the
hardest cases, then unseen singles), the one with the most cells in each, up to
``MAX_EXAMPLES``; without subgroups, the conditions with the most cells. For each: its top
20 non-dropout DE genes (the genes of the published ``plot_perturbation``), the control
mean, every test cell's true expression and the mean prediction of the model and of the
baselines at those genes.
"""

from __future__ import annotations

import numpy as np
import torch

from gears_ddp.data.conditions import CONTROL
from gears_ddp.evaluation.metrics import EvaluationResult
from gears_ddp.evaluation.truth_spread import gene_values

MAX_EXAMPLES = 4
SUBGROUP_ORDER = ("combo_seen2", "combo_seen1", "combo_seen0", "unseen_single")


def pick_conditions(result: EvaluationResult, subgroups: dict | None, limit: int = MAX_EXAMPLES) -> list[tuple]:
    """``(row of result, subgroup or None)`` of the conditions to show."""
    has_genes = np.asarray((result.non_dropout_de_idx >= 0).any(1))  # one bool per condition
    rows = {c: row for row, c in enumerate(result.conditions) if c != CONTROL and has_genes[row]}
    by_cells = sorted(rows, key=lambda c: -result.n_cells[rows[c]])
    picked: list[tuple[int, str | None]] = []
    members_of = subgroups or {}
    for subgroup in SUBGROUP_ORDER if members_of else ():
        members = set(members_of.get(subgroup, ()))
        best = next((c for c in by_cells if c in members), None)
        if best is not None:
            picked.append((rows[best], subgroup))
    chosen = {row for row, _ in picked}
    picked += [(rows[c], None) for c in by_cells if rows[c] not in chosen]
    return picked[:limit]


def prediction_examples(
    result: EvaluationResult,
    baselines: dict[str, EvaluationResult],
    cell_table,
    gene_names,
    control_mean: np.ndarray,
    subgroups: dict | None = None,
) -> list[dict]:
    """What ``report.plots.plot_predictions`` draws, for the conditions ``pick_conditions``
    chooses: condition, subgroup, gene names, control mean, the true expression of every
    cell of the condition (read from ``cell_table``), model and baseline means, all at the
    condition's top non-dropout DE genes."""
    examples = []
    for row, subgroup in pick_conditions(result, subgroups):
        genes = result.non_dropout_de_idx[row]
        valid = genes >= 0
        positions = genes[valid]
        cells = gene_values(
            cell_table.expression, cell_table.cells_of([result.conditions[row]]), torch.from_numpy(positions)
        )
        examples.append(
            {
                "condition": result.conditions[row],
                "subgroup": subgroup,
                "genes": [str(gene_names[p]) for p in positions],
                "control": control_mean[positions],
                "truth_cells": cells,
                "model": result.pred_mean[row, positions],
                "baselines": {name: other.pred_mean[row, positions] for name, other in baselines.items()},
            }
        )
    return examples
