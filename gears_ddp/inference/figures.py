"""The perturbation figure of the published ``plot_perturbation``: box plots of the observed
per-cell change at a condition's top-20 non-dropout DE genes, with the predicted change
marked."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from gears_ddp.data.conditions import CONTROL
from gears_ddp.evaluation.metrics import non_dropout_de_table


def observed_change_at_de_genes(pert_data, condition: str, control: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of ``condition``'s top-20 non-dropout DE genes and each of its cells'
    expression there minus ``control`` (cells x genes); an unknown condition is an error
    naming it."""
    cells = pert_data.cells
    if condition not in cells.conditions or condition == CONTROL:
        raise ValueError(f"{condition!r} is not a perturbation condition of the data "
                         f"(e.g. {[c for c in cells.conditions if c != CONTROL][:5]})")
    name = cells.condition_names[cells.conditions.index(condition)]
    positions = non_dropout_de_table(pert_data.uns, pert_data.var.index, [name])[0]
    positions = positions[positions >= 0].numpy()
    return positions, cells.rows(cells.cells_of([condition])).numpy()[:, positions] - control[positions]


def plot_perturbation_figure(
    truth_change: np.ndarray,
    predicted_change: np.ndarray,
    gene_names: Sequence[str],
    title: str,
    save_file: str | os.PathLike | None = None,
):
    """Draw the observed per-cell change at K genes as box plots, the prediction in red.

    ``truth_change`` (cells x K) is each cell's expression minus the control mean at the K
    genes (usually a condition's top-20 non-dropout DE genes), ``predicted_change`` (K,)
    the predicted mean expression minus the control mean, ``gene_names`` the K tick labels
    and ``title`` the condition. A dashed line marks zero change.

    The figure is built with matplotlib's object-oriented API on an Agg canvas, so it works
    headless, leaves pyplot's global state alone and never opens a window. When
    ``save_file`` is given the figure is written at exactly that path (parent folders are
    created; the format follows the file suffix, PNG when it has none). Returns the
    ``matplotlib.figure.Figure``.

    Raises ``ValueError`` when the shapes of the inputs do not agree.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    truth_change = np.asarray(truth_change, dtype=np.float64)
    predicted_change = np.asarray(predicted_change, dtype=np.float64)
    gene_names = [str(name) for name in gene_names]
    if truth_change.ndim != 2 or truth_change.shape[0] < 1 or truth_change.shape[1] < 1:
        raise ValueError(
            "`truth_change` must be a non-empty (cells x genes) array, "
            f"got shape {truth_change.shape}"
        )
    n_genes = truth_change.shape[1]
    if predicted_change.shape != (n_genes,) or len(gene_names) != n_genes:
        raise ValueError(
            f"shapes do not agree: truth_change {truth_change.shape} (cells x genes), "
            f"predicted_change {predicted_change.shape} (expected ({n_genes},)), "
            f"{len(gene_names)} gene names (expected {n_genes})"
        )

    # 16.5 x 4.5 inches at 20 genes, as the published plot; narrower for fewer genes.
    figure = Figure(figsize=(max(4.0, 0.825 * n_genes), 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = np.arange(1, n_genes + 1)
    axes.boxplot(
        truth_change, positions=positions, showfliers=False, medianprops={"linewidth": 0}
    )
    axes.scatter(positions, predicted_change, color="red", zorder=3)
    axes.axhline(0, linestyle="dashed", color="green")
    axes.set_xticks(positions, labels=gene_names, rotation=90)
    axes.set_ylabel("Change in gene expression over control", labelpad=10)
    axes.set_title(title)
    axes.tick_params(axis="both", which="major", pad=5)
    axes.spines[["top", "right"]].set_visible(False)

    if save_file is not None:
        save_file = Path(save_file)
        save_file.parent.mkdir(parents=True, exist_ok=True)
        file_format = save_file.suffix.lstrip(".").lower() or "png"
        figure.savefig(save_file, format=file_format, bbox_inches="tight")
    return figure
