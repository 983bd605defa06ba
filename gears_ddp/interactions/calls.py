"""Genetic-interaction (GI) scores of two-gene combinations.

These are pure functions on arrays, independent of the model, so they can score predictions
however they were produced (a trained model, a baseline, saved outputs).

- ``genetic_interaction_scores``: how a two-gene combination's predicted change from control
  relates to its two singles' changes. The scores and their definitions are those of the
  published GEARS (``GI_predict``): a Theil-Sen fit, without intercept, of the double's
  change on the singles' changes, plus distance correlations between the three changes.
  They are computed by ``interaction_scores``, which scores many combinations at once.
- ``with_theil_sen_fit``: the published ``GI_predict``'s dict, whose ``'ts'`` entry is the
  fitted line (``TheilSenFit``) before the scores.
- ``interaction_types``: the kinds of genetic interaction the scores imply, read as the
  published GEARS analysis reads them (``INTERACTION_THRESHOLDS``).
- ``read_gene_list``: reads the optional list of genes the GI scores are restricted to
  (usually genes with a high mean expression).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from gears_ddp.data.io import RefusedPickle, loads_plain_data
from gears_ddp.interactions.scores import MIN_GI_GENES, interaction_scores

# The published GEARS analysis of predicted genetic interactions (its GI_accuracy script)
# calls a combination synergistic when mag > 1, suppressive when mag < 1, additive when
# |mag - 1| <= 0.3, neomorphic when corr_fit < 0.85, redundant when dcor > 0.8 and
# epistatic when dominance > 0.25.
INTERACTION_THRESHOLDS = {
    "additive_band": 0.3,
    "neomorphic_below": 0.85,
    "redundant_above": 0.8,
    "epistasis_above": 0.25,
}
# the score each type is called on, and each type's calls in the order tables list them
TYPE_SCORES = {"magnitude_type": "mag", "neomorphic": "corr_fit", "redundant": "dcor", "epistasis": "dominance"}
CALL_ORDER = {
    "magnitude_type": ("additive", "synergy", "suppressor"),
    "neomorphic": (False, True),
    "redundant": (False, True),
    "epistasis": (False, True),
}
INTERACTION_TYPE_MEANINGS = {
    "magnitude_type": f"synergy (mag > {1 + INTERACTION_THRESHOLDS['additive_band']:g}), suppressor (mag < "
    f"{1 - INTERACTION_THRESHOLDS['additive_band']:g}) or additive (between)",
    "neomorphic": f"corr_fit < {INTERACTION_THRESHOLDS['neomorphic_below']:g}: the double is not a combination of "
    "the singles' changes",
    "redundant": f"dcor > {INTERACTION_THRESHOLDS['redundant_above']:g}: the double is what the singles already do",
    "epistasis": f"dominance > {INTERACTION_THRESHOLDS['epistasis_above']:g}: one single's change dominates the double",
}


def _as_change_vector(name: str, values) -> np.ndarray:
    """Convert one change-from-control input to a finite 1-D float64 array, or raise."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be numeric: {err}") from err
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D (one value per gene), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` contains NaN or infinite values")
    return array


def genetic_interaction_scores(first: np.ndarray, second: np.ndarray, double: np.ndarray) -> dict[str, float]:
    """Genetic-interaction scores of a combination A+B from three change-from-control vectors.

    ``first``, ``second`` and ``double`` are the (predicted) mean expression changes from the
    control mean after perturbing A, B and A+B, over the same genes (optionally a subset,
    see ``read_gene_list``). The double's change is fitted as ``c1 * first + c2 * second``
    by Theil-Sen regression (robust to the few genes with extreme changes) with the
    published GEARS settings, whose results (scikit-learn's) the scores match. Returned
    keys:

    - ``c1``, ``c2``: the fitted coefficients; ``mag``: ``sqrt(c1**2 + c2**2)`` (magnitude of
      the combined effect relative to additivity, which is ``c1 = c2 = 1``);
    - ``dcor``: distance correlation of the [first, second] matrix with the double;
      ``dcor_singles`` (first vs second), ``dcor_first`` (first vs double),
      ``dcor_second`` (second vs double);
    - ``corr_fit``: Pearson correlation of the fitted values with the double (fit quality);
    - ``dominance``: ``|log10(c1 / c2)|`` (whether one single dominates the combination);
    - ``eq_contr``: ``min(dcor_first, dcor_second) / max(dcor_first, dcor_second)`` (how
      equally the singles contribute).

    Degenerate inputs give the same non-finite values as the published package, without
    numpy warnings: ``dominance`` is ``inf`` when exactly one coefficient is 0 and NaN when
    both are; ``corr_fit`` is NaN when the fitted values or the double are constant;
    ``eq_contr`` is NaN when both distance correlations are 0.

    Raises ``ValueError`` unless the three inputs are finite, numeric, 1-D, of the same
    length and cover at least ``MIN_GI_GENES`` genes.
    """
    first = _as_change_vector("first", first)
    second = _as_change_vector("second", second)
    double = _as_change_vector("double", double)
    if not first.shape == second.shape == double.shape:
        raise ValueError(
            "`first`, `second` and `double` must have the same shape, got "
            f"{first.shape}, {second.shape} and {double.shape}"
        )
    if first.shape[0] < MIN_GI_GENES:
        raise ValueError(f"genetic-interaction scores need at least {MIN_GI_GENES} genes, got {first.shape[0]}")

    scores = interaction_scores(first[np.newaxis], second[np.newaxis], double[np.newaxis])
    return {key: float(values[0]) for key, values in scores.items()}


@dataclass(frozen=True, eq=False)
class TheilSenFit:
    """The fitted line ``double ~ c1 * first + c2 * second`` of a pair's scores, as the
    published ``GI_predict`` returns it under ``'ts'`` (there a fitted scikit-learn
    ``TheilSenRegressor``): ``coef_`` (c1, c2), ``intercept_`` (0: no intercept) and
    ``predict(X)`` for X of (genes x 2) singles' changes."""

    coef_: np.ndarray
    intercept_: float = 0.0

    def predict(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_


def with_theil_sen_fit(scores: Mapping[str, float]) -> dict:
    """The published ``GI_predict``'s dict: ``'ts'`` (``TheilSenFit`` of ``c1``, ``c2``) first,
    then the scores."""
    return {"ts": TheilSenFit(np.array([scores["c1"], scores["c2"]])), **scores}


def pair_scores(changes, genes: np.ndarray | None = None) -> dict:
    """The published ``GI_predict``'s dict (``with_theil_sen_fit``) of one pair from its
    changes over control (3 x genes: A, B, A+B; a tensor or an array), taken at the gene
    positions ``genes`` only when given (``pair_tables.score_gene_positions``)."""
    changes = torch.as_tensor(changes)
    if genes is not None:
        changes = changes[:, torch.as_tensor(genes, device=changes.device)]
    first, second, double = changes.double().cpu().numpy()
    return with_theil_sen_fit(genetic_interaction_scores(first, second, double))


def interaction_types(scores: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The kinds of genetic interaction the scores of each pair imply, with the published
    analysis's thresholds (``INTERACTION_THRESHOLDS``), under the published names:

    - ``magnitude_type``: ``'synergy'`` (``mag`` above 1.3: the singles' weights in the
      double, together, above one single's at full strength; the plain sum of two unrelated
      singles has ``mag`` 1.41), ``'suppressor'`` (below 0.7) or ``'additive'`` (within 0.3
      of 1: as strong as one single). The published analysis tests synergy as mag > 1,
      suppression as mag < 1 and additivity as |mag - 1| <= 0.3; one label per pair needs
      the band to take precedence;
    - ``neomorphic``: ``corr_fit`` below 0.85 (the double is not a combination of the
      singles' changes: a new phenotype);
    - ``redundant``: ``dcor`` above 0.8 (the double is what the singles already do);
    - ``epistasis``: ``dominance`` above 0.25 (one single's change dominates the double).

    NaN scores (degenerate changes) imply no type (``False``; ``magnitude_type`` needs
    ``mag``, which is always finite).
    """
    limits = INTERACTION_THRESHOLDS
    mag = np.asarray(scores["mag"], dtype=float)
    with np.errstate(invalid="ignore"):
        return {
            "magnitude_type": np.where(
                np.abs(mag - 1.0) <= limits["additive_band"], "additive", np.where(mag > 1.0, "synergy", "suppressor")
            ),
            "neomorphic": np.asarray(scores["corr_fit"], dtype=float) < limits["neomorphic_below"],
            "redundant": np.asarray(scores["dcor"], dtype=float) > limits["redundant_above"],
            "epistasis": np.asarray(scores["dominance"], dtype=float) > limits["epistasis_above"],
        }


def read_gene_list(path: str | os.PathLike) -> list[str]:
    """Read a list of gene names, e.g. the genes GI scores are restricted to.

    A ``.npy`` file is read as the published GEARS saves it: an array of names, possibly of
    dtype object, whose values numpy stores as a pickle; that pickle is read admitting plain
    data only (``data.io.loads_plain_data``), so a file that asks to run code is refused.
    Any other file is read as UTF-8 text with one gene name per line; surrounding whitespace
    and blank lines are ignored.

    Raises ``FileNotFoundError`` when the file does not exist and ``ValueError`` when it
    cannot be read, holds anything but names or holds no name; the messages name the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"gene list file not found: {path}")
    try:
        if path.suffix == ".npy":
            genes = _npy_names(path)
        else:
            lines = path.read_text(encoding="utf-8").splitlines()
            genes = [line.strip() for line in lines if line.strip()]
    except RefusedPickle as err:
        raise ValueError(
            f"refused to read gene list file {path}: its array asks to call {err}, which an array "
            "of names never needs (a pickle can run code when it is read)"
        ) from None
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise ValueError(f"cannot read gene list file {path}: {err}") from err
    if not genes:
        raise ValueError(f"gene list file {path} contains no gene names")
    return genes


def _npy_names(path: Path) -> list[str]:
    """The names in a .npy file: an array of strings, or of objects that are all strings."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _, _, dtype = read_header(handle)
        if dtype.hasobject:
            array = loads_plain_data(handle.read())
        else:
            handle.seek(0)
            array = np.load(handle, allow_pickle=False)
    if not isinstance(array, np.ndarray):
        raise ValueError(f"it holds a {type(array).__name__}, not an array of gene names")
    values = array.ravel().tolist()
    if not all(isinstance(value, str) for value in values):
        kinds = sorted({type(value).__name__ for value in values if not isinstance(value, str)})
        raise ValueError(f"it holds values that are not gene names ({', '.join(kinds)})")
    return values
