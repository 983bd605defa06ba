"""The run report's pictures and page, from synthetic inputs (no training).

The pictures are checked through the figures their builders return: what was drawn must be
the data given (bar heights, predicted points, the kept epoch), NaN must leave a gap rather
than break the picture, and each PNG must read back as an image of a plausible size. The
page must show every metric with the right verdict, escape what comes from the data, link
the pictures by relative path and say when there was no test set.
"""

import math
import re

import numpy as np
import pytest
from matplotlib.container import BarContainer
from matplotlib.image import imread
from verdict_reports import report_from_values

from gears_ddp.report.numbers import format_number
from gears_ddp.report.page import write_report_page
from gears_ddp.report.plots import (
    figure_predictions,
    figure_test_metrics,
    figure_training_curves,
    plot_predictions,
    plot_test_metrics,
    plot_training_curves,
    subgroup_label,
    true_change_per_gene,
)
from gears_ddp.report.run_files import PAGE_FILE
from gears_ddp.report.verdicts import compare

BASELINE_NAMES = ("no_change", "mean_effect", "additive", "linear")
GROUPS = (None, "combo_seen0", "combo_seen1", "unseen_single")


def make_history(epochs: int) -> list[dict]:
    """Epoch records as the training writes them, falling losses and rising correlations."""
    return [
        {
            "epoch": e,
            "train_loss": 1 / e,
            "train_seconds": 50.0,
            "seconds": 60.0,
            "train_mse": 0.01 / e,
            "train_mse_de": 0.2 / e,
            "train_pearson": 0.9,
            "train_pearson_de": 0.5 + e / 100,
            "val_mse": 0.02 / e,
            "val_mse_de": 0.3 / e + 0.01 * e,
            "val_pearson": 0.85,
            "val_pearson_de": 0.4 + e / 100,
        }
        for e in range(1, epochs + 1)
    ]


def make_summary(seed: float, groups=GROUPS) -> dict:
    """A test summary with distinct values for ``pearson_delta`` and ``mse_de`` per group."""
    summary = {}
    for position, group in enumerate(groups):
        prefix = f"test_{group + '_' if group else ''}"
        summary[prefix + "pearson_delta"] = round(seed + 0.01 * position, 4)
        summary[prefix + "mse_de"] = round(1 - seed + 0.02 * position, 4)
    return summary


def make_example(condition="FOXA1+HOXB9", subgroup="combo_seen1", genes=6, cells=40, seed=0) -> dict:
    """One test condition as ``report.examples.prediction_examples`` builds it; the last 5
    cells are NaN padding at the last gene."""
    rng = np.random.default_rng(seed)
    control = rng.uniform(0.5, 2.0, genes)
    truth = control + rng.normal(0.5, 0.3, (cells, genes))
    truth[-5:, -1] = np.nan
    return {
        "condition": condition,
        "subgroup": subgroup,
        "genes": [f"GENE{i}" for i in range(genes)],
        "control": control,
        "truth_cells": truth,
        "model": control + rng.normal(0.4, 0.1, genes),
        "baselines": {"additive": control + 0.2, "no_change": control},
    }


def bars_by_label(axes) -> dict[str, BarContainer]:
    """The bar containers of a panel keyed by their legend label."""
    return {container.get_label(): container for container in axes.containers if isinstance(container, BarContainer)}


def scatter_by_label(axes) -> dict[str, np.ndarray]:
    """The (x, y) points of each labelled scatter of a panel."""
    return {
        collection.get_label(): np.asarray(collection.get_offsets())
        for collection in axes.collections
        if collection.get_label() in ("GEARS", "additive")
    }


# ------------------------------------------------------------------ files
@pytest.mark.parametrize(
    "draw, minimum_width",
    [
        (lambda path: plot_training_curves(make_history(5), 3, path), 1500),
        (lambda path: plot_test_metrics(make_summary(0.6), {n: make_summary(0.3) for n in BASELINE_NAMES}, path), 1000),
        (lambda path: plot_predictions([make_example(), make_example(seed=1)], path), 900),
    ],
    ids=["training_curves", "test_metrics", "predictions"],
)
def test_each_picture_is_a_png_of_plausible_size_in_a_new_folder(tmp_path, draw, minimum_width):
    path = tmp_path / "new" / "plots" / "picture.png"
    assert draw(path) == path
    pixels = imread(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4)
    assert pixels.shape[1] >= minimum_width and 400 <= pixels.shape[0] <= 6000
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


# ------------------------------------------------------------------ training curves
def test_training_curves_draw_the_history_and_mark_the_kept_epoch():
    history = make_history(6)
    figure = figure_training_curves(history, best_epoch=4)
    loss_axes, mse_axes, pearson_axes = figure.axes
    drawn_mse = {
        tuple(np.round(line.get_ydata(), 6)) for line in mse_axes.lines if line.get_label() in ("train", "val")
    }
    assert drawn_mse == {
        tuple(round(r["val_mse_de"], 6) for r in history),
        tuple(round(r["train_mse_de"], 6) for r in history),
    }
    for axes in figure.axes:
        verticals = [
            line for line in axes.lines if len(set(line.get_xdata())) == 1 and line.get_label() not in ("train", "val")
        ]
        assert [line.get_xdata()[0] for line in verticals] == [4]
    assert "lower is better" in loss_axes.get_title() and "lower is better" in mse_axes.get_title()
    assert "higher is better" in pearson_axes.get_title()
    assert all(axes.get_xlabel() == "epoch" and axes.get_ylabel() for axes in figure.axes)


def test_a_single_epoch_is_drawn_with_markers_on_a_whole_number_axis():
    figure = figure_training_curves(make_history(1), best_epoch=1)
    for axes in figure.axes:
        data_lines = [line for line in axes.lines if line.get_label() in ("train", "val")]
        assert data_lines and all(line.get_marker() not in (None, "None", "") for line in data_lines)
        ticks = [tick for tick in axes.get_xticks() if axes.get_xlim()[0] <= tick <= axes.get_xlim()[1]]
        assert ticks == [1]


def test_correlation_panel_falls_back_to_pearson_and_skips_missing_validation():
    history = make_history(3)
    for record in history:
        record.update(train_pearson_de=math.nan, val_pearson_de=math.nan, val_mse_de=math.nan)
    _, mse_axes, pearson_axes = figure_training_curves(history, best_epoch=1).axes
    assert [line.get_label() for line in mse_axes.lines if line.get_label() in ("train", "val")] == ["train"]
    val_line = next(line for line in pearson_axes.lines if line.get_label() == "val")
    assert list(val_line.get_ydata()) == [r["val_pearson"] for r in history]
    assert "all genes" in pearson_axes.get_title()


# ------------------------------------------------------------------ test metrics
def test_metric_bars_are_the_summary_values_gears_first_in_each_group():
    model = make_summary(0.6)
    baselines = {name: make_summary(0.1 * (i + 2)) for i, name in enumerate(BASELINE_NAMES)}
    figure = figure_test_metrics(model, baselines)
    for axes, metric in zip(figure.axes, ("pearson_delta", "mse_de")):
        bars = bars_by_label(axes)
        assert list(bars) == ["GEARS", *BASELINE_NAMES]
        for name, summary in [("GEARS", model), *baselines.items()]:
            expected = [summary[f"test_{g + '_' if g else ''}{metric}"] for g in GROUPS]
            if (name, metric) == ("no_change", "pearson_delta"):  # not applicable: n/a, no bar
                expected = []
            assert [bar.get_height() for bar in bars[name]] == pytest.approx(expected)
        gears_x = [bar.get_x() for bar in bars["GEARS"]]
        assert all(g < b.get_x() for g, b in zip(gears_x, bars["additive"]))
        assert [label.get_text() for label in axes.get_xticklabels()] == [subgroup_label(g) for g in GROUPS]
    assert "higher is better" in figure.axes[0].get_title()
    assert "lower is better" in figure.axes[1].get_title()
    assert len(figure.legends) == 1


def test_a_nan_metric_gets_no_bar_but_an_na_mark():
    model = make_summary(0.6, groups=(None,))
    no_change = {"test_pearson_delta": math.nan, "test_mse_de": 0.9}
    figure = figure_test_metrics(model, {"no_change": no_change, "additive": make_summary(0.5, groups=(None,))})
    pearson_axes, mse_axes = figure.axes
    assert len(bars_by_label(pearson_axes)["no_change"]) == 0
    assert [text.get_text() for text in pearson_axes.texts].count("n/a") == 1
    assert [bar.get_height() for bar in bars_by_label(mse_axes)["no_change"]] == [0.9]
    assert [label.get_text() for label in pearson_axes.get_xticklabels()] == [subgroup_label(None)]


def test_a_comparison_that_is_not_applicable_is_na_in_the_picture_as_in_the_table():
    model = make_summary(0.6, groups=(None,))
    no_change = {"test_pearson_delta": 0.0, "test_mse_de": 0.9}  # a correlation with no change, reported as 0
    pearson_axes, mse_axes = figure_test_metrics(model, {"no_change": no_change}).axes
    assert len(bars_by_label(pearson_axes)["no_change"]) == 0
    texts = [text.get_text() for text in pearson_axes.texts]
    assert texts.count("n/a") == 1 and "0" not in texts
    assert [bar.get_height() for bar in bars_by_label(mse_axes)["no_change"]] == [0.9]


def test_a_subgroup_that_holds_every_test_condition_is_not_drawn_again():
    model = make_summary(0.6, groups=(None, "unseen_single"))
    figure = figure_test_metrics(model, {"linear": make_summary(0.3, groups=(None, "unseen_single"))})
    for axes in figure.axes:
        assert [label.get_text() for label in axes.get_xticklabels()] == [
            subgroup_label("all test conditions (single genes not seen in training)")
        ]
        assert [len(bars) for bars in bars_by_label(axes).values()] == [1, 1]
    two_groups = make_summary(0.6, groups=(None, "combo_seen1", "unseen_single"))
    axes = figure_test_metrics(two_groups, {}).axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == [
        subgroup_label(group) for group in (None, "combo_seen1", "unseen_single")
    ]


def test_baselines_that_predicted_the_same_share_one_bar():
    same = make_summary(0.3)
    baselines = {
        "no_change": make_summary(0.1),
        "mean_effect": same,
        "additive": dict(same),
        "linear": make_summary(0.4),
    }
    figure = figure_test_metrics(make_summary(0.6), baselines)
    for axes in figure.axes:
        assert list(bars_by_label(axes)) == ["GEARS", "no_change", "mean_effect = additive", "linear"]
    assert [text.get_text() for text in figure.legends[0].get_texts()] == [
        "GEARS",
        "no change baseline",
        "mean effect = additive baselines (equal here)",
        "linear baseline",
    ]


def test_bars_carry_their_values_as_labels():
    model = {"test_pearson_delta": 0.61234, "test_mse_de": 0.04321}
    figure = figure_test_metrics(model, {"additive": {"test_pearson_delta": 0.5, "test_mse_de": 0.05}})
    labels = {text.get_text() for axes in figure.axes for text in axes.texts}
    assert {"0.612", "0.0432", "0.5", "0.05"} <= labels


# ------------------------------------------------------------------ predictions
def test_predicted_points_are_the_change_over_control():
    examples = [make_example(), make_example("TBX2+ctrl", "unseen_single", genes=4, seed=2)]
    figure = figure_predictions(examples)
    assert len(figure.axes) == 2
    for axes, example in zip(figure.axes, examples):
        points = scatter_by_label(axes)
        assert points["GEARS"][:, 1] == pytest.approx(example["model"] - example["control"])
        assert points["additive"][:, 1] == pytest.approx(example["baselines"]["additive"] - example["control"])
        assert [label.get_text() for label in axes.get_xticklabels()] == example["genes"]
        assert example["condition"] in axes.get_title(loc="left") and "cells" in axes.get_title(loc="left")
        assert any(line.get_linestyle() == "--" and set(line.get_ydata()) == {0} for line in axes.lines)
    assert "one gene seen" in figure.axes[0].get_title(loc="left")
    assert len(figure.legends) == 1 and all(axes.get_legend() is None for axes in figure.axes)


def test_boxes_hold_each_cells_true_change_without_padding():
    example = make_example(genes=3, cells=20)
    changes = true_change_per_gene(example)
    assert [len(change) for change in changes] == [20, 20, 15]
    assert changes[0] == pytest.approx(example["truth_cells"][:, 0] - example["control"][0])
    axes = figure_predictions([example]).axes[0]
    assert len(axes.patches) == 3  # one box per gene
    assert all(np.isfinite(line.get_ydata()).all() for line in axes.lines)
    assert "(20 cells)" in axes.get_title(loc="left")


def test_no_additive_baseline_means_no_additive_marker():
    example = make_example()
    example["baselines"] = {}
    figure = figure_predictions([example])
    assert list(scatter_by_label(figure.axes[0])) == ["GEARS"]
    assert "additive" not in " ".join(text.get_text() for text in figure.legends[0].get_texts())


# ------------------------------------------------------------------ page
PICTURES = {"Training": "plots/training_curves.png", "Test metrics beside the baselines": "plots/test_metrics.png"}
SETTINGS = {
    "pert_data_path": "./data",
    "dataset_name": "norman",
    "split_config": {"split": "simulation", "seed": 1},
    "args": {"epochs": 2, "model_config": {"hidden_size": 64}, "gpu_ids": [0, 1], "wandb": False},
}


def report_with_test_results() -> dict:
    """GEARS beats every baseline on pearson_delta; on mse_de it beats additive on the combinations and loses on
    the singles: 6 test
    perturbations, 3 two-gene combinations with one gene seen and 3 unseen singles, each
    metric steady around its mean."""

    def values(pearson_delta, mse_de, combo_mse_de, single_mse_de):
        steps = [0.0, 0.004, -0.004, 0.002, -0.002, 0.0]
        return {
            "pearson_delta": [pearson_delta + step for step in steps],
            "mse_de": [combo_mse_de + step for step in steps[:3]] + [single_mse_de + step for step in steps[3:]],
        }

    report = report_from_values(
        values(0.61234567, 0.2, 0.1, 0.3),
        {
            "no_change": values(math.nan, 0.5, 0.4, 0.6),
            "mean_effect": values(0.3, 0.4, 0.3, 0.5),
            "additive": values(0.5, 0.15, 0.2, 0.1),
        },
        subgroups={"combo_seen1": [0, 1, 2], "unseen_single": [3, 4, 5]},
    )
    report["model"] = {
        key: value
        for key, value in report["model"].items()
        if "pearson_delta" not in key or key == "test_pearson_delta"
    }
    return {**report, "best_epoch": 2, "history": make_history(3), "world_size": 2, "model_path": "runs/norman"}


def verdict_rows(page: str) -> list[str]:
    """The table rows of the page whose first cell names a metric."""
    return re.findall(r"<tr><td><b>.*?</tr>", page)


def test_page_shows_every_metric_with_its_verdict(tmp_path):
    report = report_with_test_results()
    path = write_report_page(tmp_path / PAGE_FILE, SETTINGS, report, PICTURES)
    page = path.read_text(encoding="utf-8")
    assert path == tmp_path / "report.html"
    rows = verdict_rows(page)
    assert len(rows) == len(compare(report)) == 4
    pearson, mse, combo_mse, single_mse = rows
    assert "pearson_delta" in pearson and "higher is better" in pearson and 'class="win"' in pearson
    assert "beats all 2 baselines" in pearson and "0.6123" in pearson and "n/a" in pearson
    # GEARS is better on the combinations and worse on the singles: over 6 perturbations, no clear difference
    assert 'class="unknown">beats no_change, mean_effect; no clear difference from additive<' in mse
    assert "lower is better" in mse
    assert "beats all 3 baselines" in combo_mse and "loses to additive" in single_mse
    assert "Two-gene combinations, one gene seen in training</th>" in page
    assert "Single genes not seen in training</th>" in page
    assert "GEARS beats every baseline on 1 of 2 metrics" in page
    assert "correlation of predicted and true change over control" in page  # the metric's meaning
    assert "These intervals cover the test perturbations of one run: one model seed and one split seed" in page
    assert "+0.1123 [" in pearson and " 6/6" in pearson  # the paired difference with mean_effect, won by GEARS
    assert "gears-ddp train --config config.yaml --seeds 1 2 3 4 5" in page  # how to run replicates


def single_gene_screen_report() -> dict:
    """A report as the demo's screen of single genes gives it: every test condition is an
    unseen single, no change's correlations are reported as 0, and the additive baseline
    predicted what the mean-effect baseline did."""

    def values(pearson_delta, mse_de):
        steps = [0.0, 0.01, -0.01, 0.02, -0.02, 0.0]
        return {
            "pearson_delta": [pearson_delta + step for step in steps],
            "mse_de": [mse_de + s for s in steps],
            "mse": [mse_de / 10 + s / 10 for s in steps],
        }

    mean_effect = values(0.3594, 0.3593)
    report = report_from_values(
        values(-0.1424, 0.5923),
        {
            "no_change": {**values(0.0, 0.4766), "pearson_delta": [0.0] * 6},
            "mean_effect": mean_effect,
            "additive": dict(mean_effect),
            "linear": values(0.0682, 0.4891),
        },
        subgroups={"unseen_single": list(range(6))},
    )
    return {**report_with_test_results(), **report}


def test_on_a_screen_of_single_genes_the_page_says_each_thing_once(tmp_path):
    page = write_report_page(tmp_path / PAGE_FILE, SETTINGS, single_gene_screen_report(), PICTURES).read_text(
        encoding="utf-8"
    )
    rows = verdict_rows(page)
    assert len(rows) == 3  # pearson_delta, mse_de, mse: once, not again for the subgroup
    assert "Single genes not seen in training</th>" not in page
    assert "All test conditions (single genes not seen in training)</th>" in page
    assert (
        "<th>GEARS</th><th>no_change<br>difference [95% interval] won</th><th>mean_effect = additive<br>"
        "difference [95% interval] won</th><th>linear<br>difference [95% interval] won</th>"
    ) in page
    assert all(row.count('<td class="number') == 4 for row in rows[1:])  # GEARS and 3 columns of baselines
    assert (
        "mean_effect and additive predicted the same on this test set, so they are shown as one: the training "
        "conditions hold no two-gene combination" in page
    )
    assert "n/a" in rows[0] and ">0<" not in rows[0]


def test_page_links_pictures_and_shows_history_and_settings(tmp_path):
    page = write_report_page(tmp_path / PAGE_FILE, SETTINGS, report_with_test_results(), PICTURES).read_text(
        encoding="utf-8"
    )
    for title, relative in PICTURES.items():
        assert f'<img src="{relative}" alt="{title}">' in page
    assert "3 min 00 s" in page  # 3 epochs of 60 s
    assert "epoch 2 of 3" in page and "world size 2" in page
    assert page.count('<tr class="best">') == 1
    assert "<code>args.model_config.hidden_size</code></td><td>64<" in page
    assert "<code>args.gpu_ids</code></td><td>[0, 1]<" in page and "<td>false<" in page
    assert "<script" not in page and "http" not in page  # no JavaScript, nothing fetched


def test_page_escapes_names_from_the_data(tmp_path):
    settings = dict(SETTINGS, dataset_name="<script>alert(1)</script>")
    report = dict(report_with_test_results(), model_path="runs/<b>x</b>")
    page = write_report_page(tmp_path / PAGE_FILE, settings, report, {"<script>": "plots/a&b.png"}).read_text(
        encoding="utf-8"
    )
    assert "<script" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and 'src="plots/a&amp;b.png"' in page


def test_page_without_test_set_says_so_and_has_no_verdicts(tmp_path):
    report = {"best_epoch": 1, "history": make_history(1), "world_size": 1}
    path = write_report_page(tmp_path / PAGE_FILE, {}, report, {"Training": "plots/training_curves.png"})
    page = path.read_text(encoding="utf-8")
    assert "no test set" in page.lower()
    assert verdict_rows(page) == [] and "<th>verdict</th>" not in page
    assert "not recorded" in page  # no settings


@pytest.mark.parametrize(
    "value, text",
    [
        (0.123456, "0.1235"),
        (12.0, "12"),
        (3, "3"),
        (None, "n/a"),
        (math.nan, "n/a"),
        (123456.7, "123,457"),
        (0.000123456, "0.0001235"),
    ],
)
def test_numbers_have_four_significant_digits(value, text):
    assert format_number(value) == text


def test_a_run_without_report_pictures_writes_its_page_and_report_but_no_picture(data_folder, tmp_path):
    """``args.report_pictures: false``: the run report's page and report.json as always, the
    page saying why it shows no picture, and no picture drawn (nor the plots folder made)."""
    import json

    import yaml

    from gears_ddp import train_multi_gpu
    from gears_ddp.report.page import PICTURES_NOT_ASKED

    folder = tmp_path / "run"
    args = {"epochs": 1, "batch_size": 16, "cpu_processes": 1, "model_config": {"hidden_size": 8}}
    split = {"split": "simulation", "seed": 1}
    report = train_multi_gpu(data_folder, "toy", split, {**args, "save_path": str(folder), "report_pictures": False})
    assert not (folder / "plots").exists()
    page = (folder / PAGE_FILE).read_text(encoding="utf-8")
    assert PICTURES_NOT_ASKED in page and "<img" not in page
    assert "pearson_delta" in page and "Did the model learn?" in page  # the verdicts and the checks stay
    saved = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert saved["model"] == report["model"] and "report" in saved["timing"]
    assert yaml.safe_load((folder / "config.yaml").read_text())["args"]["report_pictures"] is False
    drawn = tmp_path / "drawn"  # the same run with the default draws them, and its page shows them
    train_multi_gpu(data_folder, "toy", split, {**args, "save_path": str(drawn)})
    assert (drawn / "plots" / "training_curves.png").stat().st_size > 0
    assert PICTURES_NOT_ASKED not in (drawn / PAGE_FILE).read_text(encoding="utf-8")
