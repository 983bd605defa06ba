"""Highly variable genes chosen on raw counts as scanpy's ``highly_variable_genes(flavor=
'seurat_v3')`` chooses them (one batch), from two passes over the counts a block of cells at
a time instead of a copy of the whole matrix in memory.

Per gene, with ``N`` cells: the mean ``m`` and unbiased variance ``v`` of the counts (first
pass); a loess fit (span 0.3, degree 2) of ``log10 v`` on ``log10 m`` over the genes of
non-zero variance gives the expected variance ``s^2`` (1 for the others); every count is
clipped at ``m + s sqrt(N)`` and the clipped counts' sum ``S`` and sum of squares ``Q`` taken
(second pass); the normalised variance ``(N m^2 + Q - 2 S m) / ((N - 1) s^2)`` ranks the
genes, largest first. As in scanpy, the counts are squared in their dtype and every sum is
float64, taken value by value in the order of the cells, over all blocks: scanpy's order
with one thread (its first pass splits the cells among its threads, which changes nothing
for whole-number counts, whose float64 sums are exact in any order).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gears_ddp.data.grouped import row_blocks

LOESS_SPAN = 0.3


def _stored(block) -> sp.csr_matrix:
    """A block of counts as CSR (the zeros of a dense block add nothing to any sum here)."""
    return block if sp.issparse(block) else sp.csr_matrix(block)


def highly_variable(counts, n_top_genes: int, check=None) -> pd.DataFrame:
    """The ``n_top_genes`` highly variable genes of ``counts`` (cells x genes, in memory or
    backed), chosen as scanpy's seurat_v3 flavour chooses them, with the columns scanpy adds
    to ``var`` (one row per gene, in order): ``highly_variable``, ``highly_variable_rank``
    (float32, NaN outside the chosen genes), ``means``, ``variances`` and
    ``variances_norm``. ``check`` (an ``ExpressionCheck``), if given, checks each block of
    counts of the first pass."""
    from skmisc.loess import loess

    n_cells, n_genes = counts.shape
    total, squares = np.zeros(n_genes), np.zeros(n_genes)
    for _, block in row_blocks(counts, dense=False):
        if check is not None:
            check.add(block)
        block = _stored(block)
        np.add.at(total, block.indices, block.data)
        np.add.at(squares, block.indices, block.data * block.data)  # squared in the counts' dtype, as scanpy
    mean = total / n_cells
    variance = (squares / n_cells - mean**2) * (n_cells / (n_cells - 1))

    expected_log_variance = np.zeros(n_genes)
    varying = variance > 0
    model = loess(np.log10(mean[varying]), np.log10(variance[varying]), span=LOESS_SPAN, degree=2)
    model.fit()
    expected_log_variance[varying] = model.outputs.fitted_values
    expected_sd = np.sqrt(10**expected_log_variance)
    clip = expected_sd * np.sqrt(n_cells) + mean

    clipped_total, clipped_squares = np.zeros(n_genes), np.zeros(n_genes)
    for _, block in row_blocks(counts, dense=False):
        block = _stored(block)
        values = np.minimum(block.data.astype(np.float64), clip[block.indices])
        np.add.at(clipped_total, block.indices, values)
        np.add.at(clipped_squares, block.indices, values**2)
    normalised_variance = (1 / ((n_cells - 1) * np.square(expected_sd))) * (
        n_cells * np.square(mean) + clipped_squares - 2 * clipped_total * mean
    )

    rank = np.argsort(np.argsort(-normalised_variance)).astype(np.float32)  # as scanpy ranks them
    chosen = rank < n_top_genes
    rank[~chosen] = np.nan
    return pd.DataFrame(
        {
            "highly_variable": chosen,
            "highly_variable_rank": rank,
            "means": mean,
            "variances": variance,
            "variances_norm": normalised_variance,
        }
    )
