"""Reports as a run writes them, built from per-perturbation values: the summaries are the
means over the perturbations, as ``evaluation.scoring.score`` computes them, so that a
test states the values each perturbation has and the verdicts follow from them."""

import math

import numpy as np

from gears_ddp.report.verdicts import GEARS, metric_key


def report_from_values(model: dict, baselines: dict, subgroups: dict | None = None, conditions=None) -> dict:
    """``model``: metric -> one value per perturbation (NaN: none); ``baselines``: name ->
    the same. ``subgroups``: name -> the indices of its perturbations (their summaries are
    written too). Returns ``{'model', 'baselines', 'per_perturbation'}``."""
    count = len(next(iter(model.values())))
    conditions = list(conditions or [f"P{i}+ctrl" for i in range(count)])
    subgroups = subgroups or {}

    def summary(values: dict) -> dict:
        out = {}
        for metric, column in values.items():
            column = np.asarray(column, dtype=float)
            for name, rows in [(None, list(range(count))), *subgroups.items()]:
                chosen = column[rows]
                chosen = chosen[np.isfinite(chosen)]
                out[metric_key(metric, name)] = float(chosen.mean()) if chosen.size else math.nan
        return out

    methods = {GEARS: model, **baselines}
    return {
        "model": summary(model),
        "baselines": {name: summary(values) for name, values in baselines.items()},
        "per_perturbation": {
            "conditions": conditions,
            "subgroups": {name: [conditions[i] for i in rows] for name, rows in subgroups.items()},
            "values": {
                method: {metric: [float(v) for v in column] for metric, column in values.items()}
                for method, values in methods.items()
            },
        },
    }
