"""How the true expression of a condition's cells spreads at its DE genes, read from the dataset.

The reference's in-range and sigma metrics compare each condition's mean prediction with
the spread of its cells' true expression at the condition's 20 DE genes: std, min, max and
quantiles over the cells. That spread depends on the data alone, not on the model, so it is
read here from the cell table, a condition at a time, instead of being collected per cell
during an evaluation pass: memory is bounded by one condition's cells at 20 genes whatever
the number of cells in the test set, and nothing per cell crosses between ranks. Every
cell of an evaluated condition is in its evaluation set (splits assign whole conditions),
so the spread equals the one over the evaluated cells.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from gears_ddp.data.cells import VALUES_PER_BLOCK
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess

QUANTILE_BANDS = {"45_55": (0.45, 0.55), "40_60": (0.4, 0.6), "25_75": (0.25, 0.75)}
QUANTILES = sorted({q for band in QUANTILE_BANDS.values() for q in band})
SPREAD_STATISTICS: tuple[str | float, ...] = ("std", "min", "max", *QUANTILES)
Spread = dict[str | float, np.ndarray]  # statistic (a name, or a quantile) -> its values per gene


def spread(values: np.ndarray) -> Spread:
    """Per column of ``values`` (cells x genes): std, min, max and ``QUANTILES`` over the
    cells, in float64 (NaN for a column holding NaN, and everywhere when there are no cells).
    The values are summed in row order whatever their layout, so equal values give equal bits."""
    block = np.ascontiguousarray(values, dtype=np.float64)
    if not len(block):
        return {name: np.full(block.shape[1], np.nan) for name in SPREAD_STATISTICS}
    out: Spread = {"std": block.std(0), "min": block.min(0), "max": block.max(0)}
    out.update(zip(QUANTILES, np.quantile(block, QUANTILES, axis=0)))
    return out


def gene_values(expression: torch.Tensor, cells: torch.Tensor, genes: torch.Tensor) -> np.ndarray:
    """(cells x genes) float32 expression of ``cells`` at ``genes``, NaN where a gene is -1
    (padding); only those columns are read, about ``VALUES_PER_BLOCK`` values at a time."""
    columns = genes.clamp(min=0)
    blocks = [
        expression[block.unsqueeze(1), columns.unsqueeze(0)].float()
        for block in cells.split(max(1, VALUES_PER_BLOCK // max(1, len(genes))))
    ]
    values = torch.cat(blocks) if blocks else torch.empty(0, len(genes))
    return values.masked_fill(genes < 0, float("nan")).numpy()


def condition_spreads(
    cell_table,
    conditions: Sequence[str],
    gene_tables: Mapping[str, torch.Tensor],
    ranks: SingleProcess = SINGLE_PROCESS,
) -> dict[str, dict[str, dict]]:
    """``{table name: {condition: spread}}``: the ``spread`` of the cells of each of
    ``conditions`` at the genes of its row of each table (conditions x 20 gene positions, -1
    padded, indexed by condition code like ``CellTable.condition_de_idx``).

    With several ranks each reads a share of the conditions and the ranks exchange the
    (small) results, so every rank returns all of them.
    """
    code_of = {c: i for i, c in enumerate(cell_table.conditions)}
    unknown = [c for c in conditions if c not in code_of]
    if unknown:
        raise ValueError(f"conditions {unknown[:10]} are not in the dataset")
    codes = cell_table.condition_codes
    order = torch.argsort(codes, stable=True)
    bounds = torch.searchsorted(codes[order], torch.arange(len(cell_table.conditions) + 1)).tolist()
    names = list(gene_tables)
    ends = np.cumsum([gene_tables[name].shape[1] for name in names]).tolist()
    mine: dict[str, dict[str, Spread]] = {name: {} for name in names}
    for condition in list(conditions)[ranks.rank :: ranks.world_size]:
        code = code_of[condition]
        genes = torch.cat([gene_tables[name][code] for name in names])
        values = gene_values(cell_table.expression, order[bounds[code] : bounds[code + 1]], genes)
        for name, start, end in zip(names, [0] + ends[:-1], ends):
            mine[name][condition] = spread(values[:, start:end])
    if ranks.world_size == 1:
        return mine
    merged: dict[str, dict[str, Spread]] = {name: {} for name in names}
    for share in ranks.gather(mine):
        for name in names:
            merged[name].update(share[name])
    return merged
