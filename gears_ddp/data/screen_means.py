"""Each condition's mean expression in a Perturb-seq screen on disk, read a block of cells at a time.

The linear baseline can place perturbations by the PCA of another screen (Ahlmann-Eltze et
al. take Replogle's K562 or RPE1 screens); what it needs of that screen is the mean
log-normalised expression of each of its conditions. The screen is a processed data folder
(its ``perturb_processed.h5ad``) or an h5ad file with ``obs['condition']`` in the GEARS
notation (``ctrl``, ``A+ctrl``, ``A+B``) and log-normalised ``X``. Its expression stays on
disk and is summed a block of cells at a time (``grouped.ConditionSums``) while it is checked
as processing checks a screen (``processing.ExpressionCheck``: raw counts, negative or
non-finite values are refused), so a screen of millions of cells takes the memory of one
block and its sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gears_ddp.data.conditions import coded_conditions
from gears_ddp.data.grouped import ConditionSums, row_blocks
from gears_ddp.data.io import PROCESSED_FILE, h5ad_parts
from gears_ddp.data.processing import ExpressionCheck

SCREEN_FORMS = f"a processed data folder (holding {PROCESSED_FILE}) or an h5ad file with obs['condition']"


@dataclass(frozen=True)
class ScreenMeans:
    """The mean expression (float64, conditions x the screen's genes) of each condition of
    the screen read from ``source``, in order of first appearance."""

    source: str
    conditions: list[str]
    means: np.ndarray


def screen_file(path) -> Path:
    """The h5ad file of a screen given as ``path``: the file itself, or a processed data
    folder's ``perturb_processed.h5ad``; an error names a path that is neither."""
    path = Path(path)
    if path.is_dir():
        if not (path / PROCESSED_FILE).is_file():
            raise FileNotFoundError(
                f"{path} is a folder without {PROCESSED_FILE}; give {SCREEN_FORMS} "
                "(gears-ddp process writes a processed data folder)"
            )
        return path / PROCESSED_FILE
    if not path.exists():
        raise FileNotFoundError(f"no screen at {path}; give {SCREEN_FORMS}")
    return path


def read_screen_means(path) -> ScreenMeans:
    """The ``ScreenMeans`` of the screen at ``path`` (``screen_file``), its expression checked
    as it is read. Errors name the file and what is wrong: not an h5ad file, no
    ``obs['condition']``, condition strings that do not parse, raw counts."""
    file = screen_file(path)
    with h5ad_parts(file, ["condition"]) as parts:
        if "condition" not in parts.obs.columns:
            raise ValueError(
                f"{file} has no obs['condition'] column; give {SCREEN_FORMS} in the GEARS notation "
                "('ctrl', 'A+ctrl', 'A+B'): gears-ddp process turns a raw screen into one"
            )
        conditions, codes = coded_conditions(parts.obs["condition"], f"{file} obs['condition']")
        check = ExpressionCheck()
        sums = ConditionSums(codes, len(conditions), parts.X.shape[1])
        for start, block in row_blocks(parts.X, dense=False):
            check.add(block)
            sums.add(start, block)
        check.finish(str(file))
    return ScreenMeans(str(file), conditions, sums.mean())
