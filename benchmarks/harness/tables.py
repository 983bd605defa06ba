"""Markdown tables and numbers as every benchmark prints them: the first ``left`` columns
(labels) aligned left, the others (figures) right, in the source as in a rendered page."""

from __future__ import annotations

import math


def format_number(value, spec: str = ".4f") -> str:
    """``value`` formatted with ``spec``; '-' for a figure that is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _line(cells, widths, left: int) -> str:
    return (
        "| "
        + " | ".join(str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        + " |"
    )


def _rule(widths, left: int) -> str:
    return "|" + "|".join("-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"


def print_table(header: list, rows: list[list], left: int = 1) -> None:
    """A markdown table, every column as wide as its widest cell."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print(_line(header, widths, left))
    print(_rule(widths, left))
    for row in rows:
        print(_line(row, widths, left))


class StreamedTable:
    """A markdown table printed a row at a time, as a long benchmark's results come (the
    header when it is made); columns as wide as their headers."""

    def __init__(self, header: list, left: int = 1):
        self.widths, self.left = [len(h) for h in header], left
        print(_line(header, self.widths, left))
        print(_rule(self.widths, left), flush=True)

    def add(self, row: list) -> None:
        print(_line(row, self.widths, self.left), flush=True)


def per_rank(values: list[float], spec: str = ".0f") -> str:
    """One figure per rank (or process), in order: 'rank 0 / rank 1 / ...'; '-' for none."""
    return " / ".join(format(v, spec) for v in values) or "-"
