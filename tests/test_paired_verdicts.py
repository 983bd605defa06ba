"""Verdicts carry their uncertainty: every "beats" comes from a paired bootstrap interval over
the test perturbations (and, over replicates, over the seeds too), never from two means;
too few perturbations give n/a with the reason; a missing value is dropped and counted,
never a win; and a model whose predictions barely differ between perturbations is named."""

import dataclasses
import math

import numpy as np
import pytest
from verdict_reports import report_from_values

from gears_ddp.evaluation.baselines import baseline_results
from gears_ddp.evaluation.metrics import MetricContext
from gears_ddp.evaluation.paired_bootstrap import (
    BEATS,
    LOSES,
    NO_CLEAR,
    NOT_APPLICABLE,
    RESAMPLES,
    SEED,
    compare_paired,
    expanded_alpha,
)
from gears_ddp.evaluation.prediction_spread import COLLAPSE_BELOW, spread_ratio, spread_warnings
from gears_ddp.evaluation.scoring import score
from gears_ddp.report.learning import learning_checks
from gears_ddp.report.replicate_summary import summarise_replicates
from gears_ddp.report.verdicts import (
    GEARS,
    HEADLINE_METRICS,
    NO_PER_PERTURBATION,
    compare,
    per_perturbation_record,
    verdict_records,
    verdict_table,
)

DIFFERENCES = np.array([0.21, -0.05, 0.13, 0.30, 0.02, 0.11])


def plain_bootstrap(differences: np.ndarray, seed: int = SEED, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The expanded percentile interval of the mean, written out with numpy alone: one
    resample at a time."""
    rng = np.random.default_rng(seed)
    n = differences.size
    draws = rng.integers(0, n, (resamples, n))
    means = np.array([differences[row].mean() for row in draws])
    alpha = expanded_alpha(n)
    return tuple(np.quantile(means, [alpha / 2, 1 - alpha / 2]))


def plain_two_level_bootstrap(grid: np.ndarray, seed: int = SEED, resamples: int = RESAMPLES):
    """The same over a replicates x perturbations grid: perturbations drawn first, then the
    replicates, both with replacement, each resample the mean of the drawn cells."""
    rng = np.random.default_rng(seed)
    replicates, n = grid.shape
    perturbations = rng.integers(0, n, (resamples, n))
    seeds = rng.integers(0, replicates, (resamples, replicates))
    means = np.array([grid[np.ix_(seeds[b], perturbations[b])].mean() for b in range(resamples)])
    alpha = expanded_alpha(n)
    return tuple(np.quantile(means, [alpha / 2, 1 - alpha / 2]))


def test_the_interval_is_the_plain_bootstrap_to_1e12():
    baseline = np.array([0.5, 0.7, 0.2, 0.1, 0.4, 0.3])
    for higher in (True, False):
        model = baseline + (DIFFERENCES if higher else -DIFFERENCES)  # + favours the model either way
        [comparison] = compare_paired(model[None, None], baseline[None, None], [higher])
        low, high = plain_bootstrap(DIFFERENCES)
        assert comparison.low == pytest.approx(low, abs=1e-12) and comparison.high == pytest.approx(high, abs=1e-12)
        assert comparison.difference == pytest.approx(DIFFERENCES.mean(), abs=1e-12)
        assert (comparison.won, comparison.n, comparison.dropped) == (5, 6, 0)
    assert RESAMPLES >= 2000


def test_over_replicates_the_bootstrap_resamples_seeds_and_perturbations_to_1e12():
    rng = np.random.default_rng(3)
    grid = DIFFERENCES[None, :] + rng.normal(scale=0.05, size=(3, 6))  # 3 seeds x 6 perturbations
    baseline = rng.normal(size=(3, 6))
    [comparison] = compare_paired((baseline + grid)[None], baseline[None], [True])
    low, high = plain_two_level_bootstrap(grid)
    assert comparison.low == pytest.approx(low, abs=1e-12) and comparison.high == pytest.approx(high, abs=1e-12)
    assert comparison.replicates == 3 and comparison.n == 6
    one_seed = compare_paired((baseline + grid)[None, :1], baseline[None, :1], [True])[0]
    assert (one_seed.low, one_seed.high) == pytest.approx(plain_bootstrap(grid[0]), abs=1e-12)
    # the seeds' spread widens the interval beyond that of one seed's perturbations
    assert comparison.high - comparison.low > 0


def test_the_verdict_reads_the_interval_and_not_the_means():
    # GEARS's mean is better than the baseline's, but one perturbation carries it all
    model = {"mse_de": [0.5, 0.5, 0.5, 0.5, 0.5, 0.0]}
    baseline = {"mse_de": [0.45, 0.45, 0.45, 0.45, 0.45, 0.9]}
    report = report_from_values(model, {"mean_effect": baseline})
    assert report["model"]["test_mse_de"] < report["baselines"]["mean_effect"]["test_mse_de"]
    [verdict] = compare(report)
    assert verdict.comparisons["mean_effect"].verdict == NO_CLEAR and verdict.beats == {"mean_effect": None}
    assert verdict.comparisons["mean_effect"].won == 1 and not verdict.beats_every_baseline
    # and without per-perturbation values there is no verdict at all, whatever the means say
    [old] = compare({key: value for key, value in report.items() if key != "per_perturbation"})
    assert old.comparisons["mean_effect"].verdict == NOT_APPLICABLE
    assert old.comparisons["mean_effect"].reason == NO_PER_PERTURBATION


@pytest.mark.parametrize("count", [1, 2])
def test_one_or_two_perturbations_give_na_with_the_reason(count):
    report = report_from_values({"mse_de": [0.1] * count}, {"no_change": {"mse_de": [0.9] * count}})
    comparison = compare(report)[0].comparisons["no_change"]
    assert comparison.verdict == NOT_APPLICABLE and math.isnan(comparison.low)
    assert f"{count} test perturbation" in comparison.reason and "at least 3" in comparison.reason
    assert "at least 3" in verdict_table(compare(report))


def test_a_missing_value_is_dropped_and_counted_never_a_win():
    model = {"pearson_delta": [0.4, math.nan, 0.5, 0.6, 0.3]}
    baseline = {"pearson_delta": [0.1, 0.2, math.nan, 0.2, 0.1]}
    comparison = compare(report_from_values(model, {"linear": baseline}))[0].comparisons["linear"]
    assert (comparison.n, comparison.dropped, comparison.won) == (3, 2, 3)
    assert comparison.difference == pytest.approx(np.mean([0.3, 0.4, 0.2]))
    assert (comparison.low, comparison.high) == pytest.approx(plain_bootstrap(np.array([0.3, 0.4, 0.2])), abs=0.02)


def test_a_baseline_against_itself_is_no_clear_difference_on_every_metric(trained_toy):
    result = trained_toy.test_result
    context = MetricContext.from_pert_data(trained_toy.pert_data, result.conditions)
    subgroups = trained_toy.pert_data.subgroup["test_subgroup"]
    baselines = baseline_results(trained_toy.pert_data, result)
    summary, per_condition = score(baselines["mean_effect"], context, subgroups)
    report = {
        "model": summary,
        "baselines": {"mean_effect": summary},
        "per_perturbation": per_perturbation_record(
            result.conditions, subgroups, {GEARS: per_condition, "mean_effect": per_condition}
        ),
    }
    verdicts = compare(report)
    assert {v.metric for v in verdicts} == set(HEADLINE_METRICS)
    for verdict in verdicts:
        comparison = verdict.comparisons["mean_effect"]
        assert comparison.verdict in (NO_CLEAR, NOT_APPLICABLE), verdict.key
        if comparison.verdict == NO_CLEAR:
            assert comparison.low == comparison.high == comparison.difference == 0 and comparison.won == 0


def test_a_planted_perfect_model_beats_every_baseline_on_every_metric(trained_toy):
    result = trained_toy.test_result
    perfect = dataclasses.replace(result, pred_mean=result.truth_mean.copy())
    context = MetricContext.from_pert_data(trained_toy.pert_data, result.conditions)
    subgroups = trained_toy.pert_data.subgroup["test_subgroup"]
    model, model_conditions = score(perfect, context, subgroups)
    scored = {
        name: score(evaluation, context, subgroups)
        for name, evaluation in baseline_results(trained_toy.pert_data, result).items()
    }
    report = {
        "model": model,
        "baselines": {name: summary for name, (summary, _) in scored.items()},
        "per_perturbation": per_perturbation_record(
            result.conditions, subgroups, {GEARS: model_conditions, **{n: per for n, (_, per) in scored.items()}}
        ),
    }
    verdicts = compare(report, subgroups=(None,))
    assert len(verdicts) == len(HEADLINE_METRICS)
    for verdict in verdicts:
        for name, comparison in verdict.comparisons.items():
            if comparison.verdict == NOT_APPLICABLE:  # no change on a correlation with the change, or the wrong way
                assert name == "no_change" and verdict.metric.startswith(("pearson_delta", "frac_opposite"))
                continue
            assert comparison.verdict == BEATS, (verdict.metric, name, comparison)
    records = verdict_records(verdicts)
    assert set(records[0]["baselines"]["mean_effect"]) >= {"difference", "low", "high", "won", "n", "verdict"}


def test_a_loss_is_read_the_same_way():
    report = report_from_values(
        {"pearson_delta": [0.1, 0.0, 0.2, 0.1]}, {"mean_effect": {"pearson_delta": [0.5, 0.4, 0.6, 0.45]}}
    )
    comparison = compare(report)[0].comparisons["mean_effect"]
    assert comparison.verdict == LOSES and comparison.high < 0 and comparison.won == 0
    table = verdict_table(compare(report))
    assert "-0.3875 [" in table and " 0/4 " in table and "loses to" in table


def test_replicates_bootstrap_seeds_and_perturbations_from_each_replicates_values():
    rng = np.random.default_rng(0)
    reports = {}
    for seed in range(3):
        model = 0.3 + 0.05 * rng.normal(size=6)
        reports[f"seed-{seed}"] = report_from_values(
            {"pearson_delta": model}, {"mean_effect": {"pearson_delta": model - DIFFERENCES}}
        )
    [verdict] = summarise_replicates(reports)
    comparison = verdict.differences["mean_effect"]
    grid = np.stack(
        [
            np.asarray(r["per_perturbation"]["values"][GEARS]["pearson_delta"])
            - np.asarray(r["per_perturbation"]["values"]["mean_effect"]["pearson_delta"])
            for r in reports.values()
        ]
    )
    assert (comparison.low, comparison.high) == pytest.approx(plain_two_level_bootstrap(grid), abs=1e-12)
    assert comparison.replicates == 3 and comparison.n == 6 and comparison.won == 5


def test_predictions_that_do_not_differ_between_perturbations_are_named():
    rng = np.random.default_rng(1)
    truth = rng.normal(size=(8, 30))
    assert spread_ratio(truth, truth) == pytest.approx(1.0)
    same = np.repeat(truth.mean(axis=0, keepdims=True), 8, axis=0)
    assert spread_ratio(same, truth) == pytest.approx(0.0, abs=1e-12)
    shrunk = truth.mean(axis=0) + 0.3 * (truth - truth.mean(axis=0))
    assert spread_ratio(shrunk, truth) == pytest.approx(0.3)
    lines = spread_warnings({GEARS: 0.3, "no_change": 0.0, "mean_effect": 0.0, "linear": 0.9})
    assert lines[0].startswith("Warning: GEARS's predictions barely differ between perturbations (spread ratio 0.30")
    assert "no_change 0.00 (by construction" in lines[1] and "mean_effect 0.00" in lines[1] and "linear" not in lines[1]
    assert spread_warnings({GEARS: 0.9, "linear": COLLAPSE_BELOW}) == []
    report = {"history": [], "prediction_spread": {GEARS: 0.2}}
    assert any(line.startswith("Warning: GEARS's predictions barely differ") for line in learning_checks(report))


def test_the_forest_plot_draws_each_interval_its_verdict_and_the_zero_line():
    from gears_ddp.report.plots import figure_intervals

    report = report_from_values(
        {"mse_de": [0.1, 0.12, 0.09, 0.11, 0.1, 0.13], "pearson_delta": [0.2] * 6},
        {
            "no_change": {"mse_de": [0.3, 0.31, 0.29, 0.3, 0.32, 0.3], "pearson_delta": [0.0] * 6},
            "mean_effect": {"mse_de": [0.05, 0.3, 0.02, 0.2, 0.04, 0.25], "pearson_delta": [0.3] * 6},
        },
    )
    verdicts = {v.metric: v for v in compare(report)}
    rows = [
        (metric, verdicts[metric].higher_is_better, verdicts[metric].comparisons)
        for metric in ("mse_de", "pearson_delta")
    ]
    figure = figure_intervals(rows, "all test conditions")
    mse, pearson = figure.axes
    drawn = sorted(
        tuple(np.round(segment[:, 0], 9)) for collection in mse.collections for segment in collection.get_segments()
    )
    expected = sorted(tuple(np.round([c.low, c.high], 9)) for c in verdicts["mse_de"].comparisons.values())
    assert drawn == expected
    assert [text.get_text() for text in mse.texts] == ["6/6 beats", "3/6 unclear"]  # no_change, mean_effect
    assert [text.get_text() for text in pearson.texts] == ["  n/a", "0/6 loses"]
    assert any(line.get_xdata()[0] == 0 and line.get_linestyle() == "--" for line in mse.lines)
    assert mse.get_title(loc="left") == "mse_de (lower is better; + favours GEARS)"
