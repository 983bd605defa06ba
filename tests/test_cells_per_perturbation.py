"""A chosen number of predicted cells per perturbation (``cells_per_perturbation``; ``gears-ddp
predict --cells-per-perturbation N``), as a challenge asks for: N control cells drawn with a
seed, each plus the perturbation's predicted change, for a split's perturbations and for
queries alike."""

import numpy as np
import pytest
import torch
from test_bad_input import _refused_in_one_line

from gears_ddp import GEARS, PertData
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.datasets import write_synthetic_dataset
from gears_ddp.inference import cell_eval_export, model_queries
from gears_ddp.inference.cell_eval_export import CONTROL_LABEL, PERT_COLUMN, PROVENANCE_KEY, target_of
from gears_ddp.inference.prediction import drawn_control_cells, query_sets
from gears_ddp.runtime import memory_budget

SMALL = dict(n_genes=100, n_modules=6, n_perturbed_genes=12, n_combos=10, cells_per_condition=10, n_control_cells=100)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> GEARS:
    """A small model trained one epoch on the synthetic dataset (simulation split)."""
    root = tmp_path_factory.mktemp("synthetic")
    pert_data = PertData(root)
    pert_data.load(data_path=str(write_synthetic_dataset(root, **SMALL)))
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(32, test_batch_size=128)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1)
    return gears


def _rows(adata, column: str, value: str) -> np.ndarray:
    return adata.X[(adata.obs[column] == value).to_numpy()]


def test_each_perturbation_of_the_split_gets_the_chosen_number_of_cells(trained):
    predicted, real = trained.predict_split(cells_per_perturbation=7, seed=3)
    tested = [c for c in trained.pert_data.set2conditions["test"] if c != CONTROL]
    counts = predicted.obs[PERT_COLUMN].value_counts()
    n_controls = len(trained.pert_data.cells.control_cells())
    assert counts.drop(CONTROL_LABEL).to_dict() == {target_of(c): 7 for c in tested}
    assert counts[CONTROL_LABEL] == n_controls
    every_cell, every_truth = trained.predict_split()  # one predicted cell per cell of the set
    assert (every_cell.obs[PERT_COLUMN].value_counts().drop(CONTROL_LABEL) != 7).any()
    np.testing.assert_array_equal(real.X, every_truth.X)  # the truth does not depend on the predicted cells
    assert real.obs.equals(every_truth.obs)
    np.testing.assert_array_equal(_rows(predicted, PERT_COLUMN, CONTROL_LABEL), _rows(real, PERT_COLUMN, CONTROL_LABEL))
    provenance = predicted.uns[PROVENANCE_KEY]
    assert provenance["cells_per_perturbation"] == 7 and provenance["seed"] == 3 and "pairing_seed" not in provenance
    assert provenance["control_cells"] == n_controls


def test_a_split_s_cells_are_those_predict_gives_its_perturbations(trained):
    """Each perturbation's N cells are the N control cells drawn with the seed, each plus its
    predicted change and clipped at 0: ``GEARS.predict(..., return_type='cell-eval')`` of the
    same perturbations, seed and N."""
    predicted, _ = trained.predict_split(cells_per_perturbation=6, seed=4)
    tested = [c for c in trained.pert_data.set2conditions["test"] if c != CONTROL]
    queried = trained.predict(
        [condition_genes(c) for c in tested], return_type="cell-eval", seed=4, cells_per_perturbation=6
    )
    for condition in tested:
        np.testing.assert_allclose(
            _rows(predicted, "condition", condition), _rows(queried, "condition", condition), atol=1e-6
        )
    first = predicted.obs_names[(predicted.obs["condition"] == tested[0]).to_numpy()]
    assert list(first) == [f"{tested[0]}:{k}" for k in range(6)]


def test_a_query_s_prediction_averages_the_chosen_number_of_control_cells(trained):
    gene = trained.pert_list[0]
    drawn = drawn_control_cells(trained.pert_data.cells, 2, 5)
    effect, _ = trained.perturbation_effects(query_sets([[gene]], trained.node_map_pert))
    mean = trained.predict([[gene]], seed=2, cells_per_perturbation=5)[gene]
    np.testing.assert_allclose(mean, (drawn.mean(0) + effect[0].cpu()).numpy(), atol=1e-5)
    cells = trained.predict([[gene]], return_type="cell-eval", seed=2, cells_per_perturbation=5)
    assert cells.obs[PERT_COLUMN].value_counts().to_dict() == {gene: 5, CONTROL_LABEL: 5}
    np.testing.assert_array_equal(_rows(cells, PERT_COLUMN, CONTROL_LABEL), drawn.numpy())
    summary = trained.predict([[gene]], return_type="anndata", seed=2, cells_per_perturbation=5)
    assert summary.uns[PROVENANCE_KEY]["control_cells"] == 5
    np.testing.assert_allclose(summary.X[0], mean, atol=1e-6)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_a_bad_number_of_cells_is_refused(trained, bad):
    with pytest.raises(ValueError, match=rf"cells_per_perturbation must be a whole number >= 1, got {bad!r}$"):
        trained.predict_split(cells_per_perturbation=bad)
    with pytest.raises(ValueError, match=rf"cells_per_perturbation must be a whole number >= 1, got {bad!r}$"):
        trained.predict([[trained.pert_list[0]]], cells_per_perturbation=bad)


def test_the_command_refuses_a_bad_number_of_cells_before_loading_the_run(tmp_path, capsys):
    _refused_in_one_line(
        capsys,
        [
            "predict",
            "--run",
            str(tmp_path / "no-run"),
            "--split",
            "test",
            "--format",
            "cell-eval",
            "--cells-per-perturbation",
            "0",
            "--out",
            str(tmp_path / "t.h5ad"),
        ],
        "cells_per_perturbation must be a whole number >= 1, got 0",
    )


def test_more_cells_than_the_memory_holds_are_refused_before_any_is_made(trained, monkeypatch):
    """Asked for more cells than the machine holds, a prediction says so, with both sizes, and
    nothing is drawn (torch's allocator failed deep inside, or the OOM killer came)."""
    monkeypatch.setattr(memory_budget, "available_memory_bytes", lambda: 64 * 2**20)  # 64 MiB

    def never(*args, **kwargs):
        raise AssertionError("cells drawn before the refusal")

    monkeypatch.setattr(cell_eval_export, "drawn_controls", never)
    n_tested = len([c for c in trained.pert_data.set2conditions["test"] if c != CONTROL])
    with pytest.raises(memory_budget.BeyondMemory) as refused:
        trained.predict_split(cells_per_perturbation=100_000)
    message = str(refused.value)
    assert f"100,000 cells for each of the {n_tested} perturbations" in message and "x 100 genes" in message
    assert "more than the 64 MiB of memory available: ask for fewer cells per perturbation" in message
    monkeypatch.setattr(model_queries, "drawn_control_cells", never)
    gene = trained.pert_list[0]
    refused = r"cells_per_perturbation=100,000 for 2 queries \(600,000 cells"
    with pytest.raises(memory_budget.BeyondMemory, match=refused):
        trained.predict([[gene], [trained.pert_list[1]]], return_type="cell-eval", cells_per_perturbation=100_000)
    with pytest.raises(memory_budget.BeyondMemory, match=r"for 1 query \(200,000 cells"):
        trained.predict([[gene]], cells_per_perturbation=100_000, all_samples=True)


def test_the_memory_available_is_the_system_s_within_the_control_group_s_limit(tmp_path):
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:    2000000 kB\n")
    assert memory_budget.available_memory_bytes(meminfo, cgroup) == 2_000_000 * 1024  # no control group files
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("100\n")
    assert memory_budget.available_memory_bytes(meminfo, cgroup) == 2_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{2**30}\n")
    (cgroup / "memory.current").write_text(f"{2**29}\n")
    assert memory_budget.available_memory_bytes(meminfo, cgroup) == 2**29  # the container's limit is lower
    assert memory_budget.available_memory_bytes(tmp_path / "none", cgroup) is None  # not Linux: nothing known
