"""Model against baseline, perturbation by perturbation, with a 95% interval.

Both are scored on the same test perturbations, so the comparison is paired: on each
perturbation the difference model minus baseline, signed so that a positive difference
means the model is better (``higher_is_better``). The verdict reads the interval of their
mean: **beats** when it lies wholly above 0, **loses to** when wholly below, **no clear
difference** when it holds 0; with fewer than ``MIN_PERTURBATIONS`` perturbations there is
no verdict (n/a, with the reason). A perturbation whose value is missing (NaN) for either
method is dropped and counted, never a win.

The interval is a bootstrap over the test perturbations (``RESAMPLES`` resamples drawn
with ``SEED``): the expanded percentile interval (Hesterberg, "What teachers should know
about the bootstrap", The American Statistician 2015), the percentile interval read at
tail probabilities widened so that, for a normal sample of ``n``, it is as wide as the
t-interval: ``z(a'/2) = sqrt(n / (n - 1)) t(a/2, n - 1)``. The plain percentile interval is
too narrow for the handful of perturbations a test set often has (6 in the demo); this one
is not, and for many perturbations it is the percentile interval.

Over replicates the bootstrap resamples replicates and perturbations, crossed, so the
interval covers the seed-to-seed spread too (docs/replicates.md); one replicate is the
single run's bootstrap, draw for draw. Every comparison on the same perturbations shares
one set of draws, so all metrics and baselines of a test set cost one bootstrap.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0
MIN_PERTURBATIONS = 3
BEATS, LOSES, NO_CLEAR, NOT_APPLICABLE = "beats", "loses to", "no clear difference", "n/a"
INTERVAL_METHOD = (
    f"{CONFIDENCE:.0%} expanded percentile bootstrap interval (Hesterberg 2015) of the mean paired "
    "difference, signed so that + favours GEARS, over the test perturbations (and, over replicates, "
    f"over the replicates too, resampled independently); {RESAMPLES:,} resamples, seed {SEED}"
)


@dataclass
class PairedComparison:
    """Model against one baseline on one metric: the mean signed difference (+: the model is
    better), its interval, the perturbations the model won (a mean difference above 0), of
    ``n`` with both values, ``dropped`` with a missing one, over ``replicates``; the verdict
    and, for n/a, the reason. A comparison ruled out by its reason (a baseline whose value
    is fixed by how it predicts) keeps its difference but counts no perturbations won
    (None): GEARS's correlations above the no-change baseline's 0 counted as wins would be
    the verdict that reason denies."""

    difference: float
    low: float
    high: float
    won: int | None
    n: int
    dropped: int
    replicates: int
    verdict: str
    reason: str | None = None

    def record(self) -> dict:
        """As ``report.json`` holds it."""
        return {
            "difference": self.difference,
            "low": self.low,
            "high": self.high,
            "won": self.won,
            "n": self.n,
            "dropped": self.dropped,
            "replicates": self.replicates,
            "verdict": self.verdict,
            "reason": self.reason,
        }


@functools.lru_cache(maxsize=None)
def expanded_alpha(n: int, confidence: float = CONFIDENCE) -> float:
    """The tail probability (both tails) at which the expanded percentile interval reads the
    bootstrap distribution of a mean of ``n`` values: ``2 (1 - Phi(sqrt(n/(n-1)) t))`` with
    ``t`` the t-quantile of ``confidence`` on ``n - 1`` degrees of freedom."""
    from scipy.special import ndtr, stdtrit  # scipy.stats would take a second to import

    t = stdtrit(n - 1, 0.5 + confidence / 2)
    return float(2 * ndtr(-math.sqrt(n / (n - 1)) * t))


def resample_counts(rng: np.random.Generator, size: int, resamples: int) -> np.ndarray:
    """How often each of ``size`` units is drawn in each resample (``resamples x size``):
    ``rng.integers(0, size, (resamples, size))`` counted per row."""
    draws = rng.integers(0, size, (resamples, size))
    offsets = (draws + size * np.arange(resamples)[:, None]).ravel()
    return np.bincount(offsets, minlength=resamples * size).reshape(resamples, size).astype(np.float64)


def compare_paired(
    model: np.ndarray,
    baselines: np.ndarray,
    higher: Sequence[bool] | np.ndarray,
    reasons=None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> list[PairedComparison]:
    """One ``PairedComparison`` per comparison ``k``: ``model[k]`` and ``baselines[k]`` are
    replicates x perturbations (NaN: missing), ``higher[k]`` whether the metric is better
    high, ``reasons[k]`` why the comparison is no verdict (None: it is one). Every
    comparison shares the same draws: perturbations first, then replicates (with one
    replicate there are none)."""
    model, baselines = np.asarray(model, dtype=np.float64), np.asarray(baselines, dtype=np.float64)
    comparisons, replicates, perturbations = model.shape
    reasons = [None] * comparisons if reasons is None else list(reasons)
    sign = np.where(np.asarray(higher, dtype=bool), 1.0, -1.0)[:, None, None]
    with np.errstate(invalid="ignore"):
        signed = (model - baselines) * sign
    valid = np.isfinite(signed)
    values = np.where(valid, signed, 0.0)
    rng = np.random.default_rng(seed)
    perturbation_counts = resample_counts(rng, perturbations, resamples) if perturbations else None
    replicate_counts = resample_counts(rng, replicates, resamples) if replicates > 1 else None
    tested = valid.any(axis=1)  # comparisons x perturbations with a difference in some replicate
    wanted = [k for k in range(comparisons) if reasons[k] is None and tested[k].sum() >= MIN_PERTURBATIONS]
    ends = None
    if wanted and perturbation_counts is not None:  # the second always holds with the first
        means = _resampled_means(values[wanted], valid[wanted], perturbation_counts, replicate_counts)
        ends = _interval_ends(means, [int(tested[k].sum()) for k in wanted], confidence)
    out = []
    for k in range(comparisons):
        n, dropped = int(tested[k].sum()), int(perturbations - tested[k].sum())
        mean = float(values[k].sum() / valid[k].sum()) if n else math.nan
        won = None if reasons[k] else int(np.sum(_column_means(values[k], valid[k])[tested[k]] > 0))
        if k not in wanted or ends is None:  # ends are made whenever some k is wanted
            reason = reasons[k] or (
                f"{n} test perturbation{'s' if n != 1 else ''} with both values: an interval "
                f"needs at least {MIN_PERTURBATIONS}"
            )
            out.append(PairedComparison(mean, math.nan, math.nan, won, n, dropped, replicates, NOT_APPLICABLE, reason))
            continue
        low, high = (float(x) for x in ends[:, wanted.index(k)])
        out.append(PairedComparison(mean, low, high, won, n, dropped, replicates, interval_verdict(low, high)))
    return out


def _interval_ends(means: np.ndarray, counts: list[int], confidence: float) -> np.ndarray:
    """The two ends (2 x comparisons) of each column's expanded percentile interval, the
    columns of the same perturbation count ``n`` read at once."""
    ends = np.empty((2, means.shape[1]))
    for n in set(counts):
        columns = [index for index, count in enumerate(counts) if count == n]
        alpha = expanded_alpha(n, confidence)
        chosen = means[:, columns]
        quantile = np.nanquantile if np.isnan(chosen).any() else np.quantile
        ends[:, columns] = quantile(chosen, [alpha / 2, 1 - alpha / 2], axis=0)
    return ends


def _column_means(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each perturbation's mean difference over the replicates that have one (0 where none)."""
    counts = valid.sum(axis=0)
    return values.sum(axis=0) / np.maximum(counts, 1)


def _resampled_means(
    values: np.ndarray, valid: np.ndarray, perturbation_counts: np.ndarray, replicate_counts: np.ndarray | None
) -> np.ndarray:
    """The mean difference of each resample (resamples x comparisons; replicates x
    perturbations drawn; NaN for a resample that drew no pair with a value), one matrix
    product for every comparison with one replicate."""
    weights = valid.astype(np.float64)
    if replicate_counts is None:  # one replicate
        sums, counts = perturbation_counts @ values[:, 0].T, perturbation_counts @ weights[:, 0].T
    else:
        sums = np.stack(
            [np.einsum("bp,bp->b", replicate_counts @ column, perturbation_counts) for column in values], axis=1
        )
        counts = np.stack(
            [np.einsum("bp,bp->b", replicate_counts @ column, perturbation_counts) for column in weights], axis=1
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def interval_verdict(low: float, high: float) -> str:
    """What an interval of a signed difference (+: the model is better) says."""
    if low > 0:
        return BEATS
    if high < 0:
        return LOSES
    return NO_CLEAR
