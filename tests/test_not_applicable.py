"""Comparisons with a baseline whose value is fixed by how it predicts (no change on a
correlation with the change, or on the share of genes moved the wrong way) are no verdict:
n/a with the reason on the console, in a run's report.json and page, and in the
replicates' summary (its report.json, console table, page and pictures)."""

import json
import re

import pytest
from verdict_reports import report_from_values

from gears_ddp.evaluation.paired_bootstrap import BEATS, LOSES, NOT_APPLICABLE
from gears_ddp.report.not_applicable import not_applicable_reason
from gears_ddp.report.plots import figure_replicate_values
from gears_ddp.report.replicate_report import write_replicate_report
from gears_ddp.report.replicate_summary import replicate_table, summarise_replicates
from gears_ddp.report.run_files import write_run_report
from gears_ddp.report.verdicts import compare, verdict_records, verdict_table

OPPOSITE = "frac_opposite_direction_top20_non_dropout"
CORRELATION_REASON = not_applicable_reason("no_change", "pearson_delta")
DIRECTION_REASON = not_applicable_reason("no_change", OPPOSITE)


@pytest.mark.parametrize(
    "baseline, metric, applicable",
    [
        ("no_change", "pearson_delta", False),
        ("no_change", "pearson_delta_de", False),
        ("no_change", "pearson_delta_top20_de_non_dropout", False),
        ("no_change", OPPOSITE, False),
        ("no_change", "frac_opposite_direction_non_zero", False),
        ("no_change", "mse_de", True),
        ("no_change", "pearson", True),
        ("no_change", "pearson_de", True),
        ("mean_effect", "pearson_delta", True),
        ("additive", OPPOSITE, True),
    ],
)
def test_no_change_is_no_verdict_on_a_correlation_with_the_change_or_the_wrong_way_share(baseline, metric, applicable):
    assert (not_applicable_reason(baseline, metric) is None) is applicable


def test_the_two_reasons_say_why():
    assert "correlation" in CORRELATION_REASON and "reported as 0" in CORRELATION_REASON
    assert "wrong way" in DIRECTION_REASON and "0 by construction" in DIRECTION_REASON


# ----------------------------------------------------------------------------- one run

STEADY = [0.0, 0.01, -0.01, 0.02, 0.0, 0.01]


def _values(base: float):
    return [base + step for step in STEADY]


def _per_perturbation():
    """GEARS beats mean_effect and additive on every metric; against no change it "loses" the
    wrong-way share (0 by construction) and has a negative correlation where no change has 0."""
    model = {"pearson_delta": _values(-0.01), "mse_de": _values(0.1), OPPOSITE: _values(0.2)}
    baselines = {
        "no_change": {"pearson_delta": [0.0] * 6, "mse_de": _values(0.3), OPPOSITE: [0.0] * 6},
        "mean_effect": {"pearson_delta": [-0.05] * 6, "mse_de": [0.2] * 6, OPPOSITE: [0.4] * 6},
        "additive": {"pearson_delta": [-0.03] * 6, "mse_de": [0.15] * 6, OPPOSITE: [0.3] * 6},
    }
    return model, baselines


def _report():
    return report_from_values(*_per_perturbation())


def test_a_run_is_neither_won_nor_lost_where_no_change_is_no_verdict():
    pearson, mse, opposite = compare(_report())
    for verdict, reason in ((pearson, CORRELATION_REASON), (opposite, DIRECTION_REASON)):
        assert verdict.beats == {"no_change": None, "mean_effect": True, "additive": True}
        assert verdict.not_applicable == {"no_change": reason}
        assert verdict.beats_every_baseline and not verdict.loses_to_a_baseline
        assert verdict.summary == "beats all 2 baselines; n/a for no_change"
    assert mse.not_applicable == {} and mse.summary == "beats all 3 baselines"


def test_the_console_table_shows_na_and_why():
    table = verdict_table(compare(_report()))
    rows = [line.split() for line in table.splitlines()]
    no_change = {row[0]: row for row in rows if len(row) > 3 and row[3] == "no_change"}
    assert no_change["pearson_delta"][4:6] == ["n/a", "n/a"] and no_change[OPPOSITE][4:6] == ["n/a", "n/a"]
    assert no_change["mse_de"][4] == "0.3050"
    assert "GEARS beats every baseline on 3 of 3 metrics and loses to one on 0" in table
    assert f"no_change on pearson_delta: {CORRELATION_REASON}" in table
    assert f"no_change on {OPPOSITE}: {DIRECTION_REASON}" in table


def test_a_runs_report_json_and_page_show_na_and_why(tmp_path):
    report = {
        **_report(),
        "best_epoch": 1,
        "world_size": 1,
        "history": [{"epoch": 1, "train_loss": 1.0, "val_mse_de": 0.2}],
    }
    report["verdicts"] = verdict_records(compare(report))
    page = write_run_report(tmp_path, report, examples=[]).read_text(encoding="utf-8")
    records = {record["metric"]: record for record in json.loads((tmp_path / "report.json").read_text())["verdicts"]}
    no_change = records[OPPOSITE]["baselines"]["no_change"]
    assert (no_change["value"], no_change["beats"], no_change["not_applicable"]) == (0.0, None, DIRECTION_REASON)
    assert no_change["verdict"] == NOT_APPLICABLE and no_change["low"] is None  # NaN written as null
    correlation = records["pearson_delta"]["baselines"]["no_change"]  # GEARS above no change's 0 on 1 of 6
    assert (correlation["won"], correlation["n"]) == (None, 6) and no_change["won"] is None  # no wins counted
    additive = records[OPPOSITE]["baselines"]["additive"]
    assert (additive["beats"], additive["verdict"], additive["won"], additive["n"]) == (True, BEATS, 6, 6)
    assert records[OPPOSITE]["beats_every_baseline"] and records["pearson_delta"]["beats_every_baseline"]
    assert records["mse_de"]["baselines"]["no_change"]["not_applicable"] is None
    rows = re.findall(r"<tr><td><b>(.*?)</b>.*?</tr>", page)
    assert rows == ["pearson_delta", "mse_de", OPPOSITE]
    opposite = re.search(rf"<tr><td><b>{OPPOSITE}</b>.*?</tr>", page).group(0)
    assert f'<td class="na">n/a<br><span class="meaning">{DIRECTION_REASON}</span></td>' in opposite
    assert 'class="win">beats all 2 baselines; n/a for no_change<' in opposite
    assert "GEARS beats every baseline on 3 of 3 metrics and loses to one on 0" in page


# ----------------------------------------------------------------------------- replicates


def _replicate_reports():
    """Five replicates of ``_per_perturbation`` with GEARS's values moved a little per seed."""
    reports = {}
    for seed in range(5):
        model, baselines = _per_perturbation()
        moved = {metric: [value + 0.01 * seed for value in values] for metric, values in model.items()}
        reports[f"seed-{seed}"] = report_from_values(moved, baselines)
    return reports


def test_replicates_keep_the_differences_but_give_no_verdict_against_no_change(tmp_path):
    reports = _replicate_reports()
    pearson, mse, opposite = summarise_replicates(reports)
    assert opposite.differences["no_change"].verdict == NOT_APPLICABLE
    assert opposite.differences["no_change"].reason == DIRECTION_REASON
    assert opposite.differences["no_change"].difference == pytest.approx(-0.225)  # the numbers stay, signed
    assert pearson.differences["no_change"].verdict == NOT_APPLICABLE
    assert mse.differences["no_change"].verdict == BEATS and mse.differences["no_change"].reason is None
    assert opposite.differences["additive"].verdict == BEATS
    assert opposite.beats_every_baseline and not opposite.loses_to_a_baseline
    assert opposite.summary == "beats all 2 baselines; n/a for no_change"
    assert LOSES not in [d.verdict for verdict in (pearson, mse, opposite) for d in verdict.differences.values()]

    replicates = [
        {
            "name": name,
            "seed": seed,
            "split_seed": 1,
            "folder": str(tmp_path / name),
            "status": "finished",
            "error": None,
            "seconds": 10.0,
        }
        for seed, name in enumerate(reports)
    ]
    page = write_replicate_report(tmp_path, {"dataset_name": "toy"}, replicates, reports).read_text(encoding="utf-8")
    records = {record["metric"]: record for record in json.loads((tmp_path / "report.json").read_text())["metrics"]}
    assert records[OPPOSITE]["differences"]["no_change"]["verdict"] == NOT_APPLICABLE
    assert records[OPPOSITE]["differences"]["no_change"]["reason"] == DIRECTION_REASON
    assert records[OPPOSITE]["differences"]["no_change"]["mean"] == pytest.approx(0.225)  # GEARS - baseline, as before
    assert records["pearson_delta"]["differences"]["no_change"]["won"] is None  # no wins counted: no verdict
    assert records["pearson_delta"]["differences"]["mean_effect"]["won"] == 6
    assert records["mse_de"]["differences"]["no_change"]["reason"] is None

    table = replicate_table(list(records.values()))
    opposite_row = next(line for line in table.splitlines() if line.startswith(OPPOSITE))
    assert opposite_row.split("(n=5)")[1].split()[0] == "n/a"  # GEARS against no_change, after GEARS's mean ± sd
    assert f"no_change on pearson_delta: {CORRELATION_REASON}" in table

    row = re.search(rf"<tr><td><b>{OPPOSITE}</b>.*?</tr>", page).group(0)
    assert f'<td class="na">n/a<br><span class="meaning">{DIRECTION_REASON}</span></td>' in row
    assert "Over 5 replicates, GEARS beats every baseline on 3 of 3 metrics and loses to one on 0" in page


def test_the_replicates_picture_marks_no_change_na():
    verdicts = summarise_replicates(_replicate_reports(), metrics=(OPPOSITE,))
    axes = figure_replicate_values(verdicts).axes[0]
    assert [text.get_text() for text in axes.texts] == ["n/a", "beats", "beats"]  # no_change, mean_effect, additive
    assert "n/a: no interval" in axes.get_xlabel()
