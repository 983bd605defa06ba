"""Genetic-interaction (GI) scores of many two-gene combinations at once, exactly as the
published GEARS scores one combination (its ``get_GI_params``), on CPU or GPU.

The published scores fit the double's change from control as ``c1 * first + c2 * second``
with scikit-learn's ``TheilSenRegressor`` and take four distance correlations with
``dcor``, pair after pair in Python loops. Here a batch of pairs (rows of ``(pairs,
genes)`` tensors) is scored together with the same arithmetic: ``theil_sen_subsets`` (the
gene pairs Theil-Sen takes the median of, drawn once as scikit-learn draws them),
``theil_sen_coefficients`` and ``spatial_median`` (scikit-learn's solves and Weiszfeld
iterations), ``distance_correlation`` (dcor's biased distance correlation), and
``interaction_scores``, every score ``GI_predict`` returns for a batch of pairs. Results
equal the published ones to rounding, but in one degenerate case (every subset's solution
on one line), where they can differ by up to about the iterations' tolerance.

docs/screens.md ("How the scores are computed, many pairs at once") explains each step, its
cost and that exception.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.linalg.lapack import get_lapack_funcs

MIN_GI_GENES = 3
GI_SCORE_NAMES = (
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
)
# What each score is and how to read it; A, B and AB are the changes over control of the two
# singles and the double, one value per gene (docs/screens.md has a worked example).
GI_SCORE_MEANINGS = {
    "c1": "weight of A in the Theil-Sen fit AB ~ c1*A + c2*B over the genes (no intercept; a median over many "
    "two-gene fits, so a few extreme genes do not move it). 1: A's change enters the double as it is; above "
    "1 amplified, below 1 damped, near 0 absent.",
    "c2": "the same weight for B.",
    "mag": "sqrt(c1^2 + c2^2): how strong the double is against its singles. The plain sum AB = A + B has mag "
    "1.41; for two singles of the same size and unrelated changes, mag 1 is a double as strong as one "
    "single. The published analysis reads it against 1: synergy above, suppression below.",
    "dcor": "distance correlation of the double with the two singles together (0 to 1; 0: unrelated, 1: the "
    "double is a function of the singles). High: the double does what the singles already do.",
    "dcor_singles": "distance correlation of A with B: how alike the two singles act (1: the same change).",
    "dcor_first": "distance correlation of A with the double: how much of the double A alone shows.",
    "dcor_second": "distance correlation of B with the double.",
    "corr_fit": "Pearson correlation of the fit c1*A + c2*B with the double over the genes: how well the singles "
    "combined explain the double (1: fully; low: the double does something new).",
    "dominance": "|log10(c1 / c2)|: 0 when A and B weigh the same in the double, 1 when one weighs 10 times the "
    "other; high: one single dominates.",
    "eq_contr": "min(dcor_first, dcor_second) / max(dcor_first, dcor_second): 1 when the double resembles both "
    "singles equally, near 0 when it resembles one only.",
}

# The published settings of scikit-learn's TheilSenRegressor (gears.utils.get_coeffs); tol
# and the rank cut-off are scikit-learn's and LAPACK's defaults.
THEIL_SEN_MAX_SUBSETS = 100_000
THEIL_SEN_SEED = 1000
SPATIAL_MEDIAN_MAX_ITER = 1000
SPATIAL_MEDIAN_TOL = 1.0e-3
_EPSILON = float(np.finfo(np.float64).eps)
# 2 x 2 systems with |det| at or below this times their squared Frobenius norm (a ratio of
# singular values below about 2e-10) are solved by LAPACK itself: see _subset_solutions.
SINGULAR_SUSPECT = 2.0**20 * _EPSILON

# Pairs scored together and pairwise distances held at once: on CPU small enough to stay in
# cache, on GPU large enough to fill the device.
CPU_BATCH_SIZE = 2
GPU_BATCH_SIZE = 256
CPU_DISTANCES_PER_BLOCK = 1 << 18
GPU_DISTANCES_PER_BLOCK = 1 << 26


@functools.lru_cache(maxsize=4)
def theil_sen_subsets(n_genes: int) -> np.ndarray:
    """The (subsets x 2) gene indices of the pairs of genes whose least-squares fits the
    published Theil-Sen regression takes the spatial median of, in scikit-learn's order.

    With two coefficients and no intercept each subset is two genes. When the number of
    gene pairs is at most 100,000 all of them are used, in ``itertools.combinations``
    order; otherwise 100,000 are drawn with ``RandomState(1000).choice(n_genes, 2,
    replace=False)``, which shuffles all genes per draw. That costs seconds for thousands
    of genes, hence the cache (the array is read-only).
    """
    if n_genes < 2:
        raise ValueError(f"Theil-Sen subsets need at least 2 genes, got {n_genes}")
    if math.comb(n_genes, 2) <= THEIL_SEN_MAX_SUBSETS:
        subsets = np.stack(np.triu_indices(n_genes, 1), axis=1)
    else:
        # RandomState.choice(n, 2, replace=False) is permutation(n)[:2], which shuffles
        # arange(n) in place: the same draws, without allocating a permutation each time.
        generator = np.random.RandomState(THEIL_SEN_SEED)
        genes = np.arange(n_genes)
        shuffled = np.empty_like(genes)
        subsets = np.empty((THEIL_SEN_MAX_SUBSETS, 2), dtype=np.int64)
        for row in subsets:
            shuffled[:] = genes
            generator.shuffle(shuffled)
            row[:] = shuffled[:2]
    subsets = subsets.astype(np.int64, copy=False)
    subsets.flags.writeable = False
    return subsets


def _subset_solutions(changes: torch.Tensor, subsets: torch.Tensor) -> torch.Tensor:
    """Least-squares coefficients (pairs x 2 x subsets) of ``double ~ [first, second]`` on each
    two-gene subset, ``changes`` being (pairs x 3 x genes) ``[first, second, double]``, as
    LAPACK ``gelss`` (scikit-learn's solver) returns them.

    A well-conditioned 2 x 2 system is solved in closed form (Cramer's rule), which agrees
    with ``gelss`` to rounding. ``gelss`` treats a singular value at or below machine
    epsilon times the largest as zero and returns the minimum-norm solution; for a
    singular system without a zero row or column the smaller singular value it computes is
    rounding noise, so whether its answer is the minimum-norm one or a huge one cannot be
    known without running it. Systems near singular (``|det| <= SINGULAR_SUSPECT *
    ||A||_F**2``; rare outside degenerate data) are therefore handed to ``gelss`` itself
    (``_gelss_solutions``), except those with a zero row or column, where its smaller
    singular value is exactly 0 and the answer is the minimum-norm ``A^T y / ||A||_F**2``
    (0 for the zero matrix)."""
    pairs, _, genes = changes.shape
    # (pairs x 3 x 2 x subsets), contiguous along the subsets: the passes below, and the
    # spatial median's over the solutions, run along them
    genes_of_subsets = subsets.t().reshape(1, -1).expand(pairs * 3, -1)
    picked = changes.reshape(pairs * 3, genes).gather(1, genes_of_subsets).view(pairs, 3, 2, -1)
    first, second, double = picked.unbind(dim=1)
    a11, a21 = first.unbind(dim=1)
    a12, a22 = second.unbind(dim=1)
    y1, y2 = double.unbind(dim=1)
    det = torch.addcmul(a11 * a22, a12, a21, value=-1.0)
    solutions = torch.empty_like(first)
    torch.mul(a22, y1, out=solutions[:, 0]).addcmul_(a12, y2, value=-1.0)
    torch.mul(a11, y2, out=solutions[:, 1]).addcmul_(a21, y1, value=-1.0)
    solutions /= det.unsqueeze(1)
    frob = (first.square() + second.square()).sum(dim=1)
    suspect = det.abs() <= SINGULAR_SUSPECT * frob
    if not bool(suspect.any()):
        return solutions
    pair, subset = suspect.nonzero(as_tuple=True)
    system = torch.stack([value[pair, subset] for value in (a11, a12, a21, a22, y1, y2)], dim=1)
    b11, b12, b21, b22, c1, c2 = system.unbind(dim=1)
    zero_line = (
        ((b11 == 0) & (b12 == 0)) | ((b21 == 0) & (b22 == 0)) | ((b11 == 0) & (b21 == 0)) | ((b12 == 0) & (b22 == 0))
    )
    norm_sq = frob[pair, subset]
    scale = torch.where(norm_sq > 0, 1.0 / torch.where(norm_sq > 0, norm_sq, 1.0), 0.0)
    answer = torch.stack(((b11 * c1 + b21 * c2) * scale, (b12 * c1 + b22 * c2) * scale), dim=1)
    noisy = (~zero_line).nonzero(as_tuple=True)[0]
    if len(noisy):
        answer[noisy] = torch.from_numpy(_gelss_solutions(system[noisy].cpu().numpy())).to(answer.device)
    solutions[pair, :, subset] = answer
    return solutions


def _gelss_solutions(systems: np.ndarray) -> np.ndarray:
    """LAPACK ``gelss`` solutions (k x 2) of 2 x 2 systems given as rows ``a11, a12, a21,
    a22, y1, y2``, called as scikit-learn's ``_lstsq`` calls it."""
    matrix, target = np.ones((2, 2)), np.zeros(2)
    (gelss,) = get_lapack_funcs(("gelss",), (matrix, target))
    solutions = np.empty((len(systems), 2))
    for row, system in enumerate(systems):
        matrix[:] = system[:4].reshape(2, 2)
        target[:] = system[4:]
        solutions[row] = gelss(matrix, target)[1][:2]
    return solutions


def spatial_median(
    points: torch.Tensor, max_iter: int = SPATIAL_MEDIAN_MAX_ITER, tol: float = SPATIAL_MEDIAN_TOL
) -> torch.Tensor:
    """Spatial (L1) median (batch x 2) of each batch row of ``points`` (batch x 2 x points)
    by scikit-learn's modified Weiszfeld iterations (``_spatial_median``): start at the
    mean; each step moves to the inverse-distance-weighted mean of the points, damped when
    the current estimate coincides (within machine epsilon) with a point; stop after the
    first step shorter than ``tol`` or after ``max_iter`` steps. Each row iterates until its
    own stop, as if it were alone; all rows step together, those still moving only (they
    are gathered afresh only when one stops)."""
    current = points.mean(dim=2)
    active = torch.arange(points.shape[0], device=points.device)
    rows = points
    for _ in range(max_iter):
        previous = current[active]
        step = _weiszfeld_step(rows, previous)
        current[active] = step
        moving = (previous - step).square().sum(dim=1) >= tol * tol
        if not bool(moving.all()):
            active, rows = active[moving], rows[moving]
            if len(active) == 0:
                break
    return current


def _weiszfeld_step(points: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """One modified Weiszfeld step of scikit-learn (``_modified_weiszfeld_step``) per row:
    points at distance below epsilon are left out of the weighted mean, and when there are
    any the step is damped towards the previous estimate. The weighted mean of the points
    is taken as the previous estimate plus the weighted mean of their differences from it
    (the same value; one weighted sum serves both it and the damping), that sum as one
    batched product of the inverse distances with the differences.

    A step is a few passes over the points: their differences, the inverse distances (one
    ``rsqrt`` of the squared ones) and the product. A row whose inverse distances sum to
    at least ``1 / epsilon`` may hold a point closer than epsilon; only then are the close
    points found and left out."""
    diff = points - previous.unsqueeze(2)
    dx, dy = diff.unbind(dim=1)
    inverse = torch.addcmul(dx.square(), dy, dy).rsqrt_()
    total = inverse.sum(dim=1)
    coincides = torch.zeros_like(total, dtype=torch.bool)
    suspect = total >= 1.0 / _EPSILON
    if bool(suspect.any()):
        close = inverse > 1.0 / _EPSILON
        coincides = close.any(dim=1)
        inverse.masked_fill_(close, 0.0)
        total = inverse.sum(dim=1)
    pull = torch.matmul(inverse.unsqueeze(1), diff.transpose(1, 2)).squeeze(1)
    quotient_norm = pull.square().sum(dim=1).sqrt()
    direction = previous + pull / total.unsqueeze(1)
    degenerate = quotient_norm <= _EPSILON
    direction[degenerate] = 1.0
    ratio = (coincides.to(points.dtype) / torch.where(degenerate, 1.0, quotient_norm)).unsqueeze(1)
    return torch.clamp(1.0 - ratio, min=0.0) * direction + torch.clamp(ratio, max=1.0) * previous


def theil_sen_coefficients(
    first: torch.Tensor, second: torch.Tensor, double: torch.Tensor, subsets=None
) -> torch.Tensor:
    """Theil-Sen coefficients (pairs x 2) of ``double`` on ``first`` and ``second`` (each
    pairs x genes) without intercept, equal to scikit-learn's ``TheilSenRegressor(
    fit_intercept=False, max_subpopulation=1e5, max_iter=1000, random_state=1000)`` fitted
    on each pair: the spatial median of the least-squares solutions over the same subsets.
    ``subsets``: ``theil_sen_subsets(genes)`` drawn before (an array or a tensor), else drawn
    (or taken from the cache) here."""
    subsets = _subsets_tensor(first.shape[1], subsets, first.device)
    return spatial_median(_subset_solutions(torch.stack((first, second, double), dim=1), subsets))


def _subsets_tensor(n_genes: int, subsets, device: torch.device) -> torch.Tensor:
    """``subsets`` (or ``theil_sen_subsets(n_genes)`` when None) as a tensor on ``device``;
    subsets drawn for another gene count are an error."""
    if subsets is None:
        subsets = theil_sen_subsets(n_genes)
    if isinstance(subsets, np.ndarray) and not subsets.flags.writeable:
        subsets = subsets.copy()  # the cached array is read-only; torch would warn about sharing it
    subsets = torch.as_tensor(subsets, dtype=torch.long, device=device)
    expected = min(math.comb(n_genes, 2), THEIL_SEN_MAX_SUBSETS)
    if subsets.dim() != 2 or subsets.shape != (expected, 2) or (len(subsets) and int(subsets.max()) >= n_genes):
        raise ValueError(
            f"Theil-Sen subsets of shape {tuple(subsets.shape)} are not those of {n_genes} genes "
            f"({expected} x 2, indices below {n_genes}): draw them with theil_sen_subsets({n_genes})"
        )
    return subsets


def _exclusive_cumsum(values: torch.Tensor, dim: int) -> torch.Tensor:
    return values.cumsum(dim=dim) - values


def _row_sums_1d(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row sums ``sum_j |v_i - v_j|`` (rows x n) of the 1-D distance matrices of ``values``,
    from the sorted order (``(2 r_i - n) v_i + total - 2 * (sum of the values ranked below
    v_i)``), and that order."""
    n = values.shape[1]
    ordered, order = values.sort(dim=1)
    ranks = torch.arange(n, device=values.device, dtype=values.dtype)
    ordered_sums = (
        (2.0 * ranks - n) * ordered + ordered.sum(dim=1, keepdim=True) - 2.0 * _exclusive_cumsum(ordered, dim=1)
    )
    return torch.empty_like(values).scatter_(1, order, ordered_sums), order


def _earlier_smaller_sums(ranks: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """For each position i, the sum of ``features`` (rows x n x k) over the earlier
    positions j < i with a smaller rank, ``ranks`` (rows x n) being a permutation of 0..n-1.

    Divide and conquer on positions, top down: each pair j < i is split by exactly one
    level, where j lies in the left half of an aligned block and i in its right half.
    Within a block the elements are kept in rank order, so a running sum over the block's
    left elements, read at i, is i's sum at that level; a stable partition of each block
    into its two halves keeps rank order for the next level. O(n log n) per row, in
    vectorised steps."""
    rows, n, k = features.shape
    size = 1 << max(1, (n - 1).bit_length())
    padding = torch.arange(n, size, device=ranks.device).expand(rows, -1)
    ranks = torch.cat((ranks, padding), dim=1)
    features = torch.nn.functional.pad(features, (0, 0, 0, size - n))
    # positions in rank order, and their features and sums so far, kept in the same order
    order = torch.empty_like(ranks).scatter_(1, ranks, torch.arange(size, device=ranks.device).expand(rows, -1))
    carried = torch.cat((features.gather(1, order.unsqueeze(-1).expand(-1, -1, k)), torch.zeros_like(features)), 2)
    span = size
    while span > 1:
        half, blocks = span // 2, size // span
        positions = order.view(rows, blocks, span)
        block_carried = carried.view(rows, blocks, span, 2 * k)
        is_left = (positions & (span - 1)) < half
        left_features = block_carried[..., :k] * is_left.unsqueeze(-1)
        block_carried[..., k:] += (left_features.cumsum(dim=2) - left_features) * (~is_left).unsqueeze(-1)
        lefts_before = is_left.cumsum(dim=2) - is_left.long()
        within = torch.arange(span, device=ranks.device)
        destination = torch.where(is_left, lefts_before, half + within - lefts_before)
        order = torch.empty_like(positions).scatter_(2, destination, positions).view(rows, size)
        carried = (
            torch.empty_like(block_carried)
            .scatter_(2, destination.unsqueeze(-1).expand(-1, -1, -1, 2 * k), block_carried)
            .view(rows, size, 2 * k)
        )
        span = half
    return carried[:, :n, k:]  # blocks of one: rank order within a block is position order


def _lower_row_sums_1d(values: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """``sum_{j<i} |v_i - v_j|`` per position i of ``values`` (rows x n), ``ranks`` being
    the values' ranks (ties in any order: equal values are 0 apart). With ``c`` and ``s``
    the count and sum of the earlier smaller values: ``v_i (2 c - i) - 2 s + (sum of the
    earlier values)``."""
    counts, sums = _earlier_smaller_sums(ranks, torch.stack((torch.ones_like(values), values), dim=-1)).unbind(-1)
    earlier = torch.arange(values.shape[1], device=values.device, dtype=values.dtype)
    return values * (2.0 * counts - earlier) - 2.0 * sums + _exclusive_cumsum(values, dim=1)


def _planar_distance_sums(points: torch.Tensor, distances_per_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row sums ``sum_j a_ij`` and lower sums ``sum_{j<i} a_ij`` (rows x n) of the Euclidean
    distance matrices ``a`` of ``points`` (rows x n x 2). The lower triangle is computed
    once, in blocks of about ``distances_per_block`` distances, each as ``sqrt(dx**2 + dy**2)`` of the
    coordinate differences (as scipy's ``cdist``): by ``torch.cdist`` on a CPU, from the
    coordinates elsewhere (``coordinate_distances``)."""
    rows, n, _ = points.shape
    block = max(1, distances_per_block // (rows * n))
    lower = torch.zeros(rows, n, dtype=points.dtype, device=points.device)
    upper = torch.zeros_like(lower)
    distances_between = cdist_distances if points.device.type == "cpu" else coordinate_distances
    for start in range(0, n, block):
        stop = min(start + block, n)
        distances = distances_between(points[:, start:stop], points[:, :stop])
        distances[:, :, start:stop].tril_(diagonal=-1)
        lower[:, start:stop] += distances.sum(dim=2)
        upper[:, :stop] += distances.sum(dim=1)
    return lower + upper, lower


def _distance_correlation_from_terms(product, x_row_sums, x_squares, y_row_sums, y_squares):
    """dcor's biased distance correlation from the terms of its naive and AVL methods:
    ``product = sum_ij a_ij b_ij``, the row sums of ``a`` and ``b``, and ``sum_ij a_ij**2``,
    ``sum_ij b_ij**2`` (all per row of a batch), combined in dcor's order of operations
    (``_dcov_from_terms``), 0 when a variable is constant, and the square root of its
    positive part."""
    n = x_row_sums.shape[1]
    x_total, y_total = x_row_sums.sum(dim=1), y_row_sums.sum(dim=1)

    def covariance(prod, a_sums, a_total, b_sums, b_total):
        first = prod / n / n
        second = (a_sums / n * b_sums).sum(dim=1) / n**2
        third = a_total / n * b_total / n**3
        return first - 2 * second + third

    covariance_xy = covariance(product, x_row_sums, x_total, y_row_sums, y_total)
    variance_x = covariance(x_squares, x_row_sums, x_total, x_row_sums, x_total)
    variance_y = covariance(y_squares, y_row_sums, y_total, y_row_sums, y_total)
    denominator = torch.sqrt((variance_x * variance_y).abs())
    correlation_sq = torch.where(
        denominator == 0,
        torch.zeros_like(covariance_xy),
        covariance_xy / torch.where(denominator == 0, 1.0, denominator),
    )
    return torch.sqrt(torch.clamp(correlation_sq, min=0.0))


def _squared_distance_sum(values: torch.Tensor) -> torch.Tensor:
    """``sum_ij |v_i - v_j|**2 = 2 n sum_i |v_i - mean|**2`` per row of (rows x n [x dims])."""
    n = values.shape[1]
    centred = values - values.mean(dim=1, keepdim=True)
    squares = centred.square()
    if squares.dim() == 3:
        squares = squares.sum(dim=2)
    return 2.0 * n * squares.sum(dim=1)


def cdist_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Euclidean distances (rows x i x j) between the points ``a`` (rows x i x 2) and ``b``
    (rows x j x 2), ``sqrt(dx**2 + dy**2)``, by ``torch.cdist`` (its vectorised CPU kernel)."""
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def coordinate_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``cdist_distances`` from the coordinates' differences, in elementwise passes.
    On a GPU ``torch.cdist`` gives each distance a block of 256 threads that sum its
    coordinates' squares (its CUDA kernel): two of them work and the block's reduction
    costs the rest, so Norman's screen of 5,151 pairs took 105 s on an H200 (2026-12-04),
    where these passes, with the two sums after them, move about 1.5 GB a pair (0.5 ms at
    3 TB/s). The value is the CUDA kernel's, ``sqrt(round(dx**2) + round(dy**2))`` with each
    operation rounded once (the CPU kernel rounds a few the other way, by one unit in the
    last place). On a CPU ``torch.cdist`` stays: its vectorised kernel took 0.68 ms for a
    block of 262,000 distances where these passes took 2.63 ms (one thread, AMD EPYC)."""
    dx = a[..., 0].unsqueeze(2) - b[..., 0].unsqueeze(1)
    dy = a[..., 1].unsqueeze(2) - b[..., 1].unsqueeze(1)
    return dx.square_().add_(dy.square_()).sqrt_()


def distance_correlation(
    x: torch.Tensor, y: torch.Tensor, distances_per_block: int = CPU_DISTANCES_PER_BLOCK
) -> torch.Tensor:
    """dcor's ``distance_correlation(x_p, y_p)`` for each row p of a batch: ``y`` is (rows x
    n), ``x`` is (rows x n) or (rows x n x 2) (two-column samples, the singles matrix).

    dcor takes the 1-D case with its O(n log n) AVL method and the 2-D one with its naive
    O(n^2) method; both combine the same terms: the row sums of the two distance
    matrices, their squared sums and their inner product ``sum_ij a_ij b_ij``. In y-sorted
    order ``b_ij = |y_i - y_j|`` makes the inner product ``2 sum_i y_i (lower_i -
    upper_i)``, with ``lower_i``, ``upper_i`` the sums of row i of ``a`` left and right of
    the diagonal. For 1-D ``x`` these come from sorted orders in O(n log n); for 2-D ``x``
    they take the O(n^2) pairwise distances, ``distances_per_block`` at a time. Inputs are centred
    first: distances do not change, and sums of products lose fewer digits.
    """
    x = x - x.mean(dim=1, keepdim=True)
    y = y - y.mean(dim=1, keepdim=True)
    y_row_sums, order = _row_sums_1d(y)
    y_sorted = y.gather(1, order)
    if x.dim() == 2:
        x_row_sums, x_order = _row_sums_1d(x)
        x_ranks = torch.empty_like(x_order).scatter_(
            1, x_order, torch.arange(x.shape[1], device=x.device).expand_as(x_order)
        )
        lower = _lower_row_sums_1d(x.gather(1, order), x_ranks.gather(1, order))
        row_sums = x_row_sums.gather(1, order)
    else:
        row_sums, lower = _planar_distance_sums(x.gather(1, order.unsqueeze(-1).expand_as(x)), distances_per_block)
        x_row_sums = torch.empty_like(row_sums).scatter_(1, order, row_sums)
    product = 2.0 * (y_sorted * (2.0 * lower - row_sums)).sum(dim=1)
    return _distance_correlation_from_terms(
        product, x_row_sums, _squared_distance_sum(x), y_row_sums, _squared_distance_sum(y)
    )


def _pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson correlation per row as ``np.corrcoef(x, y)[0, 1]``: covariance over the two
    standard deviations, clipped to [-1, 1]; NaN when either row is constant."""
    xc = x - x.mean(dim=1, keepdim=True)
    yc = y - y.mean(dim=1, keepdim=True)
    scale = x.shape[1] - 1
    covariance = (xc * yc).sum(dim=1) / scale
    std_x = torch.sqrt((xc * xc).sum(dim=1) / scale)
    std_y = torch.sqrt((yc * yc).sum(dim=1) / scale)
    return torch.clamp(covariance / std_x / std_y, -1.0, 1.0)


def _as_change_matrix(name: str, values, device) -> torch.Tensor:
    """One (pairs x genes) change-from-control input as a finite float64 tensor, or raise."""
    try:
        matrix = torch.as_tensor(
            np.asarray(values, dtype=np.float64) if not torch.is_tensor(values) else values,
            dtype=torch.float64,
            device=device,
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be numeric: {err}") from err
    if matrix.dim() != 2:
        raise ValueError(f"`{name}` must be 2-D (pairs x genes), got shape {tuple(matrix.shape)}")
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"`{name}` contains NaN or infinite values")
    return matrix


def interaction_scores(
    first, second, double, *, device: str | torch.device | None = None, batch_size: int | None = None, subsets=None
) -> dict[str, np.ndarray]:
    """Genetic-interaction scores of a batch of combinations A+B, one per row.

    ``first``, ``second`` and ``double`` (pairs x genes, arrays or tensors) are the changes
    from control after perturbing A, B and A+B, over the same genes. Returns, under the
    names ``GI_predict`` uses (``GI_SCORE_NAMES``; ``GI_SCORE_MEANINGS`` says what each
    means), a float64 array of one
    score per pair, equal to what the published ``get_GI_params`` gives pair by pair.

    The work runs on ``device`` (default: the inputs' device, else CPU) in float64,
    ``batch_size`` pairs at a time (default: a few on CPU, where small batches stay in
    cache, and hundreds on GPU; Theil-Sen holds about 15 MB per pair).
    ``subsets``: the Theil-Sen subsets of this gene count (``theil_sen_subsets``) when they
    were drawn before, by a parent process say; by default they are drawn, or taken from
    this process's cache.
    Raises ``ValueError`` unless the inputs are finite, numeric, 2-D, of the same shape and
    cover at least ``MIN_GI_GENES`` genes.
    """
    if device is None:
        device = first.device if torch.is_tensor(first) else "cpu"
    device = torch.device(device)
    first = _as_change_matrix("first", first, device)
    second = _as_change_matrix("second", second, device)
    double = _as_change_matrix("double", double, device)
    if not first.shape == second.shape == double.shape:
        raise ValueError(
            "`first`, `second` and `double` must have the same shape, got "
            f"{tuple(first.shape)}, {tuple(second.shape)} and {tuple(double.shape)}"
        )
    if first.shape[1] < MIN_GI_GENES:
        raise ValueError(f"genetic-interaction scores need at least {MIN_GI_GENES} genes, got {first.shape[1]}")
    on_cpu = device.type == "cpu"
    if batch_size is None:
        batch_size = CPU_BATCH_SIZE if on_cpu else GPU_BATCH_SIZE
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    distances_per_block = CPU_DISTANCES_PER_BLOCK if on_cpu else GPU_DISTANCES_PER_BLOCK
    subsets = _subsets_tensor(first.shape[1], subsets, device)
    parts = [
        _score_batch(
            first[start : start + batch_size],
            second[start : start + batch_size],
            double[start : start + batch_size],
            subsets,
            distances_per_block,
        )
        for start in range(0, first.shape[0], batch_size)
    ]
    return {
        name: torch.cat([part[name] for part in parts]).cpu().numpy() if parts else np.empty(0)
        for name in GI_SCORE_NAMES
    }


def _score_batch(
    first: torch.Tensor, second: torch.Tensor, double: torch.Tensor, subsets: torch.Tensor, distances_per_block: int
) -> dict[str, torch.Tensor]:
    """The scores of one batch of pairs, as ``gears.utils.get_coeffs`` computes them."""
    singles = torch.stack((first, second), dim=-1)
    c1, c2 = theil_sen_coefficients(first, second, double, subsets).unbind(dim=-1)
    fitted = c1.unsqueeze(1) * first + c2.unsqueeze(1) * second
    dcor_first, dcor_second, dcor_singles = distance_correlation(
        torch.cat((first, second, first)), torch.cat((double, double, second))
    ).chunk(3)
    return {
        "c1": c1,
        "c2": c2,
        "mag": torch.sqrt(c1**2 + c2**2),
        "dcor": distance_correlation(singles, double, distances_per_block),
        "dcor_singles": dcor_singles,
        "dcor_first": dcor_first,
        "dcor_second": dcor_second,
        "corr_fit": _pearson(fitted, double),
        "dominance": torch.abs(torch.log10(c1 / c2)),
        "eq_contr": torch.minimum(dcor_first, dcor_second) / torch.maximum(dcor_first, dcor_second),
    }


def scoring_device(device) -> torch.device:
    """Where the scores of a model on ``device`` are computed: its GPU when it is a CUDA
    device, else the CPU (the scores are float64, which MPS lacks)."""
    device = torch.device(device)
    return device if device.type == "cuda" else torch.device("cpu")
