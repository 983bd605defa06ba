"""Predictions in cell-eval's layout (``gears_ddp.inference.cell_eval_export``), scored by the real
``cell-eval`` package (the ``test`` extra): its ``pearson_delta`` and ``mse`` are ours where
the definitions coincide, on the synthetic dataset with a small trained model."""

import dataclasses
import os
from types import SimpleNamespace

import anndata
import numpy as np
import pandas as pd
import pytest
import torch

import gears_ddp
from gears_ddp import GEARS, PertData
from gears_ddp.data.conditions import CONTROL, condition_genes, is_combo
from gears_ddp.datasets import write_synthetic_dataset
from gears_ddp.evaluation.metrics import MetricContext
from gears_ddp.evaluation.scoring import score
from gears_ddp.inference.cell_eval_export import (
    CONTROL_LABEL,
    PERT_COLUMN,
    PROVENANCE_KEY,
    condition_obs,
    gene_var,
    target_of,
)

try:
    from cell_eval import MetricsEvaluator, MetricType, PerturbationAnndataPair, metrics_registry
    from cell_eval.metrics import mse, pearson_delta
except ImportError as err:  # CI installs the test extra and sets GEARS_DDP_REQUIRE_REFERENCE=1: fail there
    if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
        raise
    pytest.skip(f"cell-eval not importable (pip install -e '.[test]'): {err}", allow_module_level=True)

SMALL = dict(n_genes=100, n_modules=6, n_perturbed_genes=12, n_combos=10, cells_per_condition=10, n_control_cells=100)
COMPARED = ("pearson_delta", "mse")  # cell-eval's metrics with a definition of ours


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> GEARS:
    """A small model trained one epoch on the synthetic dataset (simulation split), scored on test."""
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


def _queries(gears) -> dict[str, list[str]]:
    """A single, a combination of the data asked in reverse order, and one the data lacks."""
    conditions = gears.pert_data.cells.conditions
    combo = next(c for c in conditions if is_combo(c))
    single = next(c for c in conditions if c != CONTROL and not is_combo(c))
    seen = {frozenset(condition_genes(c)) for c in conditions}
    unseen = next([a, b] for a in gears.pert_list for b in gears.pert_list if a != b and frozenset((a, b)) not in seen)
    return {single: condition_genes(single), combo: condition_genes(combo)[::-1], "+".join(unseen): unseen}


def _rows(adata: anndata.AnnData, column: str, value: str) -> np.ndarray:
    """``X`` of the rows whose ``obs[column]`` is ``value``."""
    return adata.X[(adata.obs[column] == value).to_numpy()]


def test_anndata_predictions_name_conditions_as_the_data(trained):
    queries = _queries(trained)
    adata = trained.predict(list(queries.values()), return_type="anndata", seed=2)
    predictions = trained.predict(list(queries.values()), seed=2)
    assert list(adata.obs_names) == list(queries)  # A+ctrl, the data's A+B for [B, A], an unseen pair as asked
    assert list(adata.obs["condition"]) == list(queries)
    for (condition, query), row in zip(queries.items(), adata.X):
        obs = adata.obs.loc[condition]
        assert set(condition_genes(condition)) == set(query)
        assert [obs["gene_1"], obs["gene_2"]] == (condition_genes(condition) + [CONTROL])[:2]
        assert obs[PERT_COLUMN] == (query[0] if len(query) == 1 else condition)  # cell-eval's A, A+B
        np.testing.assert_array_equal(row, predictions["_".join(query)])  # 'dict' keys stay A_B, in query order
    assert list(adata.var_names) == trained.gene_list
    provenance = adata.uns[PROVENANCE_KEY]
    assert provenance["version"] == gears_ddp.__version__ and provenance["weights_from"] == "training"
    assert provenance["seed"] == 2 and provenance["control_cells"] == 300
    assert provenance["config"]["hidden_size"] == 8 and not any(k.startswith("G_") for k in provenance["config"])


def test_anndata_carries_uncertainty_and_the_weights_folder(trained, tmp_path):
    model = GEARS(trained.pert_data)
    model.model_initialize(hidden_size=8, uncertainty=True)
    model.train(epochs=1, max_steps=1)  # a model saved untrained refuses to predict, loaded again
    model.save_model(tmp_path / "model")
    loaded = GEARS(trained.pert_data)
    loaded.load_pretrained(tmp_path / "model")
    gene = trained.pert_list[0]
    adata = loaded.predict([[gene]], return_type="anndata")
    _, uncertainty = loaded.predict([[gene]])
    assert adata.obs["uncertainty"].tolist() == pytest.approx([uncertainty[gene]], rel=1e-6)
    assert adata.uns[PROVENANCE_KEY]["weights_from"] == str(tmp_path / "model")
    assert adata.uns[PROVENANCE_KEY]["config"]["uncertainty"]


def test_cell_eval_predictions_are_control_cells_plus_the_change(trained):
    queries = _queries(trained)
    cells = trained.predict(list(queries.values()), return_type="cell-eval", seed=3)
    predictions = trained.predict(list(queries.values()), seed=3)
    assert set(cells.obs[PERT_COLUMN]) == {target_of(c) for c in queries} | {CONTROL_LABEL}
    assert (cells.obs[PERT_COLUMN].value_counts() == 300).all()
    assert cells.X.min() >= 0  # cell-eval refuses negative expression
    controls = _rows(cells, PERT_COLUMN, CONTROL_LABEL)
    for condition, query in queries.items():
        shifted, expected = _rows(cells, "condition", condition), predictions["_".join(query)]
        unclipped = (shifted > 0).all(0)
        assert unclipped.any()
        change = shifted[:, unclipped] - controls[:, unclipped]  # cell k is control cell k plus the change
        np.testing.assert_allclose(change, np.broadcast_to(change[0], change.shape), atol=1e-5)
        np.testing.assert_allclose(shifted.mean(0)[unclipped], expected[unclipped], rtol=1e-5, atol=1e-5)
        assert (shifted.mean(0) >= expected - 1e-5).all()  # clipping at 0 only raises a mean


def test_cell_eval_metrics_equal_ours_on_the_same_predictions(trained):
    """On the unclipped split predictions, cell-eval's ``pearson_delta`` and ``mse``
    functions give, per perturbation, what ``GEARS.test`` scored."""
    pred, real = trained.predict_split(clip_at_zero=False)
    result = trained.test_result
    for condition, pred_mean, truth_mean in zip(result.conditions, result.pred_mean, result.truth_mean):
        np.testing.assert_allclose(_rows(pred, "condition", condition).mean(0), pred_mean, atol=1e-5)
        np.testing.assert_allclose(_rows(real, "condition", condition).mean(0), truth_mean, atol=1e-6)
    controls = _rows(real, PERT_COLUMN, CONTROL_LABEL)
    np.testing.assert_array_equal(_rows(pred, PERT_COLUMN, CONTROL_LABEL), controls)
    np.testing.assert_allclose(
        controls.mean(0), MetricContext.from_pert_data(trained.pert_data).control_mean, atol=1e-6
    )
    pair = PerturbationAnndataPair(real=real, pred=pred, pert_col=PERT_COLUMN, control_pert=CONTROL_LABEL)
    theirs = {"pearson_delta": pearson_delta(pair), "mse": mse(pair)}
    ours = score(result, MetricContext.from_pert_data(trained.pert_data, result.conditions))[1]
    assert set(theirs["mse"]) == {target_of(c) for c in trained.pert_data.set2conditions["test"]}
    for condition, metrics in ours.items():
        for name, values in theirs.items():
            assert values[target_of(condition)] == pytest.approx(metrics[name], abs=1e-5), (condition, name)


def test_cell_eval_evaluator_scores_the_written_files_as_we_score_them(trained, tmp_path):
    """The default (clipped) files, written and read back by ``MetricsEvaluator`` with its
    default column names, score as our metrics score the clipped means; the unclipped
    prediction is refused."""
    pred, real = trained.predict_split()
    paths = {"pred": tmp_path / "pred.h5ad", "real": tmp_path / "real.h5ad"}
    pred.write_h5ad(paths["pred"])
    real.write_h5ad(paths["real"])
    outdir = tmp_path / "cell-eval"
    evaluator = MetricsEvaluator(
        str(paths["pred"]), str(paths["real"]), pert_col=PERT_COLUMN, num_threads=1, outdir=str(outdir), skip_de=True
    )
    others = [m for m in metrics_registry.list_metrics(MetricType.ANNDATA_PAIR) if m not in COMPARED]
    results, _ = evaluator.compute(profile="anndata", skip_metrics=others, break_on_error=True)
    assert (outdir / "results.csv").exists()
    theirs = {row["perturbation"]: row for row in results.iter_rows(named=True)}

    result = trained.test_result
    clipped_means = np.stack([_rows(pred, "condition", c).mean(0, dtype=np.float64) for c in result.conditions])
    assert not np.allclose(clipped_means, result.pred_mean, atol=1e-4)  # the clipping changed some means
    context = MetricContext.from_pert_data(trained.pert_data)
    _, ours = score(dataclasses.replace(result, pred_mean=clipped_means), context)
    assert set(theirs) == {target_of(c) for c in ours}
    for condition, metrics in ours.items():
        for name in COMPARED:
            assert theirs[target_of(condition)][name] == pytest.approx(metrics[name], abs=1e-5), (condition, name)

    raw, _ = trained.predict_split(clip_at_zero=False)
    with pytest.raises(ValueError, match="negative"):
        MetricsEvaluator(raw, real, pert_col=PERT_COLUMN, num_threads=1, outdir=str(outdir), skip_de=True)


def test_predictions_round_trip_through_h5ad(trained, tmp_path):
    queries = list(_queries(trained).values())
    written = {
        "anndata": trained.predict(queries, return_type="anndata"),
        "cell-eval": trained.predict(queries, return_type="cell-eval"),
        "split": trained.predict_split()[0],
    }
    for name, adata in written.items():
        adata.write_h5ad(tmp_path / f"{name}.h5ad")
        back = anndata.read_h5ad(tmp_path / f"{name}.h5ad")
        pd.testing.assert_frame_equal(back.obs, adata.obs)
        pd.testing.assert_frame_equal(back.var, adata.var)
        np.testing.assert_array_equal(back.X, adata.X)
        assert back.uns[PROVENANCE_KEY] == adata.uns[PROVENANCE_KEY], name


def test_two_spellings_of_one_perturbation_and_unknown_splits_are_refused(trained):
    with pytest.raises(ValueError, match=r"'A\+ctrl' and 'ctrl\+A' both perturb 'A'"):
        condition_obs(["A+ctrl", "ctrl+A"], index=["0", "1"])
    with pytest.raises(ValueError, match=r"no 'validation_loader'; this split's sets are \['test', 'train', 'val'\]"):
        trained.predict_split(split="validation")


def test_var_is_indexed_by_gene_name_keeping_other_ids():
    var = pd.DataFrame({"gene_name": ["TP53", "FEV"]}, index=["ENSG00000141510", "ENSG00000163497"])
    pert_data = SimpleNamespace(var=var, gene_names=var["gene_name"])
    out = gene_var(pert_data)
    assert list(out.index) == ["TP53", "FEV"] and list(out["gene_id"]) == list(var.index)
    assert list(var.index) == ["ENSG00000141510", "ENSG00000163497"]  # the data's var is left as it was
