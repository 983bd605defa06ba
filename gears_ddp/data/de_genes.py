"""Rank every gene of every condition by its difference from control (GEARS's DE genes).

The published GEARS stores, in ``uns['rank_genes_groups_cov_all']``, the genes of each
condition ranked by scanpy's ``rank_genes_groups(method='t-test', rankby_abs=True,
reference=<control>, n_genes=<all>, use_raw=False)``. This module computes the same ranking:

- Welch's t statistic per (condition, gene) from the condition's and control's means and
  unbiased variances (``scipy.stats.ttest_ind_from_stats``); as in scanpy, the variance is
  ``E[x^2] - E[x]^2`` times ``n / (n - 1)``, with the squares taken in the matrix's dtype and
  the sums in float64;
- a NaN statistic (equal means, both variances zero) counts as 0;
- genes ordered by decreasing ``|t|``, ties in the order scanpy's sort gives them.

Genes whose statistics differ only by rounding can swap places: scanpy's own sums run in an
order that depends on the matrix's format and on the number of threads, so no ranking
reproduces its order of such genes everywhere. The per-condition sums come from blocks of
cells (``grouped.ConditionSums``), for every condition in one pass: no copy of the matrix
per condition, and none of scanpy's compiled kernels (whose compilation for sparse input
holds memory in every process that ranks genes).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gears_ddp.data.grouped import ConditionSums, row_blocks
from gears_ddp.data.screen_report import Problem, refuse

MOMENTS = ("sum", "sum_squares")  # the sums a t-test reads


def welch_t_scores(matrix, codes: np.ndarray, groups: Sequence[str], reference: int) -> np.ndarray:
    """(groups x genes) Welch t statistics of each group's cells against the cells of group
    ``reference`` (whose own row is all 0); NaN statistics are 0.

    ``codes`` gives each row of ``matrix`` (cells x genes, dense or sparse) its position in
    ``groups``; negative codes are left out. Every group needs at least two cells.
    """
    return welch_t_test(matrix, codes, groups, reference)[0]


def welch_t_test(matrix, codes: np.ndarray, groups: Sequence[str], reference: int) -> tuple[np.ndarray, np.ndarray]:
    """``welch_t_scores`` and the two-sided p-values of the same tests (1 where the
    statistic is NaN, and for the reference group)."""
    check_group_sizes(np.bincount(codes[codes >= 0], minlength=len(groups)), groups)
    sums = ConditionSums(codes, len(groups), matrix.shape[1], MOMENTS)
    for start, block in row_blocks(matrix):
        sums.add(start, block)
    return welch_t_test_of_sums(sums.counts, sums.mean("sum"), sums.mean("sum_squares"), groups, reference)


def small_groups_problem(counts: np.ndarray, groups: Sequence[str]) -> Problem | None:
    """The ``Problem`` naming the groups of fewer than two cells (``counts``), whose
    variances, so whose t statistics, are undefined; None when there are none."""
    small = [groups[int(code)] for code in np.flatnonzero(counts < 2)]
    if not small:
        return None
    return Problem(
        "cells per condition",
        f"conditions {small[:10]} have fewer than two cells: their gene "
        "variances, so their DE genes, which training reads, are undefined; "
        "remove their cells from the screen (the h5ad given to gears-ddp process "
        "--adata, or the AnnData given to new_data_process); skip_calc_de=True "
        "(Python only) processes the screen without DE genes, but a dataset "
        "without them cannot be trained",
    )


def check_group_sizes(counts: np.ndarray, groups: Sequence[str]) -> None:
    """Raise ``ValueError`` for the ``small_groups_problem`` of ``counts``, if there is one."""
    refuse([small_groups_problem(counts, groups)], "the conditions")


def welch_t_test_of_sums(
    counts: np.ndarray, mean: np.ndarray, mean_square: np.ndarray, groups: Sequence[str], reference: int
) -> tuple[np.ndarray, np.ndarray]:
    """``welch_t_test`` from each group's number of cells, mean and mean square (groups x
    genes, float64: ``ConditionSums`` of the ``MOMENTS``), which one pass over the cells
    gives for every group at once."""
    from scipy import stats  # here, not at the top: seconds to import, and most users of this module never test

    check_group_sizes(counts, groups)
    # At least 0, as a variance is: rounding in E[x^2] - E[x]^2 can make the variance of a gene
    # that a condition's cells all express at one nonzero value slightly negative, and its t
    # NaN, so 0 and ranked last. Scanpy before 1.12 (which the published GEARS calls) has that
    # artefact; 1.12 computes variances with Welford's algorithm and gives such a gene its t.
    variance = np.maximum(mean_square - mean * mean, 0.0) * (counts / (counts - 1))[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        scores, pvalues = stats.ttest_ind_from_stats(
            mean,
            np.sqrt(variance),
            counts[:, None],
            mean[reference],
            np.sqrt(variance[reference]),
            counts[reference],
            equal_var=False,
        )
    undefined = np.isnan(scores)
    scores[undefined] = 0.0
    pvalues[undefined | np.isnan(pvalues)] = 1.0
    scores[reference] = 0.0
    pvalues[reference] = 1.0
    return scores, pvalues


def order_by_magnitude(scores: np.ndarray) -> np.ndarray:
    """Gene positions by decreasing ``|scores|`` (one row of scores).

    Tied magnitudes (typically the 0 scores of genes silent in both groups) come out in the
    order scanpy's sort gives them: a partition of the whole vector, then an ascending sort,
    reversed. The same two calls here give the published GEARS's gene lists, ties included,
    when the scores compare as scanpy's do.
    """
    magnitude = np.abs(scores)
    n = len(magnitude)
    partition = np.argpartition(magnitude, -n)[-n:]
    return partition[np.argsort(magnitude[partition])[::-1]]
