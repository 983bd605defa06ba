"""The run report's pictures: training curves, test metrics beside the baselines, and
predicted against true change at the top DE genes of a few test conditions; and, for
replicates, each metric's value in every replicate, GEARS beside the baselines.

Each picture has a ``figure_...`` builder that returns the ``matplotlib.figure.Figure`` (so
tests and notebooks can inspect what was drawn) and a ``plot_...`` function that builds it
and writes a PNG. Figures use matplotlib's object-oriented API on an Agg canvas: they work
headless and leave pyplot's global state alone.

Colours mean the same in every picture: GEARS in red, the baselines in muted tones.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from gears_ddp.evaluation.paired_bootstrap import BEATS, LOSES, NO_CLEAR, NOT_APPLICABLE
from gears_ddp.report.equal_baselines import equal_baseline_groups, group_heading
from gears_ddp.report.not_applicable import not_applicable_reason
from gears_ddp.report.verdicts import (
    MEANINGS,
    SUBGROUP_NAMES,
    higher_is_better,
    metric_key,
    shown_subgroups,
    summary_value,
    whole_test_set_name,
)

GEARS_COLOUR = "#c62828"
TRAIN_COLOUR = "#5b7fa6"
BEST_EPOCH_COLOUR = "#333333"
BASELINE_COLOURS = {
    "no_change": "#c8c8c8",
    "mean_effect": "#a9c1d9",
    "additive": "#d8c79e",
    "linear": "#a8d5c2",
    "linear_pretrained": "#cdb8dc",
}
FALLBACK_BASELINE_COLOURS = ("#c9b3d6", "#b5d3b0", "#e3b6a8")
TRUE_CHANGE_FILL = "#dfe7f0"
BASE_FONT_SIZE = 11
VERDICT_LABELS = {BEATS: "beats", LOSES: "loses", NO_CLEAR: "unclear", NOT_APPLICABLE: "n/a"}
VERDICT_COLOURS = {BEATS: "#1b5e20", LOSES: "#b71c1c"}
DPI = 150


def subgroup_label(subgroup: str | None) -> str:
    """A subgroup's name (or a name of one's own) as a tick label, broken into short lines."""
    return textwrap.fill(SUBGROUP_NAMES.get(subgroup, str(subgroup)), width=22)


def save_figure(figure: Figure, path) -> Path:
    """Write ``figure`` as a PNG at ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI)
    return path


def new_figure(width: float, height: float) -> Figure:
    """An empty figure on an Agg canvas, laid out by constrained layout (nothing overlaps)."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _style(axes) -> None:
    """The house look: no top or right frame, readable ticks."""
    axes.spines[["top", "right"]].set_visible(False)
    axes.tick_params(labelsize=BASE_FONT_SIZE - 1)


def _values(history: list[dict], key: str) -> np.ndarray:
    """``key`` of every epoch as floats, NaN where missing (or null in a JSON report)."""
    return np.array([summary_value(record, key) for record in history])


# ------------------------------------------------------------------ training curves
def figure_training_curves(history: list[dict], best_epoch: int) -> Figure:
    """Training loss, mse at the DE genes and correlation per epoch, train beside val, with
    the kept model's epoch (lowest val ``mse_de``) marked in every panel.

    Markers are drawn as well as lines, so a run of a single epoch still shows its values.
    """
    figure = new_figure(15, 4.6)
    loss_axes, mse_axes, pearson_axes = figure.subplots(1, 3)
    epochs = _values(history, "epoch")
    _draw_series(loss_axes, epochs, {"train": _values(history, "train_loss")})
    _finish_panel(loss_axes, "Training loss (lower is better)", "loss (mean over steps)")
    _draw_series(mse_axes, epochs, {"train": _values(history, "train_mse_de"), "val": _values(history, "val_mse_de")})
    _finish_panel(mse_axes, "Error at top 20 DE genes (lower is better)", "MSE at top 20 DE genes")
    pearson_key = _pearson_key(history)
    _draw_series(
        pearson_axes,
        epochs,
        {"train": _values(history, f"train_{pearson_key}"), "val": _values(history, f"val_{pearson_key}")},
    )
    where = "top 20 DE genes" if pearson_key == "pearson_de" else "all genes"
    _finish_panel(pearson_axes, f"Correlation, {where} (higher is better)", f"Pearson r, {where}")
    last_epoch = np.nanmax(epochs, initial=best_epoch)
    for axes in (loss_axes, mse_axes, pearson_axes):
        axes.axvline(best_epoch, color=BEST_EPOCH_COLOUR, linestyle=":", linewidth=1.5, zorder=1)
        axes.set_xlim(0.5, max(last_epoch, 1) + 0.5)  # whole epochs on the axis, one or none included
    figure.legend(
        handles=_curve_legend_handles(best_epoch),
        loc="outside lower center",
        ncol=3,
        frameon=False,
        fontsize=BASE_FONT_SIZE,
    )
    return figure


def _pearson_key(history: list[dict]) -> str:
    """``pearson_de`` when the history has values of it, else ``pearson``."""
    has_de = (
        np.isfinite(_values(history, "val_pearson_de")).any() or np.isfinite(_values(history, "train_pearson_de")).any()
    )
    return "pearson_de" if has_de else "pearson"


def _draw_series(axes, epochs: np.ndarray, series: dict[str, np.ndarray]) -> None:
    """Train (hollow markers, dashed) and val (filled, solid) against epoch; a series with no
    value is left out, and a panel with none says so."""
    styles = {
        "train": {"color": TRAIN_COLOUR, "linestyle": "--", "marker": "o", "markerfacecolor": "white"},
        "val": {"color": GEARS_COLOUR, "linestyle": "-", "marker": "o"},
    }
    drawn = [name for name, values in series.items() if np.isfinite(values).any()]
    for name in drawn:
        axes.plot(epochs, series[name], label=name, linewidth=2, markersize=6, **styles[name])
    if not drawn:
        axes.text(0.5, 0.5, "not recorded", transform=axes.transAxes, ha="center", va="center", color="grey")


def _finish_panel(axes, title: str, ylabel: str) -> None:
    """Title, axis labels, whole-number epoch ticks and the house style."""
    axes.set_title(title, fontsize=BASE_FONT_SIZE + 1)
    axes.set_xlabel("epoch", fontsize=BASE_FONT_SIZE)
    axes.set_ylabel(ylabel, fontsize=BASE_FONT_SIZE)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axes.grid(axis="y", color="#e6e6e6")
    _style(axes)


def _curve_legend_handles(best_epoch: int) -> list:
    """One legend for the three panels: train, val and the kept epoch."""
    return [
        Line2D([], [], color=TRAIN_COLOUR, linestyle="--", marker="o", markerfacecolor="white", label="train"),
        Line2D([], [], color=GEARS_COLOUR, marker="o", label="validation"),
        Line2D(
            [],
            [],
            color=BEST_EPOCH_COLOUR,
            linestyle=":",
            label=f"model kept: epoch {best_epoch} (lowest validation MSE at DE genes)",
        ),
    ]


def plot_training_curves(history: list[dict], best_epoch: int, path) -> Path:
    """Write ``figure_training_curves`` as a PNG at ``path``; returns the path."""
    return save_figure(figure_training_curves(history, best_epoch), path)


# ------------------------------------------------------------------ test metrics
def figure_test_metrics(model: dict, baselines: dict[str, dict], metrics=("pearson_delta", "mse_de")) -> Figure:
    """One panel per metric: for all test conditions and each test subgroup that differs
    from them (``verdicts.shown_subgroups``), GEARS's bar beside each baseline's (one bar for
    baselines that predicted the same: ``equal_baselines``). A missing or NaN value, or a
    comparison that is not applicable (``not_applicable``), leaves its slot empty, marked
    "n/a". Every bar carries its value; the title says which way is better."""
    groups = [None, *shown_subgroups(model)]
    labels = [subgroup_label(group or whole_test_set_name(model)) for group in groups]
    series = [("GEARS", model, GEARS_COLOUR)] + [
        (group, baselines[group[0]], baseline_colour(group[0], position))
        for position, group in enumerate(equal_baseline_groups(baselines))
    ]
    width = max(6.5, 2.2 * len(groups) + 3)
    figure = new_figure(width, 3.9 * len(metrics) + 0.9)
    for axes, metric in zip(np.atleast_1d(figure.subplots(len(metrics), 1)), metrics):
        _draw_metric_panel(axes, metric, groups, labels, series)
    columns = len(series) if width >= 10 else 2  # a narrow figure stacks the legend
    figure.legend(
        handles=_bar_legend_handles(series),
        loc="outside upper center",
        ncol=columns,
        frameon=False,
        fontsize=BASE_FONT_SIZE,
    )
    return figure


def baseline_colour(name: str, position: int) -> str:
    """The muted colour of baseline ``name`` (the ``position``-th baseline)."""
    return BASELINE_COLOURS.get(name, FALLBACK_BASELINE_COLOURS[position % len(FALLBACK_BASELINE_COLOURS)])


def display_name(name: str | tuple[str, ...]) -> str:
    """``'mean_effect'`` -> ``'mean effect baseline'``; a group of baselines that predicted
    the same -> ``'mean effect = additive baselines (equal here)'``."""
    if isinstance(name, tuple):
        return (
            display_name(name[0])
            if len(name) == 1
            else " = ".join(member.replace("_", " ") for member in name) + " baselines (equal here)"
        )
    return name.replace("_", " ") + " baseline"


def _draw_metric_panel(axes, metric: str, groups: list, labels: list[str], series: list[tuple]) -> None:
    """The bars of one metric: for each of ``series`` (name, summary, colour; GEARS first,
    then the baselines in order) a bar per test group; a baseline's value of a comparison
    that is not applicable is no bar, only "n/a", as the table has it."""
    width = 0.8 / len(series)
    centres = np.arange(len(groups))
    for slot, (name, summary, colour) in enumerate(series):
        fixed = isinstance(name, tuple) and not_applicable_reason(name[0], metric) is not None
        heights = np.array([np.nan if fixed else summary_value(summary, metric_key(metric, group)) for group in groups])
        offsets = centres + (slot - (len(series) - 1) / 2) * width
        _draw_bars(axes, offsets, heights, width, colour, label=name if name == "GEARS" else group_heading(name))
    axes.axhline(0, color="#555555", linewidth=0.8)
    axes.set_xticks(centres, labels=labels, fontsize=BASE_FONT_SIZE)
    axes.set_ylabel(metric, fontsize=BASE_FONT_SIZE)
    direction = "higher is better" if higher_is_better(metric) else "lower is better"
    meaning = MEANINGS.get(metric)
    axes.set_title(f"{metric} ({direction})" + (f"\n{meaning}" if meaning else ""), fontsize=BASE_FONT_SIZE + 1)
    axes.set_xlim(-0.7, len(groups) - 0.3)
    axes.margins(y=0.18)
    axes.grid(axis="y", color="#e6e6e6")
    axes.set_axisbelow(True)
    _style(axes)


def _draw_bars(axes, offsets: np.ndarray, heights: np.ndarray, width: float, colour: str, label: str) -> None:
    """Bars with their values written on them; NaN heights get no bar, only "n/a"."""
    finite = np.isfinite(heights)
    bars = axes.bar(
        offsets[finite],
        heights[finite],
        width,
        color=colour,
        label=label,
        edgecolor="#444444" if label == "GEARS" else "none",
        linewidth=0.6,
    )
    axes.bar_label(
        bars,
        labels=[f"{height:.3g}" for height in heights[finite]],
        padding=2,
        fontsize=BASE_FONT_SIZE - 3,
        rotation=90,
    )
    for offset in offsets[~finite]:
        axes.text(offset, 0, "n/a", ha="center", va="bottom", rotation=90, fontsize=BASE_FONT_SIZE - 3, color="grey")


def _bar_legend_handles(series: list[tuple]) -> list:
    """GEARS and each baseline (or group of baselines that predicted the same), in bar order."""
    return [
        Patch(facecolor=colour, edgecolor="#444444", label="GEARS")
        if name == "GEARS"
        else Patch(color=colour, label=display_name(name))
        for name, _, colour in series
    ]


def plot_test_metrics(model: dict, baselines: dict[str, dict], path, metrics=("pearson_delta", "mse_de")) -> Path:
    """Write ``figure_test_metrics`` as a PNG at ``path``; returns the path."""
    return save_figure(figure_test_metrics(model, baselines, metrics), path)


# ------------------------------------------------------------------ paired differences
def figure_intervals(rows: list[tuple[str, bool, dict]], title: str) -> Figure:
    """A forest plot of one test subgroup: for each metric of ``rows`` (``(metric,
    higher_is_better, {baseline: PairedComparison})``) a panel of its own scale, one line per
    baseline: the mean difference GEARS minus the baseline, signed so that + favours GEARS
    (a point) and its 95% interval (a bar), coloured by the verdict (green beats, red loses
    to, grey no clear difference), the zero line dashed, and the perturbations won at the
    right; a comparison without an interval says n/a."""
    heights = [0.34 * max(len(comparisons), 1) + 0.75 for _, _, comparisons in rows]
    figure = new_figure(8.5, sum(heights) + 0.9)
    panels = figure.subplots(len(rows), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    for axes, (metric, higher, comparisons) in zip(panels, rows):
        names = list(comparisons)
        for line, name in enumerate(names):
            comparison = comparisons[name]
            y = len(names) - 1 - line
            if comparison.verdict == NOT_APPLICABLE:
                axes.text(0, y, "  n/a", va="center", ha="left", color="#777777", fontsize=BASE_FONT_SIZE - 2)
                continue
            colour = VERDICT_COLOURS.get(comparison.verdict, "#777777")
            axes.hlines(y, comparison.low, comparison.high, color=colour, linewidth=2.2)
            axes.plot([comparison.difference], [y], "o", color=colour, markersize=6)
            axes.text(
                1.01,
                y,
                f"{comparison.won}/{comparison.n} {VERDICT_LABELS[comparison.verdict]}",
                transform=axes.get_yaxis_transform(),
                va="center",
                fontsize=BASE_FONT_SIZE - 2,
                color=colour,
            )
        axes.axvline(0, color="#444444", linestyle="--", linewidth=0.9)
        axes.set_yticks(
            range(len(names)),
            labels=[display_name(name).replace(" baseline", "") for name in reversed(names)],
            fontsize=BASE_FONT_SIZE - 1,
        )
        axes.set_ylim(-0.6, len(names) - 0.4)
        direction = "higher" if higher else "lower"
        axes.set_title(f"{metric} ({direction} is better; + favours GEARS)", fontsize=BASE_FONT_SIZE, loc="left")
        axes.grid(axis="x", color="#e6e6e6")
        axes.set_axisbelow(True)
        axes.margins(x=0.08)
        _style(axes)
    panels[-1].set_xlabel(
        textwrap.fill(
            "GEARS minus the baseline, signed so that + favours GEARS: the mean paired "
            "difference (point) and its 95% interval (bar); at the right, the test "
            "perturbations GEARS won and the verdict",
            100,
        ),
        fontsize=BASE_FONT_SIZE - 1,
        color="#555555",
    )
    figure.suptitle(textwrap.fill(title, 85), fontsize=BASE_FONT_SIZE + 1)
    return figure


def plot_intervals(rows: list[tuple[str, bool, dict]], title: str, path) -> Path:
    """Write ``figure_intervals`` as a PNG at ``path``; returns the path."""
    return save_figure(figure_intervals(rows, title), path)


# ------------------------------------------------------------------ predictions
def figure_predictions(examples: list[dict]) -> Figure:
    """One row per test condition: box plots of each cell's true change over control at the
    condition's top DE genes, GEARS's predicted change as red dots and the additive
    baseline's as hollow diamonds, with a dashed line at no change.

    Each example is a dict of ``condition``, ``subgroup`` (or None), ``genes`` (K names),
    ``control`` (K,), ``truth_cells`` (cells x K, NaN where padded), ``model`` (K,) and
    ``baselines`` ({name: (K,)}), as ``report.examples.prediction_examples`` builds them.
    """
    if not examples:
        raise ValueError("figure_predictions needs at least one example")
    widest = max(len(example["genes"]) for example in examples)
    width = max(7.0, 0.62 * widest + 2.2)
    figure = new_figure(width, 3.9 * len(examples) + 0.8)
    for axes, example in zip(np.atleast_1d(figure.subplots(len(examples), 1)), examples):
        _draw_example(axes, example)
    with_additive = any("additive" in example.get("baselines", {}) for example in examples)
    figure.legend(
        handles=_prediction_legend_handles(with_additive),
        loc="outside upper center",
        ncol=2 if width >= 12 else 1,
        frameon=False,
        fontsize=BASE_FONT_SIZE,
    )  # narrow: one column fits
    return figure


def true_change_per_gene(example: dict) -> list[np.ndarray]:
    """Each gene's per-cell change over control, padding NaNs dropped."""
    change = np.asarray(example["truth_cells"], dtype=np.float64) - np.asarray(example["control"], dtype=np.float64)
    return [column[np.isfinite(column)] for column in change.T]


def predicted_change(example: dict, name: str = "model") -> np.ndarray:
    """The predicted mean change over control of GEARS (``'model'``) or of a baseline."""
    prediction = example["model"] if name == "model" else example["baselines"][name]
    return np.asarray(prediction, dtype=np.float64) - np.asarray(example["control"], dtype=np.float64)


def _draw_example(axes, example: dict) -> None:
    """The boxes, predictions, zero line, gene labels and title of one condition."""
    positions = np.arange(1, len(example["genes"]) + 1)
    axes.boxplot(
        true_change_per_gene(example),
        positions=positions,
        widths=0.6,
        showfliers=False,
        patch_artist=True,
        boxprops={"facecolor": TRUE_CHANGE_FILL, "edgecolor": "#4d4d4d"},
        whiskerprops={"color": "#4d4d4d"},
        capprops={"color": "#4d4d4d"},
        medianprops={"linewidth": 0},
    )
    axes.axhline(0, linestyle="dashed", color="green", linewidth=1)
    if "additive" in example.get("baselines", {}):
        axes.scatter(
            positions,
            predicted_change(example, "additive"),
            marker="D",
            s=34,
            facecolors="none",
            edgecolors="#555555",
            linewidths=1.3,
            zorder=3,
            label="additive",
        )
    axes.scatter(positions, predicted_change(example), color="red", s=38, zorder=4, label="GEARS")
    axes.set_xticks(
        positions,
        labels=[str(gene) for gene in example["genes"]],
        rotation=60,
        ha="right",
        rotation_mode="anchor",
        fontsize=BASE_FONT_SIZE - 1,
    )
    axes.set_xlim(0.4, len(positions) + 0.6)
    axes.set_ylabel("expression change\nover control", fontsize=BASE_FONT_SIZE)
    axes.set_title(_example_title(example), fontsize=BASE_FONT_SIZE + 1, loc="left")
    _style(axes)


def _example_title(example: dict) -> str:
    """``'FOXA1+HOXB9: two-gene combos, one gene seen (312 cells)'``; cells padded with NaN only are not counted."""
    subgroup = example.get("subgroup")
    where = f": {SUBGROUP_NAMES.get(subgroup, subgroup)}" if subgroup else ""
    cells = int(np.isfinite(np.asarray(example["truth_cells"], dtype=np.float64)).any(axis=1).sum())
    return f"{example['condition']}{where} ({cells} cells)"


def _prediction_legend_handles(with_additive: bool) -> list:
    """The legend shared by every row."""
    handles = [
        Patch(
            facecolor=TRUE_CHANGE_FILL,
            edgecolor="#4d4d4d",
            label="true change in the test cells (box: middle 50%, whiskers: 1.5 IQR)",
        ),
        Line2D([], [], color="red", marker="o", linestyle="none", label="GEARS predicted change"),
    ]
    if with_additive:
        handles.append(
            Line2D(
                [],
                [],
                color="#555555",
                marker="D",
                markerfacecolor="none",
                linestyle="none",
                label="additive baseline (sum of single-gene changes)",
            )
        )
    handles.append(Line2D([], [], color="green", linestyle="dashed", label="no change"))
    return handles


def plot_predictions(examples: list[dict], path) -> Path:
    """Write ``figure_predictions`` as a PNG at ``path``; returns the path."""
    return save_figure(figure_predictions(examples), path)


# ------------------------------------------------------------------ replicates
def figure_replicate_values(verdicts: list, whole: str = SUBGROUP_NAMES[None]) -> Figure:
    """One metric over the replicates (``replicate_summary.ReplicateVerdict`` of each
    subgroup): for all test conditions (named ``whole``) and each subgroup, every
    replicate's value of GEARS and of each baseline as a point, side by side, with each
    method's mean as a bar across its points. The title says which way is better."""
    metric = verdicts[0].metric
    names = ["GEARS", *verdicts[0].baselines]
    colours = [GEARS_COLOUR] + [baseline_colour(name, position) for position, name in enumerate(names[1:])]
    width = max(6.5, 2.2 * len(verdicts) + 3)
    figure = new_figure(width, 4.9)
    axes = figure.subplots()
    slot = 0.8 / len(names)
    jitter = np.random.default_rng(0)  # the same picture every time it is drawn
    for group, verdict in enumerate(verdicts):
        spreads = [verdict.gears, *(verdict.baselines[name] for name in names[1:])]
        for position, (spread, colour) in enumerate(zip(spreads, colours)):
            centre = group + (position - (len(names) - 1) / 2) * slot
            values = spread.finite
            offsets = centre + jitter.uniform(-0.22, 0.22, values.size) * slot
            axes.scatter(offsets, values, s=30, color=colour, edgecolors="#333333", linewidths=0.7, zorder=3)
            if values.size:
                axes.hlines(
                    values.mean(), centre - 0.45 * slot, centre + 0.45 * slot, color="#222222", linewidth=2, zorder=2
                )
            if position:  # the verdict of GEARS against this baseline, under its points
                verdict_text = verdict.differences[names[position]].verdict
                axes.text(
                    centre,
                    0.01,
                    VERDICT_LABELS[verdict_text],
                    transform=axes.get_xaxis_transform(),
                    ha="center",
                    va="bottom",
                    fontsize=BASE_FONT_SIZE - 3,
                    color=VERDICT_COLOURS.get(verdict_text, "#777777"),
                )
    axes.set_xticks(
        np.arange(len(verdicts)),
        labels=[subgroup_label(v.subgroup or whole) for v in verdicts],
        fontsize=BASE_FONT_SIZE,
    )
    axes.set_xlim(-0.6, len(verdicts) - 0.4)
    low, high = axes.get_ylim()
    axes.set_ylim(low - 0.18 * (high - low), high)  # room for the verdicts under the points
    axes.set_ylabel(metric, fontsize=BASE_FONT_SIZE)
    explained = [
        "under each baseline: GEARS beats it, loses to it, or the difference is unclear (the 95% "
        "interval of the paired differences, over replicates and perturbations, holds zero)"
    ]
    if any(d.verdict == NOT_APPLICABLE for verdict in verdicts for d in verdict.differences.values()):
        explained.append("n/a: no interval (the table says why)")
    line_length = int(width * 11)  # characters that fit the figure's width at this font size
    axes.set_xlabel(
        "\n".join(textwrap.fill(text, line_length) for text in explained), fontsize=BASE_FONT_SIZE - 1, color="#555555"
    )
    direction = "higher is better" if higher_is_better(metric) else "lower is better"
    meaning = MEANINGS.get(metric)
    count = max(verdict.gears.n for verdict in verdicts)
    title = textwrap.fill(f"{metric} ({direction}), {count} replicates", int(width * 9))
    axes.set_title(title + (f"\n{meaning}" if meaning else ""), fontsize=BASE_FONT_SIZE + 1)
    axes.grid(axis="y", color="#e6e6e6")
    axes.set_axisbelow(True)
    _style(axes)
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            linestyle="none",
            color=colour,
            markeredgecolor="#333333",
            label="GEARS" if name == "GEARS" else display_name(name),
        )
        for name, colour in zip(names, colours)
    ]
    handles.append(Line2D([], [], color="#222222", linewidth=2, label="mean over replicates"))
    # two columns: three of the longer names ran past the edges of the narrowest figure
    figure.legend(handles=handles, loc="outside upper center", ncol=2, frameon=False, fontsize=BASE_FONT_SIZE)
    return figure


def plot_replicate_values(verdicts: list, path, whole: str = SUBGROUP_NAMES[None]) -> Path:
    """Write ``figure_replicate_values`` as a PNG at ``path``; returns the path."""
    return save_figure(figure_replicate_values(verdicts, whole), path)
