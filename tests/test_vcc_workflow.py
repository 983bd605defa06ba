"""The Virtual Cell Challenge workflow, ``examples/vcc_workflow.py``, end to end on the small
VCC-shaped synthetic screen: process, train with whole perturbations held out, predict a
chosen number of cells per held-out perturbation, and score with the real cell-eval. It ends
with cell-eval's scores, one row per held-out perturbation, and those perturbations were
never trained on."""

import importlib.util
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import yaml
from test_launch import _clean_environment

from gears_ddp import PertData
from gears_ddp.data.conditions import CONTROL, condition_genes

try:
    import cell_eval  # noqa: F401  (the example runs it)
except ImportError as err:  # CI installs the test extra and sets GEARS_DDP_REQUIRE_REFERENCE=1: fail there
    if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
        raise
    pytest.skip(f"cell-eval not importable (pip install -e '.[test]'): {err}", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vcc_workflow.py"
CELLS = 20  # predicted cells per held-out perturbation

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tens of seconds; training spawns a process


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """The example run once on the synthetic screen: its work folder and its output."""
    work = tmp_path_factory.mktemp("vcc")
    command = [
        sys.executable,
        str(EXAMPLE),
        "--work",
        str(work),
        "--epochs",
        "1",
        "--cells-per-perturbation",
        str(CELLS),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_clean_environment())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return work, done.stdout


def _run_split(work: Path) -> dict[str, list[str]]:
    """The sets the run was trained with, rebuilt from its config.yaml by the library."""
    config = yaml.safe_load((work / "run" / "config.yaml").read_text())
    pert_data = PertData(config["pert_data_path"])
    pert_data.load(data_path=str(Path(config["pert_data_path"]) / config["dataset_name"]))
    settings = {k: v for k, v in config["split_config"].items() if v is not None}
    pert_data.prepare_split(**settings)
    return pert_data.set2conditions


def _genes(conditions) -> set[str]:
    return {gene for condition in conditions for gene in condition_genes(condition)}


def test_the_workflow_ends_with_cell_eval_s_scores_of_each_held_out_perturbation(workflow):
    work, out = workflow
    results = pd.read_csv(work / "cell-eval" / "results.csv")
    held_out = _run_split(work)["test"]
    assert sorted(results["perturbation"]) == sorted(_genes(held_out))  # one row per held-out perturbation
    assert len(held_out) >= 2 and results["perturbation"].is_unique
    assert np.isfinite(results["pearson_delta"]).all() and results["pearson_delta"].abs().le(1).all()
    assert (results[["mse", "mae"]] >= 0).all().all()
    # the printed table is cell-eval's: a row per perturbation and their mean
    table = out[out.index("cell-eval's scores of the") :]
    for perturbation, value in zip(results["perturbation"], results["pearson_delta"]):
        assert re.search(rf"^ *{perturbation} +{value:.4f} ", table, re.MULTILINE), perturbation
    assert re.search(rf"^ *mean +{results['pearson_delta'].mean():.4f} ", table, re.MULTILINE)


def test_the_held_out_perturbations_were_not_trained_on(workflow):
    work, out = workflow
    sets = _run_split(work)
    held_out = _genes(sets["test"])
    assert held_out and not held_out & _genes(sets["train"] + sets["val"])
    assert all(CONTROL != c and len(condition_genes(c)) == 1 for c in sets["test"])  # whole single perturbations
    printed = re.search(r"^ test: \d+ perturbations: (.*)$", out, re.MULTILINE).group(1)
    assert set(printed.split(", ")) == held_out


def test_each_held_out_perturbation_has_the_chosen_number_of_predicted_cells(workflow):
    work, _ = workflow
    predicted = anndata.read_h5ad(work / "predictions" / "test.h5ad")
    truth = anndata.read_h5ad(work / "predictions" / "test.truth.h5ad")
    predicted_counts = predicted.obs["target_gene"].value_counts()
    true_counts = truth.obs["target_gene"].value_counts()
    assert set(predicted_counts.index) == set(true_counts.index)
    assert (predicted_counts.drop("non-targeting") == CELLS).all()
    assert (true_counts.drop("non-targeting") != CELLS).all()  # the data's own cells, not the chosen number
    assert predicted_counts["non-targeting"] == true_counts["non-targeting"]
    assert predicted.X.min() >= 0 and list(predicted.var_names) == list(truth.var_names)


def test_a_custom_split_holds_out_the_given_genes(workflow, tmp_path):
    """The example's custom split (--test-genes): those genes' perturbations in test, some of
    the others in val, the rest and the controls in train, which the library accepts."""
    work, _ = workflow
    spec = importlib.util.spec_from_file_location("vcc_workflow", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = yaml.safe_load((work / "run" / "config.yaml").read_text())
    pert_data = PertData(config["pert_data_path"])
    pert_data.load(data_path=str(Path(config["pert_data_path"]) / config["dataset_name"]))
    conditions = pert_data.cells.conditions
    genes = sorted(_genes(conditions))[:3]
    sets = example.custom_split(conditions, genes, seed=1)
    assert _genes(sets["test"]) == set(genes) and sets["val"] and CONTROL in sets["train"]
    assert sorted(sets["train"] + sets["val"] + sets["test"]) == sorted(conditions)
    assert not _genes(sets["test"]) & _genes(sets["train"] + sets["val"])
    path = tmp_path / "split.pkl"
    path.write_bytes(pickle.dumps(sets))
    pert_data.prepare_split("custom", split_dict_path=path)
    assert pert_data.set2conditions == sets
    with pytest.raises(SystemExit, match="--test-genes: no perturbation of NOTAGENE in the processed screen"):
        example.custom_split(conditions, [genes[0], "NOTAGENE"], seed=1)
