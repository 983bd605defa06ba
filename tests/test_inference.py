"""Tests of ``gears_ddp.inference``: GI scores (parity with the published GEARS), gene lists and
the perturbation figure."""

import math

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from reference_package import import_reference

from gears_ddp.inference.figures import plot_perturbation_figure
from gears_ddp.interactions.calls import genetic_interaction_scores, read_gene_list

GI_KEYS = {
    "c1",
    "c2",
    "mag",
    "dcor",
    "dcor_singles",
    "dcor_first",
    "dcor_second",
    "corr_fit",
    "dominance",
    "eq_contr",
}


def _changes(seed: int, kind: str, n_genes: int = 200):
    """Three change-from-control vectors: two singles and a double of the given kind."""
    rng = np.random.default_rng(seed)
    first = rng.normal(0.0, 1.0, n_genes)
    second = rng.normal(0.0, 1.0, n_genes)
    noise = rng.normal(0.0, 0.1, n_genes)
    if kind == "additive":
        double = first + second + noise
    elif kind == "synergy":
        double = 1.8 * first + 1.4 * second + 0.5 * first * second + noise
    else:  # "buffering": one single dominates, the other is dampened
        double = 0.9 * first + 0.2 * second + noise
    return first, second, double


@pytest.mark.parametrize("kind", ["additive", "synergy", "buffering"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_match_published_get_coeffs(seed, kind):
    utils = import_reference("gears.utils")
    first, second, double = _changes(seed, kind)
    expected = utils.get_coeffs(np.array([first, second]).T, first, second, double)
    got = genetic_interaction_scores(first, second, double)
    assert set(got) == GI_KEYS
    for key in GI_KEYS:
        assert type(got[key]) is float, key
        assert math.isclose(got[key], float(expected[key]), rel_tol=1e-9), key


@pytest.mark.slow
def test_scores_match_published_get_gi_params_with_subsampling():
    """Enough genes (460 -> 105,570 pairs) that Theil-Sen draws 1e5 of its pairs at random."""
    utils = import_reference("gears.utils")
    first, second, double = _changes(7, "synergy", n_genes=460)
    preds = {"A": first, "B": second, "A_B": double}
    expected = utils.get_GI_params(preds, ["A", "B"])
    got = genetic_interaction_scores(first, second, double)
    for key in GI_KEYS:
        assert math.isclose(got[key], float(expected[key]), rel_tol=1e-9), key


def test_exact_linear_combination():
    rng = np.random.default_rng(3)
    first, second = rng.normal(size=50), rng.normal(size=50)
    scores = genetic_interaction_scores(first, second, 1.0 * first + 2.0 * second)
    assert scores["c1"] == pytest.approx(1.0, abs=1e-6)
    assert scores["c2"] == pytest.approx(2.0, abs=1e-6)
    assert scores["mag"] == pytest.approx(math.sqrt(5.0), abs=1e-6)
    assert scores["corr_fit"] == pytest.approx(1.0, abs=1e-9)
    assert scores["dominance"] == pytest.approx(math.log10(2.0), abs=1e-6)
    assert 0.0 < scores["eq_contr"] <= 1.0


def test_accepts_lists_and_integer_arrays():
    first, second = [1, 0, 2, -1, 3], [0, 1, -1, 2, 1]
    double = np.array(first) + 3 * np.array(second)
    scores = genetic_interaction_scores(first, second, double)
    assert scores["c1"] == pytest.approx(1.0, abs=1e-6)
    assert scores["c2"] == pytest.approx(3.0, abs=1e-6)


@pytest.mark.parametrize(
    "first, second, double, match",
    [
        (np.ones((4, 2)), np.ones(4), np.ones(4), r"`first` must be 1-D.*\(4, 2\)"),
        (np.ones(5), np.ones(4), np.ones(5), r"same shape.*\(5,\), \(4,\) and \(5,\)"),
        (np.ones(2), np.ones(2), np.ones(2), "at least 3 genes, got 2"),
        (np.ones(4), np.array([1.0, np.nan, 0.0, 1.0]), np.ones(4), "`second` contains NaN"),
        (np.ones(4), np.ones(4), np.array([1.0, np.inf, 0.0, 1.0]), "`double` contains NaN"),
        (["a", "b", "c"], np.ones(3), np.ones(3), "`first` must be numeric"),
    ],
)
def test_invalid_inputs_raise(first, second, double, match):
    with pytest.raises(ValueError, match=match):
        genetic_interaction_scores(first, second, double)


def test_read_gene_list_npy(tmp_path):
    object_file = tmp_path / "genes_with_hi_mean.npy"
    np.save(object_file, np.array(["TP53", "MYC", "KLF1"], dtype=object), allow_pickle=True)
    assert read_gene_list(object_file) == ["TP53", "MYC", "KLF1"]
    unicode_file = tmp_path / "unicode.npy"
    np.save(unicode_file, np.array(["CEBPA", "SPI1"]))
    assert read_gene_list(str(unicode_file)) == ["CEBPA", "SPI1"]


class _RunsCode:
    """Unpickled, it calls ``os.system``: what a hostile .npy file may hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_read_gene_list_refuses_an_npy_file_that_would_run_code(tmp_path):
    """An object array's values are stored as a pickle, which ``np.load(allow_pickle=True)``
    runs; the gene list is read admitting plain data only."""
    hostile = tmp_path / "genes_with_hi_mean.npy"
    marker = tmp_path / "ran"
    array = np.empty(2, dtype=object)
    array[:] = ["TP53", _RunsCode(marker)]
    np.save(hostile, array, allow_pickle=True)
    with pytest.raises(
        ValueError,
        match=r"refused to read gene list file .*genes_with_hi_mean.npy: its array asks to "
        r"call (posix|os|nt)\.system",
    ):
        read_gene_list(hostile)
    assert not marker.exists()
    numbers = tmp_path / "numbers.npy"
    np.save(numbers, np.array([1, "MYC"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"numbers.npy: it holds values that are not gene names \(int\)"):
        read_gene_list(numbers)


def test_read_gene_list_text(tmp_path):
    path = tmp_path / "genes.txt"
    path.write_text("TP53\n  MYC \n\nKLF1\n", encoding="utf-8")
    assert read_gene_list(path) == ["TP53", "MYC", "KLF1"]


def test_read_gene_list_errors(tmp_path):
    missing = tmp_path / "nowhere.npy"
    with pytest.raises(FileNotFoundError, match="nowhere.npy"):
        read_gene_list(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt contains no gene names"):
        read_gene_list(empty)
    corrupt = tmp_path / "corrupt.npy"
    corrupt.write_bytes(b"not a numpy file")
    with pytest.raises(ValueError, match="cannot read gene list file .*corrupt.npy"):
        read_gene_list(corrupt)


def _red_points(axes) -> int:
    """Number of scatter points drawn in red on the axes."""
    red = np.array(to_rgba("red"))
    count = 0
    for collection in axes.collections:
        colors = collection.get_facecolors()
        if len(colors) and np.allclose(colors, red):
            count += len(collection.get_offsets())
    return count


def test_plot_writes_png_and_draws_every_gene(tmp_path):
    import matplotlib.pyplot as plt

    open_figures = plt.get_fignums()
    rng = np.random.default_rng(0)
    genes = [f"GENE{i}" for i in range(20)]
    save_file = tmp_path / "plots" / "KLF1+MAP2K6.png"
    figure = plot_perturbation_figure(rng.normal(size=(30, 20)), rng.normal(size=20), genes, "KLF1+MAP2K6", save_file)

    assert save_file.is_file()
    content = save_file.read_bytes()
    assert content.startswith(b"\x89PNG")
    assert len(content) > 5000
    assert isinstance(figure, Figure)
    assert plt.get_fignums() == open_figures  # pyplot's global state untouched
    (axes,) = figure.axes
    assert [label.get_text() for label in axes.get_xticklabels()] == genes
    assert axes.get_title() == "KLF1+MAP2K6"
    assert axes.get_ylabel() == "Change in gene expression over control"
    assert _red_points(axes) == 20


def test_plot_one_gene_one_cell_without_saving(tmp_path):
    figure = plot_perturbation_figure(np.array([[0.5]]), np.array([0.3]), ["TP53"], "TP53+ctrl")
    (axes,) = figure.axes
    assert [label.get_text() for label in axes.get_xticklabels()] == ["TP53"]
    assert axes.get_title() == "TP53+ctrl"
    assert _red_points(axes) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "truth_shape, pred_shape, n_names, match",
    [
        ((5, 3), (2,), 3, r"truth_change \(5, 3\).*predicted_change \(2,\)"),
        ((5, 3), (3,), 2, r"2 gene names \(expected 3\)"),
        ((3,), (3,), 3, r"\(cells x genes\) array, got shape \(3,\)"),
        ((0, 3), (3,), 3, r"got shape \(0, 3\)"),
    ],
)
def test_plot_rejects_mismatched_shapes(truth_shape, pred_shape, n_names, match):
    with pytest.raises(ValueError, match=match):
        plot_perturbation_figure(np.zeros(truth_shape), np.zeros(pred_shape), [f"G{i}" for i in range(n_names)], "A+B")
