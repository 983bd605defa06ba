"""Tests for gears_ddp.report.verdicts: which way each metric is better, who won, and what
counts as beating every baseline."""
import math

import pytest

from gears_ddp.report.page import render_report_page
from gears_ddp.report.verdicts import MetricVerdict, compare, verdict_table


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
