"""perturb_processed.h5ad is interchangeable with the published GEARS, both ways."""

import contextlib
import io

import numpy as np
import pytest
import toy_data
from reference_package import import_reference

from gears_ddp import PertData

UNS_KEYS = (
    "rank_genes_groups_cov_all",
    "top_non_dropout_de_20",
    "top_non_zero_de_20",
    "non_zeros_gene_idx",
    "non_dropout_gene_idx",
)


@pytest.fixture
def reference_pert_data(data_root):
    """The toy dataset processed by the published GEARS, in ``data_root/reference_toy``."""
    gears = import_reference("gears", runs_data_code=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pert_data = gears.PertData(str(data_root))
        pert_data.new_data_process("reference_toy", toy_data.make_raw())
    return pert_data


def _assert_same_uns(ours, theirs):
    for key in UNS_KEYS:
        assert set(ours[key]) == set(theirs[key]), key
        for name in theirs[key]:
            np.testing.assert_array_equal(np.asarray(ours[key][name]), np.asarray(theirs[key][name]), err_msg=key)


def test_we_read_a_file_written_by_the_published_gears(reference_pert_data, data_root):
    ours = PertData(data_root)
    ours.load(data_path=data_root / "reference_toy")
    assert ours.adata.n_obs == reference_pert_data.adata.n_obs
    for code, condition in enumerate(ours.cells.conditions):
        example = reference_pert_data.dataset_processed[condition][0]
        de = [i for i in np.asarray(example.de_idx).tolist() if i >= 0]
        assert ours.cells.condition_de_idx[code].tolist() == de + [-1] * (20 - len(de)), condition
        pert = [i for i in np.asarray(example.pert_idx).ravel().tolist() if i >= 0]
        assert ours.cells.condition_pert_idx[code].tolist() == pert + [-1] * (2 - len(pert)), condition


def test_our_processing_writes_what_the_published_gears_writes(reference_pert_data, data_root):
    ours = PertData(data_root)
    ours.new_data_process("our_toy", toy_data.make_raw())
    _assert_same_uns(ours.adata.uns, reference_pert_data.adata.uns)
    for column in ("condition", "condition_name", "dose_val", "control"):
        assert ours.adata.obs[column].astype(str).tolist() == reference_pert_data.adata.obs[column].astype(str).tolist()


def test_the_published_gears_reads_our_file(data_root):
    gears = import_reference("gears", runs_data_code=True)
    ours = PertData(data_root)
    ours.new_data_process("our_toy", toy_data.make_raw())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        reference = gears.PertData(str(data_root))
        reference.load(data_path=str(data_root / "our_toy"))
    _assert_same_uns(reference.adata.uns, ours.adata.uns)
    for code, condition in enumerate(ours.cells.conditions):
        example = reference.dataset_processed[condition][0]
        de = [i for i in np.asarray(example.de_idx).tolist() if i >= 0]
        assert ours.cells.condition_de_idx[code].tolist()[: len(de)] == de
    assert sum(len(v) for v in reference.dataset_processed.values()) == ours.adata.n_obs
