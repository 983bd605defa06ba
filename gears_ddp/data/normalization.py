"""Raw counts to the expression GEARS reads, with scanpy: each cell normalised to 1e4
counts (``sc.pp.normalize_total(target_sum=1e4)``), then ``sc.pp.log1p``; optionally the
highly variable genes first, chosen on the counts (``sc.pp.highly_variable_genes``,
``flavor='seurat_v3'``), always with every perturbed gene the screen measures.

The genes are chosen on the counts (seurat_v3 models counts) and each cell is normalised
over all its genes before the others are left out, so a cell's scale does not depend on
which genes were kept. scanpy is imported inside these functions only: it takes seconds to
import, and the processes that train (every DDP rank) read processed data and never need it.
"""
from __future__ import annotations

import numpy as np

from gears_ddp._logging import get_logger
from gears_ddp.data.grouped import row_blocks
from gears_ddp.data.processing import ExpressionCheck

logger = get_logger(__name__)

TARGET_SUM = 1e4
HVG_FLAVOR = "seurat_v3"


def check_counts(matrix, source: str) -> None:
    """Raise ``ValueError`` when ``matrix`` cannot be raw counts (non-finite or negative
    values); warn when it holds values that are not whole numbers (normalised already?)."""
    check = ExpressionCheck()
    for _, block in row_blocks(matrix):
        check.add(block)
    if check.non_finite:
        raise ValueError(f"{source} has {check.non_finite} non-finite values (NaN or inf); raw counts are finite")
    if check.negative:
        raise ValueError(f"{source} has {check.negative} negative values (min {check.minimum:.4g}); raw counts are "
                         "never negative: normalisation needs the screen's raw counts")
    if not check.whole:
        logger.warning("%s holds values that are not whole numbers: if it is normalised already, process it "
                       "without normalisation", source)


def normalized_screen(adata, n_top_genes: int | None, perturbed_genes, source: str = "the AnnData"):
    """A normalised copy of the raw-count screen ``adata`` (in memory; ``adata`` is left as
    it was), restricted to its ``n_top_genes`` highly variable genes and the
    ``perturbed_genes`` it measures (``var['gene_name']``) when ``n_top_genes`` is given."""
    import scanpy as sc

    if n_top_genes is not None and (isinstance(n_top_genes, bool) or not isinstance(n_top_genes, (int, np.integer))
                                    or n_top_genes < 1):
        raise ValueError(f"n_top_genes must be a positive whole number, got {n_top_genes!r}")
    check_counts(adata.X, source)
    screen = adata.to_memory() if adata.isbacked else adata.copy()
    if not np.issubdtype(screen.X.dtype, np.floating):
        screen.X = screen.X.astype(np.float32)
    keep = None
    if n_top_genes is not None and n_top_genes < screen.n_vars:
        sc.pp.highly_variable_genes(screen, n_top_genes=int(n_top_genes), flavor=HVG_FLAVOR)
        perturbed = screen.var["gene_name"].astype(str).isin(set(perturbed_genes)).to_numpy()
        keep = screen.var["highly_variable"].to_numpy(bool) | perturbed
        logger.info("%s: %d highly variable genes (%s, on the counts) and %d perturbed genes outside them: %d of "
                    "%d genes kept", source, n_top_genes, HVG_FLAVOR, int(np.count_nonzero(keep)) - n_top_genes,
                    int(np.count_nonzero(keep)), screen.n_vars)
    sc.pp.normalize_total(screen, target_sum=TARGET_SUM)
    sc.pp.log1p(screen)
    logger.info("%s: counts normalised to %g per cell, then log1p", source, TARGET_SUM)
    return screen[:, keep].copy() if keep is not None else screen
