"""Tests for gears_ddp.report.learning: the sentences that say whether a run learned, each
comparison with its verdict and interval from the report's verdicts."""

import math

from verdict_reports import report_from_values

from gears_ddp.report.learning import NO_CHANGE_METRICS, learning_checks
from gears_ddp.report.not_applicable import not_applicable_reason
from gears_ddp.report.page import render_report_page
from gears_ddp.report.verdicts import compare, verdict_records

STEPS = [0.0, 0.001, -0.001, 0.002, -0.002, 0.0]


def _column(value):
    return [value + step * abs(value) for step in STEPS]


def _report(losses, model, no_change, mean_effect):
    """A finished run: its history, and test values per perturbation around the means given."""
    metrics = {metric: _column(value) for metric, value in model.items()}
    baselines = {
        name: {metric: _column(value) for metric, value in values.items()}
        for name, values in (("no_change", no_change), ("mean_effect", mean_effect))
        if values
    }
    report = report_from_values(metrics, baselines)
    report["verdicts"] = verdict_records(compare(report))
    return {
        **report,
        "history": [{"epoch": i + 1, "train_loss": loss} for i, loss in enumerate(losses)],
        "best_epoch": len(losses),
        "world_size": 1,
    }


def test_a_run_that_learned():
    report = _report(
        [0.5, 0.4, 0.3],
        {"mse": 0.001, "mse_de": 0.01, "pearson_delta": 0.55},
        {"mse": 0.002, "mse_de": 0.02, "pearson_delta": math.nan},
        {"mse": 0.0015, "mse_de": 0.015, "pearson_delta": 0.5},
    )
    loss, no_change, pearson = learning_checks(report)
    assert loss == "Training loss fell: 0.5 in epoch 1, 0.3 in epoch 3."
    assert no_change.startswith("Against predicting no change: mse 0.001 against 0.002: beats (+0.001 [")
    assert "won 6 of 6 perturbations); mse_de 0.01 against 0.02: beats (+0.01 [" in no_change
    assert pearson.startswith("Against the mean-effect baseline: pearson_delta 0.55 against 0.5: beats (+0.05 [")


def test_a_run_that_did_not_learn():
    report = _report(
        [32.3, 32.4],
        {"mse": 0.084, "mse_de": 0.25, "pearson_delta": 0.01},
        {"mse": 0.042, "mse_de": 0.24},
        {"pearson_delta": 0.16},
    )
    loss, no_change, pearson = learning_checks(report)
    assert loss.startswith("Training loss did not fall")
    assert "mse 0.084 against 0.042: loses to (-0.042 [" in no_change
    assert "mse_de 0.25 against 0.24: loses to (-0.01 [" in no_change
    assert "pearson_delta 0.01 against 0.16: loses to (-0.15 [" in pearson and pearson.endswith("perturbations).")


def test_no_verdict_without_an_interval():
    report = _report([2.0, 1.0], {"mse_de": 0.1}, {"mse_de": 0.2}, {})
    report["verdicts"] = verdict_records(
        compare({key: value for key, value in report.items() if key != "per_perturbation"})
    )
    assert learning_checks(report)[1].startswith(
        "Against predicting no change: mse_de 0.1 against 0.2: no verdict (the report holds no per-perturbation values"
    )


def test_missing_figures_leave_their_check_out():
    assert learning_checks({"history": [{"train_loss": 1.0}], "best_epoch": 1}) == []
    report = _report([2.0, 1.0], {"mse_de": 0.1}, {"mse_de": 0.2}, {})
    assert learning_checks(report)[1].startswith("Against predicting no change: mse_de 0.1 against 0.2: beats")
    assert len(learning_checks(report)) == 2


def test_the_report_page_shows_the_checks():
    report = _report(
        [0.5, 0.3],
        {"mse": 0.001, "mse_de": 0.01, "pearson_delta": 0.55},
        {"mse": 0.002, "mse_de": 0.02},
        {"pearson_delta": 0.5},
    )
    page = render_report_page({}, report, {})
    assert "<h2>Did the model learn?</h2>" in page
    assert "<li>Training loss fell: 0.5 in epoch 1, 0.3 in epoch 2.</li>" in page
    assert "Against the mean-effect baseline: pearson_delta 0.55 against 0.5: beats" in page


def test_the_checks_compare_with_a_baseline_only_where_that_is_a_verdict():
    # pearson_delta against no change would be no verdict (its change is zero); the checks do not make it
    assert [metric for metric in NO_CHANGE_METRICS if not_applicable_reason("no_change", metric)] == []
    assert not_applicable_reason("mean_effect", "pearson_delta") is None
    assert not_applicable_reason("no_change", "pearson_delta") is not None


def test_a_run_of_no_epoch_says_so():
    """train(epochs=0) scores the model as it was: the checks say so first."""
    report = _report([], {"mse_de": 0.3}, {"mse_de": 0.2}, {})
    first, no_change = learning_checks(report)
    assert first.startswith("No epoch was trained (epochs=0)")
    assert no_change.startswith("Against predicting no change: mse_de 0.3 against 0.2: loses to (-0.1 [")
