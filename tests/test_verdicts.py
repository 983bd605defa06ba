"""Tests for gears_ddp.report.verdicts: which way each metric is better, who won, and what
counts as beating every baseline."""
import math

import pytest

from gears_ddp.report.page import render_report_page
from gears_ddp.report.verdicts import MetricVerdict, compare, higher_is_better, summary_verdicts, verdict_table


def test_verdicts_know_which_way_is_better_and_who_won():
    assert higher_is_better("pearson_delta") and not higher_is_better("mse_de")
    assert not higher_is_better("frac_opposite_direction_top20_non_dropout")
    model = {"test_pearson_delta": 0.02, "test_mse_de": 0.30, "test_unseen_single_pearson_delta": 0.5}
    baselines = {"no_change": {"test_pearson_delta": 0.0, "test_mse_de": 0.40},
                 "mean_effect": {"test_pearson_delta": 0.16, "test_mse_de": 0.20,
                                 "test_unseen_single_pearson_delta": 0.1}}
    verdicts = {v.key: v for v in compare(model, baselines)}
    assert verdicts["test_pearson_delta"].beats == {"no_change": None, "mean_effect": False}  # n/a: no change
    assert verdicts["test_mse_de"].beats == {"no_change": True, "mean_effect": False}
    assert verdicts["test_unseen_single_pearson_delta"].beats == {"no_change": None, "mean_effect": True}
    table = verdict_table(list(verdicts.values()))
    assert "loses to mean_effect" in table and "lower" in table and "higher" in table
    assert "GEARS beats every baseline on 0 of 2 metrics" in table


def _verdict(beats: dict) -> MetricVerdict:
    return MetricVerdict("test_mse_de", None, "mse_de", False, 0.1, {name: 0.2 for name in beats}, beats)


@pytest.mark.parametrize("beats, expected", [
    ({"no_change": True, "additive": True}, True),
    ({"no_change": True, "additive": None}, True),    # a missing baseline value is no comparison
    ({"no_change": True, "additive": False}, False),
    ({"no_change": None, "additive": None}, False),   # nothing compared is no win
    ({}, False)])
def test_beating_every_baseline_needs_a_comparison_and_no_loss(beats, expected):
    assert _verdict(beats).beats_every_baseline is expected


def test_a_nan_metric_or_one_no_baseline_has_is_not_counted_as_a_win():
    model = {"test_pearson_delta": math.nan, "test_mse_de": 0.1, "test_mse": 0.01}
    baselines = {"mean_effect": {"test_pearson_delta": 0.2, "test_mse_de": 0.3}}  # no test_mse
    verdicts = compare(model, baselines, metrics=("pearson_delta", "mse_de", "mse"), subgroups=(None,))
    assert "GEARS beats every baseline on 1 of 3 metrics" in verdict_table(verdicts)
    report = {"model": model, "baselines": baselines, "best_epoch": 1, "history": [], "world_size": 1}
    assert "GEARS beats every baseline on 1 of 3 metrics" in render_report_page({}, report, {})
    assert [verdict.beats_every_baseline for verdict in verdicts] == [False, True, False]


def test_the_console_table_shows_a_subgroup_only_where_it_differs_from_all_test_conditions():
    def summary(value, groups):
        return {f"test_{group + '_' if group else ''}{metric}": value for group in groups
                for metric in ("pearson_delta", "mse_de")}

    for groups, shown in [((None, "unseen_single"), []),  # a screen of single genes: the subgroup is the whole
                          ((None, "combo_seen1", "unseen_single"), ["combo_seen1", "unseen_single"])]:
        table = verdict_table(summary_verdicts(summary(0.5, groups), {"mean_effect": summary(0.4, groups)}))
        labelled = sorted({line.split(":")[0] for line in table.splitlines() if line.split(":")[0] in groups})
        assert labelled == shown, table


def test_the_console_table_gives_baselines_that_predicted_the_same_one_column_and_says_why():
    model = {"test_pearson_delta": 0.1, "test_mse_de": 0.4}
    same = {"test_pearson_delta": 0.36, "test_mse_de": 0.36}
    baselines = {"mean_effect": same, "additive": dict(same), "linear": {"test_pearson_delta": 0.07, "test_mse_de": 0.5}}
    table = verdict_table(summary_verdicts(model, baselines))
    assert table.splitlines()[0].split()[3:] == ["mean_effect", "=", "additive", "linear", "verdict"]  # one column
    assert table.splitlines()[1].split()[:5] == ["pearson_delta", "higher", "0.1000", "0.3600", "0.0700"]
    assert table.splitlines()[-1].startswith("mean_effect and additive predicted the same on this test set, so they "
                                             "share a column")
    assert "predicted the same" not in verdict_table(summary_verdicts(model, {**baselines, "additive": model}))
