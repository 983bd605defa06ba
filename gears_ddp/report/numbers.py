"""How the report writes a figure: a value, a signed difference with its interval, a mean
± sd, a duration. The console tables and both pages write them through these, so the same
figure reads the same wherever it is shown."""

from __future__ import annotations

import math


def format_number(value) -> str:
    """4 significant digits (thousands as whole numbers); ``n/a`` for a missing value or NaN."""
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def format_signed(value) -> str:
    """``format_number`` with a ``+`` before a positive value (a difference)."""
    text = format_number(value)
    return text if text == "n/a" or text.startswith("-") else "+" + text


def format_interval(mean, low, high) -> str:
    """A mean difference and its interval: ``'+0.0236 [-0.0093, +0.0564]'``."""
    return f"{format_signed(mean)} [{format_signed(low)}, {format_signed(high)}]"


def format_comparison(comparison) -> str:
    """A paired comparison (``evaluation.paired_bootstrap.PairedComparison``) as the tables
    write it: ``'+0.078 [-0.02, +0.17] 4/6'`` (difference, 95% interval, perturbations won);
    ``'n/a'`` without an interval."""
    if not math.isfinite(comparison.low):
        return "n/a"
    return f"{format_interval(comparison.difference, comparison.low, comparison.high)} {comparison.won}/{comparison.n}"


def format_mean_sd(mean, sd, n: int) -> str:
    """A mean, its standard deviation and how many values they cover: ``'0.3 ± 0.02 (n=5)'``."""
    return f"{format_number(mean)} ± {format_number(sd)} (n={n})"


def format_duration(seconds: float) -> str:
    """``'1 h 02 min'``, ``'12 min 05 s'`` or ``'42 s'``."""
    whole = int(round(seconds))
    hours, minutes, secs = whole // 3600, whole % 3600 // 60, whole % 60
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
