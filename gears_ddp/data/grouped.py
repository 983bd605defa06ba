"""Per-condition sums and means over the cells of an expression matrix, without whole-matrix copies.

Metrics (control mean), baselines (training condition means) and data processing (the DE
statistics and the genes ever non-zero per condition) all reduce cells by condition. One
sparse indicator product over the whole matrix would first convert it to float64 (or to a
non-zero mask): for a Norman-size dataset (about 90,000 cells x 5,000 genes) that is a
3.6 GB transient copy. Here rows are reduced a block at a time instead, dense or sparse,
so a screen larger than memory is reduced as it is read, and processing reduces the blocks
it normalises and writes without reading them back.

A block's sums are the indicator product of its rows (made dense: at the density of
expression data a sparse product is slower), accumulated in row order within the block,
then added to the running totals, so the totals depend only on where the blocks start.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

BLOCK_ELEMENTS = 2**21  # values of a block of rows read at once, unless a caller says otherwise

STATISTICS: dict[
    str, Callable[[np.ndarray], np.ndarray]
] = {  # name -> the values summed, of a block's values (float64 sums of the values' dtype)
    "sum": lambda values: values,
    "sum_squares": np.square,  # squared in the values' dtype, as scanpy squares them
    "nonzero": lambda values: values != 0,
}


def block_rows(n_columns: int, block_elements: int | None = None) -> int:
    """Rows of a block of about ``block_elements`` (default ``BLOCK_ELEMENTS``) values of
    ``n_columns`` columns."""
    return max(1, (BLOCK_ELEMENTS if block_elements is None else block_elements) // max(1, n_columns))


def row_blocks(
    matrix, block_elements: int | None = None, *, dense: bool = True, rows: int | None = None
) -> Iterator[tuple[int, np.ndarray | sp.csr_matrix]]:
    """``(first row, block)`` for consecutive blocks of the rows of ``matrix``: a numpy array
    or memory map, a scipy sparse matrix, a tensor, or the backed ``X`` of an h5ad file (an
    h5py dataset or anndata's backed sparse matrix), so that a matrix larger than memory is
    read one block at a time.

    A block has ``rows`` rows, by default ``block_rows`` of the matrix's columns. Blocks come
    as dense arrays, or, with ``dense=False``, sparse blocks stay CSR."""
    rows = block_rows(matrix.shape[1], block_elements) if rows is None else rows
    for start in range(0, matrix.shape[0], rows):
        block = matrix[start : start + rows]
        if sp.issparse(block):
            yield start, block.toarray() if dense else sp.csr_matrix(block)
        else:
            yield start, np.asarray(block)


class ConditionSums:
    """Float64 sums per condition of the ``statistics`` (names of ``STATISTICS``) of the rows
    of a matrix, fed a block of rows at a time (``add``). ``codes`` gives each row its
    condition; rows with a negative code are left out. Rows are summed in blocks of about
    ``block_elements`` values."""

    def __init__(
        self,
        codes: np.ndarray,
        n_conditions: int,
        n_genes: int,
        statistics: Sequence[str] = ("sum",),
        block_elements: int | None = None,
    ):
        unknown = set(statistics) - set(STATISTICS)
        if unknown:
            raise ValueError(f"unknown statistics {sorted(unknown)}; known: {sorted(STATISTICS)}")
        self.codes = np.asarray(codes)
        self.n_conditions, self.step = n_conditions, block_rows(n_genes, block_elements)
        self.sums = {name: np.zeros((n_conditions, n_genes)) for name in statistics}

    @property
    def counts(self) -> np.ndarray:
        """Rows per condition."""
        return np.bincount(self.codes[self.codes >= 0], minlength=self.n_conditions)

    def add(self, start: int, block) -> None:
        """Add the rows ``start, start + 1, ...`` of the matrix: ``block``, dense or CSR. Its
        rows are summed in blocks of ``block_rows`` of the genes, counted from ``start``: the
        blocks of ``row_blocks`` when ``start`` is a multiple of that (as ``row_blocks``
        starts its blocks), so a block of several of them sums as they would."""
        for first in range(0, block.shape[0], self.step):
            self._add_rows(start + first, block[first : first + self.step])

    def _add_rows(self, start: int, block) -> None:
        block_codes = self.codes[start : start + block.shape[0]]
        kept = np.flatnonzero(block_codes >= 0)
        indicator = sp.csr_matrix(
            (np.ones(len(kept)), (block_codes[kept], kept)), shape=(self.n_conditions, len(block_codes))
        )
        values = block.toarray() if sp.issparse(block) else np.asarray(block)
        for name, sums in self.sums.items():
            sums += indicator @ np.asarray(STATISTICS[name](values), np.float64)

    def mean(self, name: str = "sum") -> np.ndarray:
        """(conditions x genes) means of statistic ``name``; NaN for a condition without rows."""
        with np.errstate(invalid="ignore"):
            return self.sums[name] / self.counts[:, None]


def condition_means(
    matrix, codes: np.ndarray, n_conditions: int, statistic: str = "sum", block_elements: int | None = None
) -> np.ndarray:
    """(conditions x genes) float64 means of the rows of ``matrix`` (see ``row_blocks``)
    grouped by ``codes``, of ``statistic`` (a name of ``STATISTICS``: the values, their
    squares, or whether they are non-zero). Rows with a negative code are left out; a
    condition without rows gets NaN. The rows are summed in blocks of about
    ``block_elements`` values."""
    sums = ConditionSums(codes, n_conditions, matrix.shape[1], (statistic,), block_elements)
    for start, block in row_blocks(matrix, block_elements):
        sums.add(start, block)
    return sums.mean(statistic)
