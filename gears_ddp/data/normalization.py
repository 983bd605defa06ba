"""Raw counts to the expression GEARS reads, a block of cells at a time, as scanpy computes
it: each cell normalised to 1e4 counts (``sc.pp.normalize_total(target_sum=1e4)``), then
``sc.pp.log1p``; optionally the highly variable genes first, chosen on the counts
(``highly_variable``: scanpy's ``seurat_v3`` flavour), always with every perturbed gene the
screen measures.

Both steps are per cell, so a block of cells normalised alone has the values the whole
matrix gets, while only a block is in memory: a screen larger than memory is normalised from
its backed file as its processed file is written (``PertData.new_data_process``). The genes
are chosen on the counts (seurat_v3 models counts) and each cell is normalised over all its
genes before the others are left out, so a cell's scale does not depend on which genes were
kept. The arithmetic is scanpy's, operation for operation (``normalised_in_place``; the tests
hold the values equal to scanpy's, bit for bit), without importing scanpy, which takes
seconds, or compiling its numba kernel, which takes seconds more on every machine without
numba's cache (a fresh one, a read-only installation).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Iterator

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gears_ddp._logging import get_logger
from gears_ddp.data.grouped import block_rows, row_blocks
from gears_ddp.data.highly_variable import highly_variable
from gears_ddp.data.processing import LOG_NORMALISED_MAX, ExpressionCheck
from gears_ddp.data.screen_report import Problem, refuse

if TYPE_CHECKING:  # imported where an AnnData is built, not by every process that imports this module
    import anndata

logger = get_logger(__name__)

TARGET_SUM = 1e4
HVG_FLAVOR = "seurat_v3"
COUNTS_PER_BLOCK = 2**24  # about this many counts (zeros included) normalised at once: scanpy's cost per call


def option_problems(normalize: bool, n_top_genes) -> list[Problem]:
    """The problems of the normalisation options: ``n_top_genes`` must be a positive whole
    number, and chooses genes on counts, so needs ``normalize``."""
    problems = []
    if n_top_genes is not None and (
        isinstance(n_top_genes, bool) or not isinstance(n_top_genes, (int, np.integer)) or n_top_genes < 1
    ):
        problems.append(Problem("options", f"n_top_genes must be a positive whole number, got {n_top_genes!r}"))
    if n_top_genes is not None and not normalize:
        problems.append(
            Problem(
                "options",
                "n_top_genes chooses genes on the raw counts: give the screen's counts "
                "with normalize=True (gears-ddp process --normalize)",
            )
        )
    return problems


def counts_problems(check: ExpressionCheck, source: str) -> list[Problem]:
    """What the values ``check`` saw say of raw counts: non-finite or negative values stop
    them, and so do values that are not whole numbers and all within the range of
    log-normalised ones (normalised already); other values that are not whole numbers
    (corrected counts, or normalised without the log) are a warning."""
    problems = []
    if check.non_finite:
        problems.append(
            Problem(
                "expression", f"{source} has {check.non_finite} non-finite values (NaN or inf); raw counts are finite"
            )
        )
    if check.negative:
        problems.append(
            Problem(
                "expression",
                f"{source} has {check.negative} negative values (min "
                f"{check.minimum:.4g}); raw counts are never negative: normalisation "
                "needs the screen's raw counts",
            )
        )
    if not check.whole and check.maximum <= LOG_NORMALISED_MAX:
        problems.append(
            Problem(
                "expression",
                f"{source} holds values that are not whole numbers, all at most {check.maximum:.4g}, as "
                f"log-normalised values are (log1p of counts per {TARGET_SUM:.0e}: at most "
                f"{LOG_NORMALISED_MAX:.4g}), not raw counts: normalising them again would log-transform them "
                "twice; process the screen without normalisation (no --normalize; normalize=False)",
            )
        )
    elif not check.whole:
        problems.append(
            Problem(
                "expression",
                f"{source} holds values that are not whole numbers: if it is normalised "
                "already, process it without normalisation",
                stops=False,
            )
        )
    return problems


def finish_counts_check(check: ExpressionCheck, source: str) -> None:
    """Raise ``ScreenProblems`` for the ``counts_problems`` that stop the counts; log the warnings."""
    problems = counts_problems(check, source)
    refuse(problems, source)
    for problem in problems:
        logger.warning("%s", problem)


def normalized_annotations(
    adata, n_top_genes: int | None, perturbed_genes, source: str = "the AnnData"
) -> tuple[anndata.AnnData, np.ndarray | None]:
    """The annotations of the raw-count screen ``adata`` normalised (an AnnData without
    ``X``: its ``obs``, ``var``, ``uns``, ``obsm`` and ``varm``, and ``uns['log1p']`` as scanpy
    adds it), and which of its genes that
    keeps: all (None) without ``n_top_genes``, else its ``n_top_genes`` highly variable genes
    and the ``perturbed_genes`` it measures (``var['gene_name']``), described in ``var`` and
    ``uns['hvg']`` as scanpy describes them (``n_top_genes`` checked: ``option_problems``).
    Choosing them reads the counts, which are checked on the way (``finish_counts_check``)."""
    import anndata

    var, uns, keep = adata.var.copy(), copy.deepcopy(dict(adata.uns)), None
    uns["log1p"] = {"base": None}  # as sc.pp.log1p records it
    if n_top_genes is not None and n_top_genes < adata.n_vars:
        check = ExpressionCheck()
        chosen = highly_variable(adata.X, int(n_top_genes), check)
        finish_counts_check(check, source)
        for column in chosen.columns:
            var[column] = chosen[column].to_numpy()
        uns["hvg"] = {"flavor": HVG_FLAVOR}
        keep = chosen["highly_variable"].to_numpy() | var["gene_name"].astype(str).isin(set(perturbed_genes)).to_numpy()
        logger.info(
            "%s: %d highly variable genes (%s, on the counts) and %d perturbed genes outside them: %d of %d genes kept",
            source,
            n_top_genes,
            HVG_FLAVOR,
            int(np.count_nonzero(keep)) - n_top_genes,
            int(np.count_nonzero(keep)),
            adata.n_vars,
        )
    if keep is not None:  # as anndata subsets genes: the categories no kept gene has go
        var = var[keep]
        for column in var.columns:
            if isinstance(var[column].dtype, pd.CategoricalDtype):
                var[column] = var[column].cat.remove_unused_categories()
    varm = {key: value if keep is None else value[keep] for key, value in adata.varm.items()}
    return anndata.AnnData(obs=adata.obs.copy(), var=var, uns=uns, obsm=dict(adata.obsm), varm=varm), keep


def normalized_dtype(counts) -> np.dtype:
    """The dtype of normalised values of ``counts``: theirs if floating, else float32."""
    return counts.dtype if np.issubdtype(counts.dtype, np.floating) else np.dtype(np.float32)


def normalized_blocks(
    counts, genes: np.ndarray | None = None, source: str = "the AnnData", check_counts: bool = True
) -> Iterator[tuple[int, sp.csr_matrix]]:
    """``(first cell, block)`` for consecutive blocks of cells of the raw ``counts`` (cells x
    genes, in memory or backed), normalised as ``sc.pp.normalize_total(target_sum=1e4)``
    then ``sc.pp.log1p`` normalise them, cut to the ``genes`` (a mask; None: all), as CSR of
    ``normalized_dtype``. A block has a whole number of the blocks ``grouped.row_blocks``
    gives a matrix of the kept genes, so ``ConditionSums`` over these blocks are those over
    the normalised matrix. With ``check_counts``, the counts are checked as they are read
    (``finish_counts_check``, after the last block); from a block holding counts that
    cannot be raw counts on, the blocks are only read, to count what is wrong, and none is
    given."""
    check = ExpressionCheck()
    dtype = normalized_dtype(counts)
    summed = block_rows(counts.shape[1] if genes is None else int(np.count_nonzero(genes)))
    rows = summed * max(1, block_rows(counts.shape[1], COUNTS_PER_BLOCK) // summed)
    for start, block in row_blocks(counts, dense=False, rows=rows):
        if check_counts:
            check.add(block)
            if check.negative or check.non_finite:
                continue  # refused at the end: the rest is only read, to count what is wrong
        cells = normalised_in_place(sp.csr_matrix(block, dtype=dtype, copy=True))  # never the caller's counts
        yield start, cells if genes is None else cells[:, genes]
    if check_counts:
        finish_counts_check(check, source)


def normalised_in_place(cells: sp.csr_matrix) -> sp.csr_matrix:
    """``cells`` (CSR of raw counts, floating) normalised in place and returned: each cell
    scaled to ``TARGET_SUM`` counts, then ``log1p``, as ``sc.pp.normalize_total(target_sum=1e4)``
    and ``sc.pp.log1p`` compute it: a cell's count summed in float64 (exact for counts, in any
    order) and rounded to the values' dtype, divided by the target (a cell of no counts by 1,
    so it stays zero), each value divided by its cell's factor, then ``log1p``, all in the
    values' dtype. Beside the values it holds one factor per stored value, as scanpy does."""
    lengths = np.diff(cells.indptr)
    stored = lengths > 0  # reduceat sums the values from each start to the next
    totals = np.zeros(cells.shape[0], dtype=np.float64)
    totals[stored] = np.add.reduceat(cells.data, cells.indptr[:-1][stored], dtype=np.float64)
    factors = totals.astype(cells.dtype) / TARGET_SUM
    factors += factors == 0
    cells.data /= np.repeat(factors, lengths)
    np.log1p(cells.data, out=cells.data)
    return cells
