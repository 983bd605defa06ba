"""``saved_pred``: the published package's dict of predictions, and the entries of it that
``GEARS.predict`` and ``GEARS.GI_predict`` answer from.

The published GEARS keeps every prediction ``predict`` makes in ``GEARS.saved_pred``,
keyed by the queried genes joined with ``'_'`` (``'A'``, ``'A_B'``), each the mean predicted
expression (one value per gene), and in uncertainty mode ``exp(-mean logvar)`` in
``saved_logvar_sum``. Its ``predict`` answers a query from those dicts when its entry is
there, and its ``GI_predict`` scores A+B from ``saved_pred['A']``, ``['B']`` and ``['A_B']``
minus the control mean when all three are there, trained weights or none. The paper relies
on it: predictions made once on a GPU are handed to a CPU ``GEARS`` that never loads
weights and scores them in parallel, and observed combinations are scored by writing their
true mean expression into ``saved_pred``.

Here entries that were handed in (written by the user, or copied from another ``GEARS``)
are answered from exactly so. The entries a ``GEARS`` object's own ``predict`` wrote are
kept there for the user to read, as published, but never read back: that object's weights
give them again (``predict`` draws the same control cells for the same seed), so a cache
cannot return another model's predictions after ``load_pretrained`` or training (the
published cache does), and ``GI_predict`` scores the model's exact changes rather than
predict's drawn cells' means. ``handed_in`` tells the two apart by identity: an entry is
the object's own while it is the very array its ``predict`` stored.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np


def handed_in(saved: Mapping[str, object], own: Mapping[str, object], keys: Iterable[str]) -> dict[str, object]:
    """The entries of ``saved`` for ``keys`` that were handed in: present, and not the
    object ``own`` (what ``predict`` stored) holds for the key."""
    return {key: saved[key] for key in keys if key in saved and saved[key] is not own.get(key)}


def saved_expression(entries: Mapping[str, object], keys: Iterable[str], n_genes: int) -> np.ndarray:
    """The saved expression of ``keys`` as a (keys x genes) float64 array; an entry that is
    not one finite number per gene is an error naming its key."""
    rows = []
    for key in keys:
        try:
            row = np.asarray(entries[key], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as err:
            raise ValueError(f"saved_pred[{key!r}] is not an array of numbers: {err}") from None
        if row.shape != (n_genes,):
            raise ValueError(
                f"saved_pred[{key!r}] holds {row.size} values; it needs one per gene of the data "
                f"({n_genes}, in the order of GEARS.gene_list)"
            )
        if not np.isfinite(row).all():
            raise ValueError(f"saved_pred[{key!r}] holds NaN or infinite values")
        rows.append(row)
    return np.stack(rows) if rows else np.empty((0, n_genes))


def forget_own(saved: dict, logvar_sums: dict, own: dict) -> None:
    """Remove from ``saved`` (and their uncertainty from ``logvar_sums``) the entries that
    ``own`` says this object's ``predict`` stored, and empty ``own``: a new network forgets
    the predictions of the weights it replaces; entries handed in stay."""
    for key, value in own.items():
        if saved.get(key) is value:
            del saved[key]
            logvar_sums.pop(key, None)
    own.clear()
