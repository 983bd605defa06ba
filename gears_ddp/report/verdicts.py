"""Which way each metric is better, and whether the model beat each baseline.

A table of numbers alone does not say that GEARS lost to a baseline: ``mse`` is better
low, ``pearson_delta`` high, and a model can win one and lose the other; nor does a
difference of two means over a handful of test perturbations say whether it would hold on
others. ``compare`` turns a run's report into one ``MetricVerdict`` per metric (and
subgroup), each baseline's verdict read from the paired per-perturbation comparison and its
95% interval (``evaluation.paired_bootstrap``), never from the two means alone; the console
summary (``verdict_table``), the run's ``report.json`` (``verdict_records``), the run report
page and its plots share them. A comparison without an interval (``not_applicable``, too
few perturbations, a metric that is one number for the whole test set) is neither a win
nor a loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gears_ddp.evaluation.paired_bootstrap import (
    BEATS,
    LOSES,
    NO_CLEAR,
    NOT_APPLICABLE,
    PairedComparison,
    compare_paired,
)
from gears_ddp.report.equal_baselines import equal_baseline_groups, equal_baselines_notes, group_heading
from gears_ddp.report.not_applicable import not_applicable_notes, not_applicable_reason
from gears_ddp.report.numbers import format_comparison

SUBGROUPS = ("combo_seen0", "combo_seen1", "combo_seen2", "unseen_single")
SUBGROUP_NAMES = {
    None: "all test conditions",  # the simulation split's test subgroups, in words
    "combo_seen0": "two-gene combinations, neither gene seen in training",
    "combo_seen1": "two-gene combinations, one gene seen in training",
    "combo_seen2": "two-gene combinations, both genes seen in training",
    "unseen_single": "single genes not seen in training",
}
# the metrics shown by default: the reference's logged test summary and its overall metrics
HEADLINE_METRICS = (
    "pearson_delta",
    "mse_de",
    "pearson_delta_de",
    "mse",
    "pearson",
    "frac_opposite_direction_top20_non_dropout",
    "mse_top20_de_non_dropout",
)
SUBGROUP_METRICS = ("pearson_delta", "mse_de")  # what the console and the pictures show per subgroup
LOWER_IS_BETTER_PREFIXES = (
    "mse",
    "frac_opposite_direction",
    "frac_0/1_direction",
    "fold_change_gap",
    "mean_sigma",
    "std_sigma",
)
MEANINGS = {
    "pearson_delta": "correlation of predicted and true change over control, all genes",
    "pearson_delta_de": "correlation of predicted and true change over control, top 20 DE genes",
    "mse_de": "squared error of the predicted expression at the top 20 DE genes",
    "mse": "squared error of the predicted expression, all genes",
    "pearson": "correlation of predicted and true expression, all genes (high even for no change)",
    "pearson_de": "correlation of predicted and true expression, top 20 DE genes",
    "frac_opposite_direction_top20_non_dropout": "share of top 20 DE genes predicted to move the wrong way",
    "frac_sigma_below_1_non_dropout": "share of top 20 DE genes predicted within one cell-to-cell SD",
    "mse_top20_de_non_dropout": "squared error of the predicted change at the top 20 non-dropout DE genes",
}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` (a name without prefix or subgroup) is better."""
    return not metric.startswith(LOWER_IS_BETTER_PREFIXES)


def metric_key(metric: str, subgroup: str | None = None, prefix: str = "test_") -> str:
    """``('mse_de', 'combo_seen1')`` -> ``'test_combo_seen1_mse_de'``: the key of a metric
    in a test summary, as the reference logs it."""
    return f"{prefix}{subgroup + '_' if subgroup else ''}{metric}"


def summary_value(summary: dict, key: str) -> float:
    """``summary[key]`` as a float; NaN when absent or null (a report read from JSON)."""
    value = summary.get(key)
    return math.nan if value is None else float(value)


GEARS = "GEARS"
ONE_NUMBER = "one number for the whole test set, not one per perturbation: no interval"
NO_PER_PERTURBATION = "the report holds no per-perturbation values (written before verdicts had intervals): no interval"
READING = (
    "difference: GEARS minus the baseline, signed so that + favours GEARS, with its 95% interval over the test "
    "perturbations (docs/evaluation.md, reading a verdict); won: the perturbations where GEARS did better"
)


def per_perturbation_record(
    conditions, subgroups: dict | None, per_condition: dict[str, dict], metrics=HEADLINE_METRICS
) -> dict:
    """The per-perturbation values a report keeps, from which every verdict is derived:
    ``conditions`` (the test perturbations, control left out), ``subgroups`` (each
    subgroup's conditions) and ``values`` (method -> metric -> one value per condition, NaN
    where it has none). ``per_condition``: method (``'GEARS'`` and each baseline) -> the
    per-condition metrics ``evaluation.scoring.score`` gives."""
    conditions = [condition for condition in conditions if condition != "ctrl"]
    values = {}
    for method, by_condition in per_condition.items():
        values[method] = {
            metric: [float(by_condition.get(c, {}).get(metric, math.nan)) for c in conditions]
            for metric in metrics
            if any(metric in by_condition.get(c, {}) for c in conditions)
        }
    chosen = set(conditions)
    return {
        "conditions": conditions,
        "subgroups": {name: [c for c in members if c in chosen] for name, members in (subgroups or {}).items()},
        "values": values,
    }


def paired_comparisons(
    reports: list[dict], wanted: list[tuple[str | None, str, str]]
) -> dict[tuple[str | None, str, str], PairedComparison]:
    """The ``PairedComparison`` of each ``(subgroup, metric, baseline)`` of ``wanted``, from
    the per-perturbation values of ``reports`` (one run's report, or each replicate's):
    their perturbations aligned by name (a replicate that did not test one leaves a gap)
    and bootstrapped together per subgroup (``evaluation.paired_bootstrap``). A comparison
    without per-perturbation values is n/a with the reason; so is one that
    ``not_applicable`` rules out."""
    records = [report.get("per_perturbation") for report in reports]
    out = {}
    for subgroup in dict.fromkeys(subgroup for subgroup, _, _ in wanted):
        chosen = [(metric, name) for group, metric, name in wanted if group == subgroup]
        if any(record is None for record in records):
            out.update(
                {
                    (subgroup, metric, name): _not_applicable(NO_PER_PERTURBATION, len(reports))
                    for metric, name in chosen
                }
            )
            continue
        complete = [record for record in records if record is not None]  # every one (none is None, above)
        members = [_members(record, subgroup) for record in complete]
        position = {condition: index for index, condition in enumerate(dict.fromkeys(c for m in members for c in m))}
        stacked, keys, reasons, higher = [], [], [], []
        for metric, name in chosen:
            model, baseline = (
                _grid(complete, members, position, GEARS, metric),
                _grid(complete, members, position, name, metric),
            )
            if model is None or baseline is None:
                out[(subgroup, metric, name)] = _not_applicable(ONE_NUMBER, len(reports))
                continue
            stacked.append((model, baseline))
            keys.append((subgroup, metric, name))
            reasons.append(not_applicable_reason(name, metric))
            higher.append(higher_is_better(metric))
        if stacked:
            compared = compare_paired(
                np.stack([m for m, _ in stacked]), np.stack([b for _, b in stacked]), higher, reasons
            )
            out.update(zip(keys, compared))
    return out


def _members(record: dict, subgroup: str | None) -> list[str]:
    """The perturbations of ``subgroup`` (None: all) that a run's record tested."""
    return record["conditions"] if subgroup is None else record["subgroups"].get(subgroup, [])


def _grid(
    records: list[dict], members: list[list[str]], position: dict[str, int], method: str, metric: str
) -> np.ndarray | None:
    """``method``'s ``metric`` per run (rows) and perturbation (columns, at ``position``) over
    each run's ``members``; NaN where a run did not test one; None when no run has it."""
    values = np.full((len(records), len(position)), np.nan)
    found = False
    for row, (record, tested) in enumerate(zip(records, members)):
        column = record["values"].get(method, {}).get(metric)
        if column is None:
            continue
        found = True
        index = {c: i for i, c in enumerate(record["conditions"])}
        for condition in tested:
            value = column[index[condition]]
            values[row, position[condition]] = math.nan if value is None else value
    return values if found else None


def _not_applicable(reason: str, replicates: int) -> PairedComparison:
    return PairedComparison(math.nan, math.nan, math.nan, 0, 0, 0, replicates, NOT_APPLICABLE, reason)


def comparison_summary(comparisons: dict[str, PairedComparison]) -> str:
    """``'beats all 3 baselines'``, ``'beats linear; loses to mean_effect; no clear difference
    from additive; n/a for no_change'``, ...: each baseline under its interval's verdict."""
    by_verdict: dict[str, list[str]] = {}
    for name, comparison in comparisons.items():
        by_verdict.setdefault(comparison.verdict, []).append(name)
    parts = []
    if set(by_verdict) - {NOT_APPLICABLE} == {BEATS} and len(by_verdict[BEATS]) > 1:
        parts.append(f"beats all {len(by_verdict.pop(BEATS))} baselines")
    words = {BEATS: "beats", LOSES: "loses to", NO_CLEAR: "no clear difference from", NOT_APPLICABLE: "n/a for"}
    parts += [f"{words[verdict]} {', '.join(by_verdict[verdict])}" for verdict in words if verdict in by_verdict]
    return "; ".join(parts) if parts else "no baseline to compare"


def beats_every_baseline(comparisons: dict[str, PairedComparison]) -> bool:
    """True when at least one baseline was compared (an interval, not n/a) and every one
    compared was beaten, interval and all."""
    compared = [c.verdict for c in comparisons.values() if c.verdict != NOT_APPLICABLE]
    return bool(compared) and all(verdict == BEATS for verdict in compared)


@dataclass
class MetricVerdict:
    """One metric (and subgroup) of a run: the model's value and each baseline's, and each
    baseline's ``PairedComparison`` (its interval and verdict; n/a, with the reason, where
    there is none)."""

    key: str
    subgroup: str | None
    metric: str
    higher_is_better: bool
    model: float
    baselines: dict[str, float]
    comparisons: dict[str, PairedComparison]

    @property
    def direction(self) -> str:
        return direction_words(self.higher_is_better)

    @property
    def beats(self) -> dict[str, bool | None]:
        """Per baseline: True beaten, False lost to (interval and all), None otherwise."""
        return {name: {BEATS: True, LOSES: False}.get(c.verdict) for name, c in self.comparisons.items()}

    @property
    def not_applicable(self) -> dict[str, str | None]:
        """Per baseline without an interval: why."""
        return {name: c.reason for name, c in self.comparisons.items() if c.verdict == NOT_APPLICABLE}

    @property
    def beats_every_baseline(self) -> bool:
        return beats_every_baseline(self.comparisons)

    @property
    def loses_to_a_baseline(self) -> bool:
        return any(c.verdict == LOSES for c in self.comparisons.values())

    @property
    def summary(self) -> str:
        return comparison_summary(self.comparisons)


def compare(
    report: dict, metrics=HEADLINE_METRICS, subgroups=(None, *SUBGROUPS), prefix: str = "test_"
) -> list[MetricVerdict]:
    """A verdict for each (subgroup, metric) the report's model summary has, in the order
    given, each baseline's from the paired per-perturbation comparison
    (``paired_comparisons``); never from the two means alone."""
    model, baselines = report["model"], report.get("baselines", {})
    keys = [
        (subgroup, metric)
        for subgroup in subgroups
        for metric in metrics
        if metric_key(metric, subgroup, prefix) in model
    ]
    wanted = [
        (subgroup, metric, name)
        for subgroup, metric in keys
        for name, summary in baselines.items()
        if metric_key(metric, subgroup, prefix) in summary
    ]
    comparisons = paired_comparisons([report], wanted)
    verdicts = []
    for subgroup, metric in keys:
        key = metric_key(metric, subgroup, prefix)
        values = {name: summary_value(summary, key) for name, summary in baselines.items() if key in summary}
        verdicts.append(
            MetricVerdict(
                key,
                subgroup,
                metric,
                higher_is_better(metric),
                summary_value(model, key),
                values,
                {name: comparisons[(subgroup, metric, name)] for name in values},
            )
        )
    return verdicts


def report_verdicts(report: dict, subgroups=(None, *SUBGROUPS)) -> list[MetricVerdict]:
    """The verdicts of ``subgroups`` as the report's ``verdicts`` records hold them (a run
    computes them once, when it scores its test set; the page and its pictures show the very
    same), else computed from its per-perturbation values (``compare``)."""
    records = report.get("verdicts") or []
    if not records or any("verdict" not in compared for record in records for compared in record["baselines"].values()):
        return compare(report, subgroups=subgroups)
    return [
        MetricVerdict(
            record["key"],
            record["subgroup"],
            record["metric"],
            record["higher_is_better"],
            _number(record["model"]),
            {name: _number(compared["value"]) for name, compared in record["baselines"].items()},
            {name: _comparison_of_record(compared) for name, compared in record["baselines"].items()},
        )
        for record in records
        if record["subgroup"] in subgroups
    ]


def _comparison_of_record(compared: dict) -> PairedComparison:
    """A ``PairedComparison`` as ``report.json`` holds it (``PairedComparison.record``)."""
    values: dict[str, Any] = {
        key: _number(compared[key]) if key in ("difference", "low", "high") else compared[key]
        for key in PairedComparison.__dataclass_fields__
    }
    return PairedComparison(**values)


def _number(value) -> float:
    """A figure as ``report.json`` holds it (null for NaN) as a float."""
    return math.nan if value is None else float(value)


def direction_words(higher_is_better: bool) -> str:
    """Which way a metric is better, in words."""
    return "higher is better" if higher_is_better else "lower is better"


def summary_verdicts(verdicts: list[MetricVerdict], model: dict) -> list[MetricVerdict]:
    """What the console shows of ``verdicts`` (``compare``'s): every headline metric over all
    test conditions, then ``pearson_delta`` and ``mse_de`` per subgroup that differs from
    them (``shown_subgroups`` of the model's summary)."""
    shown = shown_subgroups(model)
    return [v for v in verdicts if v.subgroup is None] + [
        v for subgroup in shown for v in verdicts if v.subgroup == subgroup and v.metric in SUBGROUP_METRICS
    ]


def shown_subgroups(model: dict, prefix: str = "test_") -> tuple[str, ...]:
    """The test subgroups the model's summary has metrics of, each shown beside all test
    conditions only where it differs from them: a simulation split's subgroups divide its
    test set among them, so a subgroup alone holds every test condition, and its rows would
    repeat those of all test conditions (a screen of single genes: every test condition is
    a single gene not seen in training). ``whole_test_set_name`` then says what they all are."""
    present = _present_subgroups(model, prefix)
    return present if len(present) > 1 else ()


def whole_test_set_name(model: dict, prefix: str = "test_") -> str:
    """``'all test conditions'``; where one subgroup holds them all, what they all are:
    ``'all test conditions (single genes not seen in training)'``."""
    present = _present_subgroups(model, prefix)
    return SUBGROUP_NAMES[None] + (f" ({SUBGROUP_NAMES[present[0]]})" if len(present) == 1 else "")


def _present_subgroups(model: dict, prefix: str) -> tuple[str, ...]:
    """The subgroups (in ``SUBGROUPS`` order) that the summary ``model`` has a metric of."""
    return tuple(
        subgroup for subgroup in SUBGROUPS if any(key.startswith(metric_key("", subgroup, prefix)) for key in model)
    )


def verdict_table(verdicts: list[MetricVerdict]) -> str:
    """A text table, one row per metric and baseline (baselines that predicted the same,
    equal at every metric shown, share a row: ``equal_baselines``): the metric, its
    direction, GEARS's value, the baseline's, the paired difference with its 95% interval
    and the perturbations GEARS won (``+0.078 [-0.02, +0.17] 4/6``), and the verdict; then
    how many of the overall metrics GEARS won and lost, how to read a row, why the n/a ones
    are no verdict, and why baselines share a row."""
    names = list(dict.fromkeys(name for v in verdicts for name in v.comparisons))
    groups = equal_baseline_groups({name: {v.key: v.baselines.get(name) for v in verdicts} for name in names})
    headings = {group[0]: group_heading(group) for group in groups}
    rows = [["metric", "better", "GEARS", "baseline", "value", "difference [95% interval] won", "verdict"]]
    for v in verdicts:
        label = f"{v.subgroup + ': ' if v.subgroup else ''}{v.metric}"
        first = True
        for name, heading in headings.items():
            if name not in v.comparisons:
                continue
            comparison = v.comparisons[name]
            rows.append(
                [
                    label if first else "",
                    ("higher" if v.higher_is_better else "lower") if first else "",
                    f"{v.model:.4f}" if first else "",
                    heading,
                    "n/a" if not_applicable_reason(name, v.metric) else f"{v.baselines[name]:.4f}",
                    format_comparison(comparison),
                    comparison.verdict,
                ]
            )
            first = False
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    right = {2, 4}
    lines = [
        "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]
    if any(v.subgroup is None for v in verdicts):
        lines.append("overall: " + outcome_line(verdicts, interval_basis(verdicts)))
    lines.append(READING)
    lines += not_applicable_notes(
        (name, v.metric) for v in verdicts for name in v.comparisons if not_applicable_reason(name, v.metric)
    )
    other_reasons = dict.fromkeys(
        c.reason
        for v in verdicts
        for name, c in v.comparisons.items()
        if c.verdict == NOT_APPLICABLE and not not_applicable_reason(name, v.metric)
    )
    lines += [f"n/a: {reason}" for reason in other_reasons]
    return "\n".join(lines + equal_baselines_notes(groups))


def verdict_records(verdicts: list[MetricVerdict]) -> list[dict]:
    """The verdicts as plain data (a run's ``report.json``): per metric and subgroup, the
    model's value and, per baseline, its value, the paired comparison (``difference``,
    ``low``, ``high``, ``won``, ``n``, ``dropped``, ``verdict``, ``reason``: ``PairedComparison``),
    and, as earlier reports had them, ``beats`` (true: beaten, false: lost to, interval and
    all; null: neither) and ``not_applicable`` (why there is no verdict)."""
    return [
        {
            "key": v.key,
            "subgroup": v.subgroup,
            "metric": v.metric,
            "higher_is_better": v.higher_is_better,
            "model": v.model,
            "baselines": {
                name: {
                    "value": v.baselines.get(name),
                    **comparison.record(),
                    "beats": v.beats[name],
                    "not_applicable": v.not_applicable.get(name),
                }
                for name, comparison in v.comparisons.items()
            },
            "beats_every_baseline": v.beats_every_baseline,
            "summary": v.summary,
        }
        for v in verdicts
    ]


def interval_basis(verdicts: list[MetricVerdict]) -> str:
    """``'all test conditions, 95% intervals over 6 test perturbations'``: what the overall
    verdicts rest on (``'all test conditions'`` where none has an interval)."""
    counted = [
        c.n for v in verdicts if v.subgroup is None for c in v.comparisons.values() if c.verdict != NOT_APPLICABLE
    ]
    return (
        f"{SUBGROUP_NAMES[None]}, 95% intervals over {max(counted)} test perturbations"
        if counted
        else SUBGROUP_NAMES[None]
    )


def outcome_line(verdicts: list, basis: str = "all test conditions") -> str:
    """``'GEARS beats every baseline on 2 of 7 metrics and loses to one on 3 (all test
    conditions)'``, counted over the verdicts without subgroup. The console table and both
    report pages say it; ``verdicts`` are a run's ``MetricVerdict`` or the replicates'
    ``ReplicateVerdict`` (both say ``beats_every_baseline`` and ``loses_to_a_baseline``)."""
    overall = [verdict for verdict in verdicts if verdict.subgroup is None]
    if not any(verdict.baselines for verdict in overall):
        return "GEARS has no test metric with a baseline to compare it with"
    won = sum(verdict.beats_every_baseline for verdict in overall)
    lost = sum(verdict.loses_to_a_baseline for verdict in overall)
    return f"GEARS beats every baseline on {won} of {len(overall)} metrics and loses to one on {lost} ({basis})"
