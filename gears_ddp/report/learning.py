"""Did the model learn? Three checks on a finished run, in plain sentences.

The verdict table says which baseline won each metric; these say whether training did
anything at all: whether the training loss fell, whether the model beat predicting no
change (``mse`` and ``mse_de``), and how its ``pearson_delta`` compares with the
mean-effect baseline's (the same average change for every perturbation: on real screens
GEARS is about level with it), each comparison with its verdict and 95% interval over the
test perturbations (the report's ``verdicts``, never two means alone), and a warning when
the model's predictions barely differ between perturbations (``evaluation.prediction_spread``).
``gears-ddp demo`` prints them and the run report page shows them.
"""

from __future__ import annotations

from gears_ddp.evaluation.prediction_spread import spread_warnings
from gears_ddp.report.numbers import format_interval
from gears_ddp.report.verdicts import GEARS

# compared with the no-change baseline; comparisons that are verdicts (report.not_applicable
# rules out no change's correlations with the change and its share of genes moved the wrong way)
NO_CHANGE_METRICS = ("mse", "mse_de")


def _comparison(report: dict, metric: str, baseline: str) -> str | None:
    """``'mse_de 0.377 against 0.4766: beats (+0.0996 [+0.03, +0.17], won 5 of 6 perturbations)'``,
    from the report's verdict over all test conditions; None when the report has none."""
    record = next((v for v in report.get("verdicts") or [] if v["subgroup"] is None and v["metric"] == metric), None)
    if record is None:
        return None
    compared = record.get("baselines", {}).get(baseline)
    if not compared or "verdict" not in compared:
        return None
    values = f"{metric} {record['model']:.4g} against {compared['value']:.4g}"
    if compared["verdict"] == "n/a":
        return f"{values}: no verdict ({compared['reason']})"
    return (
        f"{values}: {compared['verdict']} ({format_interval(compared['difference'], compared['low'], compared['high'])}"
        f", won {compared['won']} of {compared['n']} perturbations)"
    )


def learning_checks(report: dict) -> list[str]:
    """The checks of the module docstring as sentences; a check whose figures the report
    lacks (no test set, no baseline) is left out."""
    losses = [record["train_loss"] for record in report.get("history") or [] if record.get("train_loss") is not None]
    lines = []
    if report.get("history") == []:
        lines.append("No epoch was trained (epochs=0): the scores below are those of the model as it was.")
    if len(losses) >= 2:
        fell = "fell" if losses[-1] < losses[0] else "did not fall"
        lines.append(f"Training loss {fell}: {losses[0]:.4g} in epoch 1, {losses[-1]:.4g} in epoch {len(losses)}.")
    parts = [part for metric in NO_CHANGE_METRICS if (part := _comparison(report, metric, "no_change"))]
    if parts:
        lines.append("Against predicting no change: " + "; ".join(parts) + ".")
    mean_effect = _comparison(report, "pearson_delta", "mean_effect")
    if mean_effect:
        lines.append(f"Against the mean-effect baseline: {mean_effect}.")
    spreads = report.get("prediction_spread") or {}
    if GEARS in spreads:
        lines += spread_warnings({GEARS: spreads[GEARS]})
    return lines
