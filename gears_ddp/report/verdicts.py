"""Which way each metric is better, and whether the model beat each baseline.

A table of numbers alone does not say that GEARS lost to a baseline: ``mse`` is better
low, ``pearson_delta`` high, and a model can win one and lose the other. ``compare`` turns
the test summaries of the model and the baselines into one ``MetricVerdict`` per metric
(and subgroup), which the console summary (``verdict_table``), the run's ``report.json``
(``verdict_records``), the run report page and its plots share. A comparison that
``not_applicable`` rules out is neither a win nor a loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gears_ddp.report.equal_baselines import equal_baseline_groups, equal_baselines_notes, group_heading
from gears_ddp.report.not_applicable import not_applicable_notes, not_applicable_reason

SUBGROUPS = ("combo_seen0", "combo_seen1", "combo_seen2", "unseen_single")
SUBGROUP_NAMES = {None: "all test conditions",  # the simulation split's test subgroups, in words
                  "combo_seen0": "two-gene combinations, neither gene seen in training",
                  "combo_seen1": "two-gene combinations, one gene seen in training",
                  "combo_seen2": "two-gene combinations, both genes seen in training",
                  "unseen_single": "single genes not seen in training"}
# the metrics shown by default: the reference's logged test summary and its overall metrics
HEADLINE_METRICS = ("pearson_delta", "mse_de", "pearson_delta_de", "mse", "pearson",
                    "frac_opposite_direction_top20_non_dropout", "mse_top20_de_non_dropout")
LOWER_IS_BETTER_PREFIXES = ("mse", "frac_opposite_direction", "frac_0/1_direction", "fold_change_gap", "mean_sigma",
                            "std_sigma")
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


@dataclass
class MetricVerdict:
    """One metric of the model beside the baselines: ``beats[name]`` is True where the model
    is better than that baseline, False where it is not, None where either value is missing
    or the comparison is not applicable (``not_applicable[name]`` then says why)."""

    key: str
    subgroup: str | None
    metric: str
    higher_is_better: bool
    model: float
    baselines: dict[str, float]
    beats: dict[str, bool | None]
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def direction(self) -> str:
        return direction_words(self.higher_is_better)

    @property
    def beats_every_baseline(self) -> bool:
        """True when the model was compared with at least one baseline and beat each one
        compared; a NaN value, a baseline without the metric and a comparison that is not
        applicable are no comparison, so a metric with none is not a win."""
        compared = [won for won in self.beats.values() if won is not None]
        return bool(compared) and all(compared)

    @property
    def loses_to_a_baseline(self) -> bool:
        return False in self.beats.values()

    @property
    def summary(self) -> str:
        """``'beats all 3 baselines'``, ``'loses to mean_effect, additive'``, ``'beats all 2
        baselines; n/a for no_change'``, ..."""
        lost = [name for name, won in self.beats.items() if won is False]
        known = [name for name, won in self.beats.items() if won is not None]
        if lost:
            parts = ["loses to " + ", ".join(lost)]
        elif known:
            parts = [f"beats all {len(known)} baselines" if len(known) > 1 else f"beats {known[0]}"]
        else:
            parts = []
        if self.not_applicable:
            parts.append("n/a for " + ", ".join(self.not_applicable))
        return "; ".join(parts) or "no baseline to compare"


def compare(model: dict, baselines: dict[str, dict], metrics=HEADLINE_METRICS, subgroups=(None, *SUBGROUPS),
            prefix: str = "test_") -> list[MetricVerdict]:
    """A verdict for each (subgroup, metric) the model's summary has, in the order given."""
    verdicts = []
    for subgroup in subgroups:
        for metric in metrics:
            key = metric_key(metric, subgroup, prefix)
            if key not in model:
                continue
            value, higher = summary_value(model, key), higher_is_better(metric)
            others = {name: summary_value(summary, key) for name, summary in baselines.items() if key in summary}
            reasons = {name: reason for name in others if (reason := not_applicable_reason(name, metric))}
            beats = {name: None if name in reasons else is_better(value, others.get(name), higher)
                     for name in baselines}
            verdicts.append(MetricVerdict(key, subgroup, metric, higher, value, others, beats, reasons))
    return verdicts


def direction_words(higher_is_better: bool) -> str:
    """Which way a metric is better, in words."""
    return "higher is better" if higher_is_better else "lower is better"


def is_better(value: float, other: float | None, higher: bool) -> bool | None:
    """Whether ``value`` is better than ``other`` in the metric's direction; None when
    either is missing or NaN."""
    if other is None or value != value or other != other:  # NaN: no verdict
        return None
    return value > other if higher else value < other


def summary_verdicts(model: dict, baselines: dict[str, dict]) -> list[MetricVerdict]:
    """What the console shows: every headline metric over all test conditions, then
    ``pearson_delta`` and ``mse_de`` per subgroup that differs from them (``shown_subgroups``)."""
    return (compare(model, baselines, subgroups=(None,))
            + compare(model, baselines, metrics=("pearson_delta", "mse_de"), subgroups=shown_subgroups(model)))


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
    return tuple(subgroup for subgroup in SUBGROUPS
                 if any(key.startswith(metric_key("", subgroup, prefix)) for key in model))


def verdict_table(verdicts: list[MetricVerdict]) -> str:
    """A text table: each metric with its direction, the model beside each baseline (n/a
    where the comparison is not applicable; one column for baselines that predicted the
    same, equal at every metric shown: ``equal_baselines``), and the verdict; then how many
    of the overall metrics the model won, why the n/a ones are no verdict, and why baselines
    share a column."""
    names = list(dict.fromkeys(name for v in verdicts for name in v.beats))
    groups = equal_baseline_groups({name: {v.key: v.baselines.get(name) for v in verdicts} for name in names})
    labels = [f"{v.subgroup + ': ' if v.subgroup else ''}{v.metric}" for v in verdicts]
    width = max([len("metric"), *map(len, labels)]) + 2
    headings = {group[0]: group_heading(group) for group in groups}
    column = {n: max(13, len(heading) + 2) for n, heading in headings.items()}
    lines = [f"{'metric':{width}}{'better':>7}{'GEARS':>10}"
             + "".join(f"{heading:>{column[n]}}" for n, heading in headings.items()) + "  verdict"]
    for label, v in zip(labels, verdicts):
        cells = "".join(f"{'n/a':>{column[n]}}" if n in v.not_applicable else f"{v.baselines[n]:{column[n]}.4f}"
                        if n in v.baselines else f"{'-':>{column[n]}}" for n in headings)
        lines.append(f"{label:{width}}{'higher' if v.higher_is_better else 'lower':>7}{v.model:10.4f}{cells}  "
                     f"{v.summary}")
    if any(v.subgroup is None for v in verdicts):
        lines.append("overall: " + outcome_line(verdicts))
    lines += not_applicable_notes((name, v.metric) for v in verdicts for name in v.not_applicable)
    return "\n".join(lines + equal_baselines_notes(groups))


def verdict_records(verdicts: list[MetricVerdict]) -> list[dict]:
    """The verdicts as plain data (a run's ``report.json``): per metric and subgroup, the
    model's value and, per baseline, its value, whether the model beats it (null: no
    comparison) and why the comparison is not applicable (null when it is)."""
    return [{"key": v.key, "subgroup": v.subgroup, "metric": v.metric, "higher_is_better": v.higher_is_better,
             "model": v.model,
             "baselines": {name: {"value": v.baselines.get(name), "beats": beats,
                                  "not_applicable": v.not_applicable.get(name)} for name, beats in v.beats.items()},
             "beats_every_baseline": v.beats_every_baseline, "summary": v.summary} for v in verdicts]


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
