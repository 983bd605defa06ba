"""A loaded dataset's cells: the ``CellTable`` training reads, and the AnnData that views it.

``cell_table`` builds the table of the cells a dataset keeps (those its perturbation
vocabulary covers) over their expression, held once per machine: a read-only map of a file
beside the processed file (``expression_map``), shared by every process through the page
cache, or a dense tensor in memory. With it come the per-condition tables GEARS reads (the
perturbed genes' positions in the vocabulary, the top DE genes). ``anndata_view`` gives the
same cells as an AnnData whose ``X`` views that expression, without a copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from gears_ddp.data import processing
from gears_ddp.data.cells import MAX_PERTURBED_GENES, N_DE_GENES, CellTable
from gears_ddp.data.conditions import CONTROL, coded_conditions, condition_genes, first_cell_values
from gears_ddp.data.expression_map import as_tensor, mapped_expression

if TYPE_CHECKING:  # imported where the view is built, not by every rank that reads the cell table
    import anndata


def cell_table(data, keep: np.ndarray, node_map_pert: dict, folder: Path, storage: str, dtype: str) -> CellTable:
    """The ``CellTable`` of the cells ``keep`` of ``data`` (an AnnData, or the parts of an
    h5ad file, of the dataset in ``folder``), its expression of ``dtype`` mapped
    (``storage='mapped'``) or in memory, its perturbed genes placed by ``node_map_pert``."""
    if storage == "mapped":
        values, path, digest = mapped_expression(folder, data.X, keep, dtype)
        expression, mapped_from = as_tensor(values), str(path)
    else:  # the digest of values in memory is computed when first asked for (CellTable.identity)
        expression, mapped_from, digest = _in_memory(data.X, keep, dtype), None, None
    kept = data.obs.iloc[np.flatnonzero(keep)] if not keep.all() else data.obs
    conditions, codes = coded_conditions(kept["condition"])
    names = dict(zip(conditions, first_cell_values(kept["condition_name"], codes)))
    pert_idx, de_idx = _condition_tables(conditions, names, dict(data.uns), data.var_names, node_map_pert)
    table = CellTable(
        expression, torch.from_numpy(codes), conditions, pert_idx, de_idx, [names[c] for c in conditions], mapped_from
    )
    table.expression_digest = digest
    return table


def _condition_tables(
    conditions: list[str], condition_names: dict, uns: dict, var_names: pd.Index, node_map_pert: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-condition perturbed-gene indices (C x 2) and top-20 DE gene indices (C x 20), -1 padded.

    DE indices are the positions of the condition's 20 top-ranked genes, in gene order (as
    the reference stores them); all -1 for control or when DE genes were not computed.
    """
    pert_idx = torch.full((len(conditions), MAX_PERTURBED_GENES), -1, dtype=torch.long)
    de_idx = torch.full((len(conditions), N_DE_GENES), -1, dtype=torch.long)
    for code, condition in enumerate(conditions):
        genes = condition_genes(condition)
        pert_idx[code, : len(genes)] = torch.tensor([node_map_pert[g] for g in genes], dtype=torch.long)
        if condition != CONTROL:
            top = processing.top_de_positions(uns, var_names, condition_names[condition])
            de_idx[code, : len(top)] = torch.from_numpy(top)
    return pert_idx, de_idx


def _in_memory(matrix, keep: np.ndarray, dtype: str) -> torch.Tensor:
    """The rows ``keep`` of ``matrix`` as a dense tensor in memory."""
    rows = np.flatnonzero(keep)
    matrix = matrix[rows] if len(rows) < len(keep) else matrix[:]
    dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)
    return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.dtype(dtype)))


def anndata_view(
    expression: torch.Tensor, obs: pd.DataFrame, keep: np.ndarray, var: pd.DataFrame, uns: dict
) -> anndata.AnnData:
    """An AnnData of the cells ``keep`` of ``obs`` (without categories that no longer occur)
    whose ``X`` views ``expression``, the kept cells' values."""
    import anndata

    obs = obs.iloc[np.flatnonzero(keep)].copy() if not keep.all() else obs.copy()
    for column in obs.columns:
        if isinstance(obs[column].dtype, pd.CategoricalDtype):
            obs[column] = obs[column].cat.remove_unused_categories()
    return anndata.AnnData(X=expression.numpy(), obs=obs, var=var.copy(), uns=uns)
