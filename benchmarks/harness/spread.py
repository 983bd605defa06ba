"""Figures over seeds: the mean ± sample standard deviation of one side, and the paired
difference of two sides seed by seed with its verdict. Pairing by seed removes what a seed
changes for both sides alike (the split, the data)."""

from __future__ import annotations

import math
import statistics

from gears_ddp.report.replicate_summary import Spread


def mean_sd(values: list[float]) -> str:
    """'mean ± sample sd (n=k)' of the values that are finite, as the library's replicate
    summaries write it."""
    return Spread(list(values)).text


def paired_difference(
    first: list[float], second: list[float], higher_is_better: bool, names: tuple[str, str]
) -> tuple[int, str, str]:
    """(paired seeds, 'mean +- standard error' of first - second over the seeds where both
    have a value, verdict). The verdict is 'within noise' when |mean| <= 2 standard errors,
    else '<name> better' of the better side; '-' with fewer than two paired seeds. With a
    few seeds the standard error is itself rough: 2 SE is a screen, not a test at a stated
    level."""
    diffs = [a - b for a, b in zip(first, second) if not (math.isnan(a) or math.isnan(b))]
    if len(diffs) < 2:
        return len(diffs), (f"{diffs[0]:+.4f}" if diffs else "-"), "-"
    mean, se = statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    if abs(mean) <= 2 * se:
        verdict = "within noise"
    else:
        verdict = f"{names[0] if (mean > 0) == higher_is_better else names[1]} better"
    return len(diffs), f"{mean:+.4f} +- {se:.4f}", verdict
