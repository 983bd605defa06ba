"""Scoring an evaluation result: overall, per-condition and per-subgroup metrics, for the
model and for the baselines, under the published metric names."""

from __future__ import annotations

import numpy as np

from gears_ddp.evaluation.metrics import (
    EvaluationResult,
    MetricContext,
    compute_metrics,
    deeper_analysis,
    non_dropout_analysis,
    subgroup_metrics,
)

# the per-condition metrics the reference averages into its logged test summary
SUMMARY_METRICS = (
    "pearson_delta",
    "pearson_delta_de",
    "frac_opposite_direction_top20_non_dropout",
    "frac_sigma_below_1_non_dropout",
    "mse_top20_de_non_dropout",
)


def score(
    result: EvaluationResult, context: MetricContext, subgroups: dict | None = None, prefix: str = "test_"
) -> tuple[dict, dict]:
    """Summary metrics (``{prefix}{metric}`` and ``{prefix}{subgroup}_{metric}``) and the
    per-condition metrics (compute_metrics, deeper and non-dropout analyses merged)."""
    overall, per_condition = compute_metrics(result)
    for extra in (deeper_analysis(context, result), non_dropout_analysis(context, result)):
        for condition, metrics in extra.items():
            per_condition.setdefault(condition, {}).update(metrics)
    summary = {f"{prefix}{k}": float(v) for k, v in overall.items()}
    for metric in SUMMARY_METRICS:
        values = [m[metric] for m in per_condition.values() if metric in m]
        if values:
            summary[f"{prefix}{metric}"] = float(np.mean(values))
    if subgroups:
        summary.update(subgroup_metrics(per_condition, subgroups, prefix=prefix))
    return summary, per_condition
