"""Did the model learn? Three checks on a finished run, in plain sentences.

The verdict table says which baseline won each metric; these say whether training did
anything at all: whether the training loss fell, whether the model beat predicting no
change (``mse`` and ``mse_de``), and how its ``pearson_delta`` compares with the
mean-effect baseline's (the same average change for every perturbation: on real screens
GEARS is about level with it). ``gears-ddp demo`` prints them and the run report page shows
them.
"""
from __future__ import annotations

from gears_ddp.report.verdicts import higher_is_better, is_better, metric_key

# compared with the no-change baseline; comparisons that are verdicts (report.not_applicable
# rules out no change's correlations with the change and its share of genes moved the wrong way)
NO_CHANGE_METRICS = ("mse", "mse_de")


def _compare(model: float, baseline: float, metric: str) -> str:
    better = is_better(model, baseline, higher_is_better(metric))
    if better is None:
        return "not comparable"
    return "level" if model == baseline else ("better" if better else "worse")


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
    model, baselines = report.get("model") or {}, report.get("baselines") or {}
    no_change = baselines.get("no_change", {})
    parts = [f"{metric} {model[key]:.4g} against {no_change[key]:.4g} ({_compare(model[key], no_change[key], metric)})"
             for metric in NO_CHANGE_METRICS for key in [metric_key(metric)] if key in model and key in no_change]
    if parts:
        lines.append("Against predicting no change: " + ", ".join(parts) + ".")
    key = metric_key("pearson_delta")
    if key in model and key in baselines.get("mean_effect", {}):
        ours, theirs = model[key], baselines["mean_effect"][key]
        lines.append(f"pearson_delta {ours:.4f} against the mean-effect baseline's {theirs:.4f} "
                     f"({ours - theirs:+.4f}; {_compare(ours, theirs, 'pearson_delta')}).")
    return lines
