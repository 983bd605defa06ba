"""The real screen inside the package (``gears_ddp.datasets.papalexi2021``): the raw screen a
user would have, the GO gene sets its model reads, their notice, the dataset the demo
processes from them, and the files in the built wheel.

The packaged files are checked against the shared originals (``../shared/data/real``) where
those are present; there the tests that need them skip, and fail under
``GEARS_DDP_REQUIRE_REFERENCE=1`` as CI sets it.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import anndata
import numpy as np
import pytest
import torch

from gears_ddp import PertData
from gears_ddp.data import io
from gears_ddp.data.gene_sets import read_gene_sets
from gears_ddp.data.go_files import GENE2GO_FILE, write_go_files
from gears_ddp.data.graphs import go_edge_list, jaccard_edge_list, to_gene_graph
from gears_ddp.datasets import papalexi2021, papalexi2021_go_gene_sets, write_papalexi2021_dataset
from gears_ddp.datasets.go_neighbourhood import go_neighbourhood, restrict_gene_sets
from gears_ddp.datasets.real_screen import (
    CONTROL_LABEL,
    GO_LAYERS,
    GO_SIMILAR_GENES,
    NAME,
    NOTICE_FILE,
    PERTURBATION_COLUMN,
    SCREEN_FILE,
    packaged_file,
    write_papalexi2021_go_gene_sets,
)
from gears_ddp.model.graph_conv import normalised_edges
from gears_ddp.model.model_options import ModelOptions

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real"
SHARED_SCREEN = REAL / SCREEN_FILE
FULL_GENE_SETS = REAL / "go_biological_process_2021_human.gmt.gz"


def _shared(path: Path) -> Path:
    if not path.is_file():
        message = f"the shared original {path} is absent"
        if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _targets(adata) -> list[str]:
    return sorted(set(adata.obs[PERTURBATION_COLUMN].astype(str)) - {CONTROL_LABEL})


# ----------------------------------------------------------------------------- the raw screen


def test_the_screen_comes_as_a_user_has_it_raw_counts_and_its_own_columns():
    screen = papalexi2021()
    counts = screen.X.data
    assert screen.n_obs > 0 and screen.n_vars > 0
    assert np.all(counts >= 0) and np.array_equal(counts, np.round(counts)) and counts.max() > 1
    labels = screen.obs[PERTURBATION_COLUMN].astype(str)
    assert (labels == CONTROL_LABEL).any() and labels.nunique() > 2
    assert "condition" not in screen.obs and "cell_type" not in screen.obs
    assert list(screen.var["gene_name"]) == list(screen.var_names)


def test_the_packaged_screen_is_the_shared_original():
    shared = anndata.read_h5ad(_shared(SHARED_SCREEN))
    packaged = papalexi2021()
    assert (packaged.X != shared.X).nnz == 0 and packaged.X.dtype == shared.X.dtype
    assert packaged.obs.equals(shared.obs) and packaged.var.equals(shared.var)


def test_the_notice_names_the_sources_licences_and_citation():
    notice = packaged_file(NOTICE_FILE).read_text(encoding="utf-8")
    for needed in (
        "Papalexi",
        "Nature Genetics",
        "10.1038/s41588-021-00778-2",
        "sceptredata",
        "MIT License",
        "GSEApy",
        "BSD 3-Clause License",
        "CC BY 4.0",
        SCREEN_FILE,
        papalexi2021_go_gene_sets().name,
    ):
        assert needed in notice, needed


# ----------------------------------------------------------------------------- the GO gene sets


def test_the_neighbourhood_reaches_one_step_further_than_the_layers():
    # Jaccard: A-B 1/2, B-C, C-D, D-E 1/3; F shares nothing
    gene2go = {"A": {"t1"}, "B": {"t1", "t2"}, "C": {"t2", "t3"}, "D": {"t3", "t4"}, "E": {"t4", "t5"}, "F": {"t9"}}
    assert go_neighbourhood(gene2go, ["A", "unannotated"], k=20, layers=0) == {"A", "B"}
    assert go_neighbourhood(gene2go, ["A"], k=20, layers=1) == {"A", "B", "C"}
    assert go_neighbourhood(gene2go, ["A"], k=20, layers=2) == {"A", "B", "C", "D"}
    assert go_neighbourhood(gene2go, ["A"], k=0, layers=2) == {"A"}  # its one source: itself


def test_restricted_gene_sets_keep_each_kept_gene_with_all_its_sets(tmp_path):
    source = tmp_path / "sets.gmt"
    source.write_text("one (GO:0000001)\t\tA\tB\tC\ntwo (GO:0000002)\tdescribed\tC\tD\nthree\t\tD\n")
    out = restrict_gene_sets(source, {"A", "C"}, tmp_path / "kept.gmt.gz")
    assert read_gene_sets(out) == {"A": {"GO:0000001"}, "C": {"GO:0000001", "GO:0000002"}}
    assert restrict_gene_sets(source, {"A", "C"}, tmp_path / "again.gmt.gz").read_bytes() == out.read_bytes()


def test_the_gene_sets_are_made_for_the_published_go_graph_defaults():
    defaults = ModelOptions()
    assert (GO_SIMILAR_GENES, GO_LAYERS) == (defaults.num_similar_genes_go_graph, defaults.num_go_gnn_layers)


@pytest.mark.slow
def test_the_packaged_gene_sets_are_the_full_library_restricted_as_documented(tmp_path):
    full = read_gene_sets(_shared(FULL_GENE_SETS))
    packaged = read_gene_sets(papalexi2021_go_gene_sets())
    assert packaged == {gene: full[gene] for gene in packaged}
    assert set(_targets(papalexi2021())) & set(full) <= set(packaged)
    remade = write_papalexi2021_go_gene_sets(FULL_GENE_SETS, tmp_path / "remade.gmt.gz")
    assert remade.read_bytes() == papalexi2021_go_gene_sets().read_bytes()


def _incoming(gene2go: dict, targets) -> dict:
    """Each target's normalised incoming GO edges (source, weight), as the model's graph
    convolution weighs them, over the vocabulary of every gene of ``gene2go``."""
    vocabulary = sorted(gene2go)
    index = {gene: i for i, gene in enumerate(vocabulary)}
    graph = to_gene_graph(go_edge_list(jaccard_edge_list(gene2go, vocabulary), vocabulary, GO_SIMILAR_GENES), index)
    source, target, weight = normalised_edges(graph.edge_index, graph.edge_weight, len(vocabulary), torch.float64)
    return {
        gene: sorted(
            (vocabulary[s], round(w, 12))
            for s, w in zip(source[target == index[gene]].tolist(), weight[target == index[gene]].tolist())
        )
        for gene in targets
    }


@pytest.mark.slow
def test_the_knocked_out_genes_have_the_same_go_neighbourhoods_as_in_the_full_graph():
    """What the model reads at a knocked-out gene: its sources and their normalised weights
    (which hold the sources' degrees). A neighbourhood one step shorter changes them."""
    full = read_gene_sets(_shared(FULL_GENE_SETS))
    targets = [gene for gene in _targets(papalexi2021()) if gene in full]
    expected = _incoming(full, targets)
    assert _incoming(read_gene_sets(papalexi2021_go_gene_sets()), targets) == expected
    shorter = go_neighbourhood(full, targets, GO_SIMILAR_GENES, GO_LAYERS - 1)
    assert _incoming({gene: full[gene] for gene in shorter}, targets) != expected


# ----------------------------------------------------------------------------- the processed dataset


def test_the_dataset_is_processed_once_from_the_packaged_files(tmp_path):
    folder = write_papalexi2021_dataset(tmp_path)
    assert folder == tmp_path / NAME
    written = anndata.read_h5ad(folder / io.PROCESSED_FILE, backed="r")
    labels = papalexi2021().obs[PERTURBATION_COLUMN].astype(str)
    assert list(written.obs["condition"].astype(str)) == list(
        np.where(labels == CONTROL_LABEL, "ctrl", labels + "+ctrl")
    )
    gene_sets = read_gene_sets(papalexi2021_go_gene_sets())
    pert_data = PertData(tmp_path)
    pert_data.load(data_path=folder)
    assert set(pert_data.pert_names) == set(gene_sets)
    assert pert_data.cells.n_cells == int(labels.isin([CONTROL_LABEL, *gene_sets]).sum())
    modified = (folder / io.PROCESSED_FILE).stat().st_mtime_ns
    assert write_papalexi2021_dataset(tmp_path) == folder
    assert (folder / io.PROCESSED_FILE).stat().st_mtime_ns == modified


def test_go_files_of_another_annotation_are_refused_not_replaced(tmp_path):
    write_go_files(tmp_path, {"GENE": {"GO:0000001"}})
    with pytest.raises(FileExistsError, match="other GO annotations"):
        write_papalexi2021_dataset(tmp_path)
    assert io.read_pickle(tmp_path / GENE2GO_FILE, "GO") == {"GENE": {"GO:0000001"}}
    assert not (tmp_path / NAME).exists()


# ----------------------------------------------------------------------------- installed


@pytest.mark.slow
def test_the_built_wheel_holds_the_screen_its_gene_sets_and_notice(tmp_path):
    """Built from a copy of setup.py, README.md and the package, as pip builds an install."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(ROOT / "gears_ddp", source / "gears_ddp", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))) as wheel:
        names = set(wheel.namelist())
    folder = Path("gears_ddp") / "datasets" / NAME
    packaged = {(folder / path.name).as_posix() for path in packaged_file(NOTICE_FILE).parent.iterdir()}
    assert packaged >= {
        (folder / name).as_posix() for name in (SCREEN_FILE, papalexi2021_go_gene_sets().name, NOTICE_FILE)
    }
    assert packaged <= names
