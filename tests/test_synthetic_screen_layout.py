"""The synthetic generator's ``"screen"`` layout: the same cells as its GEARS layout, written
as a screen comes (raw counts, ``obs['target_gene']``, ``non-targeting`` controls, gene
symbols as ``var_names``), and the ``"vcc"`` preset, shaped as the Virtual Cell Challenge's
training file, which ``gears-ddp process`` takes in one command."""

import contextlib
import logging
from io import StringIO

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from gears_ddp.cli import main
from gears_ddp.data import io
from gears_ddp.datasets import make_synthetic_perturb_seq, preset, write_synthetic_dataset, write_synthetic_screen

SMALL = dict(
    n_genes=120, n_modules=6, n_perturbed_genes=10, n_combos=6, cells_per_condition=12, n_control_cells=60, seed=5
)


def _screen_labels(conditions: pd.Series) -> list[str]:
    """GEARS conditions as the screen names them, written here without the library."""
    return ["non-targeting" if c == "ctrl" else c.replace("+ctrl", "") for c in conditions.astype(str)]


def test_the_screen_layout_holds_the_counts_that_normalise_to_the_gears_layout():
    import scanpy as sc

    gears = make_synthetic_perturb_seq(**SMALL)
    screen = make_synthetic_perturb_seq(**SMALL, layout="screen")
    counts = screen.adata.X
    assert sp.isspmatrix_csr(counts) and counts.dtype == np.float32
    assert np.all(np.mod(counts.data, 1) == 0) and counts.max() > np.log1p(1e4)  # whole numbers, beyond log1p
    normalised = screen.adata.copy()
    sc.pp.normalize_total(normalised, target_sum=1e4)
    sc.pp.log1p(normalised)
    np.testing.assert_allclose(normalised.X.toarray(), gears.adata.X.toarray(), atol=1e-5)
    assert list(screen.adata.obs.columns) == ["target_gene"]
    assert screen.adata.obs["target_gene"].astype(str).tolist() == _screen_labels(gears.adata.obs["condition"])
    assert "gene_name" not in screen.adata.var.columns and list(screen.adata.var_names) == list(gears.adata.var_names)
    pd.testing.assert_frame_equal(screen.true_means, gears.true_means)
    assert screen.gene2go == gears.gene2go and screen.params["layout"] == "screen"


@pytest.fixture(scope="module")
def vcc_screen(tmp_path_factory):
    """The ``"vcc"`` preset written as a raw screen, with its GO files beside it."""
    return write_synthetic_screen(tmp_path_factory.mktemp("vcc") / "data", "vcc_screen", **preset("vcc"))


def test_the_vcc_preset_is_shaped_as_the_challenge_s_training_file(vcc_screen):
    screen = anndata.read_h5ad(vcc_screen)
    assert list(screen.obs.columns) == ["target_gene"]  # no condition, no cell_type: one cell type
    labels = screen.obs["target_gene"].astype(str)
    assert (labels == "non-targeting").sum() == preset("vcc")["n_control_cells"]
    targets = set(labels) - {"non-targeting"}
    assert len(targets) == preset("vcc")["n_perturbed_genes"] and not any("+" in t for t in targets)  # singles only
    assert targets <= set(screen.var_names)  # knock-downs of measured genes, named by their symbols
    assert sp.isspmatrix_csr(screen.X) and np.all(np.mod(screen.X.data, 1) == 0)
    gene2go = io.read_pickle(vcc_screen.parent / "gene2go_all.pkl", "GO")
    assert all(gene2go.get(t) for t in targets)  # every target has GO terms: none is dropped


def test_the_vcc_shaped_screen_is_processed_in_one_command(vcc_screen, caplog):
    data = vcc_screen.parent
    argv = [
        "process",
        "--adata",
        str(vcc_screen),
        "--data-path",
        str(data),
        "--name",
        "vcc",
        "--perturbation-column",
        "target_gene",
        "--control-label",
        "non-targeting",
        "--normalize",
    ]
    with contextlib.redirect_stdout(StringIO()), caplog.at_level(logging.INFO, logger="gears_ddp"):
        assert main(argv) == 0
    processed = anndata.read_h5ad(data / "vcc" / io.PROCESSED_FILE)
    screen = anndata.read_h5ad(vcc_screen)
    assert list(processed.var["gene_name"]) == list(screen.var_names)
    assert "has no var['gene_name']: its var_names are taken as the gene symbols" in caplog.text
    labels = screen.obs["target_gene"].astype(str)
    expected = np.where(labels == "non-targeting", "ctrl", labels + "+ctrl")
    assert processed.obs["condition"].astype(str).tolist() == expected.tolist()


def test_a_screen_s_own_gene_names_are_kept(data_root):
    """var['gene_name'] is filled in from var_names only where the screen has none."""
    import toy_data

    from gears_ddp import PertData

    raw = toy_data.make_raw()
    labels = ["NT" if c == "ctrl" else c.replace("+ctrl", "").replace("+", "_") for c in raw.obs["condition"]]
    screen = anndata.AnnData(
        raw.X,
        obs=pd.DataFrame({"target": labels}, index=raw.obs_names),
        var=pd.DataFrame(
            {"gene_name": raw.var["gene_name"].to_numpy()}, index=[f"ENSG{i:011d}" for i in range(raw.n_vars)]
        ),
    )
    pert_data = PertData(data_root)
    pert_data.new_data_process(
        "own", screen, perturbation_column="target", control_label="NT", combination_separator="_"
    )
    assert list(pert_data.gene_names) == list(raw.var["gene_name"])


def test_a_screen_layout_is_refused_where_the_gears_layout_is_needed(tmp_path):
    with pytest.raises(ValueError, match=r"layout must be 'gears' .* or 'screen' .*, got 'vcc'"):
        make_synthetic_perturb_seq(**SMALL, layout="vcc")
    with pytest.raises(ValueError, match=r"layout='screen' is a screen as it comes: write it with write_synthetic_scr"):
        write_synthetic_dataset(tmp_path, layout="screen")
    assert not any(tmp_path.iterdir())
