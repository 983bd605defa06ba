"""Perturbation condition strings: parsing and validation.

A condition names what was done to a cell, in the GEARS notation:
``'ctrl'`` (control), ``'A+ctrl'`` or ``'ctrl+A'`` (gene A perturbed alone) and
``'A+B'`` (genes A and B together). Every other module goes through these helpers
so that the notation is interpreted in exactly one place.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from gears_ddp.data.screen_report import Problem, refuse

CONTROL = "ctrl"


def condition_genes(condition: str) -> list[str]:
    """Return the perturbed genes of a condition, in written order (``[]`` for control)."""
    return [part for part in condition.split("+") if part != CONTROL]


def is_single(condition: str) -> bool:
    """True for a one-gene perturbation such as ``'A+ctrl'``."""
    return CONTROL in condition.split("+") and condition != CONTROL


def is_combo(condition: str) -> bool:
    """True for a two-gene perturbation such as ``'A+B'``."""
    return condition != CONTROL and CONTROL not in condition.split("+")


def condition_problem(condition: object) -> str | None:
    """Explain why ``condition`` is not a valid GEARS condition string, or return None."""
    if not isinstance(condition, str):
        return f"not a string ({type(condition).__name__})"
    if condition == CONTROL:
        return None
    parts = condition.split("+")
    if len(parts) != 2:
        return "expected 'ctrl', 'GENE+ctrl' or 'GENE1+GENE2'"
    if any(part.strip() != part or part == "" for part in parts):
        return "empty gene name or surrounding whitespace"
    if parts == [CONTROL, CONTROL]:
        return "'ctrl+ctrl' names no gene; write 'ctrl'"
    if parts[0] == parts[1]:
        return f"names gene {parts[0]!r} twice"
    return None


def malformed_conditions(conditions: Iterable[object]) -> dict[object, str]:
    """Each distinct malformed condition string of ``conditions`` and what is wrong with it."""
    found = {condition: condition_problem(condition) for condition in dict.fromkeys(conditions)}
    return {condition: problem for condition, problem in found.items() if problem is not None}


def malformed_conditions_problem(conditions: Iterable[object], source: str = "obs['condition']") -> Problem | None:
    """The ``Problem`` listing every malformed condition string (at most 10 shown), or None."""
    bad = [f"{condition!r}: {problem}" for condition, problem in malformed_conditions(conditions).items()]
    if not bad:
        return None
    shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
    return Problem(
        "conditions",
        f"malformed condition strings in {source}: {shown}; write each as 'ctrl', "
        "'GENE+ctrl' or 'GENE1+GENE2', or read the screen's own labels (gears-ddp process "
        "--perturbation-column and --control-label)",
    )


def validate_conditions(conditions: Iterable[object], source: str = "obs['condition']") -> None:
    """Raise ``ValueError`` listing every malformed condition string (at most 10 shown)."""
    refuse([malformed_conditions_problem(conditions, source)], source)


def genes_of_conditions(conditions: Iterable[str]) -> np.ndarray:
    """Sorted unique genes perturbed in any of ``conditions`` (control excluded)."""
    genes = {gene for condition in set(conditions) for gene in condition_genes(condition)}
    return np.array(sorted(genes), dtype=object)


def coded_conditions(column: pd.Series, source: str = "obs['condition']") -> tuple[list[str], np.ndarray]:
    """The distinct conditions of an ``obs`` column, validated (``validate_conditions``), in
    order of first appearance, and each cell's position among them (int64).

    A categorical column (as an h5ad file stores it) is read through its codes, so no
    string is made per cell: for a million cells that saves a few hundred MB at load.
    """
    values = column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column)
    codes = np.asarray(values.codes, dtype=np.int64)
    present, first = np.unique(codes, return_index=True)
    in_order = present[np.argsort(first, kind="stable")]
    validate_conditions([values.categories[c] if c >= 0 else None for c in in_order], source)
    position = np.zeros(len(values.categories), dtype=np.int64)
    position[in_order] = np.arange(len(in_order))
    return [str(values.categories[c]) for c in in_order], position[codes]


def first_cell_values(column: pd.Series, codes: np.ndarray) -> list[str]:
    """Each condition's value of ``column`` (an ``obs`` column such as ``condition_name``,
    one value per condition), read at its first cell; ``codes``: ``coded_conditions``'s
    positions of the cells, so the list follows its conditions."""
    first_cells = np.unique(codes, return_index=True)[1]  # codes number the conditions in order of first cell
    return column.iloc[first_cells].astype(str).tolist()
