"""From a raw AnnData to the processed GEARS form (``perturb_processed.h5ad``).

Input: log-normalised expression, ``obs['condition']``, ``obs['cell_type']`` and
``var['gene_name']``. Output (same AnnData, in place): ``obs`` columns ``condition_name``,
``dose_val`` and ``control``; ``uns`` entries ``rank_genes_groups_cov_all`` (all genes
ranked as scanpy's t-test against control with ``rankby_abs=True`` ranks them: see
``de_genes``), ``top_non_dropout_de_20``, ``top_non_zero_de_20``, ``non_zeros_gene_idx``
and ``non_dropout_gene_idx``, exactly as the published GEARS writes them.

The expression is read once, a block of cells at a time (``ExpressionReading``): each block
is checked and added to per-condition sums of the values, of their squares and of the
non-zero values (``grouped.ConditionSums``), from which the DE ranking and the gene sets
follow, vectorised over genes. Nothing holds the matrix whole, so a screen larger than
memory is processed from its backed file, or from blocks as normalisation writes them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gears_ddp._logging import get_logger
from gears_ddp.data.conditions import CONTROL, coded_conditions, first_cell_values, malformed_conditions_problem
from gears_ddp.data.de_genes import MOMENTS, check_group_sizes, order_by_magnitude, welch_t_test_of_sums
from gears_ddp.data.grouped import ConditionSums, row_blocks
from gears_ddp.data.screen_report import Problem, listed, refuse

logger = get_logger(__name__)

REQUIRED_OBS = ("condition", "cell_type")
REQUIRED_VAR = ("gene_name",)
N_TOP_DE = 20
RANK_KEY = "rank_genes_groups_cov_all"
LOG_NORMALISED_MAX = float(np.log1p(1e4))  # the largest log1p value of a cell normalised to 1e4 counts
NOT_LOG_TRANSFORMED = 50  # a larger maximum looks normalised but not log-transformed


def missing_columns_problem(
    adata, source: str, obs_columns=REQUIRED_OBS, var_columns=REQUIRED_VAR, screen_columns=None
) -> Problem | None:
    """The ``Problem`` naming every required ``obs`` / ``var`` column that is missing, or None;
    without ``obs['condition']`` it lists the screen's own ``obs`` columns (``screen_columns``,
    default ``adata``'s: those of the file, when ``adata`` has gained GEARS's columns since)
    for the user to find its column of perturbations among."""
    missing = [f"obs[{c!r}]" for c in obs_columns if c not in adata.obs.columns]
    missing += [f"var[{c!r}]" for c in var_columns if c not in adata.var.columns]
    if not missing:
        return None
    own_column = (
        f"; or name the screen's own column of perturbations and its control label (perturbation_column "
        f"and control_label; gears-ddp process --perturbation-column, --control-label): its obs columns "
        f"are {listed(adata.obs.columns if screen_columns is None else screen_columns) or 'none'}"
        if "condition" in obs_columns and "condition" not in adata.obs.columns
        else ""
    )
    return Problem(
        "columns",
        f"{source} lacks required column(s) {', '.join(missing)}; GEARS data needs "
        "obs['condition'] ('ctrl', 'A+ctrl', 'A+B'), obs['cell_type'] and var['gene_name']" + own_column,
    )


def check_columns(adata, source: str, obs_columns=REQUIRED_OBS, var_columns=REQUIRED_VAR) -> None:
    """Raise ``ValueError`` naming every required ``obs`` / ``var`` column that is missing."""
    refuse([missing_columns_problem(adata, source, obs_columns, var_columns)], source)


class ExpressionCheck:
    """The expression checks, over blocks of cells: ``add`` each block, then ``finish``
    raises ``ValueError`` for non-finite or negative values (with their counts) and for raw
    counts, and warns when the values look normalised but not log-transformed."""

    def __init__(self):
        self.non_finite = self.negative = 0
        self.minimum, self.maximum = np.inf, -np.inf
        self.whole = True  # every finite value so far is a whole number

    def add(self, block) -> None:
        """Check a block of cells: dense, or sparse (its stored values: the others are zeros)."""
        block = block.data if sp.issparse(block) else block
        finite = np.isfinite(block)
        self.non_finite += int(block.size - np.count_nonzero(finite))
        values = block if finite.all() else block[finite]
        if values.size:
            self.negative += int(np.count_nonzero(values < 0))
            self.minimum, self.maximum = min(self.minimum, values.min()), max(self.maximum, values.max())
            self.whole = self.whole and bool(np.all(values == np.trunc(values)))

    @property
    def raw_counts(self) -> bool:
        """Whole numbers above what log1p of a cell normalised to 1e4 counts can reach."""
        return self.whole and self.maximum > LOG_NORMALISED_MAX

    def problems(self, source: str) -> list[Problem]:
        """What the values seen say of log-normalised expression: non-finite or negative
        values and raw counts stop it; normalised values that look not log-transformed are a
        warning."""
        problems = []
        if self.non_finite:
            problems.append(
                Problem(
                    "expression",
                    f"{source} has {self.non_finite} non-finite expression values "
                    "(NaN or inf); GEARS needs log-normalised, finite expression",
                )
            )
        if self.negative:
            problems.append(
                Problem(
                    "expression",
                    f"{source} has {self.negative} negative expression values (min "
                    f"{self.minimum:.4g}); GEARS needs non-negative log-normalised "
                    "expression (normalise_total + log1p)",
                )
            )
        if self.raw_counts:
            problems.append(
                Problem(
                    "expression",
                    f"{source} holds raw counts (whole numbers up to {self.maximum:.0f}); "
                    "GEARS needs log-normalised expression: process the screen with "
                    "normalize=True (gears-ddp process --normalize), which normalises "
                    "each cell to 1e4 counts and takes log1p",
                )
            )
        elif self.maximum > NOT_LOG_TRANSFORMED:
            problems.append(
                Problem(
                    "expression",
                    f"{source}: maximum expression {self.maximum:.1f} looks normalised but "
                    "not log-transformed; GEARS expects log-normalised data "
                    "(normalise_total to 1e4, then log1p)",
                    stops=False,
                )
            )
        return problems

    def finish(self, source: str) -> None:
        """Raise ``ScreenProblems`` for the ``problems`` that stop the expression; log the warnings."""
        problems = self.problems(source)
        refuse(problems, source)
        for problem in problems:
            logger.warning("%s", problem)


def check_expression(matrix, source: str) -> None:
    """The ``ExpressionCheck`` of a whole matrix, read a block of cells at a time."""
    check = ExpressionCheck()
    for _, block in row_blocks(matrix):
        check.add(block)
    check.finish(source)


def annotation_problems(adata, source: str = "the AnnData", screen_columns=None) -> list[Problem]:
    """The problems of the columns, conditions, control cells, cell type and gene names that
    processing relies on (the expression is checked as it is read: ``ExpressionCheck``);
    ``screen_columns``: the ``obs`` columns of the screen as it came (``missing_columns_problem``)."""
    problems = [missing_columns_problem(adata, source, screen_columns=screen_columns)]
    if "condition" in adata.obs.columns:
        conditions = adata.obs["condition"].astype(object)
        problems.append(malformed_conditions_problem(conditions, f"{source} obs['condition']"))
        if not (conditions == CONTROL).any():
            problems.append(
                Problem(
                    "control label",
                    f"{source} has no control cells (obs['condition'] == 'ctrl'); "
                    "GEARS pairs each perturbed cell with a control cell: label "
                    "them 'ctrl', or name the screen's own column and control "
                    "label (gears-ddp process --perturbation-column, "
                    "--control-label)",
                )
            )
    if "cell_type" in adata.obs.columns:
        cell_types = pd.unique(adata.obs["cell_type"].astype(object))
        if len(cell_types) != 1:
            problems.append(
                Problem(
                    "cell type",
                    f"{source} has {len(cell_types)} cell types {list(cell_types)[:10]}; "
                    "GEARS models one cell type per dataset: subset the AnnData first",
                )
            )
    if "gene_name" in adata.var.columns:
        gene_names = adata.var["gene_name"].astype(str)
        duplicated = sorted(set(gene_names[gene_names.duplicated()]))
        if duplicated:
            problems.append(
                Problem(
                    "duplicates",
                    f"{source} var['gene_name'] repeats genes {duplicated[:10]}; gene "
                    "names must be unique: keep one row per gene (drop or sum the "
                    "repeats)",
                )
            )
    return [problem for problem in problems if problem is not None]


def validate_annotations(adata, source: str = "the AnnData") -> None:
    """Refuse, naming them all, the ``annotation_problems`` of ``adata``."""
    refuse(annotation_problems(adata, source), source)


class ExpressionReading:
    """What processing reads from the expression of ``obs``'s cells, a block of cells at a
    time (``add``): the ``ExpressionCheck``, and, with ``de``, per condition (``conditions``,
    in order of appearance) the sums of the values, of their squares and of the non-zero
    values, which the DE ranking and the gene sets are computed from; the conditions
    ``unranked`` (``unranked_conditions``) get neither."""

    def __init__(self, obs: pd.DataFrame, n_genes: int, de: bool = True, unranked: frozenset[str] = frozenset()):
        self.unranked = unranked
        self.conditions, codes = coded_conditions(obs["condition"])
        self.row_of = {condition: row for row, condition in enumerate(self.conditions)}
        self.check = ExpressionCheck()
        self.sums = ConditionSums(codes, len(self.conditions), n_genes, (*MOMENTS, "nonzero") if de else ())

    def add(self, start: int, block) -> None:
        """Read the cells ``start, start + 1, ...`` (``block``, dense or CSR)."""
        self.check.add(block)
        if self.sums.sums:
            self.sums.add(start, block)

    def rows(self, conditions) -> np.ndarray:
        """The rows of the sums of ``conditions``."""
        return np.array([self.row_of[condition] for condition in conditions], dtype=np.int64)


def read_expression(
    adata, source: str = "the AnnData", de: bool = True, unranked: frozenset[str] = frozenset()
) -> ExpressionReading:
    """The ``ExpressionReading`` of ``adata``'s expression (in memory or backed), read a block
    of cells at a time, its checks passed; ``unranked``: conditions left out of the DE genes."""
    reading = ExpressionReading(adata.obs, adata.n_vars, de, unranked)
    for start, block in row_blocks(adata.X, dense=False):
        reading.add(start, block)
    reading.check.finish(source)
    return reading


def unranked_conditions(obs: pd.DataFrame, keep: np.ndarray) -> frozenset[str]:
    """The conditions left out of the DE ranking: those of fewer than two cells (whose DE
    genes are undefined) that processing drops whole (``keep``: the cells it keeps, e.g.
    those of genes with GO terms), so no model is trained or scored on them. Any other
    condition of fewer than two cells is refused (``check_de_group_sizes``)."""
    conditions, codes = coded_conditions(obs["condition"])
    cells = np.bincount(codes, minlength=len(conditions))
    kept = np.bincount(codes[keep], minlength=len(conditions))
    return frozenset(condition for condition, n, k in zip(conditions, cells, kept) if n < 2 and k == 0)


def kept_with_de_genes(adata, name: str, keep: np.ndarray) -> np.ndarray:
    """The cells ``keep`` of dataset ``name`` (a processed ``adata``, or its
    ``io.H5adParts``) less those of conditions without DE genes: every condition but the
    control needs its entries in ``uns[RANK_KEY]`` and ``uns['non_zeros_gene_idx']``, which
    training's loss and the DE metrics read (a dataset without DE genes keeps every cell).
    Processing ranks no condition of fewer than two cells, whose cells it drops; a
    perturbation vocabulary that covers its genes would keep it, so it is dropped here, with
    a warning naming it."""
    rankings = [adata.uns[key] for key in (RANK_KEY, "non_zeros_gene_idx") if key in adata.uns]
    if not rankings:
        return keep
    conditions, codes = coded_conditions(adata.obs["condition"])
    names = first_cell_values(adata.obs["condition_name"], codes)
    ranked = np.array(
        [
            condition == CONTROL or all(names[code] in ranking for ranking in rankings)
            for code, condition in enumerate(conditions)
        ]
    )
    kept_cells = np.bincount(codes[keep], minlength=len(conditions))
    dropped = [
        f"{conditions[code]} ({kept_cells[code]} cell{'s' if kept_cells[code] != 1 else ''})"
        for code in np.flatnonzero(~ranked & (kept_cells > 0))
    ]
    if dropped:
        logger.warning(
            "dataset %s: dropping %d condition(s) without DE genes (uns['%s']), which training's loss and the DE "
            "metrics read: %s; a condition of fewer than two cells has none (its DE genes are undefined)",
            name,
            len(dropped),
            RANK_KEY,
            listed(dropped),
        )
    return keep & ranked[codes]


def prepare_for_reading(adata, de: bool = True, unranked: frozenset[str] = frozenset()) -> None:
    """Add the processed condition columns to the validated ``adata`` and, with ``de``, refuse
    the conditions whose DE genes are undefined, but those ``unranked``: both before any
    expression is read."""
    add_condition_columns(adata)
    if de:
        check_de_group_sizes(adata, unranked)


def check_de_group_sizes(adata, unranked: frozenset[str] = frozenset()) -> None:
    """Refuse, before any expression is read, conditions whose DE genes are undefined (after
    ``add_condition_columns``: they are named by their ``condition_name``), but those
    ``unranked``, which get none."""
    conditions, codes = coded_conditions(adata.obs["condition"])
    names = dict(zip(adata.obs["condition"].astype(str), adata.obs["condition_name"].astype(str)))
    ranked = [code for code, condition in enumerate(conditions) if condition not in unranked]
    check_group_sizes(np.bincount(codes, minlength=len(conditions))[ranked], [names[conditions[c]] for c in ranked])


def add_condition_columns(adata) -> None:
    """Add ``dose_val``, ``control`` and ``condition_name`` to ``obs`` (all categorical)."""
    conditions = adata.obs["condition"].astype(str)
    two_part = conditions.str.count(r"\+") == 1
    adata.obs["dose_val"] = np.where(two_part, "1+1", "1")
    adata.obs["control"] = np.where(two_part, 0, 1)
    adata.obs["condition_name"] = adata.obs["cell_type"].astype(str) + "_" + conditions + "_" + adata.obs["dose_val"]
    adata.obs = adata.obs.astype("category")


def rank_de_genes(adata, reading: ExpressionReading) -> None:
    """Rank all genes of each condition (but ``reading.unranked``) against control into
    ``uns[RANK_KEY]`` (``{condition_name: [gene ids]}``, scanpy's t-test ranking: see
    ``de_genes``), from the sums of ``reading``."""
    names = adata.obs["condition_name"].astype("category")
    condition_of = dict(zip(adata.obs["condition_name"].astype(str), adata.obs["condition"].astype(str)))
    groups = [str(group) for group in names.cat.categories if condition_of[str(group)] not in reading.unranked]
    rows = reading.rows([condition_of[group] for group in groups])
    sums = reading.sums
    control = groups.index(str(names[(adata.obs["condition"] == CONTROL).to_numpy()].iloc[0]))
    scores, _ = welch_t_test_of_sums(
        sums.counts[rows], sums.mean("sum")[rows], sums.mean("sum_squares")[rows], groups, control
    )
    gene_ids = np.asarray(adata.var_names).astype(str)
    adata.uns[RANK_KEY] = {
        group: gene_ids[order_by_magnitude(scores[code])].tolist()
        for code, group in enumerate(groups)
        if code != control
    }


def top_de_positions(uns, var_names: pd.Index, condition_name: str) -> np.ndarray:
    """Positions, in gene order, of the ``N_TOP_DE`` top-ranked genes of a condition in
    ``uns[RANK_KEY]``: the published loaders' ``de_idx`` (empty without a ranking)."""
    ranked = uns.get(RANK_KEY, {}).get(condition_name)
    if ranked is None:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(pd.Index(var_names).isin(list(ranked)[:N_TOP_DE]))


def add_dropout_gene_sets(adata, reading: ExpressionReading) -> None:
    """Add the non-zero / non-dropout gene sets and their top-20 DE genes to ``uns``.

    Non-zero genes of a condition: some cell of it has a non-zero value. Non-dropout genes:
    non-zero, or zero both in the condition and in control.
    """
    nonzero, row_of = reading.sums.sums["nonzero"] > 0, reading.row_of
    control_zero = ~nonzero[row_of[CONTROL]]
    name_to_condition = dict(zip(adata.obs["condition_name"].astype(str), adata.obs["condition"].astype(str)))
    gene_ids = np.asarray(adata.var_names)
    position_of = pd.Index(gene_ids)

    sets: dict[str, dict[str, np.ndarray]] = {
        key: {} for key in ("top_non_dropout_de_20", "non_dropout_gene_idx", "non_zeros_gene_idx", "top_non_zero_de_20")
    }
    for name, ranked_ids in adata.uns[RANK_KEY].items():
        nonzero_mask = nonzero[row_of[name_to_condition[name]]]
        non_dropout_mask = nonzero_mask | control_zero
        ranked = position_of.get_indexer(list(ranked_ids))
        sets["non_zeros_gene_idx"][name] = np.flatnonzero(nonzero_mask)
        sets["non_dropout_gene_idx"][name] = np.flatnonzero(non_dropout_mask)
        sets["top_non_zero_de_20"][name] = gene_ids[ranked[nonzero_mask[ranked]][:N_TOP_DE]]
        sets["top_non_dropout_de_20"][name] = gene_ids[ranked[non_dropout_mask[ranked]][:N_TOP_DE]]
    adata.uns.update(sets)


def add_de_entries(adata, reading: ExpressionReading) -> None:
    """Add the DE ranking and the gene sets to ``uns`` from the sums of ``reading`` (none
    when it was read without them), after ``add_condition_columns``."""
    if reading.sums.sums:
        logger.info("ranking differentially expressed genes for %d conditions", len(reading.conditions) - 1)
        rank_de_genes(adata, reading)
        add_dropout_gene_sets(adata, reading)
