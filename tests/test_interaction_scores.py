"""Tests of ``gears_ddp.interactions.scores``: a batch of pairs gets the published GEARS scores
(``get_GI_params``), scikit-learn's Theil-Sen coefficients and dcor's distance correlations."""

import math
import warnings

import dcor
import numpy as np
import pytest
import sklearn.linear_model._theil_sen as sklearn_theil_sen
import torch
from reference_package import import_reference
from sklearn.linear_model import TheilSenRegressor

from gears_ddp.interactions import scores
from gears_ddp.interactions.scores import (
    GI_SCORE_NAMES,
    _subset_solutions,
    _subsets_tensor,
    cdist_distances,
    coordinate_distances,
    distance_correlation,
    interaction_scores,
    spatial_median,
    theil_sen_coefficients,
    theil_sen_subsets,
)

# Scores derived from the Theil-Sen coefficients are held to the coefficients' tolerance.
COEFFICIENT_SCORES = {"c1", "c2", "mag", "corr_fit", "dominance"}


def _changes(seed: int, n_pairs: int, n_genes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pairs x genes) changes of two singles and their double, pairs of varied kinds
    (additive, synergistic, one single dominating), rounded to float32 as predictions are."""
    rng = np.random.default_rng(seed)
    first = rng.normal(0.0, 1.0, (n_pairs, n_genes))
    second = rng.normal(0.0, 1.0, (n_pairs, n_genes))
    weights = rng.uniform(0.1, 2.0, (n_pairs, 2, 1))
    double = (
        weights[:, 0] * first + weights[:, 1] * second + 0.4 * first * second + rng.normal(0.0, 0.2, (n_pairs, n_genes))
    )
    return tuple(values.astype(np.float32).astype(np.float64) for values in (first, second, double))


def _degenerate(first: np.ndarray, second: np.ndarray, double: np.ndarray) -> None:
    """Make rows exactly singular the ways predictions can: genes with no change in either
    single, genes where both singles change equally, and runs of tied values."""
    n = first.shape[-1]
    first[..., : n // 10] = 0.0
    second[..., : n // 10] = 0.0
    second[..., n // 10 : n // 5] = first[..., n // 10 : n // 5]
    double[..., n // 5 : n // 4] = 1.0


def _published_scores(first, second, double) -> dict:
    utils = import_reference("gears.utils")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return utils.get_GI_params({"A": first, "B": second, "A_B": double}, ["A", "B"])


def _assert_scores_equal(got: dict, expected: dict, where: str) -> None:
    for name in GI_SCORE_NAMES:
        value, reference = float(got[name]), float(expected[name])
        if math.isnan(reference) or math.isinf(reference):
            assert value == reference or (math.isnan(value) and math.isnan(reference)), (where, name)
        else:
            tolerance = 1e-6 if name in COEFFICIENT_SCORES else 1e-9
            assert abs(value - reference) <= tolerance, (where, name, value, reference)


@pytest.mark.parametrize("degenerate", [False, True])
def test_batch_equals_published_get_gi_params(device, degenerate):
    first, second, double = _changes(0, n_pairs=3, n_genes=300)
    if degenerate:
        _degenerate(first, second, double)
    got = interaction_scores(first, second, double, device=device)
    assert set(got) == set(GI_SCORE_NAMES)
    for pair in range(3):
        expected = _published_scores(first[pair], second[pair], double[pair])
        _assert_scores_equal({name: got[name][pair] for name in got}, expected, f"pair {pair}")


@pytest.mark.slow
def test_batch_equals_published_get_gi_params_with_sampled_subsets(device):
    """460 genes have 105,570 pairs: Theil-Sen draws its 100,000 subsets at random."""
    first, second, double = _changes(1, n_pairs=2, n_genes=460)
    _degenerate(first[1], second[1], double[1])
    got = interaction_scores(first, second, double, device=device)
    for pair in range(2):
        expected = _published_scores(first[pair], second[pair], double[pair])
        _assert_scores_equal({name: got[name][pair] for name in got}, expected, f"pair {pair}")


@pytest.mark.parametrize("case", ["linear", "double zero", "unchanged genes", "constant first", "integers"])
def test_degenerate_inputs_give_published_values(case):
    """Exact fits, zero and constant changes and heavy ties, including the NaN and infinite
    scores they give (dominance with a zero coefficient, corr_fit of a constant)."""
    rng = np.random.default_rng(5)
    first, second = rng.normal(size=120), rng.normal(size=120)
    double = first + 2.0 * second
    if case == "double zero":
        double = np.zeros(120)
    elif case == "unchanged genes":
        double += rng.normal(0.0, 0.3, 120)
        unchanged = rng.random(120) < 0.7
        first[unchanged], second[unchanged], double[unchanged] = 0.0, 0.0, 0.0
    elif case == "constant first":
        first = np.ones(120)
    elif case == "integers":
        first, second, double = (rng.integers(-2, 3, 120).astype(float) for _ in range(3))
    got = interaction_scores(first[None], second[None], double[None])
    _assert_scores_equal({name: got[name][0] for name in got}, _published_scores(first, second, double), case)


@pytest.mark.parametrize("n_genes", [2, 3, 447, 448])
def test_theil_sen_subsets_are_scikit_learns(n_genes, monkeypatch):
    """All pairs of genes, in order, up to 447 genes (99,681 pairs); 100,000 drawn from
    ``RandomState(1000)`` from 448 genes (100,128 pairs) on."""
    seen = []
    solve = sklearn_theil_sen._lstsq

    def recording(X, y, indices, fit_intercept):
        seen.append(np.asarray(indices))
        return solve(X, y, indices, fit_intercept)

    monkeypatch.setattr(sklearn_theil_sen, "_lstsq", recording)
    rng = np.random.default_rng(n_genes)
    TheilSenRegressor(fit_intercept=False, max_subpopulation=1e5, max_iter=1000, random_state=1000).fit(
        rng.normal(size=(n_genes, 2)), rng.normal(size=n_genes)
    )
    expected = np.concatenate(seen)
    subsets = theil_sen_subsets(n_genes)
    assert subsets.shape == (min(math.comb(n_genes, 2), 100_000), 2)
    np.testing.assert_array_equal(subsets, expected)


def _sklearn_coefficients(first, second, double) -> np.ndarray:
    regression = TheilSenRegressor(fit_intercept=False, max_subpopulation=1e5, max_iter=1000, random_state=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return regression.fit(np.column_stack([first, second]), double).coef_


SAMPLED = pytest.mark.slow  # 448 genes and more: scikit-learn draws its subsets, seconds per fit


@pytest.mark.parametrize(
    "n_genes, degenerate",
    [
        (3, False),
        (25, False),
        (25, True),
        (447, True),
        pytest.param(448, False, marks=SAMPLED),
        pytest.param(448, True, marks=SAMPLED),
    ],
)
def test_theil_sen_matches_scikit_learn(n_genes, degenerate, device):
    """Up to 447 genes scikit-learn fits all pairs of genes, from 448 on 100,000 drawn ones."""
    first, second, double = _changes(n_genes, n_pairs=2, n_genes=n_genes)
    if degenerate:
        _degenerate(first, second, double)
    got = theil_sen_coefficients(*(torch.tensor(values, device=device) for values in (first, second, double)))
    expected = np.stack([_sklearn_coefficients(first[p], second[p], double[p]) for p in range(2)])
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_theil_sen_matches_scikit_learn_on_norman_gene_count():
    first, second, double = _changes(11, n_pairs=1, n_genes=5045)
    got = theil_sen_coefficients(*(torch.tensor(values) for values in (first, second, double)))
    np.testing.assert_allclose(got[0].numpy(), _sklearn_coefficients(first[0], second[0], double[0]), rtol=0, atol=1e-6)


def _median_clouds(n_points: int) -> np.ndarray:
    """(rows x 2 x points) clouds whose spatial medians the Weiszfeld iterations are held to:
    the least-squares solutions of a real-sized Theil-Sen fit (heavy tails), a tight cloud,
    a cloud whose points half coincide (the damped step), one point repeated (all points
    coincide) and a symmetric cloud whose unit vectors cancel at its mean (the degenerate
    step's fixed answer)."""
    rng = np.random.default_rng(7)
    first, second, double = (torch.tensor(values) for values in _changes(8, n_pairs=1, n_genes=400))
    subsets = torch.from_numpy(theil_sen_subsets(400).copy())[:n_points]
    solutions = _subset_solutions(torch.stack((first, second, double), dim=1), subsets)[0].numpy()
    tight = rng.normal(0.0, 1e-4, (2, n_points)) + np.array([[0.3], [-1.2]])
    coinciding = rng.standard_cauchy((2, n_points))
    coinciding[:, : n_points // 2] = np.array([[0.25], [0.5]])
    repeated = np.tile(np.array([[1.5], [-2.0]]), (1, n_points))
    symmetric = np.concatenate([np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]])] * (n_points // 4), axis=1)
    return np.stack([solutions, tight, coinciding, repeated, symmetric[:, :n_points]])


def test_spatial_median_is_scikit_learns_for_every_row_at_once(device):
    """Every row steps together, each stops at its own step: each equals scikit-learn's
    ``_spatial_median`` of that row alone (its iterations contract, so the summation orders'
    rounding stays far below the tolerance), the damped and degenerate steps included."""
    clouds = _median_clouds(79_800)
    got = spatial_median(torch.tensor(clouds, device=device)).cpu().numpy()
    for row, cloud in enumerate(clouds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scikit-learn warns when max_iter is reached
            expected = sklearn_theil_sen._spatial_median(cloud.T, max_iter=1000, tol=1e-3)[1]
        np.testing.assert_allclose(got[row], expected, rtol=0, atol=1e-9, err_msg=f"row {row}")


def _dcor_inputs(n_genes: int, seed: int, ties: bool):
    rng = np.random.default_rng(seed)
    first, second = rng.normal(size=(2, 3, n_genes))
    double = np.sin(2.0 * first) + second * first + rng.normal(0.0, 0.3, (3, n_genes))
    if ties:
        first, second, double = (np.round(values, 1) for values in (first, second, double))
        first[0] = 0.5  # a constant row: distance correlation 0
    return first, second, double


@pytest.mark.parametrize("n_genes", [3, 4, 5, 60, 2000])
@pytest.mark.parametrize("ties", [False, True])
def test_distance_correlations_equal_dcor(n_genes, ties, device):
    """1-D (dcor's AVL method above 3 samples) and two-column (its naive method) cases."""
    first, second, double = _dcor_inputs(n_genes, n_genes, ties)
    tensors = [torch.tensor(values, device=device) for values in (first, second, double)]
    one_dimensional = distance_correlation(tensors[0], tensors[2]).cpu().numpy()
    planar = distance_correlation(torch.stack(tensors[:2], dim=-1), tensors[2]).cpu().numpy()
    for row in range(3):
        assert abs(one_dimensional[row] - dcor.distance_correlation(first[row], double[row])) <= 1e-9
        singles = np.column_stack([first[row], second[row]])
        assert abs(planar[row] - dcor.distance_correlation(singles, double[row])) <= 1e-9


@pytest.mark.parametrize("distances", ["cdist", "coordinates"])
def test_planar_distance_correlation_is_blocked_exactly(distances, monkeypatch):
    """The O(genes^2) distances are summed block by block; any block size gives dcor's value,
    with the distances of a CPU (``torch.cdist``) and of a GPU (from the coordinates)."""
    if distances == "coordinates":
        monkeypatch.setattr(scores, "cdist_distances", coordinate_distances)
    first, second, double = (torch.tensor(values) for values in _dcor_inputs(700, 3, ties=False))
    singles = torch.stack((first, second), dim=-1)
    expected = [dcor.distance_correlation(singles[row].numpy(), double[row].numpy()) for row in range(3)]
    for distances_per_block in (3 * 700 * 13, 3 * 700 * 160, 10**8):  # 13, 160 and all 700 rows
        got = distance_correlation(singles, double, distances_per_block).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)


def test_distances_from_coordinates_are_torch_cdists_to_the_last_bit():
    """A GPU's planar distances come from the coordinates' differences (``torch.cdist``'s
    CUDA kernel spends a block of threads on each distance): on a CPU they equal
    ``torch.cdist``'s to the last bit (its vectorised CPU kernel rounds some sums of squares
    the other way: 34 of 4,800 here), each row of a batch against its own points, including
    equal points (distance 0) and coordinates of very different sizes."""
    rng = np.random.default_rng(5)
    points = rng.normal(0.0, 1.0, (3, 40, 2)) * rng.choice([1e-6, 1.0, 1e6], size=(3, 40, 1))
    points[1, 7] = points[1, 3]
    points = torch.tensor(points.astype(np.float32).astype(np.float64))
    for start, stop in ((0, 40), (13, 29), (39, 40)):
        got = coordinate_distances(points[:, start:stop], points[:, :stop])
        assert got.shape == (3, stop - start, stop)
        torch.testing.assert_close(got, cdist_distances(points[:, start:stop], points[:, :stop]), rtol=2.3e-16, atol=0)
    assert float(coordinate_distances(points[1:2, 7:8], points[1:2, 3:4])) == 0.0


def test_batch_equals_pairs_one_at_a_time(device):
    first, second, double = _changes(4, n_pairs=5, n_genes=250)
    _degenerate(first[2], second[2], double[2])
    together = interaction_scores(first, second, double, device=device, batch_size=5)
    for pair in range(5):
        alone = interaction_scores(
            first[pair : pair + 1], second[pair : pair + 1], double[pair : pair + 1], device=device, batch_size=1
        )
        for name in GI_SCORE_NAMES:
            assert together[name][pair] == pytest.approx(alone[name][0], rel=1e-12, abs=1e-12), (pair, name)


def test_tensor_inputs_stay_on_their_device(device):
    first, second, double = (torch.tensor(values, device=device) for values in _changes(6, 2, 40))
    from_tensors = interaction_scores(first, second, double)
    from_arrays = interaction_scores(first.cpu().numpy(), second.cpu().numpy(), double.cpu().numpy(), device=device)
    for name in GI_SCORE_NAMES:
        np.testing.assert_allclose(from_tensors[name], from_arrays[name], rtol=1e-12, atol=1e-12)


def test_no_pairs_give_empty_scores():
    scores = interaction_scores(np.empty((0, 10)), np.empty((0, 10)), np.empty((0, 10)))
    assert all(values.shape == (0,) for values in scores.values())


@pytest.mark.parametrize(
    "first, second, double, match",
    [
        (np.ones(4), np.ones(4), np.ones(4), r"`first` must be 2-D \(pairs x genes\), got shape \(4,\)"),
        (np.ones((2, 5)), np.ones((2, 4)), np.ones((2, 5)), r"same shape.*\(2, 5\), \(2, 4\) and \(2, 5\)"),
        (np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)), "at least 3 genes, got 2"),
        (np.ones((1, 4)), np.array([[1.0, np.nan, 0.0, 1.0]]), np.ones((1, 4)), "`second` contains NaN"),
        ([["a", "b", "c"]], np.ones((1, 3)), np.ones((1, 3)), "`first` must be numeric"),
    ],
)
def test_invalid_inputs_raise(first, second, double, match):
    with pytest.raises(ValueError, match=match):
        interaction_scores(first, second, double)


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        interaction_scores(np.ones((1, 5)), np.ones((1, 5)), np.ones((1, 5)), batch_size=0)


def test_subsets_drawn_elsewhere_give_the_same_scores_and_must_fit_the_gene_count():
    """A parent process draws the subsets once and passes them to its workers."""
    first, second, double = _changes(3, n_pairs=2, n_genes=60)
    passed = torch.from_numpy(theil_sen_subsets(60).copy())
    drawn_here = interaction_scores(first, second, double)
    given = interaction_scores(first, second, double, subsets=passed)
    as_array = interaction_scores(first, second, double, subsets=theil_sen_subsets(60))
    assert all(np.array_equal(as_array[name], drawn_here[name], equal_nan=True) for name in GI_SCORE_NAMES)
    tensor = _subsets_tensor(60, theil_sen_subsets(60), torch.device("cpu"))
    tensor[0] = 7  # the cached array is read-only: the tensor is a copy, not a view torch warns about
    assert theil_sen_subsets(60)[0].tolist() == [0, 1]
    assert all(np.array_equal(given[name], drawn_here[name], equal_nan=True) for name in GI_SCORE_NAMES)
    with pytest.raises(ValueError, match=r"subsets of shape \(1711, 2\) are not those of 60 genes \(1770 x 2"):
        interaction_scores(first, second, double, subsets=theil_sen_subsets(59))
    with pytest.raises(ValueError, match="indices below 60"):
        interaction_scores(first, second, double, subsets=theil_sen_subsets(61)[:1770])
