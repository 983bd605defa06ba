"""Pictures of what a trained model predicts:

- the perturbation figure of the published ``plot_perturbation``: box plots of the observed
  per-cell change at a condition's top-20 non-dropout DE genes, with the predicted change
  marked (``plot_perturbation_figure``);
- the map of a screen: the genetic-interaction magnitude of every pair of its genes, with
  the most synergistic and the most suppressive pairs named (``plot_pair_screen``); over several
  models, the same map in full colour only where the magnitude call is confident, the most
  synergistic and suppressive confident pairs named (``plot_replicate_pair_screen``).

Figures are built with matplotlib's object-oriented API on an Agg canvas, so they work
headless, leave pyplot's global state alone and never open a window."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.screen_report import counted
from gears_ddp.evaluation.metrics import non_dropout_de_table
from gears_ddp.interactions.calls import INTERACTION_THRESHOLDS


def observed_change_at_de_genes(pert_data, condition: str, control: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of ``condition``'s top-20 non-dropout DE genes and each of its cells'
    expression there minus ``control`` (cells x genes); an unknown condition is an error
    naming it."""
    cells = pert_data.cells
    if condition not in cells.conditions or condition == CONTROL:
        raise ValueError(
            f"{condition!r} is not a perturbation condition of the data "
            f"(e.g. {[c for c in cells.conditions if c != CONTROL][:5]})"
        )
    name = cells.condition_names[cells.conditions.index(condition)]
    row = non_dropout_de_table(pert_data.uns, pert_data.var.index, [name])[0]
    positions = row[row >= 0].numpy()
    return positions, cells.rows(cells.cells_of([condition])).numpy()[:, positions] - control[positions]


def plot_perturbation(
    pert_data, query: str, control: np.ndarray, mean_expression: Callable[[list[str]], np.ndarray], save_file=None
):
    """``GEARS.plot_perturbation``: the observed change over ``control`` of ``query``'s cells
    at its top-20 non-dropout DE genes (``observed_change_at_de_genes``; an unknown condition
    is an error before anything is predicted), with the change ``mean_expression`` predicts
    for its genes marked (``plot_perturbation_figure``)."""
    positions, observed = observed_change_at_de_genes(pert_data, query, control)
    predicted = mean_expression(condition_genes(query))
    return plot_perturbation_figure(
        observed,
        predicted[positions] - control[positions],
        list(pert_data.gene_names.iloc[positions]),  # by position: the Series' index is var's names
        query,
        save_file,
    )


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
        raise ValueError(f"`truth_change` must be a non-empty (cells x genes) array, got shape {truth_change.shape}")
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
    axes.boxplot(truth_change, positions=positions, showfliers=False, medianprops={"linewidth": 0})
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


GREYED_WEIGHT, GREYED_TO = 0.2, 0.8  # a greyed-out cell keeps a fifth of its colour, on light grey


def plot_pair_screen(table, save_file: str | os.PathLike | None = None, top: int = 10):
    """The map of a screen (``inference.pair_screen_job.pair_screen_table``): a heatmap of ``log2(mag)``
    over every pair of its genes (red: synergy, the double changes more than the singles'
    sum; blue: suppression, less; white: additive), the genes ordered by similarity of
    their rows (average-linkage clustering), pairs seen in training dotted, and beside it
    the ``top`` pairs of highest and of lowest ``mag`` (the most synergistic and the most
    suppressive; of fewer than ``2 * top`` pairs, the higher and the lower half), marked on
    the map with triangles (up and down) and named with their ``mag`` and interaction types.

    Written to ``save_file`` when given (atomically; the format follows the suffix, PNG
    when it has none). Returns the ``matplotlib.figure.Figure``.
    """
    pairs = _PairMap(table, "mag")
    figure, axes, text_axes = _map_figure()
    image = axes.imshow(
        pairs.matrix[np.ix_(pairs.order, pairs.order)],
        cmap=_colours(),
        vmin=-pairs.limit,
        vmax=pairs.limit,
        interpolation="nearest",
    )
    _colour_bar(figure, axes, image)
    pairs.dot_trained(axes, table["seen_in_training"].to_numpy(dtype=bool), "pair seen in training")
    by_mag = np.argsort(-pairs.log_mag, kind="stable")
    # by mag alone: a short list can reach additive pairs, which the text names as such; a
    # screen of fewer than 2 x top pairs is shared between the lists, so that none is in both
    highest = min(top, (len(by_mag) + 1) // 2)
    lists = {
        "highest mag (most synergistic first)": by_mag[:highest],
        "lowest mag (most suppressive first)": by_mag[::-1][: min(top, len(by_mag) - highest)],
    }
    for (title, picked), marker in zip(lists.items(), ("^", "v")):
        pairs.mark(axes, picked, marker, f"{title.split(' (')[0]}: {len(picked)} pairs")
    pairs.label_axes(axes, f"Genetic-interaction magnitude of {len(table):,} pairs of {len(pairs.genes)} genes")
    text_axes.text(
        0,
        1,
        _named_pairs(table, lists),
        va="top",
        ha="left",
        family="monospace",
        fontsize=8,
        transform=text_axes.transAxes,
    )
    _save(figure, save_file)
    return figure


def plot_replicate_pair_screen(summary, save_file: str | os.PathLike | None = None, top: int = 10):
    """The map of a screen over replicates (``inference.pair_screen_statistics.summarise_models``):
    ``log2`` of every pair's mean ``mag`` over the models, as ``plot_pair_screen`` draws it, but in
    full colour and outlined only where the magnitude call is confident (the models agree
    and the interval lies on the call's side of its thresholds); the other pairs are greyed
    out. Pairs some model saw in training are dotted. Beside it the ``top`` confident
    synergies and suppressions (highest and lowest mean ``mag``), named with their interval
    and the models' agreement, and how many calls of each type are confident.

    Written to ``save_file`` when given, as ``plot_pair_screen``. Returns the figure."""
    from matplotlib.colors import Normalize

    pairs = _PairMap(summary, "mag_mean")
    confident = summary["magnitude_type_confident"].to_numpy(dtype=bool)
    figure, axes, text_axes = _map_figure()
    colours, scale = _colours(), Normalize(-pairs.limit, pairs.limit)
    rgba = colours(scale(np.ma.masked_invalid(pairs.matrix)))
    held = np.zeros(pairs.matrix.shape, dtype=bool)
    held[pairs.first[confident], pairs.second[confident]] = held[pairs.second[confident], pairs.first[confident]] = True
    grey = ~held & np.isfinite(pairs.matrix)
    rgba[grey, :3] = GREYED_WEIGHT * rgba[grey, :3] + (1 - GREYED_WEIGHT) * GREYED_TO
    axes.imshow(rgba[np.ix_(pairs.order, pairs.order)], interpolation="nearest")
    _colour_bar(
        figure,
        axes,
        _mappable(colours, scale),
        "log2(mean mag over the models): 0 additive, > 0 synergy, < 0 suppression; greyed: not confident",
    )
    pairs.mark(axes, np.flatnonzero(confident), "s", "confident magnitude call", size=16)
    pairs.dot_trained(axes, summary["seen_in_training"].to_numpy() > 0, "pair seen in training (by some model)")
    models = int(summary["models"].iloc[0]) if len(summary) else 0
    pairs.label_axes(
        axes,
        f"Genetic-interaction magnitude over {models} models: {len(summary):,} pairs of "
        f"{len(pairs.genes)} genes, {counted(int(confident.sum()), 'confident magnitude call')}",
    )
    text_axes.text(
        0,
        1,
        _confident_text(summary, top),
        va="top",
        ha="left",
        family="monospace",
        fontsize=8,
        transform=text_axes.transAxes,
    )
    _save(figure, save_file)
    return figure


def _mappable(colours, scale):
    """What a colour bar reads its colours and scale from, for an image drawn as RGBA."""
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=scale, cmap=colours)


class _PairMap:
    """A screen's pairs laid out on a symmetric genes x genes map: ``log2`` of the column
    ``mag`` per pair, the genes clustered (``order``) and each pair's place on the map."""

    def __init__(self, table, mag: str):
        self.genes = list(dict.fromkeys([*table["first_gene"], *table["second_gene"]]))
        position = {gene: i for i, gene in enumerate(self.genes)}
        self.first = table["first_gene"].map(position).to_numpy()
        self.second = table["second_gene"].map(position).to_numpy()
        self.log_mag = np.log2(table[mag].to_numpy(dtype=float))
        self.matrix = np.full((len(self.genes), len(self.genes)), np.nan)
        self.matrix[self.first, self.second] = self.matrix[self.second, self.first] = self.log_mag
        self.order = _clustered_order(self.matrix)
        rank = np.empty_like(self.order)
        rank[self.order] = np.arange(len(self.order))
        # each pair marked once, above the diagonal
        self.rows = np.minimum(rank[self.first], rank[self.second])
        self.columns = np.maximum(rank[self.first], rank[self.second])
        finite = np.abs(self.log_mag[np.isfinite(self.log_mag)])
        self.limit = max(float(np.percentile(finite, 99)), 0.1) if len(finite) else 1.0

    def dot_trained(self, axes, seen: np.ndarray, label: str) -> None:
        # white edges keep the marks visible on the darkest cells; drawn above the lists' marks,
        # inside a triangle or square where a listed pair was seen in training
        axes.scatter(
            self.columns[seen],
            self.rows[seen],
            s=16,
            color="black",
            marker="o",
            edgecolors="white",
            linewidths=0.6,
            label=label,
            zorder=3,
        )

    def mark(self, axes, picked: np.ndarray, marker: str, label: str, size: float = 34) -> None:
        axes.scatter(
            self.columns[picked],
            self.rows[picked],
            s=size,
            facecolors="none" if marker == "s" else "white",
            edgecolors="black",
            marker=marker,
            linewidths=0.9,
            label=label,
        )

    def label_axes(self, axes, title: str) -> None:
        many = len(self.genes) > 60
        if many:
            axes.set_xticks([])
            axes.set_yticks([])
            axes.set_xlabel(f"{len(self.genes)} genes, clustered")
        else:
            labels = [self.genes[i] for i in self.order]
            axes.set_xticks(range(len(self.genes)), labels=labels, rotation=90, fontsize=7)
            axes.set_yticks(range(len(self.genes)), labels=labels, fontsize=7)
        axes.set_title(title)
        axes.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.06 if many else -0.12), ncol=3, fontsize=8, frameon=False
        )


def _map_figure():
    """A figure with the map on the left and room for text on the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 8.5))
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(1, 2, width_ratios=(20, 10), wspace=0.3)
    axes, text_axes = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    text_axes.axis("off")
    return figure, axes, text_axes


def _colours():
    import matplotlib

    return matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.55")  # the empty diagonal grey, not additive white


def _colour_bar(figure, axes, mappable, label: str = "log2(mag): 0 additive, > 0 synergy, < 0 suppression") -> None:
    figure.colorbar(mappable, ax=axes, fraction=0.046, pad=0.03).set_label(label)


def _save(figure, save_file) -> None:
    """Write ``figure`` to ``save_file`` atomically (the format follows the suffix, PNG when
    it has none); nothing when None."""
    if save_file is None:
        return
    from gears_ddp.data.io import atomic_path

    save_file = Path(save_file)
    with atomic_path(save_file) as tmp:
        figure.savefig(tmp, format=save_file.suffix.lstrip(".").lower() or "png", bbox_inches="tight", dpi=120)


def _clustered_order(matrix: np.ndarray) -> np.ndarray:
    """The rows of a symmetric matrix ordered by average-linkage clustering of the rows (NaN
    as 0), each row a gene's profile: their Euclidean distances are given to ``linkage``
    condensed, as it computes them itself, so that a matrix with a zero diagonal is not
    taken for a distance matrix (scipy warns that it looks like one); the given order for
    fewer than 3 rows."""
    if len(matrix) < 3:
        return np.arange(len(matrix))
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import pdist

    return leaves_list(linkage(pdist(np.nan_to_num(matrix)), method="average"))


def _named_pairs(table, lists: dict) -> str:
    """The text beside the map: each list's pairs with their mag and interaction types."""
    lines = []
    for title, rows in lists.items():
        lines += [title, ""]
        for row in rows:
            pair = table.iloc[int(row)]
            kinds = [kind for kind in ("neomorphic", "redundant", "epistasis") if bool(pair[kind])]
            seen = " (trained)" if bool(pair["seen_in_training"]) else ""
            lines.append(
                f"{pair['pair'][:24]:<24} {pair['mag']:6.2f}  {pair['magnitude_type']}"
                + (", " + ", ".join(kinds) if kinds else "")
                + seen
            )
        lines.append("")
    return "\n".join(lines + _threshold_lines())


def _confident_text(summary, top: int) -> str:
    """The text beside a screen over replicates: the ``top`` confident synergies and
    suppressions with their mean mag and interval, then the confident calls of every type."""
    from gears_ddp.inference.pair_screen_statistics import confident_counts

    confident = summary[summary["magnitude_type_confident"].to_numpy(dtype=bool)]
    models = int(summary["models"].iloc[0]) if len(summary) else 0
    lines = []
    for call, title, ascending in (
        ("synergy", "highest mean mag first", False),
        ("suppressor", "lowest mean mag first", True),
    ):
        held = confident[confident["magnitude_type"] == call].sort_values("mag_mean", ascending=ascending)
        lines += [
            f"confident {call}: {counted(len(held), 'pair')} ({title})",
            "    mean mag [95% interval over the models]",
        ]
        for _, pair in held.head(top).iterrows():
            kinds = [
                kind
                for kind in ("neomorphic", "redundant", "epistasis")
                if bool(pair[kind]) and bool(pair[f"{kind}_confident"])
            ]
            seen = f" (trained in {pair['seen_in_training']}/{models})" if pair["seen_in_training"] else ""
            lines.append(
                f"{pair['pair'][:24]:<24} {pair['mag_mean']:5.2f} [{pair['mag_ci_low']:.2f}, "
                f"{pair['mag_ci_high']:.2f}]" + (" " + ", ".join(kinds) if kinds else "") + seen
            )
        lines.append("")
    lines.append(f"confident calls of {len(summary):,} pairs:")
    lines += [
        f"{kind}: " + ", ".join(f"{call} {count}" for call, count in counts.items())
        for kind, counts in confident_counts(summary).items()
    ]
    lines += [
        "",
        "confident: every model makes the call and the 95%",
        "interval of the mean over the models lies where",
        "the call holds.",
        "",
    ]
    return "\n".join(lines + _threshold_lines())


def _threshold_lines() -> list[str]:
    limits = INTERACTION_THRESHOLDS
    return [
        "types as the published GEARS analysis reads them:",
        f"synergy mag > {1 + limits['additive_band']:g}, suppressor mag < {1 - limits['additive_band']:g}, "
        "additive between;",
        f"neomorphic corr_fit < {limits['neomorphic_below']:g}; redundant dcor > {limits['redundant_above']:g};",
        f"epistasis dominance > {limits['epistasis_above']:g}",
    ]
