"""Verdicts that hold beyond one seed: the test metrics of several replicates of a run (the
same configuration trained with other model or split seeds), summarised per metric and
subgroup.

For GEARS and each baseline, the mean and standard deviation (n - 1 in the denominator)
over the replicates. For each baseline, the paired comparison over the replicates and
their test perturbations together (``verdicts.paired_comparisons``): every replicate scores
GEARS and the baselines on the same test conditions of its split, perturbation by
perturbation, and the bootstrap resamples both the replicates and the perturbations
(``evaluation.paired_bootstrap``), so that a win that belongs to a few perturbations does
not read as certain because every seed repeats it. The verdict reads the interval of the
mean signed difference (+ favours GEARS): "beats" when it lies wholly above 0, "loses to"
when wholly below, "no clear difference" when it holds 0; n/a, with the reason, where there
is no interval (a comparison ``not_applicable`` rules out, fewer than 3 perturbations,
reports without per-perturbation values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gears_ddp.evaluation.paired_bootstrap import LOSES, NOT_APPLICABLE, PairedComparison
from gears_ddp.report.not_applicable import not_applicable_notes, not_applicable_reason
from gears_ddp.report.numbers import format_interval, format_mean_sd
from gears_ddp.report.verdicts import (
    GEARS,
    HEADLINE_METRICS,
    READING,
    SUBGROUPS,
    beats_every_baseline,
    comparison_summary,
    direction_words,
    higher_is_better,
    metric_key,
    paired_comparisons,
    summary_value,
)

CONFIDENCE = 0.95


@dataclass
class Spread:
    """One method's values of one metric, one per replicate (NaN where missing)."""

    values: list[float]

    @property
    def finite(self) -> np.ndarray:
        values = np.asarray(self.values, dtype=np.float64)
        return values[np.isfinite(values)]

    @property
    def n(self) -> int:
        return int(self.finite.size)

    @property
    def mean(self) -> float:
        return float(self.finite.mean()) if self.n else math.nan

    @property
    def sd(self) -> float:
        return float(standard_deviation(self.finite))  # a float already: one row of values

    @property
    def text(self) -> str:
        """``'0.3 ± 0.02 (n=5)'``, as the pages and tables write it (``numbers.format_mean_sd``)."""
        return format_mean_sd(self.mean, self.sd, self.n)


@dataclass
class ReplicateVerdict:
    """One metric (and subgroup) over the replicates: GEARS's and each baseline's spread over
    the replicates, and each baseline's paired comparison over replicates and perturbations."""

    key: str
    subgroup: str | None
    metric: str
    higher_is_better: bool
    gears: Spread
    baselines: dict[str, Spread]
    differences: dict[str, PairedComparison]

    @property
    def direction(self) -> str:
        return direction_words(self.higher_is_better)

    @property
    def beats_every_baseline(self) -> bool:
        return beats_every_baseline(self.differences)

    @property
    def loses_to_a_baseline(self) -> bool:
        return any(d.verdict == LOSES for d in self.differences.values())

    @property
    def summary(self) -> str:
        return comparison_summary(self.differences)


def standard_deviation(values) -> float | np.ndarray:
    """The sample standard deviation (n - 1) of the values along the last axis, exactly 0 for
    equal values (a baseline that no seed changes), NaN for fewer than two: a float for one
    row of values, an array for several (rows x replicates)."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape[-1] < 2:
        return _float_or_array(np.full(values.shape[:-1], math.nan))
    with np.errstate(invalid="ignore"):  # infinite values: NaN
        return _float_or_array(np.where(np.ptp(values, axis=-1) == 0, 0.0, values.std(ddof=1, axis=-1)))


def t_interval(differences, confidence: float = CONFIDENCE):
    """Mean, standard deviation and the two ends of the ``confidence`` t-interval of the mean
    of the values along the last axis of ``differences`` (NaN ends for fewer than two): floats
    for one row of values, arrays for several (rows x replicates, e.g. pairs x models)."""
    values = np.asarray(differences, dtype=np.float64)
    n = values.shape[-1]
    if n == 0:
        nan = _float_or_array(np.full(values.shape[:-1], math.nan))
        return nan, nan, nan, nan
    with np.errstate(invalid="ignore"):  # infinite values: NaN where they meet
        mean = _float_or_array(values.mean(axis=-1))
        if n < 2:
            nan = _float_or_array(np.full(values.shape[:-1], math.nan))
            return mean, nan, nan, nan
        from scipy import stats  # here, not at the top: seconds to import, and the library imports this module

        sd = standard_deviation(values)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return mean, sd, mean - half, mean + half


def _float_or_array(values: np.ndarray) -> float | np.ndarray:
    return float(values) if values.ndim == 0 else values


def summarise_replicates(
    reports: dict[str, dict], metrics=HEADLINE_METRICS, subgroups=(None, *SUBGROUPS)
) -> list[ReplicateVerdict]:
    """One ``ReplicateVerdict`` for each (subgroup, metric) some replicate's model summary
    has, in the order given. ``reports`` maps each replicate's name to its run report
    (``'model'`` and ``'baselines'`` test summaries and ``'per_perturbation'`` values); the
    values keep the mapping's order."""
    runs = list(reports.values())
    baseline_names = list(dict.fromkeys(name for report in runs for name in report.get("baselines", {})))
    keys = [
        (subgroup, metric)
        for subgroup in subgroups
        for metric in metrics
        if any(metric_key(metric, subgroup) in report.get("model", {}) for report in runs)
    ]
    comparisons = paired_comparisons(
        runs, [(subgroup, metric, name) for subgroup, metric in keys for name in baseline_names]
    )
    verdicts = []
    for subgroup, metric in keys:
        key = metric_key(metric, subgroup)
        gears = Spread([summary_value(report.get("model", {}), key) for report in runs])
        baselines = {
            name: Spread([summary_value(report.get("baselines", {}).get(name, {}), key) for report in runs])
            for name in baseline_names
        }
        differences = {name: comparisons[(subgroup, metric, name)] for name in baseline_names}
        verdicts.append(
            ReplicateVerdict(key, subgroup, metric, higher_is_better(metric), gears, baselines, differences)
        )
    return verdicts


def summary_records(verdicts: list[ReplicateVerdict]) -> list[dict]:
    """The verdicts as plain data (``report.json``): per metric and subgroup, each method's
    values, mean and sd, and each baseline's paired comparison (``difference``, ``low``,
    ``high``: signed, + favours GEARS; ``won``, ``n``, ``replicates``, ``verdict``,
    ``reason``), with, as earlier summaries had them, the replicates' differences of the
    means GEARS - baseline (``gears_minus_baseline``, their ``mean`` and ``sd``) and the
    interval in that orientation (``ci_low``, ``ci_high``)."""
    records = []
    for verdict in verdicts:
        methods = {GEARS: verdict.gears, **verdict.baselines}
        differences = {}
        for name, comparison in verdict.differences.items():
            raw = [
                a - b
                for a, b in zip(verdict.gears.values, verdict.baselines[name].values)
                if math.isfinite(a) and math.isfinite(b)
            ]
            ends = (
                (comparison.low, comparison.high) if verdict.higher_is_better else (-comparison.high, -comparison.low)
            )
            differences[name] = {
                **comparison.record(),
                "gears_minus_baseline": raw,
                "mean": float(np.mean(raw)) if raw else math.nan,
                "sd": standard_deviation(raw),
                "ci_low": ends[0],
                "ci_high": ends[1],
            }
        records.append(
            {
                "key": verdict.key,
                "subgroup": verdict.subgroup,
                "metric": verdict.metric,
                "higher_is_better": verdict.higher_is_better,
                "methods": {
                    name: {"values": spread.values, "n": spread.n, "mean": spread.mean, "sd": spread.sd}
                    for name, spread in methods.items()
                },
                "differences": differences,
                "summary": verdict.summary,
            }
        )
    return records


def replicate_table(records: list[dict]) -> str:
    """A text table of ``summary_records`` (as ``report.json`` holds them): each metric with
    its direction, GEARS's mean ± sd, and for each baseline the mean paired difference
    (signed, + favours GEARS), its 95% interval over replicates and perturbations, the
    perturbations GEARS won and the verdict (n/a where there is no interval, explained
    under the table)."""
    names = list(dict.fromkeys(name for record in records for name in record["differences"]))
    header = ["metric", "better", "GEARS mean ± sd", *(f"vs {name}: difference [95% interval] won" for name in names)]
    rows = [header]
    for record in records:
        gears = record["methods"][GEARS]
        row = [
            f"{record['subgroup'] + ': ' if record['subgroup'] else ''}{record['metric']}",
            "higher" if record["higher_is_better"] else "lower",
            format_mean_sd(gears["mean"], gears["sd"], gears["n"]),
        ]
        for name in names:
            d = record["differences"][name]
            row.append(
                "n/a"
                if d["verdict"] == NOT_APPLICABLE
                else f"{format_interval(d['difference'], d['low'], d['high'])} {d['won']}/{d['n']} {d['verdict']}"
            )
        rows.append(row)
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    notes = not_applicable_notes(
        (name, record["metric"])
        for record in records
        for name, d in record["differences"].items()
        if d["verdict"] == NOT_APPLICABLE and not_applicable_reason(name, record["metric"])
    )
    others = dict.fromkeys(
        d["reason"]
        for record in records
        for name, d in record["differences"].items()
        if d["verdict"] == NOT_APPLICABLE and not not_applicable_reason(name, record["metric"])
    )
    return "\n".join(
        ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        + [READING.replace("over the test perturbations", "over the replicates and their test perturbations")]
        + notes
        + [f"n/a: {reason}" for reason in others]
    )
