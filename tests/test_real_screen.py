"""A real screen as it comes (Papalexi et al. 2021: raw UMI counts, its knockouts in
obs['target_gene'], controls 'non-targeting', no condition or cell type), with GO from GMT
gene sets, through ``gears-ddp process`` in one command, then ``gears-ddp train``.

The files are in the shared data beside the repository (``../shared/data/real``; their
README says what they hold). Where they are absent these tests skip, and fail under
``GEARS_DDP_REQUIRE_REFERENCE=1`` as CI sets it.
"""

import contextlib
import gzip
import json
import math
import os
from io import StringIO
from pathlib import Path

import anndata
import numpy as np
import pytest
from test_bad_input import _refused_in_one_line, _refused_naming

from gears_ddp import PertData
from gears_ddp.cli import main

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
SCREEN = REAL / "papalexi2021_thp1_raw.h5ad"
GENE_SETS = REAL / "go_biological_process_2021_human.gmt.gz"
OWN_COLUMNS = ["--perturbation-column", "target_gene", "--control-label", "non-targeting"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_files():
    missing = [str(path) for path in (SCREEN, GENE_SETS) if not path.is_file()]
    if missing:
        message = f"the real screen's files are absent: {missing}"
        if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return SCREEN, GENE_SETS


def _genes_with_sets() -> set:
    """Every gene of the GMT file, read here without the library."""
    with gzip.open(GENE_SETS, "rt", encoding="utf-8") as lines:
        return {gene for line in lines for gene in line.rstrip("\n").split("\t")[2:] if gene}


@pytest.fixture(scope="module")
def processed(real_files, tmp_path_factory):
    """The screen processed by one ``gears-ddp process`` command: the data folder and the
    command's last output line."""
    data = tmp_path_factory.mktemp("real") / "data"
    argv = [
        "process",
        "--adata",
        str(SCREEN),
        "--data-path",
        str(data),
        "--name",
        "papalexi",
        *OWN_COLUMNS,
        "--normalize",
        "--go-gene-sets",
        str(GENE_SETS),
        "--drop-unannotated",
    ]
    with contextlib.redirect_stdout(StringIO()) as out:
        assert main(argv) == 0
    return data, out.getvalue().strip().splitlines()[-1]


def test_the_real_screen_is_processed_from_its_raw_counts_in_one_command(processed):
    """Each cell's expression is scanpy's normalisation of its counts (total 1e4, log1p);
    each knockout becomes GEARS's ``GENE+ctrl`` and the controls ``ctrl``; the loaded data
    leaves out the cells of knockouts without GO terms, which the summary names."""
    import scanpy as sc

    data, summary = processed
    raw = anndata.read_h5ad(SCREEN)
    written = anndata.read_h5ad(data / "papalexi" / "perturb_processed.h5ad")
    assert list(written.obs_names) == list(raw.obs_names) and list(written.var_names) == list(raw.var_names)
    expected = raw.copy()
    sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)
    np.testing.assert_allclose(written.X.toarray(), expected.X.toarray(), rtol=1e-6, atol=1e-6)
    targets = raw.obs["target_gene"].astype(str)
    expected_conditions = np.where(targets == "non-targeting", "ctrl", targets + "+ctrl")
    assert list(written.obs["condition"].astype(str)) == list(expected_conditions)
    without_sets = sorted(set(targets) - {"non-targeting"} - _genes_with_sets())
    kept = int((~targets.isin(without_sets)).sum())
    assert summary.startswith(
        f"dataset papalexi: {kept} cells x {raw.n_vars} genes, {len(set(targets)) - len(without_sets)} conditions"
    )
    assert f"cells dropped: {', '.join(without_sets)}" in summary
    pert_data = PertData(data)
    pert_data.load(data_path=data / "papalexi")
    assert pert_data.cells.n_cells == kept


def test_a_gene_without_go_terms_is_named_unless_its_cells_are_dropped(processed, capsys):
    data, _ = processed
    without_sets = sorted(
        set(anndata.read_h5ad(SCREEN, backed="r").obs["target_gene"].astype(str))
        - {"non-targeting"}
        - _genes_with_sets()
    )
    assert without_sets  # the README: MARCH8 is MARCHF8 in the gene sets
    _refused_in_one_line(
        capsys,
        ["process", "--adata", str(SCREEN), "--data-path", str(data), "--name", "again", *OWN_COLUMNS, "--normalize"],
        *without_sets,
        "--drop-unannotated",
    )
    counts = ("holds raw counts", "--normalize")  # named with every other problem, at once
    _refused_naming(
        capsys,
        ["process", "--adata", str(SCREEN), "--data-path", str(data), "--name", "again", *OWN_COLUMNS],
        (*without_sets, "--drop-unannotated"),
        counts,
    )
    _refused_naming(
        capsys,
        [
            "process",
            "--adata",
            str(SCREEN),
            "--data-path",
            str(data),
            "--name",
            "again",
            "--perturbation-column",
            "gene",
            "--control-label",
            "non-targeting",
        ],
        ("no obs column 'gene'; its columns: target_gene, grna, bio_rep",),
        counts,
    )
    assert not (data / "again").exists()


def test_the_processed_real_screen_trains_and_reports_finite_test_metrics(processed, tmp_path, capsys):
    data, _ = processed
    run = tmp_path / "run"
    settings = {
        "pert_data_path": data,
        "dataset_name": "papalexi",
        "args.epochs": 1,
        "args.max_steps": 20,
        "args.cpu_processes": 1,
        "args.model_config.hidden_size": 16,
        "args.save_path": run,
    }
    assert main(["train", *[part for key, value in settings.items() for part in ("--set", f"{key}={value}")]]) == 0
    assert (run / "report.html").is_file()
    report = json.loads((run / "report.json").read_text())
    test_metrics = {name: value for name, value in report["model"].items() if name.startswith("test_")}
    assert {"test_mse", "test_pearson_delta", "test_mse_de"} <= set(test_metrics)
    assert all(math.isfinite(value) for value in test_metrics.values() if isinstance(value, (int, float))), test_metrics
