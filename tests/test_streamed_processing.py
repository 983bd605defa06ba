"""Processing reads a screen a block of cells at a time, normalising, summing and writing each
block as it comes: the result is scanpy's on the whole matrix, the same whatever the blocks,
and bad counts are refused in one line with nothing left behind."""

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from test_bad_input import _refused_in_one_line, _refused_naming
from test_raw_screens import _counts, _own_columns

from gears_ddp import PertData
from gears_ddp.data import grouped, io, normalization
from gears_ddp.data.grouped import ConditionSums, row_blocks
from gears_ddp.data.highly_variable import highly_variable
from gears_ddp.data.processing import RANK_KEY

N_GENES = 40  # the toy screen's


@pytest.fixture
def small_blocks(monkeypatch):
    """Sums over 7 cells at a time, normalisation 21 cells at a time (16 blocks of the toy screen)."""
    monkeypatch.setattr(grouped, "BLOCK_ELEMENTS", 7 * N_GENES)
    monkeypatch.setattr(normalization, "COUNTS_PER_BLOCK", 21 * N_GENES)


def _scanpy_normalised(counts):
    import scanpy as sc

    expected = counts.copy()
    sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)
    return expected


def _processed(folder):
    return anndata.read_h5ad(folder / io.PROCESSED_FILE)


def test_counts_normalised_in_blocks_are_scanpy_s_whole_matrix_and_process_as_in_one_block(
    data_root, monkeypatch, small_blocks
):
    expected = _scanpy_normalised(_counts()).X
    PertData(data_root).new_data_process("blocks", _counts(), normalize=True)
    streamed = _processed(data_root / "blocks")
    for part in ("data", "indices", "indptr"):  # the same CSR, value for value
        np.testing.assert_array_equal(getattr(streamed.X, part), getattr(expected, part))
    assert streamed.X.dtype == np.float32

    monkeypatch.setattr(grouped, "BLOCK_ELEMENTS", 10**9)  # every cell in one block: the matrix in memory
    monkeypatch.setattr(normalization, "COUNTS_PER_BLOCK", 10**9)
    PertData(data_root).new_data_process("whole", _counts(), normalize=True)
    whole = _processed(data_root / "whole")
    assert len(whole.uns[RANK_KEY]) == 18
    for key in (RANK_KEY, "non_zeros_gene_idx", "non_dropout_gene_idx", "top_non_zero_de_20", "top_non_dropout_de_20"):
        assert streamed.uns[key].keys() == whole.uns[key].keys()
        for name in whole.uns[key]:
            np.testing.assert_array_equal(streamed.uns[key][name], whole.uns[key][name])

    dense = expected.toarray()  # the gene sets, from their definition
    conditions = streamed.obs["condition"].astype(str).to_numpy()
    control_zero = ~(dense[conditions == "ctrl"] != 0).any(0)
    for name, condition in zip(streamed.obs["condition_name"].astype(str), conditions):
        if condition != "ctrl":
            nonzero = (dense[conditions == condition] != 0).any(0)
            np.testing.assert_array_equal(streamed.uns["non_zeros_gene_idx"][name], np.flatnonzero(nonzero))
            np.testing.assert_array_equal(
                streamed.uns["non_dropout_gene_idx"][name], np.flatnonzero(nonzero | control_zero)
            )


def test_highly_variable_genes_from_blocks_are_scanpy_s_to_the_bit(monkeypatch):
    import scanpy as sc

    monkeypatch.setattr(grouped, "BLOCK_ELEMENTS", 7 * N_GENES)
    rng = np.random.default_rng(4)
    counts = rng.negative_binomial(2, 2 / (2 + rng.lognormal(0, 1.5, N_GENES)), size=(1500, N_GENES))
    outlying = rng.choice(N_GENES, 15, replace=False)  # a few cells far out: clipped, and squares float32 rounds
    counts[rng.integers(0, 1500, (3, 15)), outlying] = rng.integers(5000, 30000, (3, 15))
    counts = sp.csr_matrix(counts.astype(np.float32))
    theirs = sc.pp.highly_variable_genes(anndata.AnnData(counts), n_top_genes=8, flavor="seurat_v3", inplace=False)
    ours = highly_variable(counts, 8)
    assert ours["highly_variable"].sum() == 8
    for column in ("highly_variable", "highly_variable_rank", "means", "variances", "variances_norm"):
        np.testing.assert_array_equal(ours[column].to_numpy(), theirs[column].to_numpy(), err_msg=column)


def test_normalising_dense_counts_leaves_them_as_they_were(data_root, small_blocks):
    counts = _counts()
    counts.X = counts.X.toarray()
    before = counts.X.copy()
    pert_data = PertData(data_root, expression_storage="memory")
    pert_data.new_data_process("dense", counts, normalize=True)
    np.testing.assert_array_equal(counts.X, before)
    np.testing.assert_array_equal(pert_data.adata.X, _scanpy_normalised(_counts()).X.toarray())


def test_negative_counts_in_any_block_are_all_counted_and_nothing_is_left(data_root, small_blocks):
    counts = _counts()
    x = counts.X.toarray()
    x[2, 3], x[300, 5] = -1, -2  # in the first and the last block of 21 cells
    counts.X = sp.csr_matrix(x)
    with pytest.raises(ValueError, match=r"has 2 negative values \(min -2\); raw counts are never negative"):
        PertData(data_root).new_data_process("negative", counts, normalize=True)
    assert not (data_root / "negative").exists()


def test_the_process_command_refuses_bad_counts_naming_every_problem(tmp_path, capsys, small_blocks):
    import toy_data

    data_path = tmp_path / "data"
    toy_data.write_go_files(data_path)
    screen = _own_columns(_counts())
    x = screen.X.toarray()
    x[200, 7] = np.nan
    screen.X = sp.csr_matrix(x)
    raw = tmp_path / "screen.h5ad"
    screen.write_h5ad(raw)
    command = [
        "process",
        "--adata",
        str(raw),
        "--data-path",
        str(data_path),
        "--name",
        "own",
        "--normalize",
        "--perturbation-column",
        "target",
        "--control-label",
        "NT",
        "--combination-separator",
        "_",
    ]
    _refused_in_one_line(capsys, command, "AnnData for dataset 'own' has 1 non-finite values", "raw counts are finite")
    nan = ("AnnData for dataset 'own' has 1 non-finite values", "raw counts are finite")  # named with the others
    _refused_naming(
        capsys,
        command[:-6] + ["--perturbation-column", "guide", "--control-label", "NT"],
        ("no obs column 'guide'; its columns: target",),
        nan,
    )
    _refused_naming(
        capsys,
        command[:-4] + ["--control-label", "control", "--combination-separator", "_"],
        ("no cell of obs['target'] has the control label 'control'", "NT (120)"),
        nan,
    )
    assert not (data_path / "own").exists()


def test_sums_of_blocks_depend_only_on_where_the_summed_blocks_start(monkeypatch):
    monkeypatch.setattr(grouped, "BLOCK_ELEMENTS", 7 * N_GENES)
    rng = np.random.default_rng(0)  # values of many magnitudes, so that sums round
    values = rng.gamma(2.0, 1.5, (300, N_GENES)) * 2.0 ** rng.integers(-30, 30, (300, N_GENES))
    dense = np.where(rng.random((300, N_GENES)) < 0.5, values, 0).astype(np.float32)
    codes = rng.integers(-1, 6, size=300)
    statistics = ("sum", "sum_squares", "nonzero")
    by_row_blocks = ConditionSums(codes, 6, N_GENES, statistics)
    for start, block in row_blocks(dense):  # 7 rows each
        by_row_blocks.add(start, block)
    in_threes = ConditionSums(codes, 6, N_GENES, statistics)
    for start, block in row_blocks(sp.csr_matrix(dense), dense=False, rows=21):  # 3 summed blocks each, sparse
        in_threes.add(start, block)
    for name in statistics:
        np.testing.assert_array_equal(in_threes.sums[name], by_row_blocks.sums[name], err_msg=name)
    np.testing.assert_allclose(
        in_threes.mean("sum"), [dense[codes == c].astype(np.float64).mean(0) for c in range(6)], rtol=1e-12
    )


def test_a_matrix_written_in_blocks_widens_its_row_pointers_when_int32_no_longer_holds_them(tmp_path, monkeypatch):
    monkeypatch.setattr(io.CsrRows, "INT32_VALUES", 50)  # as if int32 held 50 values
    blocks = [sp.random(10, 8, density=0.5, format="csr", dtype=np.float32, random_state=seed) for seed in range(4)]
    cells = anndata.AnnData(
        obs=pd.DataFrame(index=[f"c{i}" for i in range(40)]), var=pd.DataFrame(index=[f"g{i}" for i in range(8)])
    )
    path = tmp_path / "blocks.h5ad"
    with io.h5ad_by_blocks(path, cells, np.float32) as expression:
        expression.append(blocks[0])
        assert expression.group["indptr"].dtype == np.int32
        for block in blocks[1:]:
            expression.append(block)
        cells.uns["written"] = "after the blocks"
    with h5py.File(path) as handle:
        assert handle["X/indptr"].dtype == np.int64
    written = anndata.read_h5ad(path)
    np.testing.assert_array_equal(written.X.toarray(), sp.vstack(blocks).toarray())
    assert written.uns["written"] == "after the blocks"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_block_is_normalised_as_scanpy_normalises_it_to_the_bit(dtype):
    """``normalised_in_place`` against ``sc.pp.normalize_total(target_sum=1e4)`` then
    ``sc.pp.log1p`` on counts with cells of no stored value (first, inside, last), a cell whose
    stored values are all zero, large counts and unsorted columns: the same CSR, value for value."""
    import scanpy as sc

    rng = np.random.default_rng(3)
    dense = rng.negative_binomial(1, 0.05, size=(60, 300)).astype(dtype)
    dense[rng.random(dense.shape) < 0.7] = 0
    dense[[0, 17, 59]] = 0  # cells with nothing stored
    dense[5, :3] = [40000, 65000, 90000]  # counts far above the rest
    counts = sp.csr_matrix(dense)
    counts.data[counts.indptr[23] : counts.indptr[24]] = 0  # stored zeros: a cell of no counts
    for cell in range(counts.shape[0]):
        stored = slice(counts.indptr[cell], counts.indptr[cell + 1])
        permuted = rng.permutation(stored.stop - stored.start)
        counts.indices[stored], counts.data[stored] = counts.indices[stored][permuted], counts.data[stored][permuted]
    counts.has_sorted_indices = False  # shuffle each cell's columns: its values are summed in their stored order
    assert np.diff(counts.indptr)[23] > 0
    expected = anndata.AnnData(counts.copy())
    with pytest.warns(UserWarning, match="zero counts"):
        sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)

    ours = normalization.normalised_in_place(counts.copy())
    assert ours.dtype == dtype
    for part in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(ours, part), getattr(expected.X, part), err_msg=part)


def test_processing_raw_counts_imports_neither_scanpy_nor_numba(data_root):
    """Normalising and choosing genes are gears_ddp's own code: a process that processes raw
    counts never imports scanpy (seconds) or numba (whose kernels compile on a machine without
    their cache)."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    script = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from test_raw_screens import _counts\n"
        "from gears_ddp import PertData\n"
        "PertData(sys.argv[1]).new_data_process('counts', _counts(), normalize=True, n_top_genes=20)\n"
        "print(sorted(name for name in ('scanpy', 'numba') if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_root), str(tests)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (data_root / "counts" / io.PROCESSED_FILE).is_file()
