"""Do predictions differ between perturbations? The spread of predicted changes against the
true spread.

A model that predicts nearly the same change for every perturbation can still beat
predicting no change (the published GEARS's issue #82; Ahlmann-Eltze et al., Nature
Methods 2025): it has learnt the average effect, not the perturbations. The spread ratio
says how much of the perturbations' differences a method's predictions carry: for each
gene, the standard deviation across the test perturbations of the predicted mean
expression (the change over control, up to the control mean every perturbation shares),
averaged over genes, over the same for the true means. 1: predictions as varied as the
truth; 0: the same prediction for every perturbation, as the no-change and mean-effect
baselines give by construction. Below ``COLLAPSE_BELOW`` the report warns.
"""

from __future__ import annotations

import math

import numpy as np

COLLAPSE_BELOW = 0.5
BY_CONSTRUCTION = {
    "no_change": "the control mean for every perturbation",
    "mean_effect": "the same average change for every perturbation",
}


def spread_ratio(predicted: np.ndarray, truth: np.ndarray) -> float:
    """The spread ratio of ``predicted`` against ``truth`` (perturbations x genes, each
    perturbation's mean expression); NaN with fewer than 2 perturbations or no true spread."""
    predicted, truth = np.asarray(predicted, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if predicted.shape[0] < 2:
        return math.nan
    true_spread = truth.std(axis=0).mean()
    return float(predicted.std(axis=0).mean() / true_spread) if true_spread > 0 else math.nan


def spread_warnings(ratios: dict[str, float], model: str = "GEARS") -> list[str]:
    """Plain warnings for ``ratios`` (method -> spread ratio): the model's below
    ``COLLAPSE_BELOW``, then one line naming the baselines there, with why where it is so by
    construction; no lines when none is below."""
    lines = []
    ratio = ratios.get(model, math.nan)
    if ratio == ratio and ratio < COLLAPSE_BELOW:
        lines.append(
            f"Warning: {model}'s predictions barely differ between perturbations (spread ratio {ratio:.2f}, "
            f"below {COLLAPSE_BELOW}): it predicts nearly the same change for every test perturbation, so a "
            "win over no change may be the average effect, not the perturbations'."
        )
    low = [
        f"{name} {value:.2f}" + (f" (by construction: {BY_CONSTRUCTION[name]})" if name in BY_CONSTRUCTION else "")
        for name, value in ratios.items()
        if name != model and value == value and value < COLLAPSE_BELOW
    ]
    if low:
        lines.append(
            f"Baselines whose predictions barely differ between perturbations (spread ratio below "
            f"{COLLAPSE_BELOW}): " + ", ".join(low) + "."
        )
    return lines


def spread_line(ratios: dict[str, float]) -> str:
    """``'spread of predicted changes across test perturbations / true spread: GEARS 0.41,
    no_change 0.00, ...'``."""
    return (
        "spread of predicted changes across the test perturbations, over the true spread (1: as varied as the "
        "truth, 0: the same for all): " + ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
    )
