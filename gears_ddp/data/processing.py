"""From a raw AnnData to the processed GEARS form (``perturb_processed.h5ad``).

Input: log-normalised expression, ``obs['condition']``, ``obs['cell_type']`` and
``var['gene_name']``. Output (same AnnData, in place): ``obs`` columns ``condition_name``,
``dose_val`` and ``control``; ``uns`` entries ``rank_genes_groups_cov_all`` (all genes
ranked as scanpy's t-test against control with ``rankby_abs=True`` ranks them: see
``de_genes``), ``top_non_dropout_de_20``, ``top_non_zero_de_20``, ``non_zeros_gene_idx``
and ``non_dropout_gene_idx``, exactly as the published GEARS writes them. The gene-set
bookkeeping is vectorised over genes: per-condition sums over blocks of cells
(``grouped.condition_means``) give which genes are non-zero in which condition.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.data.conditions import CONTROL, validate_conditions
from gears_ddp.data.de_genes import order_by_magnitude, welch_t_scores
from gears_ddp.data.grouped import condition_means, row_blocks

logger = get_logger(__name__)

REQUIRED_OBS = ("condition", "cell_type")
REQUIRED_VAR = ("gene_name",)
N_TOP_DE = 20
RANK_KEY = "rank_genes_groups_cov_all"
LOG_NORMALISED_MAX = float(np.log1p(1e4))  # the largest log1p value of a cell normalised to 1e4 counts


def check_columns(adata, source: str, obs_columns=REQUIRED_OBS, var_columns=REQUIRED_VAR) -> None:
    """Raise ``ValueError`` naming every required ``obs`` / ``var`` column that is missing."""
    missing = [f"obs[{c!r}]" for c in obs_columns if c not in adata.obs.columns]
    missing += [f"var[{c!r}]" for c in var_columns if c not in adata.var.columns]
    if missing:
        raise ValueError(f"{source} lacks required column(s) {', '.join(missing)}; GEARS data needs "
                         "obs['condition'] ('ctrl', 'A+ctrl', 'A+B'), obs['cell_type'] and var['gene_name']")


class ExpressionCheck:
    """The expression checks, over blocks of cells: ``add`` each block, then ``finish``
    raises ``ValueError`` for non-finite or negative values (with their counts) and for raw
    counts, and warns when the values look normalised but not log-transformed."""

    def __init__(self):
        self.non_finite = self.negative = 0
        self.minimum, self.maximum = np.inf, -np.inf
        self.whole = True  # every finite value so far is a whole number

    def add(self, block: np.ndarray) -> None:
        finite = np.isfinite(block)
        self.non_finite += int(block.size - np.count_nonzero(finite))
        values = block if finite.all() else block[finite]
        if values.size:
            self.negative += int(np.count_nonzero(values < 0))
            self.minimum, self.maximum = min(self.minimum, values.min()), max(self.maximum, values.max())
            self.whole = self.whole and bool(np.all(np.mod(values, 1) == 0))

    @property
    def raw_counts(self) -> bool:
        """Whole numbers above what log1p of a cell normalised to 1e4 counts can reach."""
        return self.whole and self.maximum > LOG_NORMALISED_MAX

    def finish(self, source: str) -> None:
        if self.non_finite:
            raise ValueError(f"{source} has {self.non_finite} non-finite expression values (NaN or inf); "
                             "GEARS needs log-normalised, finite expression")
        if self.negative:
            raise ValueError(f"{source} has {self.negative} negative expression values (min {self.minimum:.4g}); "
                             "GEARS needs non-negative log-normalised expression (normalise_total + log1p)")
        if self.raw_counts:
            raise ValueError(f"{source} holds raw counts (whole numbers up to {self.maximum:.0f}); GEARS needs "
                             "log-normalised expression: process the screen with normalize=True (gears-ddp process "
                             "--normalize), which normalises each cell to 1e4 counts and takes log1p")
        if self.maximum > 50:
            logger.warning("%s: maximum expression %.1f looks normalised but not log-transformed; GEARS expects "
                           "log-normalised data (normalise_total to 1e4, then log1p)", source, self.maximum)


def check_expression(matrix, source: str) -> None:
    """The ``ExpressionCheck`` of a whole matrix, read a block of cells at a time."""
    check = ExpressionCheck()
    for _, block in row_blocks(matrix):
        check.add(block)
    check.finish(source)


def validate_raw(adata, source: str = "the AnnData") -> None:
    """Check everything ``add_condition_columns`` and the DE step rely on, with clear errors."""
    check_columns(adata, source)
    conditions = adata.obs["condition"].astype(object)
    validate_conditions(conditions, f"{source} obs['condition']")
    if not (conditions == CONTROL).any():
        raise ValueError(f"{source} has no control cells (obs['condition'] == 'ctrl'); GEARS pairs "
                         "each perturbed cell with a control cell")
    cell_types = pd.unique(adata.obs["cell_type"].astype(object))
    if len(cell_types) != 1:
        raise ValueError(f"{source} has {len(cell_types)} cell types {list(cell_types)[:10]}; "
                         "GEARS models one cell type per dataset: subset the AnnData first")
    gene_names = adata.var["gene_name"].astype(str)
    duplicated = sorted(set(gene_names[gene_names.duplicated()]))
    if duplicated:
        raise ValueError(f"{source} var['gene_name'] repeats genes {duplicated[:10]}; gene names must be unique")
    check_expression(adata.X, source)


def add_condition_columns(adata) -> None:
    """Add ``dose_val``, ``control`` and ``condition_name`` to ``obs`` (all categorical)."""
    conditions = adata.obs["condition"].astype(str)
    two_part = conditions.str.count(r"\+") == 1
    adata.obs["dose_val"] = np.where(two_part, "1+1", "1")
    adata.obs["control"] = np.where(two_part, 0, 1)
    adata.obs["condition_name"] = (adata.obs["cell_type"].astype(str) + "_" + conditions + "_"
                                   + adata.obs["dose_val"])
    adata.obs = adata.obs.astype("category")


def rank_de_genes(adata) -> None:
    """Rank all genes of each condition against control into ``uns[RANK_KEY]``
    (``{condition_name: [gene ids]}``, scanpy's t-test ranking: see ``de_genes``)."""
    names = adata.obs["condition_name"].astype("category")
    groups, codes = list(names.cat.categories), names.cat.codes.to_numpy(np.int64)
    control = groups.index(str(names[(adata.obs["condition"] == CONTROL).to_numpy()].iloc[0]))
    scores = welch_t_scores(adata.X, codes, groups, control)
    gene_ids = np.asarray(adata.var_names).astype(str)
    adata.uns[RANK_KEY] = {group: gene_ids[order_by_magnitude(scores[code])].tolist()
                           for code, group in enumerate(groups) if code != control}


def nonzero_by_condition(adata) -> tuple[list[str], np.ndarray]:
    """Conditions (in order of appearance) and a (conditions x genes) mask of genes ever non-zero."""
    conditions = pd.Categorical(adata.obs["condition"].astype(str),
                                categories=pd.unique(adata.obs["condition"].astype(str)))
    nonzero_share = condition_means(adata.X, conditions.codes, len(conditions.categories), of=lambda b: b != 0)
    return list(conditions.categories), nonzero_share > 0


def add_dropout_gene_sets(adata) -> None:
    """Add the non-zero / non-dropout gene sets and their top-20 DE genes to ``uns``.

    Non-zero genes of a condition: mean expression over its cells is not zero. Non-dropout
    genes: non-zero, or zero both in the condition and in control.
    """
    conditions, nonzero = nonzero_by_condition(adata)
    row_of = {c: i for i, c in enumerate(conditions)}
    control_zero = ~nonzero[row_of[CONTROL]]
    name_to_condition = dict(zip(adata.obs["condition_name"].astype(str), adata.obs["condition"].astype(str)))
    gene_ids = np.asarray(adata.var_names)
    position_of = pd.Index(gene_ids)

    sets = {key: {} for key in ("top_non_dropout_de_20", "non_dropout_gene_idx",
                                "non_zeros_gene_idx", "top_non_zero_de_20")}
    for name, ranked_ids in adata.uns[RANK_KEY].items():
        nonzero_mask = nonzero[row_of[name_to_condition[name]]]
        non_dropout_mask = nonzero_mask | control_zero
        ranked = position_of.get_indexer(list(ranked_ids))
        sets["non_zeros_gene_idx"][name] = np.flatnonzero(nonzero_mask)
        sets["non_dropout_gene_idx"][name] = np.flatnonzero(non_dropout_mask)
        sets["top_non_zero_de_20"][name] = gene_ids[ranked[nonzero_mask[ranked]][:N_TOP_DE]]
        sets["top_non_dropout_de_20"][name] = gene_ids[ranked[non_dropout_mask[ranked]][:N_TOP_DE]]
    adata.uns.update(sets)


def process_raw(adata, skip_calc_de: bool = False, source: str = "the AnnData") -> None:
    """Validate ``adata`` and add every column and ``uns`` entry of the processed GEARS form."""
    validate_raw(adata, source)
    add_processed_entries(adata, skip_calc_de)


def add_processed_entries(adata, skip_calc_de: bool = False) -> None:
    """Add every column and ``uns`` entry of the processed GEARS form to a validated ``adata``."""
    add_condition_columns(adata)
    if not skip_calc_de:
        logger.info("ranking differentially expressed genes for %d conditions",
                    adata.obs["condition"].nunique() - 1)
        rank_de_genes(adata)
        add_dropout_gene_sets(adata)
