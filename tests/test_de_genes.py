"""The DE ranking equals scanpy's t-test ranking, which the published GEARS stores."""

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from gears_ddp.data.de_genes import order_by_magnitude, welch_t_scores
from gears_ddp.data.processing import RANK_KEY, add_condition_columns, rank_de_genes, read_expression


def _raw(matrix, conditions):
    n_genes = matrix.shape[1]
    genes = [f"G{i}" for i in range(n_genes)]
    return anndata.AnnData(
        matrix,
        obs=pd.DataFrame(
            {"condition": conditions, "cell_type": "K562"}, index=[f"c{i}" for i in range(len(conditions))]
        ),
        var=pd.DataFrame({"gene_name": genes}, index=genes),
    )


def _tie_heavy_expression(rng, n_cells, n_genes):
    """Log-normalised-looking counts with the cases that make ties: silent genes, copies of
    one gene, a gene constant across all cells, few distinct values."""
    counts = rng.poisson(rng.gamma(0.3, 1.0, n_genes), size=(n_cells, n_genes)).astype(np.float32)
    counts[:, :5] = 0  # silent everywhere: t = NaN -> 0
    counts[:, 5:9] = counts[:, [9]]  # identical genes: identical statistics
    counts[:, 10] = 2.0  # constant
    return np.log1p(counts).astype(np.float32)


def _scanpy_ranking(adata):
    """scanpy's ranking as the published GEARS asks for it: {group: (gene ids, scores)}."""
    scanpy = pytest.importorskip("scanpy")
    adata = adata.copy()
    scanpy.tl.rank_genes_groups(
        adata,
        groupby="condition_name",
        reference="K562_ctrl_1",
        rankby_abs=True,
        n_genes=adata.n_vars,
        use_raw=False,
        method="t-test",
    )
    result = adata.uns["rank_genes_groups"]
    return {
        group: ([str(g) for g in result["names"][group]], np.asarray(result["scores"][group], np.float64))
        for group in result["names"].dtype.names
    }


def _expressed_at_one_value(expression: np.ndarray) -> np.ndarray:
    """Genes (columns) whose cells (rows) all hold one nonzero value."""
    return (expression == expression[:1]).all(0) & (expression[0] != 0)


@pytest.mark.parametrize("sparse", [False, True])
def test_ranking_equals_scanpys(sparse):
    """Same statistics for each gene, in the same order; genes whose |t| is within rounding of
    another's may swap (scanpy's own order for them depends on its release, format and
    threads), all others match. Genes that a condition, or control, expresses at one nonzero
    value are left out of that condition's comparison: scanpy before 1.12 may rank them 0
    (``test_a_gene_expressed_at_one_value_in_a_condition_gets_its_t``)."""
    rng = np.random.default_rng(3)
    conditions = ["ctrl"] * 60 + ["A+ctrl"] * 7 + ["B+ctrl"] * 2 + ["A+B"] * 11 + ["C+ctrl"] * 25
    expression = _tie_heavy_expression(rng, len(conditions), 300)
    adata = _raw(sp.csr_matrix(expression) if sparse else expression, conditions)
    add_condition_columns(adata)
    expected = _scanpy_ranking(adata)
    groups = list(adata.obs["condition_name"].cat.categories)
    codes = adata.obs["condition_name"].cat.codes.to_numpy(np.int64)
    scores = welch_t_scores(adata.X, codes, groups, groups.index("K562_ctrl_1"))
    rank_de_genes(adata, read_expression(adata))
    ours = adata.uns[RANK_KEY]
    assert list(ours) == list(expected)  # same conditions, in scanpy's order
    at_one_value_in_control = _expressed_at_one_value(expression[codes == groups.index("K562_ctrl_1")])
    for name, (genes, their_scores) in expected.items():
        at_one_value = at_one_value_in_control | _expressed_at_one_value(expression[codes == groups.index(name)])
        compared = [not at_one_value[int(g[1:])] for g in genes]
        genes, their_scores = np.asarray(genes)[compared], their_scores[compared]
        our_genes = np.asarray([g for g in ours[name] if not at_one_value[int(g[1:])]])
        our_scores = scores[groups.index(name)][[int(g[1:]) for g in genes]]
        np.testing.assert_allclose(our_scores, their_scores, rtol=1e-6, atol=1e-12, err_msg=name)
        magnitude = np.abs(their_scores)
        close = np.isclose(magnitude[:, None], magnitude[None, :], rtol=1e-6, atol=1e-12)
        unambiguous = close.sum(1) == 1
        assert unambiguous.sum() > 100, name  # the comparison below has teeth
        assert np.array_equal(our_genes[unambiguous], genes[unambiguous]), name
    assert _expressed_at_one_value(expression[codes == groups.index("K562_B+ctrl_1+1")]).sum() > 5  # left out


def test_a_gene_expressed_at_one_value_in_a_condition_gets_its_t():
    """A condition whose cells all express a gene at one value has variance 0 there: its Welch
    t is the difference of means over control's standard error alone (scipy's ``ttest_ind``
    of the cells), as scanpy 1.12 gives it. Rounding in E[x^2] - E[x]^2 made that variance
    slightly negative, the t NaN and the gene ranked last (scanpy before 1.12 does so)."""
    from scipy import stats

    rng = np.random.default_rng(0)
    control = np.log1p(rng.poisson(0.3, size=(60, 40))).astype(np.float32)
    condition = np.log1p(rng.poisson(0.3, size=(2, 40))).astype(np.float32)
    condition[:, :8] = np.log1p(np.arange(1, 9, dtype=np.float32))  # each of 8 genes at one value
    expression = np.vstack([control, condition])
    codes = np.repeat([0, 1], [60, 2])
    scores = welch_t_scores(expression, codes, ["ctrl", "A+ctrl"], reference=0)[1]
    expected = stats.ttest_ind(condition.astype(np.float64), control.astype(np.float64), equal_var=False).statistic
    expected[np.isnan(expected)] = 0
    np.testing.assert_allclose(scores, expected, rtol=1e-4)
    assert (np.abs(scores[:8]) > 2).all()  # large, not 0
    adata = _raw(expression, ["ctrl"] * 60 + ["A+ctrl"] * 2)
    add_condition_columns(adata)
    rank_de_genes(adata, read_expression(adata))
    assert set(adata.uns[RANK_KEY]["K562_A+ctrl_1+1"][:8]) <= {f"G{i}" for i in range(40) if abs(expected[i]) > 2}


def test_tied_silent_genes_keep_the_published_order():
    """Exact ties (genes silent in a condition and in control, t = 0) are ordered as the
    published GEARS orders them: scanpy's sort of |t|."""
    rng = np.random.default_rng(5)
    expression = rng.normal(2.0, 1.0, size=(40, 60)).astype(np.float32) ** 2
    expression[:, ::3] = 0
    adata = _raw(expression, ["ctrl"] * 20 + ["A+ctrl"] * 10 + ["A+B"] * 10)
    add_condition_columns(adata)
    expected = _scanpy_ranking(adata)
    rank_de_genes(adata, read_expression(adata))
    for name, (genes, _) in expected.items():
        assert adata.uns[RANK_KEY][name] == genes, name


def test_statistics_follow_welchs_definition():
    rng = np.random.default_rng(0)
    expression = rng.normal(3.0, 1.0, size=(9, 4))
    codes = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    scores = welch_t_scores(expression, codes, ["ctrl", "a", "b"], reference=0)
    control = expression[codes == 0]
    for group in (1, 2):
        cells = expression[codes == group]
        expected = (cells.mean(0) - control.mean(0)) / np.sqrt(
            cells.var(0, ddof=1) / len(cells) + control.var(0, ddof=1) / len(control)
        )
        np.testing.assert_allclose(scores[group], expected, rtol=1e-10)
    assert (scores[0] == 0).all()


def test_rows_with_negative_codes_are_left_out():
    rng = np.random.default_rng(1)
    expression = rng.normal(size=(12, 5))
    codes = np.array([0, 0, 0, 1, 1, 1, -1, -1, 0, 1, -1, 0])
    kept = codes >= 0
    np.testing.assert_array_equal(
        welch_t_scores(expression, codes, ["ctrl", "a"], 0),
        welch_t_scores(expression[kept], codes[kept], ["ctrl", "a"], 0),
    )


def test_order_is_by_decreasing_magnitude():
    scores = np.array([0.5, -3.0, 0.0, 2.0, -0.1])
    assert order_by_magnitude(scores).tolist() == [1, 3, 0, 4, 2]


def test_a_condition_with_one_cell_is_named():
    expression = np.ones((5, 3), dtype=np.float32)
    adata = _raw(expression, ["ctrl", "ctrl", "A+ctrl", "B+ctrl", "B+ctrl"])
    add_condition_columns(adata)
    with pytest.raises(ValueError, match=r"K562_A\+ctrl_1.*fewer than two cells.*skip_calc_de"):
        rank_de_genes(adata, read_expression(adata))
