"""Tests for gears_ddp.report.verdicts: which way each metric is better, who won (by the
paired intervals), and what counts as beating every baseline."""

import math

import pytest
from verdict_reports import report_from_values

from gears_ddp.evaluation.paired_bootstrap import BEATS, LOSES, NO_CLEAR, NOT_APPLICABLE, PairedComparison
from gears_ddp.report.page import render_report_page
from gears_ddp.report.verdicts import MetricVerdict, compare, higher_is_better, summary_verdicts, verdict_table

UP = [0.1, 0.12, 0.09, 0.11, 0.1, 0.13]  # a clear, steady difference


def _shifted(values, by):
    return [value + by for value in values]


def test_verdicts_know_which_way_is_better_and_who_won():
    assert higher_is_better("pearson_delta") and not higher_is_better("mse_de")
    assert not higher_is_better("frac_opposite_direction_top20_non_dropout")
    model = {"pearson_delta": _shifted(UP, 0.0), "mse_de": _shifted(UP, 0.2)}
    baselines = {
        "no_change": {"pearson_delta": [0.0] * 6, "mse_de": _shifted(UP, 0.3)},
        "mean_effect": {"pearson_delta": _shifted(UP, 0.15), "mse_de": _shifted(UP, 0.1)},
    }
    report = report_from_values(model, baselines, subgroups={"unseen_single": [0, 1, 2]})
    verdicts = {v.key: v for v in compare(report)}
    assert verdicts["test_pearson_delta"].beats == {"no_change": None, "mean_effect": False}  # n/a: no change
    assert verdicts["test_mse_de"].beats == {"no_change": True, "mean_effect": False}
    assert verdicts["test_unseen_single_mse_de"].beats == {"no_change": True, "mean_effect": False}
    table = verdict_table(list(verdicts.values()))
    assert "loses to" in table and "lower" in table and "higher" in table
    assert "GEARS beats every baseline on 0 of 2 metrics and loses to one on 2" in table


def _verdict(verdicts: dict) -> MetricVerdict:
    comparisons = {
        name: PairedComparison(
            0.1,
            0.05 if verdict == BEATS else -0.2,
            0.15 if verdict != LOSES else -0.05,
            3,
            6,
            0,
            1,
            verdict,
            "why" if verdict == NOT_APPLICABLE else None,
        )
        for name, verdict in verdicts.items()
    }
    return MetricVerdict("test_mse_de", None, "mse_de", False, 0.1, {name: 0.2 for name in verdicts}, comparisons)


@pytest.mark.parametrize(
    "verdicts, expected",
    [
        ({"no_change": BEATS, "additive": BEATS}, True),
        ({"no_change": BEATS, "additive": NOT_APPLICABLE}, True),  # no interval is no comparison
        ({"no_change": BEATS, "additive": NO_CLEAR}, False),  # not clearly better is no win
        ({"no_change": BEATS, "additive": LOSES}, False),
        ({"no_change": NOT_APPLICABLE, "additive": NOT_APPLICABLE}, False),  # nothing compared is no win
        ({}, False),
    ],
)
def test_beating_every_baseline_needs_an_interval_above_zero_for_each(verdicts, expected):
    assert _verdict(verdicts).beats_every_baseline is expected


def test_a_nan_metric_or_one_no_baseline_has_is_not_counted_as_a_win():
    model = {"pearson_delta": [math.nan] * 6, "mse_de": _shifted(UP, 0.0), "mse": _shifted(UP, -0.05)}
    baselines = {"mean_effect": {"pearson_delta": _shifted(UP, 0.1), "mse_de": _shifted(UP, 0.2)}}  # no mse
    report = report_from_values(model, baselines)
    verdicts = compare(report, metrics=("pearson_delta", "mse_de", "mse"), subgroups=(None,))
    assert "GEARS beats every baseline on 1 of 3 metrics" in verdict_table(verdicts)
    page = render_report_page({}, {**report, "best_epoch": 1, "history": [], "world_size": 1}, {})
    assert "GEARS beats every baseline on 1 of 3 metrics" in page
    assert [verdict.beats_every_baseline for verdict in verdicts] == [False, True, False]
    assert verdicts[0].comparisons["mean_effect"].verdict == NOT_APPLICABLE  # no perturbation with both values


def test_the_console_table_shows_a_subgroup_only_where_it_differs_from_all_test_conditions():
    values = {"pearson_delta": UP, "mse_de": UP}
    for subgroups, shown in [
        ({"unseen_single": [0, 1, 2, 3, 4, 5]}, []),  # single genes: the subgroup is the whole
        ({"combo_seen1": [0, 1, 2], "unseen_single": [3, 4, 5]}, ["combo_seen1", "unseen_single"]),
    ]:
        report = report_from_values(
            values, {"mean_effect": {k: _shifted(v, -0.1) for k, v in values.items()}}, subgroups
        )
        table = verdict_table(summary_verdicts(compare(report), report["model"]))
        labelled = sorted({line.split(":")[0] for line in table.splitlines() if line.split(":")[0] in subgroups})
        assert labelled == shown, table


def test_the_console_table_gives_baselines_that_predicted_the_same_one_row_and_says_why():
    model = {"pearson_delta": UP, "mse_de": _shifted(UP, 0.3)}
    same = {"pearson_delta": _shifted(UP, 0.26), "mse_de": _shifted(UP, 0.26)}
    linear = {"pearson_delta": _shifted(UP, -0.03), "mse_de": _shifted(UP, 0.4)}
    report = report_from_values(model, {"mean_effect": same, "additive": dict(same), "linear": linear})
    lines = verdict_table(compare(report)).splitlines()
    assert lines[0].split() == [
        "metric",
        "better",
        "GEARS",
        "baseline",
        "value",
        "difference",
        "[95%",
        "interval]",
        "won",
        "verdict",
    ]
    assert lines[1].split()[:5] == ["pearson_delta", "higher", "0.1083", "mean_effect", "="]  # one row for both
    assert lines[1].split()[5:8] == ["additive", "0.3683", "-0.26"]
    assert lines[2].split()[:2] == ["linear", "0.0783"]
    assert lines[-1].startswith("mean_effect and additive predicted the same on this test set, so they are shown as")
    report = report_from_values(model, {"mean_effect": same, "additive": model, "linear": linear})
    assert "predicted the same" not in verdict_table(compare(report))
