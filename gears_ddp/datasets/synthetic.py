"""A built-in, Perturb-seq-like synthetic dataset, so GEARS can be trained with no download.

``make_synthetic_perturb_seq`` returns a ``SyntheticPerturbSeq``: an AnnData in the raw GEARS
input form (``layout="gears"``) or as a screen comes (``layout="screen"``: raw counts,
``obs['target_gene']``), a GO annotation (``gene2go``), the perturbable-gene vocabulary
(``pert_genes``) and the ground truth (noise-free mean profile and interaction type of every
condition). A gene-regulatory network over gene modules spreads each perturbation's direct
effect downstream; two-gene combinations are additive or synergistic, buffering or
epistatic; cellular programs make genes of a module co-vary from cell to cell; counts are
negative binomial; GO terms follow the modules. Every random draw comes from one
``numpy.random.default_rng(seed)``. ``preset(name)`` gives the options of ``PRESETS``
(``"benchmark"``, ``"vcc"``, ``"norman"``, the last calibrated to the Norman screen).

docs/synthetic.md describes the generative model step by step, and the presets.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve_triangular

from gears_ddp._logging import get_logger
from gears_ddp.data.conditions import CONTROL, condition_genes

logger = get_logger(__name__)

ADDITIVE = "additive"
NON_ADDITIVE_TYPES = ("synergy", "buffering", "epistasis")
DEFAULT_INTERACTION_FRACTIONS = {"synergy": 0.15, "buffering": 0.15, "epistasis": 0.15}
GO_TERMS_PER_MODULE = 8
GEARS_LAYOUT, SCREEN_LAYOUT = "gears", "screen"
SCREEN_PERTURBATION_COLUMN = "target_gene"  # the Virtual Cell Challenge's column (cell-eval's default)
SCREEN_CONTROL_LABEL = "non-targeting"  # and its label of control cells
TARGET_SUM = 1e4

MODULE_SIZE_CONCENTRATION = 4.0
MEAN_REGULATORS = 3.0
CROSS_MODULE_EDGE_FRACTION = 0.1
EDGE_WEIGHT_RANGE = (0.4, 1.0)
MAX_INCOMING_WEIGHT = 0.8
BASELINE_LOG_MEAN, BASELINE_LOG_SD, BASELINE_CLIP = -1.0, 1.5, (-5.0, 4.5)
TARGET_MIN_LOG_RATE = 0.0
PERTURB_WEIGHT_EPS = 0.1
KNOCKDOWN_RANGE = (-2.5, -1.5)
ACTIVATION_RANGE = (1.0, 2.0)
SYNERGY_GAIN_RANGE = (0.5, 1.0)
BUFFERING_DAMPING_RANGE = (0.5, 0.8)
EPISTASIS_RESIDUAL_RANGE = (0.0, 0.2)
INVERSE_DISPERSION_MEDIAN, INVERSE_DISPERSION_LOG_SD = 4.0, 0.5
SIZE_FACTOR_LOG_SD = 0.3
DEFAULT_PROGRAM_SD = 1.0
PROGRAM_LOADING_RANGE = (0.5, 1.5)
NEGATIVE_LOADING_FRACTION = 0.2
SHARED_RESPONSE_MODULE_FRACTION = 0.15
SHARED_RESPONSE_STRENGTH_RANGE = (0.3, 0.9)
GO_MODULE_TERM_BETA = (2.0, 1.5)
GO_NOISE_TERMS_MEAN = 1.0
UNANNOTATED_FRACTION = 0.03
CELL_CHUNK = 2048


@dataclass
class SyntheticPerturbSeq:
    """A synthetic Perturb-seq dataset in GEARS raw input form, with its ground truth.

    ``adata``: log-normalised CSR expression, ``obs['condition']``, ``obs['cell_type']`` and
    ``var['gene_name']``, or in the ``"screen"`` layout raw counts and ``obs['target_gene']``
    (module docstring, step 10); None when ``expression_to`` wrote the expression elsewhere. ``gene2go``: gene symbol
    -> set of GO term ids. ``pert_genes``: the
    perturbable vocabulary (every annotated gene, measured or not). ``true_means``: noise-free
    log-normalised profile per condition (rows) and measured gene (columns).
    ``interaction_types``: combo condition -> 'additive' | 'synergy' | 'buffering' |
    'epistasis'. ``params``: the parameters used (JSON-serialisable).
    """

    adata: anndata.AnnData | None
    gene2go: dict[str, set[str]]
    pert_genes: list[str]
    true_means: pd.DataFrame
    interaction_types: dict[str, str]
    params: dict


def _check_positive_int(name: str, value, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_fraction(name: str, value) -> None:
    """Raise ``ValueError`` unless ``value`` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def _check_non_negative(name: str, value) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _validate(
    n_genes,
    n_modules,
    n_perturbed_genes,
    n_combos,
    cells_per_condition,
    n_control_cells,
    n_go_terms,
    seed,
    frac_activation,
    frac_unmeasured,
    interaction_fractions,
    cell_type,
    program_sd,
    activation_range,
    shared_response,
    library_size,
    measured_share,
    layout,
) -> None:
    """Check every argument of ``make_synthetic_perturb_seq``, naming the offending one."""
    for name, value in (
        ("n_genes", n_genes),
        ("n_modules", n_modules),
        ("n_perturbed_genes", n_perturbed_genes),
        ("cells_per_condition", cells_per_condition),
        ("n_control_cells", n_control_cells),
    ):
        _check_positive_int(name, value)
    _check_positive_int("n_combos", n_combos, minimum=0)
    _check_positive_int("seed", seed, minimum=0)
    if n_modules > n_genes:
        raise ValueError(f"n_modules ({n_modules}) must not exceed n_genes ({n_genes})")
    if n_perturbed_genes > n_genes:
        raise ValueError(f"n_perturbed_genes ({n_perturbed_genes}) must not exceed n_genes ({n_genes})")
    max_combos = n_perturbed_genes * (n_perturbed_genes - 1) // 2
    if n_combos > max_combos:
        raise ValueError(
            f"n_combos ({n_combos}) exceeds the {max_combos} possible pairs of {n_perturbed_genes} perturbed genes"
        )
    if n_go_terms is not None:
        _check_positive_int("n_go_terms", n_go_terms)
        if n_go_terms < n_modules:
            raise ValueError(
                f"n_go_terms ({n_go_terms}) must be at least n_modules ({n_modules}) "
                "so that every module has its own GO terms"
            )
    if not isinstance(cell_type, str) or not cell_type:
        raise ValueError(f"cell_type must be a non-empty string, got {cell_type!r}")
    if layout not in (GEARS_LAYOUT, SCREEN_LAYOUT):
        raise ValueError(
            f"layout must be {GEARS_LAYOUT!r} (GEARS's raw input) or {SCREEN_LAYOUT!r} (raw counts "
            f"and obs[{SCREEN_PERTURBATION_COLUMN!r}], as a screen comes), got {layout!r}"
        )
    _check_fraction("frac_activation", frac_activation)
    _check_fraction("frac_unmeasured", frac_unmeasured)
    _check_non_negative("program_sd", program_sd)
    _check_non_negative("shared_response", shared_response)
    if (
        not isinstance(activation_range, (tuple, list))
        or len(activation_range) != 2
        or not all(isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) for v in activation_range)
        or not 0 < activation_range[0] <= activation_range[1]
    ):
        raise ValueError(f"activation_range must be (low, high) with 0 < low <= high, got {activation_range!r}")
    if library_size is not None:
        _check_non_negative("library_size", library_size)
        if library_size == 0:
            raise ValueError("library_size must be > 0 (or None: counts of the measured genes only)")
    _check_fraction("measured_share", measured_share)
    if measured_share == 0 or (library_size is None and measured_share != 1):
        raise ValueError(
            f"measured_share must be in (0, 1], and 1 unless library_size is given; got {measured_share!r}"
        )
    unknown = set(interaction_fractions) - set(NON_ADDITIVE_TYPES)
    if unknown:
        raise ValueError(
            f"interaction_fractions has unknown types {sorted(unknown)}; "
            f"allowed: {list(NON_ADDITIVE_TYPES)} (the rest is additive)"
        )
    for name, value in interaction_fractions.items():
        _check_fraction(f"interaction_fractions[{name!r}]", value)
    if sum(interaction_fractions.values()) > 1:
        raise ValueError(f"interaction_fractions sum to {sum(interaction_fractions.values()):.3g} > 1")


def _gene_symbols(rng: np.random.Generator, n_genes: int, n_unmeasured: int) -> tuple[list[str], list[str]]:
    """Measured and unmeasured gene symbols, interleaved at random in one numbering."""
    total = n_genes + n_unmeasured
    width = max(4, len(str(total)))
    symbols = np.array([f"SG{i:0{width}d}" for i in range(1, total + 1)])
    measured = np.zeros(total, dtype=bool)
    measured[rng.choice(total, size=n_genes, replace=False)] = True
    return list(symbols[measured]), list(symbols[~measured])


def _assign_modules(rng: np.random.Generator, n_genes: int, n_modules: int) -> np.ndarray:
    """Module label of each gene: random module sizes (each >= 1), genes shuffled."""
    proportions = rng.dirichlet(np.full(n_modules, MODULE_SIZE_CONCENTRATION))
    sizes = 1 + rng.multinomial(n_genes - n_modules, proportions)
    return rng.permutation(np.repeat(np.arange(n_modules), sizes))


def _within_module_edges(rng: np.random.Generator, members: np.ndarray) -> tuple[list[int], list[int]]:
    """(targets, regulators) inside one module whose ``members`` are in topological order.

    Earlier genes are preferred as regulators (weight 1/(position+1)), which makes hubs.
    """
    targets: list[int] = []
    regulators: list[int] = []
    for position in range(1, len(members)):
        n_regulators = min(position, rng.poisson(MEAN_REGULATORS))
        if n_regulators == 0:
            continue
        preference = 1.0 / np.arange(1, position + 1)
        chosen = rng.choice(position, size=n_regulators, replace=False, p=preference / preference.sum())
        targets.extend([members[position]] * n_regulators)
        regulators.extend(members[chosen])
    return targets, regulators


def _cross_module_edges(
    rng: np.random.Generator, modules: np.ndarray, rank: np.ndarray, n_edges: int
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``n_edges`` distinct (targets, regulators) joining different modules, earlier to later."""
    n_candidates = 4 * n_edges + 16
    regulators = rng.integers(len(modules), size=n_candidates)
    targets = rng.integers(len(modules), size=n_candidates)
    valid = (modules[regulators] != modules[targets]) & (rank[regulators] < rank[targets])
    codes = targets[valid] * len(modules) + regulators[valid]
    _, first = np.unique(codes, return_index=True)
    keep = np.sort(first)[:n_edges]
    return targets[valid][keep], regulators[valid][keep]


def _make_grn(rng: np.random.Generator, modules: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """Sparse DAG weight matrix ``W[target, regulator]`` and the topological rank of each gene.

    Incoming absolute weights are capped at ``MAX_INCOMING_WEIGHT`` per gene so that the
    propagated response ``(I - W)^-1 s`` stays bounded.
    """
    n_genes = len(modules)
    rank = rng.permutation(n_genes)
    within_targets: list[int] = []
    within_regulators: list[int] = []
    for module in range(modules.max() + 1):
        members = np.flatnonzero(modules == module)
        module_targets, module_regulators = _within_module_edges(rng, members[np.argsort(rank[members])])
        within_targets.extend(module_targets)
        within_regulators.extend(module_regulators)
    n_cross = int(round(CROSS_MODULE_EDGE_FRACTION * len(within_targets)))
    cross_targets, cross_regulators = _cross_module_edges(rng, modules, rank, n_cross)
    targets = np.concatenate([np.asarray(within_targets, dtype=np.int64), cross_targets])
    regulators = np.concatenate([np.asarray(within_regulators, dtype=np.int64), cross_regulators])
    weights = rng.choice([-1.0, 1.0], size=len(targets)) * rng.uniform(*EDGE_WEIGHT_RANGE, size=len(targets))
    incoming = np.bincount(targets, weights=np.abs(weights), minlength=n_genes)
    scale = np.minimum(1.0, MAX_INCOMING_WEIGHT / np.maximum(incoming, 1e-12))
    weights *= scale[targets]
    grn = sp.csr_matrix((weights, (targets, regulators)), shape=(n_genes, n_genes))
    return grn, rank


def _solve_in_dag_order(matrix: sp.csr_matrix, rank: np.ndarray, rhs: np.ndarray, lower: bool) -> np.ndarray:
    """Solve ``matrix @ x = rhs`` where ``matrix`` is triangular once genes are sorted by ``rank``."""
    order = np.argsort(rank)
    solved = spsolve_triangular(matrix[order][:, order].tocsr(), rhs[order], lower=lower)
    result = np.empty_like(solved)
    result[order] = solved
    return result


def _propagate(grn: sp.csr_matrix, rank: np.ndarray, direct: np.ndarray) -> np.ndarray:
    """Log-rate response ``(I - W)^-1 s`` for each column ``s`` of ``direct`` (genes x perturbations).

    Reordered by topological rank, ``I - W`` is lower triangular, so a sparse triangular
    solve is exact and scales to many genes.
    """
    identity = sp.identity(grn.shape[0], format="csr")
    return _solve_in_dag_order(identity - grn, rank, direct, lower=True)


def _downstream_influence(grn: sp.csr_matrix, rank: np.ndarray) -> np.ndarray:
    """Per gene, the summed absolute path weight to all its descendants.

    These are the column sums of ``(I - |W|)^-1`` minus the diagonal one, obtained from a
    single transposed triangular solve ``(I - |W|)^T y = 1``.
    """
    identity = sp.identity(grn.shape[0], format="csr")
    ones = np.ones(grn.shape[0])
    return _solve_in_dag_order((identity - abs(grn)).T.tocsr(), rank, ones, lower=False) - 1.0


def _choose_perturbed(rng: np.random.Generator, grn: sp.csr_matrix, rank: np.ndarray, n_perturbed: int) -> np.ndarray:
    """Indices of perturbed genes (sorted), favouring genes with large downstream influence."""
    weight = _downstream_influence(grn, rank) + PERTURB_WEIGHT_EPS
    return np.sort(rng.choice(len(weight), size=n_perturbed, replace=False, p=weight / weight.sum()))


def _baseline(rng: np.random.Generator, n_genes: int, perturbed: np.ndarray) -> np.ndarray:
    """Baseline log mean count per gene; perturbed genes are kept observably expressed."""
    baseline = np.clip(rng.normal(BASELINE_LOG_MEAN, BASELINE_LOG_SD, size=n_genes), *BASELINE_CLIP)
    baseline[perturbed] = np.maximum(baseline[perturbed], TARGET_MIN_LOG_RATE)
    return baseline


def _direct_effects(
    rng: np.random.Generator, n_perturbed: int, frac_activation: float, activation_range: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Direct log effect on each perturbed gene and whether it is activated (else knocked down)."""
    activated = rng.random(n_perturbed) < frac_activation
    effect = np.where(
        activated, rng.uniform(*activation_range, size=n_perturbed), rng.uniform(*KNOCKDOWN_RANGE, size=n_perturbed)
    )
    return effect, activated


def _choose_pairs(rng: np.random.Generator, n_perturbed: int, n_combos: int) -> np.ndarray:
    """``n_combos`` distinct (i, j) pairs, i < j, of perturbed-gene positions."""
    first, second = np.triu_indices(n_perturbed, k=1)
    chosen = np.sort(rng.choice(len(first), size=n_combos, replace=False))
    return np.stack([first[chosen], second[chosen]], axis=1)


def _interaction_labels(rng: np.random.Generator, n_combos: int, fractions: dict) -> np.ndarray:
    """Interaction type per combo: ``round(fraction * n_combos)`` of each type, rest additive."""
    labels: list[str] = []
    for name in NON_ADDITIVE_TYPES:
        count = min(int(round(fractions.get(name, 0.0) * n_combos)), n_combos - len(labels))
        labels.extend([name] * count)
    labels.extend([ADDITIVE] * (n_combos - len(labels)))
    return rng.permutation(np.array(labels, dtype=object))


def _combo_effect(
    rng: np.random.Generator, kind: str, direct: np.ndarray, downstream_a: np.ndarray, downstream_b: np.ndarray
) -> np.ndarray:
    """Log-rate effect of a two-gene combo of interaction ``kind`` (see the module docstring)."""
    if kind == "synergy":
        downstream = (1 + rng.uniform(*SYNERGY_GAIN_RANGE)) * (downstream_a + downstream_b)
    elif kind == "buffering":
        downstream = (1 - rng.uniform(*BUFFERING_DAMPING_RANGE)) * (downstream_a + downstream_b)
    elif kind == "epistasis":
        dominant, other = (downstream_a, downstream_b) if rng.random() < 0.5 else (downstream_b, downstream_a)
        downstream = dominant + rng.uniform(*EPISTASIS_RESIDUAL_RANGE) * other
    else:
        downstream = downstream_a + downstream_b
    return direct + downstream


def _go_terms_per_gene(
    rng: np.random.Generator, modules: np.ndarray, n_modules: int, n_go_terms: int, annotated: np.ndarray
) -> list[set[int]]:
    """GO term indices per gene: most of its module's terms plus a few random ones."""
    module_terms = np.array_split(rng.permutation(n_go_terms), n_modules)
    probability = rng.beta(*GO_MODULE_TERM_BETA, size=len(modules))
    terms: list[set[int]] = [set() for _ in modules]
    for module, own in enumerate(module_terms):
        members = np.flatnonzero(modules == module)
        taken = rng.random((len(members), len(own))) < probability[members, None]
        for gene, row in zip(members.tolist(), taken):
            terms[gene].update(own[row].tolist())
    n_noise = rng.poisson(GO_NOISE_TERMS_MEAN, size=len(modules))
    noise = np.split(rng.integers(n_go_terms, size=n_noise.sum()), np.cumsum(n_noise)[:-1])
    fallback = rng.random(len(modules))
    for gene, extra in enumerate(noise):
        terms[gene].update(extra.tolist())
        own = module_terms[modules[gene]]
        if not terms[gene]:
            terms[gene].add(int(own[int(fallback[gene] * len(own))]))
    return [gene_terms if keep else set() for gene_terms, keep in zip(terms, annotated)]


def _program_loadings(rng: np.random.Generator, n_genes: int) -> np.ndarray:
    """Each gene's loading on its module's activity: magnitude uniform, a minority negative."""
    sign = np.where(rng.random(n_genes) < NEGATIVE_LOADING_FRACTION, -1.0, 1.0)
    return sign * rng.uniform(*PROGRAM_LOADING_RANGE, size=n_genes)


def _sample_expression(
    rng: np.random.Generator,
    expected: np.ndarray,
    other: np.ndarray,
    cells_of: np.ndarray,
    modules: np.ndarray,
    loadings: np.ndarray,
    program_sd: float,
    raw_counts: bool = False,
) -> tuple[np.ndarray, Iterator[sp.csr_matrix]]:
    """Each cell's condition index (cells in shuffled order), and their log-normalised
    expression (``raw_counts``: their counts of the measured genes) as CSR blocks of
    ``CELL_CHUNK`` cells, drawn as they are consumed.

    ``expected``: each condition's expected count of every measured gene in a cell of size
    factor one; ``other``: its expected count of the unmeasured genes (0: none). Negative-
    binomial counts with per-gene dispersion, log-normal size factors and per-cell module
    (program) activities, sampled a chunk of cells at a time (vectorised within a chunk), so
    memory is bounded by a chunk, not by the number of cells. The activity factor
    ``exp(l_g z - (l_g sigma)^2 / 2)`` has mean one, so a condition's expected count stays
    ``expected[c]`` (times the cell's size factor). Unmeasured counts are Poisson and enter
    only the cell's total, as in data normalised before the genes were selected.
    """
    n_genes = expected.shape[1]
    condition = rng.permutation(np.repeat(np.arange(len(expected)), cells_of))
    size_factor = rng.lognormal(0.0, SIZE_FACTOR_LOG_SD, size=len(condition))
    theta = rng.lognormal(math.log(INVERSE_DISPERSION_MEDIAN), INVERSE_DISPERSION_LOG_SD, size=n_genes)
    activity = rng.normal(0.0, 1.0, size=(len(condition), int(modules.max()) + 1)) * program_sd
    correction = 0.5 * (loadings * program_sd) ** 2
    unmeasured = bool(other.any())

    def blocks() -> Iterator[sp.csr_matrix]:
        for start in range(0, len(condition), CELL_CHUNK):
            stop = start + CELL_CHUNK
            program = np.exp(activity[start:stop][:, modules] * loadings - correction)
            mean = size_factor[start:stop, None] * expected[condition[start:stop]] * program
            counts = rng.negative_binomial(theta, theta / (theta + mean)).astype(np.float32)
            total = counts.sum(axis=1, keepdims=True)
            if unmeasured:  # drawn in both forms, so that the later blocks are the same cells
                total = total + rng.poisson(size_factor[start:stop] * other[condition[start:stop]])[:, None]
            if raw_counts:
                yield sp.csr_matrix(counts)
                continue
            scaled = np.divide(counts * np.float32(TARGET_SUM), total, out=np.zeros_like(counts), where=total > 0)
            yield sp.csr_matrix(np.log1p(scaled))

    return condition, blocks()


def _shared_response(
    rng: np.random.Generator, modules: np.ndarray, pairs: np.ndarray, n_perturbed: int, sd: float
) -> np.ndarray:
    """The shared perturbation response's log-rate effect (conditions x genes: control,
    singles, combos); all zero when ``sd`` is 0 (then nothing is drawn)."""
    n_conditions = 1 + n_perturbed + len(pairs)
    if sd == 0:
        return np.zeros((n_conditions, len(modules)))
    n_modules = int(modules.max()) + 1
    chosen = rng.choice(n_modules, size=max(1, int(round(SHARED_RESPONSE_MODULE_FRACTION * n_modules))), replace=False)
    response = np.where(np.isin(modules, chosen), rng.normal(0.0, sd, size=len(modules)), 0.0)
    single = rng.uniform(*SHARED_RESPONSE_STRENGTH_RANGE, size=n_perturbed)
    combo = 1 - (1 - single[pairs[:, 0]]) * (1 - single[pairs[:, 1]])
    return np.concatenate([[0.0], single, combo])[:, None] * response[None, :]


def _log_rates(
    rng: np.random.Generator,
    baseline: np.ndarray,
    grn: sp.csr_matrix,
    rank: np.ndarray,
    perturbed: np.ndarray,
    direct_values: np.ndarray,
    pairs: np.ndarray,
    labels: np.ndarray,
) -> np.ndarray:
    """Log-rate matrix (conditions x genes): control, then singles, then combos."""
    n_genes, n_perturbed = len(baseline), len(perturbed)
    direct = np.zeros((n_genes, n_perturbed))
    direct[perturbed, np.arange(n_perturbed)] = direct_values
    response = _propagate(grn, rank, direct)
    downstream = response - direct
    combos = [
        _combo_effect(rng, kind, direct[:, a] + direct[:, b], downstream[:, a], downstream[:, b])
        for (a, b), kind in zip(pairs, labels)
    ]
    effects = np.vstack([np.zeros((1, n_genes)), response.T] + [np.asarray(combos).reshape(-1, n_genes)])
    return baseline[None, :] + effects


def _unannotated_genes(rng: np.random.Generator, n_genes: int, perturbed: np.ndarray) -> np.ndarray:
    """Measured, never-perturbed genes that get no GO terms (``UNANNOTATED_FRACTION`` of genes)."""
    candidates = np.setdiff1d(np.arange(n_genes), perturbed)
    count = min(int(round(UNANNOTATED_FRACTION * n_genes)), len(candidates))
    return rng.choice(candidates, size=count, replace=False)


def _gene2go(
    rng: np.random.Generator,
    measured: list[str],
    unmeasured: list[str],
    modules: np.ndarray,
    n_modules: int,
    n_go_terms: int,
    perturbed: np.ndarray,
) -> dict[str, set[str]]:
    """Gene symbol -> set of ``GO:0000123``-style ids for every annotated gene.

    Unmeasured genes join random modules; a few never-perturbed measured genes stay unannotated.
    """
    all_modules = np.concatenate([modules, rng.integers(n_modules, size=len(unmeasured))])
    annotated = np.ones(len(all_modules), dtype=bool)
    annotated[_unannotated_genes(rng, len(measured), perturbed)] = False
    term_ids = [f"GO:{i:07d}" for i in range(1, n_go_terms + 1)]
    terms = _go_terms_per_gene(rng, all_modules, n_modules, n_go_terms, annotated)
    return {
        gene: {term_ids[t] for t in gene_terms} for gene, gene_terms in zip(measured + unmeasured, terms) if gene_terms
    }


def screen_label(condition: str) -> str:
    """A condition's label in the ``"screen"`` layout: ``A`` for ``A+ctrl``, ``A+B`` for
    ``A+B``, ``SCREEN_CONTROL_LABEL`` for ``ctrl``."""
    return "+".join(condition_genes(condition)) or SCREEN_CONTROL_LABEL


def _obs_and_var(
    condition_index: np.ndarray,
    conditions: list[str],
    symbols: np.ndarray,
    modules: np.ndarray,
    perturbed: np.ndarray,
    activated: np.ndarray,
    cell_type: str,
    layout: str,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``obs`` and ``var`` in the ``layout`` (module docstring, step 10), plus
    ``var['module']`` and ``var['perturbation']`` ground truth."""
    width = len(str(len(condition_index)))
    index = pd.Index([f"cell{i:0{width}d}" for i in range(len(condition_index))])
    if layout == SCREEN_LAYOUT:
        labels = [screen_label(c) for c in conditions]
        obs = pd.DataFrame(
            {SCREEN_PERTURBATION_COLUMN: pd.Categorical.from_codes(condition_index, labels)}, index=index
        )
    else:
        obs = pd.DataFrame(
            {
                "condition": pd.Categorical.from_codes(condition_index, conditions),
                "cell_type": pd.Categorical([cell_type] * len(condition_index)),
            },
            index=index,
        )
    mode = np.full(len(symbols), "none", dtype=object)
    mode[perturbed] = np.where(activated, "activation", "knockdown")
    var = pd.DataFrame(
        {
            "module": modules.astype(np.int64),
            "perturbation": pd.Categorical(mode, categories=["none", "knockdown", "activation"]),
        },
        index=pd.Index(symbols),
    )
    if layout == GEARS_LAYOUT:
        var.insert(0, "gene_name", symbols)
    return obs, var


PRESETS = {
    # the generator's defaults: the data of the speed and parity benchmarks, and of most tests
    "benchmark": {},
    # calibrated to the Norman screen (see "Presets" in the module docstring); the demo's data
    "norman": {
        "n_genes": 500,
        "n_modules": 20,
        "n_perturbed_genes": 48,
        "n_combos": 60,
        "cells_per_condition": 200,
        "n_control_cells": 1900,
        "frac_activation": 1.0,
        "interaction_fractions": {"synergy": 0.05, "buffering": 0.05, "epistasis": 0.05},
        "activation_range": (2.0, 4.0),
        "shared_response": 1.0,
        "library_size": 10000.0,
        "measured_share": 0.006,
    },
    # the Virtual Cell Challenge's file in shape (see "Presets"); examples/vcc_workflow.py's data
    "vcc": {
        "n_genes": 300,
        "n_modules": 10,
        "n_perturbed_genes": 20,
        "n_combos": 0,
        "cells_per_condition": 100,
        "n_control_cells": 500,
        "frac_activation": 0.0,
        "shared_response": 1.0,
        "library_size": 5000.0,
        "layout": SCREEN_LAYOUT,
    },
}


def preset(name: str) -> dict:
    """The ``make_synthetic_perturb_seq`` options of a named preset (a copy to change freely)."""
    if name not in PRESETS:
        raise ValueError(f"unknown synthetic preset {name!r}; known: {sorted(PRESETS)}")
    return {key: dict(value) if isinstance(value, dict) else value for key, value in PRESETS[name].items()}


def in_memory(obs: pd.DataFrame, var: pd.DataFrame, blocks: Iterator[sp.csr_matrix]) -> anndata.AnnData:
    """The default ``expression_to`` of ``make_synthetic_perturb_seq``: an AnnData in memory."""
    return anndata.AnnData(X=sp.vstack(list(blocks), format="csr"), obs=obs, var=var)


def make_synthetic_perturb_seq(
    n_genes: int = 1000,
    n_modules: int = 20,
    n_perturbed_genes: int = 60,
    n_combos: int = 80,
    cells_per_condition: int = 45,
    n_control_cells: int = 1000,
    n_go_terms: int | None = None,
    seed: int = 0,
    frac_activation: float = 0.2,
    frac_unmeasured: float = 0.15,
    interaction_fractions: dict | None = None,
    cell_type: str = "synthetic",
    program_sd: float = DEFAULT_PROGRAM_SD,
    activation_range: tuple[float, float] = ACTIVATION_RANGE,
    shared_response: float = 0.0,
    library_size: float | None = None,
    measured_share: float = 1.0,
    layout: str = GEARS_LAYOUT,
    expression_to: Callable = in_memory,
) -> SyntheticPerturbSeq:
    """Generate a synthetic Perturb-seq dataset (see the module docstring for the model).

    Defaults give 7,300 cells x 1,000 genes (60 singles and 80 combos of 45 cells, 1,000
    controls). 80 combos of 60 genes leave, under GEARS's ``simulation`` split (25% of the
    genes unseen), about 80 * C(15, 2) / C(60, 2) = 4.7 ``combo_seen0`` test combos on
    average. ``n_go_terms`` defaults to 8 per module; ``frac_unmeasured`` adds that
    fraction of ``n_genes`` as annotated but unmeasured genes; ``interaction_fractions``
    maps 'synergy' / 'buffering' / 'epistasis' to fractions of the combos (default 0.15 each,
    the rest additive). ``program_sd`` is the standard deviation of the per-cell module
    (program) activities that create within-module co-expression (0 turns them off).
    ``layout``: ``"gears"`` (GEARS's raw input) or ``"screen"`` (raw counts and
    ``obs['target_gene']``, as a screen comes; module docstring, step 10). Deterministic for a given ``seed``.
    ``expression_to(obs, var, blocks)`` consumes the
    expression, which arrives as CSR blocks of cells, and returns the AnnData to report: by
    default one in memory; ``datasets.write_synthetic_screen`` writes the blocks to a file
    instead, so a screen larger than memory can be generated.
    """
    fractions = dict(DEFAULT_INTERACTION_FRACTIONS if interaction_fractions is None else interaction_fractions)
    _validate(
        n_genes,
        n_modules,
        n_perturbed_genes,
        n_combos,
        cells_per_condition,
        n_control_cells,
        n_go_terms,
        seed,
        frac_activation,
        frac_unmeasured,
        fractions,
        cell_type,
        program_sd,
        activation_range,
        shared_response,
        library_size,
        measured_share,
        layout,
    )
    n_go_terms = GO_TERMS_PER_MODULE * n_modules if n_go_terms is None else n_go_terms
    started = time.perf_counter()
    rng = np.random.default_rng(seed)

    n_unmeasured = int(round(frac_unmeasured * n_genes))
    measured_genes, unmeasured_genes = _gene_symbols(rng, n_genes, n_unmeasured)
    modules = _assign_modules(rng, n_genes, n_modules)
    grn, rank = _make_grn(rng, modules)
    perturbed = _choose_perturbed(rng, grn, rank, n_perturbed_genes)
    baseline = _baseline(rng, n_genes, perturbed)
    direct_values, activated = _direct_effects(rng, n_perturbed_genes, frac_activation, activation_range)
    pairs = _choose_pairs(rng, n_perturbed_genes, n_combos)
    labels = _interaction_labels(rng, n_combos, fractions)
    log_rates = _log_rates(rng, baseline, grn, rank, perturbed, direct_values, pairs, labels) + _shared_response(
        rng, modules, pairs, n_perturbed_genes, float(shared_response)
    )

    symbols = np.array(measured_genes)
    pert_symbols = symbols[perturbed]
    combo_names = [f"{pert_symbols[a]}+{pert_symbols[b]}" for a, b in pairs]
    conditions = [CONTROL] + [f"{gene}+{CONTROL}" for gene in pert_symbols] + combo_names
    cells_of = np.array([n_control_cells] + [cells_per_condition] * (len(conditions) - 1))
    rates = np.exp(log_rates)
    if library_size is None:
        expected, other = rates, np.zeros(len(rates))
    else:  # a control cell of size factor one has library_size counts, measured_share of them measured
        expected = rates * (library_size * measured_share / rates[0].sum())
        other = np.full(len(rates), library_size * (1 - measured_share))
    loadings = _program_loadings(rng, n_genes)
    condition_index, blocks = _sample_expression(
        rng, expected, other, cells_of, modules, loadings, float(program_sd), raw_counts=layout == SCREEN_LAYOUT
    )
    obs, var = _obs_and_var(condition_index, conditions, symbols, modules, perturbed, activated, cell_type, layout)
    adata = expression_to(obs, var, blocks)  # consumes every block before the GO draws below (None: written)
    gene2go = _gene2go(rng, measured_genes, unmeasured_genes, modules, n_modules, n_go_terms, perturbed)
    true_means = pd.DataFrame(
        np.log1p(TARGET_SUM * expected / (expected.sum(axis=1, keepdims=True) + other[:, None])),
        index=pd.Index(conditions, name="condition"),
        columns=pd.Index(symbols, name="gene"),
    )
    params = {
        "n_genes": int(n_genes),
        "n_modules": int(n_modules),
        "n_perturbed_genes": int(n_perturbed_genes),
        "n_combos": int(n_combos),
        "cells_per_condition": int(cells_per_condition),
        "n_control_cells": int(n_control_cells),
        "n_go_terms": int(n_go_terms),
        "seed": int(seed),
        "frac_activation": float(frac_activation),
        "frac_unmeasured": float(frac_unmeasured),
        "interaction_fractions": {k: float(v) for k, v in fractions.items()},
        "cell_type": cell_type,
        "program_sd": float(program_sd),
        "activation_range": [float(v) for v in activation_range],
        "shared_response": float(shared_response),
        "library_size": None if library_size is None else float(library_size),
        "measured_share": float(measured_share),
        "layout": layout,
        "n_cells": int(cells_of.sum()),
        "n_unmeasured_genes": n_unmeasured,
    }
    logger.info(
        "synthetic Perturb-seq: %d cells x %d genes, %d conditions, %d GO-annotated genes (%.1f s)",
        int(cells_of.sum()),
        n_genes,
        len(conditions),
        len(gene2go),
        time.perf_counter() - started,
    )
    return SyntheticPerturbSeq(
        adata=adata,
        gene2go=gene2go,
        pert_genes=sorted(gene2go),
        true_means=true_means,
        interaction_types=dict(zip(combo_names, labels.tolist())),
        params=params,
    )
