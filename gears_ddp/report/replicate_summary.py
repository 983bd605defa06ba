"""Verdicts that hold beyond one seed: the test metrics of several replicates of a run (the
same configuration trained with other model or split seeds), summarised per metric and
subgroup.

For GEARS and each baseline, the mean and standard deviation (n - 1 in the denominator)
over the replicates. For each baseline, the paired differences GEARS - baseline: every
replicate scores GEARS and the baselines on the same test conditions of the same split, so
what moves both from one replicate to the next cancels in the difference. Their mean and a
95% t-interval on them (``INTERVAL_METHOD``) give the verdict, read in the metric's own
direction (``verdicts.higher_is_better``): "beats" when the whole interval lies on GEARS's
better side of zero, "loses to" when it lies wholly on the worse side, "no clear
difference" when it holds zero. A replicate missing either value of a pair is left out of
that pair's interval; fewer than two pairs give no interval and no verdict. A pair that
``not_applicable`` rules out (a baseline whose value is fixed by how it predicts) keeps its
numbers but gives no verdict either: "not applicable", with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gears_ddp.report.not_applicable import NOT_APPLICABLE, not_applicable_notes, not_applicable_reason
from gears_ddp.report.numbers import format_interval, format_mean_sd
from gears_ddp.report.verdicts import (HEADLINE_METRICS, SUBGROUPS, direction_words, higher_is_better, metric_key,
                                       summary_value)

CONFIDENCE = 0.95
INTERVAL_METHOD = ("95% t-interval on the paired differences GEARS - baseline over the replicates: mean difference "
                   "± t(0.975, n - 1) x sd / sqrt(n), where sd is the differences' standard deviation (n - 1 in the "
                   "denominator) and n the number of replicates")
BEATS, LOSES, NO_CLEAR, NO_INTERVAL = "beats", "loses to", "no clear difference", "no interval"
GEARS = "GEARS"


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
        return standard_deviation(self.finite)

    @property
    def text(self) -> str:
        """``'0.3 ± 0.02 (n=5)'``, as the pages and tables write it (``numbers.format_mean_sd``)."""
        return format_mean_sd(self.mean, self.sd, self.n)


@dataclass
class PairedDifference:
    """GEARS - one baseline, replicate by replicate, with the t-interval of the mean
    difference and the verdict it gives; ``reason`` says why the comparison is not
    applicable (None when it is)."""

    differences: list[float]
    mean: float
    sd: float
    low: float
    high: float
    verdict: str
    reason: str | None = None

    @property
    def n(self) -> int:
        return len(self.differences)


@dataclass
class ReplicateVerdict:
    """One metric (and subgroup) over the replicates: GEARS's and each baseline's spread and
    each baseline's paired difference."""

    key: str
    subgroup: str | None
    metric: str
    higher_is_better: bool
    gears: Spread
    baselines: dict[str, Spread]
    differences: dict[str, PairedDifference]

    @property
    def direction(self) -> str:
        return direction_words(self.higher_is_better)

    @property
    def beats_every_baseline(self) -> bool:
        """True when GEARS was compared with at least one baseline and beats each one
        compared, interval and all; a comparison that is not applicable does not count."""
        compared = [d.verdict for d in self.differences.values() if d.verdict != NOT_APPLICABLE]
        return bool(compared) and all(verdict == BEATS for verdict in compared)

    @property
    def loses_to_a_baseline(self) -> bool:
        return any(d.verdict == LOSES for d in self.differences.values())

    @property
    def summary(self) -> str:
        """``'beats all 3 baselines'``, ``'beats mean_effect; loses to additive'``, ``'beats
        all 2 baselines; n/a for no_change'``, ..."""
        by_verdict: dict[str, list[str]] = {}
        for name, difference in self.differences.items():
            by_verdict.setdefault(difference.verdict, []).append(name)
        parts = []
        if set(by_verdict) - {NOT_APPLICABLE} == {BEATS} and len(by_verdict[BEATS]) > 1:
            parts.append(f"beats all {len(by_verdict.pop(BEATS))} baselines")
        words = {BEATS: "beats", LOSES: "loses to", NO_CLEAR: "no clear difference from",
                 NO_INTERVAL: "no interval (fewer than 2 replicates) for", NOT_APPLICABLE: "n/a for"}
        parts += [f"{words[verdict]} {', '.join(by_verdict[verdict])}" for verdict in words if verdict in by_verdict]
        return "; ".join(parts) if parts else "no baseline to compare"


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


def interval_verdict(low: float, high: float, higher: bool) -> str:
    """What an interval of GEARS - baseline says, for a metric better high (``higher``) or low."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return NO_INTERVAL
    if low > 0 or high < 0:
        gears_larger = low > 0
        return BEATS if gears_larger == higher else LOSES
    return NO_CLEAR


def paired_difference(model: Spread, baseline: Spread, higher: bool, reason: str | None = None) -> PairedDifference:
    """The differences of the replicates where both values are known, their interval and
    verdict; "not applicable" instead when there is a ``reason`` the comparison is none."""
    pairs = [(a, b) for a, b in zip(model.values, baseline.values) if math.isfinite(a) and math.isfinite(b)]
    differences = [a - b for a, b in pairs]
    mean, sd, low, high = t_interval(differences)
    verdict = NOT_APPLICABLE if reason else interval_verdict(low, high, higher)
    return PairedDifference(differences, mean, sd, low, high, verdict, reason)


def summarise_replicates(reports: dict[str, dict], metrics=HEADLINE_METRICS,
                         subgroups=(None, *SUBGROUPS)) -> list[ReplicateVerdict]:
    """One ``ReplicateVerdict`` for each (subgroup, metric) some replicate's model summary
    has, in the order given. ``reports`` maps each replicate's name to its run report
    (``'model'`` and ``'baselines'`` test summaries); the values keep the mapping's order."""
    baseline_names = list(dict.fromkeys(name for report in reports.values() for name in report.get("baselines", {})))
    verdicts = []
    for subgroup in subgroups:
        for metric in metrics:
            key = metric_key(metric, subgroup)
            if not any(key in report.get("model", {}) for report in reports.values()):
                continue
            higher = higher_is_better(metric)
            gears = Spread([summary_value(report.get("model", {}), key) for report in reports.values()])
            baselines = {name: Spread([summary_value(report.get("baselines", {}).get(name, {}), key)
                                       for report in reports.values()]) for name in baseline_names}
            differences = {name: paired_difference(gears, spread, higher, not_applicable_reason(name, metric))
                           for name, spread in baselines.items()}
            verdicts.append(ReplicateVerdict(key, subgroup, metric, higher, gears, baselines, differences))
    return verdicts


def summary_records(verdicts: list[ReplicateVerdict]) -> list[dict]:
    """The verdicts as plain data (``report.json``): per metric and subgroup, each method's
    values, mean and sd, and each baseline's paired difference, interval, verdict and, for a
    comparison that is not applicable, the reason."""
    records = []
    for verdict in verdicts:
        methods = {GEARS: verdict.gears, **verdict.baselines}
        records.append({
            "key": verdict.key, "subgroup": verdict.subgroup, "metric": verdict.metric,
            "higher_is_better": verdict.higher_is_better,
            "methods": {name: {"values": spread.values, "n": spread.n, "mean": spread.mean, "sd": spread.sd}
                        for name, spread in methods.items()},
            "differences": {name: {"gears_minus_baseline": difference.differences, "n": difference.n,
                                   "mean": difference.mean, "sd": difference.sd, "ci_low": difference.low,
                                   "ci_high": difference.high, "verdict": difference.verdict,
                                   "reason": difference.reason}
                            for name, difference in verdict.differences.items()},
            "summary": verdict.summary})
    return records


def replicate_table(records: list[dict]) -> str:
    """A text table of ``summary_records`` (as ``report.json`` holds them): each metric with
    its direction, GEARS's mean ± sd, and for each baseline the mean difference GEARS -
    baseline, its 95% interval and the verdict (n/a where the comparison is not applicable,
    explained under the table)."""
    names = list(dict.fromkeys(name for record in records for name in record["differences"]))
    header = ["metric", "better", "GEARS mean ± sd", *(f"GEARS - {name} [95% interval]" for name in names)]
    rows = [header]
    for record in records:
        gears = record["methods"][GEARS]
        row = [f"{record['subgroup'] + ': ' if record['subgroup'] else ''}{record['metric']}",
               "higher" if record["higher_is_better"] else "lower",
               format_mean_sd(gears["mean"], gears["sd"], gears["n"])]
        for name in names:
            d = record["differences"][name]
            row.append("n/a" if d["verdict"] == NOT_APPLICABLE else
                       f"{format_interval(d['mean'], d['ci_low'], d['ci_high'])} {d['verdict']}")
        rows.append(row)
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    notes = not_applicable_notes((name, record["metric"]) for record in records
                                 for name, d in record["differences"].items() if d["verdict"] == NOT_APPLICABLE)
    return "\n".join(["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
                     + notes)
