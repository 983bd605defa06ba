"""Tests for gears_ddp.report.learning: the sentences that say whether a run learned."""
import math

from gears_ddp.report.learning import NO_CHANGE_METRICS, learning_checks
from gears_ddp.report.not_applicable import not_applicable_reason
from gears_ddp.report.page import render_report_page


def _report(losses, model, no_change, mean_effect):
    return {"history": [{"epoch": i + 1, "train_loss": loss} for i, loss in enumerate(losses)],
            "model": model, "baselines": {"no_change": no_change, "mean_effect": mean_effect},
            "best_epoch": len(losses), "world_size": 1}


def test_a_run_that_learned():
    report = _report([0.5, 0.4, 0.3], {"test_mse": 0.001, "test_mse_de": 0.01, "test_pearson_delta": 0.55},
                     {"test_mse": 0.002, "test_mse_de": 0.02, "test_pearson_delta": math.nan},
                     {"test_mse": 0.0015, "test_mse_de": 0.015, "test_pearson_delta": 0.5})
    loss, no_change, pearson = learning_checks(report)
    assert loss == "Training loss fell: 0.5 in epoch 1, 0.3 in epoch 3."
    assert no_change == ("Against predicting no change: mse 0.001 against 0.002 (better), "
                         "mse_de 0.01 against 0.02 (better).")
    assert pearson == "pearson_delta 0.5500 against the mean-effect baseline's 0.5000 (+0.0500; better)."


def test_a_run_that_did_not_learn():
    report = _report([32.3, 32.4], {"test_mse": 0.084, "test_mse_de": 0.25, "test_pearson_delta": 0.01},
                     {"test_mse": 0.042, "test_mse_de": 0.24}, {"test_pearson_delta": 0.16})
    loss, no_change, pearson = learning_checks(report)
    assert loss.startswith("Training loss did not fall")
    assert "mse 0.084 against 0.042 (worse)" in no_change and "mse_de 0.25 against 0.24 (worse)" in no_change
    assert pearson.endswith("(-0.1500; worse).")


def test_missing_figures_leave_their_check_out():
    assert learning_checks({"history": [{"train_loss": 1.0}], "best_epoch": 1}) == []
    report = _report([2.0, 1.0], {"test_mse_de": 0.1}, {"test_mse_de": 0.2}, {})
    assert learning_checks(report)[1] == "Against predicting no change: mse_de 0.1 against 0.2 (better)."
    assert len(learning_checks(report)) == 2


def test_the_report_page_shows_the_checks():
    report = _report([0.5, 0.3], {"test_mse": 0.001, "test_mse_de": 0.01, "test_pearson_delta": 0.55},
                     {"test_mse": 0.002, "test_mse_de": 0.02}, {"test_pearson_delta": 0.5})
    page = render_report_page({}, report, {})
    assert "<h2>Did the model learn?</h2>" in page
    assert "<li>Training loss fell: 0.5 in epoch 1, 0.3 in epoch 2.</li>" in page
    assert "the mean-effect baseline&#x27;s 0.5000" in page


def test_the_checks_compare_with_a_baseline_only_where_that_is_a_verdict():
    # pearson_delta against no change would be no verdict (its change is zero); the checks do not make it
    assert [metric for metric in NO_CHANGE_METRICS if not_applicable_reason("no_change", metric)] == []
    assert not_applicable_reason("mean_effect", "pearson_delta") is None
    assert not_applicable_reason("no_change", "pearson_delta") is not None


def test_a_run_of_no_epoch_says_so():
    """train(epochs=0) scores the model as it was: the checks say so first."""
    report = _report([], {"test_mse_de": 0.3}, {"test_mse_de": 0.2}, {})
    first, no_change = learning_checks(report)
    assert first.startswith("No epoch was trained (epochs=0)")
    assert no_change == "Against predicting no change: mse_de 0.3 against 0.2 (worse)."
