"""The linear baselines reach every verdict through the paths the other baselines take: the
console table, a run's report.json and report.html, ``GEARS.test`` (``gears-ddp evaluate``),
the replicates' summary with its paired intervals, and the cell-eval export of a baseline's
cells (``predict_split(baseline=...)``, ``gears-ddp predict --baseline``)."""

import csv
import json
import logging
import math

import numpy as np
import pytest
import torch
import toy_data

from gears_ddp import GEARS
from gears_ddp.evaluation.baselines import PRETRAINED, baseline_predictions
from gears_ddp.evaluation.linear_baseline import other_screen_embedding
from gears_ddp.inference.cell_eval_export import CONTROL_LABEL, PERT_COLUMN, split_predictions
from gears_ddp.report.replicate_report import TABLE_FILE, write_replicate_report

LINEAR = ("linear", PRETRAINED)


@pytest.fixture(scope="module")
def other_screen(tmp_path_factory):
    path = tmp_path_factory.mktemp("other") / "other.h5ad"
    toy_data.make_raw(seed=7, singles=[f"G{i}+ctrl" for i in range(0, 40, 2)], combos=[]).write_h5ad(path)
    return path


def _trained(toy, seed: int, other_screen, save_path=None) -> tuple[GEARS, dict]:
    """A small model trained one epoch, scored beside the baselines, the run folder written
    to ``save_path`` when given."""
    toy.get_dataloader(16, test_batch_size=64)
    torch.manual_seed(seed)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    return gears, gears.train(
        epochs=1, seed=seed, save_path=save_path and str(save_path), linear_baseline_screen=str(other_screen)
    )


def test_a_run_shows_both_linear_baselines_on_the_console_in_report_json_and_page(toy, tmp_path, other_screen, caplog):
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        gears, report = _trained(toy, 1, other_screen, tmp_path / "run")
    table = next(r.getMessage() for r in caplog.records if "best model vs baselines" in r.getMessage())
    rows = [line.split() for line in table.splitlines()[2:7]]  # pearson_delta: one row per baseline
    assert [rows[0][3]] + [row[0] for row in rows[1:]] == ["no_change", "mean_effect", "additive", "linear", PRETRAINED]
    for name in LINEAR:
        assert math.isfinite(report["baselines"][name]["test_mse_de"])
    assert report["baselines"]["linear"] != report["baselines"][PRETRAINED]

    written = json.loads((tmp_path / "run" / "report.json").read_text())
    overall = {r["metric"]: r for r in written["verdicts"] if r["subgroup"] is None}
    for name in LINEAR:
        assert written["baselines"][name]["test_pearson_delta"] == pytest.approx(
            report["baselines"][name]["test_pearson_delta"]
        )
        record = overall["pearson_delta"]["baselines"][name]
        assert record["value"] == pytest.approx(report["baselines"][name]["test_pearson_delta"])
        assert record["verdict"] in ("beats", "loses to", "no clear difference") and record["not_applicable"] is None
        assert record["beats"] is {"beats": True, "loses to": False}.get(record["verdict"])
        assert record["low"] <= record["difference"] <= record["high"] and record["n"] >= 3
    page = (tmp_path / "run" / "report.html").read_text()
    assert f"<th>{PRETRAINED}<br>" in page and "<th>linear<br>" in page and "Ahlmann-Eltze" in page

    # the published API's return value carries the verdicts with their intervals, as report.json does
    returned = {r["metric"]: r for r in report["verdicts"] if r["subgroup"] is None}
    for name in LINEAR:
        assert (
            returned["pearson_delta"]["baselines"][name]["verdict"]
            == overall["pearson_delta"]["baselines"][name]["verdict"]
        )
        assert returned["pearson_delta"]["baselines"][name]["low"] == pytest.approx(
            overall["pearson_delta"]["baselines"][name]["low"]
        )
    assert set(report["prediction_spread"]) >= {"GEARS", *LINEAR} and "per_perturbation" in report

    # gears-ddp evaluate scores the saved model through GEARS.test, with the run's other screen
    again = gears.test(linear_baseline_screen=str(other_screen))
    assert [r["key"] for r in again["verdicts"]] == [r["key"] for r in report["verdicts"]]
    for name in LINEAR:
        assert again["baselines"][name] == pytest.approx(report["baselines"][name], nan_ok=True)
    assert PRETRAINED not in gears.test()["baselines"]


def test_replicates_summarise_the_linear_baselines_with_paired_intervals(toy, tmp_path, other_screen):
    reports = {f"seed-{seed}": _trained(toy, seed, other_screen)[1] for seed in (1, 2, 3)}
    replicates = [
        {
            "name": name,
            "seed": int(name[-1]),
            "split_seed": 1,
            "folder": str(tmp_path / name),
            "status": "finished",
            "error": None,
        }
        for name in reports
    ]
    page = write_replicate_report(tmp_path, {"dataset_name": "toy"}, replicates, reports)
    summary = json.loads((tmp_path / "report.json").read_text())
    pearson = next(r for r in summary["metrics"] if r["metric"] == "pearson_delta" and r["subgroup"] is None)
    for name in LINEAR:
        difference = pearson["differences"][name]
        assert difference["replicates"] == 3 and difference["low"] < difference["difference"] < difference["high"]
        assert difference["ci_low"] < difference["mean"] < difference["ci_high"]  # GEARS - baseline, as before
        assert difference["gears_minus_baseline"] == pytest.approx(
            [
                reports[r]["model"]["test_pearson_delta"] - reports[r]["baselines"][name]["test_pearson_delta"]
                for r in reports
            ]
        )
    with open(tmp_path / TABLE_FILE, newline="") as table:
        methods = {row["method"] for row in csv.DictReader(table)}
    assert {"GEARS", "linear", PRETRAINED} <= methods
    assert f"{PRETRAINED}: mean ± sd<br>difference [95% interval] won" in page.read_text()


def test_the_cell_eval_export_writes_a_linear_baselines_cells_as_the_models(toy, tmp_path, other_screen):
    gears, _ = _trained(toy, 1, other_screen)
    model, real = gears.predict_split(clip_at_zero=False)
    # the control cell each cell starts from: the same export with no change at all
    genes = len(toy.gene_names)
    paired, _ = split_predictions(
        toy, gears.dataloader, lambda sets: (torch.zeros(len(sets), genes), None), {}, clip_at_zero=False
    )
    test = gears.test_result.conditions
    for name, screen in (("linear", None), (PRETRAINED, other_screen)):
        predicted, truth = gears.predict_split(clip_at_zero=False, baseline=name, linear_baseline_screen=screen)
        assert predicted.uns["gears_ddp"]["baseline"] == name
        np.testing.assert_array_equal(truth.X, real.X)
        assert list(predicted.obs_names) == list(model.obs_names)
        embedding = None if screen is None else other_screen_embedding(screen, toy.set2conditions["train"])
        expected = baseline_predictions(toy, test, embedding)
        controls = (predicted.obs[PERT_COLUMN] == CONTROL_LABEL).to_numpy()
        np.testing.assert_array_equal(predicted.X[controls], paired.X[controls])
        for row, condition in enumerate(test):
            cells = (predicted.obs["condition"] == condition).to_numpy()
            change = expected[name][row] - expected["no_change"][row]
            np.testing.assert_allclose(
                predicted.X[cells] - paired.X[cells], np.tile(change, (cells.sum(), 1)), atol=1e-5
            )
    with pytest.raises(ValueError, match="linear_pretrained needs another screen"):
        gears.predict_split(baseline=PRETRAINED)
    with pytest.raises(ValueError, match="no baseline 'linaer'"):
        gears.predict_split(baseline="linaer")
