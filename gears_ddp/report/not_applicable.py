"""Comparisons that are no verdict: a baseline whose value of a metric is fixed by how the
baseline is built, not by the data.

The no-change baseline predicts the control mean for every perturbation: its predicted
change is zero at every gene. Two families of metrics then say nothing about it.

- A correlation with the change (``pearson_delta``, ``pearson_delta_de``,
  ``pearson_delta_top20_de_non_dropout``, ...) is undefined for a prediction that does not
  change; the reference reports it as 0, so any positive correlation would "beat" no change
  and any negative one "lose" to it.
- The share of genes predicted to move the wrong way (``frac_opposite_direction_*``) is 0 by
  construction: a gene that is not moved is never moved the wrong way, so GEARS could only
  lose.

Such a comparison is *not applicable*: neither a win nor a loss. The console tables, a
run's ``report.json`` and page, and the replicates' summary show it as n/a with the reason
given here, the one place that says which (baseline, metric) pairs these are.
"""

from __future__ import annotations

from typing import Iterable

NOT_APPLICABLE = "not applicable"
# (baseline, metric name prefix) -> why comparing GEARS with that baseline on those metrics is no verdict
REASONS = {
    (
        "no_change",
        "pearson_delta",
    ): "it predicts no change, so a correlation with the change is undefined (reported as 0)",
    (
        "no_change",
        "frac_opposite_direction",
    ): "it predicts no change, so it never moves a gene the wrong way (0 by construction)",
}


def not_applicable_reason(baseline: str, metric: str) -> str | None:
    """Why comparing GEARS with ``baseline`` on ``metric`` (a name without prefix or
    subgroup) is no verdict; None when it is one."""
    return next(
        (reason for (name, prefix), reason in REASONS.items() if name == baseline and metric.startswith(prefix)), None
    )


def not_applicable_notes(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """The note under a console table that shows n/a for the ``(baseline, metric)`` pairs:
    for each baseline and reason, the metrics it covers; no lines when there are none."""
    metrics: dict[tuple[str, str | None], list[str]] = {}
    for baseline, metric in pairs:
        reason = not_applicable_reason(baseline, metric)
        metrics.setdefault((baseline, reason), [])
        if metric not in metrics[(baseline, reason)]:
            metrics[(baseline, reason)].append(metric)
    if not metrics:
        return []
    return ["n/a: not a verdict, the baseline's value is fixed by how it predicts:"] + [
        f"  {baseline} on {', '.join(names)}: {reason}" for (baseline, reason), names in metrics.items()
    ]
