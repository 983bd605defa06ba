"""Pictures of what a trained model predicts:

- the perturbation figure of the published ``plot_perturbation``: box plots of the observed
  per-cell change at a condition's top-20 non-dropout DE genes, with the predicted change
  marked (``plot_perturbation_figure``);
- the map of a screen: the genetic-interaction magnitude of every pair of its genes, with
  the most synergistic and the most suppressive pairs named (``plot_screen``).

Figures are built with matplotlib's object-oriented API on an Agg canvas, so they work
headless, leave pyplot's global state alone and never open a window."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from gears_ddp.data.conditions import CONTROL
from gears_ddp.evaluation.metrics import non_dropout_de_table
from gears_ddp.inference.interactions import INTERACTION_THRESHOLDS


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


def plot_screen(table, save_file: str | os.PathLike | None = None, top: int = 10):
    """The map of a screen (``inference.screen.screen_table``): a heatmap of ``log2(mag)``
    over every pair of its genes (red: synergy, the double changes more than the singles'
    sum; blue: suppression, less; white: additive), the genes ordered by similarity of
    their rows (average-linkage clustering), pairs seen in training dotted, and beside it
    the ``top`` pairs of highest and of lowest ``mag`` (the most synergistic and the most
    suppressive), marked on the map with triangles (up and down) and named with their
    ``mag`` and interaction types.

    Written to ``save_file`` when given (atomically; the format follows the suffix, PNG
    when it has none). Returns the ``matplotlib.figure.Figure``.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    genes = list(dict.fromkeys([*table["first_gene"], *table["second_gene"]]))
    position = {gene: i for i, gene in enumerate(genes)}
    first = table["first_gene"].map(position).to_numpy()
    second = table["second_gene"].map(position).to_numpy()
    log_mag = np.log2(table["mag"].to_numpy(dtype=float))
    matrix = np.full((len(genes), len(genes)), np.nan)
    matrix[first, second] = matrix[second, first] = log_mag
    order = _clustered_order(matrix)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))

    figure = Figure(figsize=(14, 8.5))
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(1, 2, width_ratios=(20, 10), wspace=0.3)
    axes, text_axes = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    limit = max(float(np.nanpercentile(np.abs(log_mag), 99)), 0.1) if len(log_mag) else 1.0
    colours = matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.8")  # the empty diagonal grey, not additive white
    image = axes.imshow(matrix[np.ix_(order, order)], cmap=colours, vmin=-limit, vmax=limit,
                        interpolation="nearest")
    colorbar = figure.colorbar(image, ax=axes, fraction=0.046, pad=0.03)
    colorbar.set_label("log2(mag): 0 additive, > 0 synergy, < 0 suppression")
    # each pair marked once, above the diagonal
    rows, columns = np.minimum(rank[first], rank[second]), np.maximum(rank[first], rank[second])
    seen = table["seen_in_training"].to_numpy(dtype=bool)
    # white edges keep the marks visible on the darkest cells
    axes.scatter(columns[seen], rows[seen], s=16, color="black", marker="o", edgecolors="white", linewidths=0.6,
                 label="pair seen in training")
    by_mag = np.argsort(-log_mag, kind="stable")
    # by mag alone: a short list can reach additive pairs, which the text names as such
    lists = {"highest mag (most synergistic first)": by_mag[:top],
             "lowest mag (most suppressive first)": by_mag[::-1][:top]}
    for (title, picked), marker in zip(lists.items(), ("^", "v")):
        axes.scatter(columns[picked], rows[picked], s=34, facecolors="white", edgecolors="black",
                     marker=marker, linewidths=0.9, label=f"{title.split(' (')[0]}: {len(picked)} pairs")
    if len(genes) <= 60:
        labels = [genes[i] for i in order]
        axes.set_xticks(range(len(genes)), labels=labels, rotation=90, fontsize=7)
        axes.set_yticks(range(len(genes)), labels=labels, fontsize=7)
    else:
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_xlabel(f"{len(genes)} genes, clustered")
    axes.set_title(f"Genetic-interaction magnitude of {len(table):,} pairs of {len(genes)} genes")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 if len(genes) > 60 else -0.12), ncol=3,
                fontsize=8, frameon=False)
    text_axes.axis("off")
    text_axes.text(0, 1, _named_pairs(table, lists), va="top", ha="left", family="monospace", fontsize=8,
                   transform=text_axes.transAxes)
    if save_file is not None:
        from gears_ddp.data.io import atomic_path

        save_file = Path(save_file)
        with atomic_path(save_file) as tmp:
            figure.savefig(tmp, format=save_file.suffix.lstrip(".").lower() or "png", bbox_inches="tight", dpi=120)
    return figure


def _clustered_order(matrix: np.ndarray) -> np.ndarray:
    """The rows of a symmetric matrix ordered by average-linkage clustering of the rows (NaN
    as 0); the given order for fewer than 3 rows."""
    if len(matrix) < 3:
        return np.arange(len(matrix))
    from scipy.cluster.hierarchy import leaves_list, linkage

    return leaves_list(linkage(np.nan_to_num(matrix), method="average"))


def _named_pairs(table, lists: dict) -> str:
    """The text beside the map: each list's pairs with their mag and interaction types."""
    lines = []
    for title, rows in lists.items():
        lines += [title, ""]
        for row in rows:
            pair = table.iloc[int(row)]
            kinds = [kind for kind in ("neomorphic", "redundant", "epistasis") if bool(pair[kind])]
            seen = " (trained)" if bool(pair["seen_in_training"]) else ""
            lines.append(f"{pair['pair'][:24]:<24} {pair['mag']:6.2f}  {pair['magnitude_type']}"
                         + (", " + ", ".join(kinds) if kinds else "") + seen)
        lines.append("")
    limits = INTERACTION_THRESHOLDS
    lines += ["types as the published GEARS analysis reads them:",
              f"synergy mag > {1 + limits['additive_band']:g}, suppressor mag < {1 - limits['additive_band']:g}, "
              "additive between;",
              f"neomorphic corr_fit < {limits['neomorphic_below']:g}; redundant dcor > {limits['redundant_above']:g};",
              f"epistasis dominance > {limits['epistasis_above']:g}"]
    return "\n".join(lines)
