"""A screen checked whole before it is processed: every problem at once, each with its fix.

``check_screen`` reads a screen, raw or processed, as ``PertData.new_data_process`` (and,
for each split asked for, ``PertData.prepare_split``) would take it, and processes nothing:
it writes no file and changes nothing of the screen. It says what it finds (the conditions
and their cells, which perturbed genes are measured and which have GO terms, what the
expression holds and what normalisation will do with it, each split's sets) and every
``Problem``, in one ``ScreenReport``. The checks are those of the processing path itself
(``raw_screens``, ``processing``, ``normalization``, ``de_genes``, ``go_coverage``,
``splits``), so a screen this passes is processed and split without an error, and a problem
reads the same here as where processing would meet it. ``PertData.check_screen`` is the
entry point: it knows the GO files; ``new_data_process`` runs it first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.data import normalization, processing, raw_screens
from gears_ddp.data.conditions import CONTROL, coded_conditions, genes_of_conditions, is_combo, malformed_conditions
from gears_ddp.data.de_genes import small_groups_problem
from gears_ddp.data.go_coverage import coverage_problems, go_coverage
from gears_ddp.data.grouped import row_blocks
from gears_ddp.data.screen_report import Problem, ScreenReport, listed
from gears_ddp.data.splits import (
    ALL_SETS,
    CUSTOM_SPLIT_ADVICE,
    SPLIT_FRACTIONS,
    SUBGROUP_NAMES,
    TOO_FEW_PERTURBATIONS,
    read_custom_split,
    sets_of_split,
    sets_without_perturbations,
    split_conditions,
    split_option_problems,
    split_set_problems,
)

if TYPE_CHECKING:  # imported where an AnnData is built, not by every process that imports this module
    import anndata

logger = get_logger(__name__)

FEW_CELLS = 10  # a condition of fewer cells has a mean (what training fits and metrics score) of little weight
# the topics of the warnings processing logs from the check, as it says them in no other words:
# perturbed genes that are not measured (gene ids where symbols are wanted), conditions of few cells
PROCESSING_OMITS = ("perturbed genes", "cells per condition")
SEEDS_TRIED = 20  # split seeds tried for one that gives every set perturbations, when the one asked for does not
COMBINATION_SPLITS = ("combo_seen0", "combo_seen1", "combo_seen2")


@dataclass(frozen=True)
class GoVocabulary:
    """The perturbation vocabulary processing would use (the genes with GO terms a model may
    perturb; None when it is not known without a download), where its GO terms come from
    (or why it is not known), and the vocabulary of the data folder's GO files that it
    would replace, if any (``replaces``: what a GO file of the user's adds)."""

    genes: frozenset[str] | None
    origin: str
    replaces: "GoVocabulary | None" = None


def screen_source(name: str) -> str:
    """How messages name the screen of dataset ``name`` (as ``new_data_process`` names it)."""
    return f"AnnData for dataset {name!r}"


def check_screen(
    adata,
    name: str = "screen",
    *,
    perturbation_column: str | None = None,
    control_label: str | None = None,
    combination_separator: str | None = None,
    normalize: bool = False,
    n_top_genes: int | None = None,
    de: bool = True,
    drop_unannotated: bool = True,
    vocabulary: Callable[[anndata.AnnData], GoVocabulary] | None = None,
    splits: Sequence[dict] = (),
    read_expression: bool = True,
) -> ScreenReport:
    """The ``ScreenReport`` of ``adata`` (in memory or backed) taken as
    ``new_data_process(name, adata, ...)`` takes it with the same options (``de``: not
    ``skip_calc_de``), and split with each of ``splits`` (``prepare_split``'s options, all
    of them given). ``vocabulary`` gives, for the screen's annotations (``obs`` with GEARS's
    ``condition`` column, ``var`` with ``gene_name``), the ``GoVocabulary`` processing would
    use; without it the GO terms are not checked (a warning says so).
    ``read_expression=False`` leaves out the one check that reads the expression (a pass
    over every cell)."""
    source = screen_source(name)
    report = ScreenReport(source)
    report.fact("cells and genes", f"{adata.n_obs} cells x {adata.n_vars} genes")
    empty = _empty_screen_problem(adata, source)
    if empty is not None:  # every other check would only describe the emptiness
        report.add([empty])
        return report
    report.add(normalization.option_problems(normalize, n_top_genes))
    report.add(_duplicate_problems(adata, source))
    annotations = _gears_annotations(adata, name, perturbation_column, control_label, combination_separator, report)
    if annotations is not None:
        cells = _check_conditions(annotations, perturbation_column, report)
        go_vocabulary = _screen_vocabulary(annotations, vocabulary)
        staying = _staying(cells, go_vocabulary, drop_unannotated)
        _check_cells(staying, de, report)
        _check_measured(annotations, staying, report)
        kept = _check_go_terms(cells, go_vocabulary, name, drop_unannotated, report)
        if any(condition != CONTROL for condition in kept):
            for options in splits:
                _check_split(kept, options, report)
    if read_expression:
        _check_expression(adata.X, source, normalize, n_top_genes, report)
    return report


def _gears_annotations(
    adata, name: str, perturbation_column, control_label, combination_separator, report: ScreenReport
) -> anndata.AnnData | None:
    """The screen's annotations (no expression) with GEARS's columns written as processing
    writes them, only the cells whose condition is well formed, after their problems are
    reported; None when the conditions cannot be read (the problems say why)."""
    import anndata

    source = report.source
    annotations = anndata.AnnData(obs=adata.obs.copy(), var=adata.var.copy())
    conditions, problems = raw_screens.gears_column_problems(
        annotations, perturbation_column, control_label, combination_separator, source
    )
    report.add(problems)
    if perturbation_column is not None and conditions is None:
        return None
    for note in raw_screens.write_gears_columns(annotations, name, perturbation_column, conditions, source):
        report.fact("columns", note)
    if "condition" in annotations.obs.columns:  # cells whose label makes no condition are named above
        annotations = annotations[annotations.obs["condition"].notna().to_numpy()]
    report.add(processing.annotation_problems(annotations, source, screen_columns=list(adata.obs.columns)))
    if "condition" not in annotations.obs.columns:
        return None
    column = annotations.obs["condition"].astype(object)
    well_formed = ~column.isin(list(malformed_conditions(column.unique()))).to_numpy()
    return annotations[well_formed] if not well_formed.all() else annotations


def _empty_screen_problem(adata, source: str) -> Problem | None:
    """A screen without cells or without genes, named for what it is: nothing to train on."""
    missing = [what for what, count in (("cells", adata.n_obs), ("genes", adata.n_vars)) if count == 0]
    if not missing:
        return None
    return Problem(
        "cells and genes",
        f"{source} has no {' and no '.join(missing)} ({adata.n_obs} cells x "
        f"{adata.n_vars} genes), so there is nothing to train on; give the screen's "
        "own file (cells or genes chosen by names that match none leave it empty)",
    )


def _duplicate_problems(adata, source: str) -> list[Problem]:
    """Repeated gene ids (``var_names``: the DE genes are stored by id) stop the screen;
    repeated cell names (a cell twice, or files joined without unique names) are a warning."""
    problems = []
    genes = pd.Index(adata.var_names)
    if genes.has_duplicates:
        problems.append(
            Problem(
                "duplicates",
                f"{source} var_names repeat gene ids "
                f"{listed(sorted(set(genes[genes.duplicated()])))}; gene ids must be "
                "unique: keep one row per gene, or make them unique "
                "(adata.var_names_make_unique())",
            )
        )
    cells = pd.Index(adata.obs_names)
    if cells.has_duplicates:
        repeated = sorted(set(cells[cells.duplicated()]))
        problems.append(
            Problem(
                "duplicates",
                f"{source} obs_names repeat {len(repeated)} cell name(s) "
                f"({listed(repeated, 5)}); if the screen joins files of several "
                "lanes or samples, make the names unique "
                "(adata.obs_names_make_unique()); if a cell is there twice, remove "
                "the copy",
                stops=False,
            )
        )
    return problems


def _check_conditions(annotations, perturbation_column, report: ScreenReport) -> dict[str, int]:
    """The cells of each condition (in the screen's order), told as facts."""
    conditions, codes = coded_conditions(annotations.obs["condition"])
    cells = dict(zip(conditions, np.bincount(codes, minlength=len(conditions)).tolist()))
    perturbations = [condition for condition in conditions if condition != CONTROL]
    combos = sum(is_combo(condition) for condition in perturbations)
    column = f"obs[{perturbation_column!r}]" if perturbation_column else "obs['condition']"
    report.fact(
        "conditions",
        f"{len(perturbations)} perturbations from {column} ({len(perturbations) - combos} "
        f"single-gene, {combos} two-gene) and the control",
    )
    counts = [cells[condition] for condition in perturbations]
    if counts:
        report.fact(
            "cells per condition",
            f"{cells.get(CONTROL, 0)} control cells; perturbations {min(counts)} to "
            f"{max(counts)} cells (median {int(np.median(counts))})",
        )
    return cells


def _staying(cells: dict[str, int], vocabulary: GoVocabulary, drop_unannotated: bool) -> dict[str, int]:
    """The conditions (with their cells) whose cells processing keeps: with
    ``drop_unannotated``, those the GO vocabulary covers (all when it is not known); without
    it, all (the uncovered ones are refused, not dropped: ``_check_go_terms`` names them)."""
    if not drop_unannotated or vocabulary.genes is None:
        return cells
    return {condition: cells[condition] for condition in go_coverage(cells, vocabulary.genes).kept}


def _check_cells(cells: dict[str, int], de: bool, report: ScreenReport) -> None:
    """Problems of the cells per condition (``cells``: the conditions processing keeps; one it
    drops is not trained on, and gets no DE genes if it has fewer than two cells): a
    condition of fewer than two cells stops the DE genes; fewer than ``FEW_CELLS`` is a
    warning."""
    if de:
        report.add([small_groups_problem(np.array(list(cells.values())), list(cells))])
    few = [f"{condition} ({n})" for condition, n in cells.items() if (2 if de else 0) <= n < FEW_CELLS]
    if few:
        report.add(
            [
                Problem(
                    "cells per condition",
                    f"{len(few)} condition(s) have fewer than {FEW_CELLS} cells: "
                    f"{listed(few)}; their mean, which training fits and the "
                    "metrics score, rests on few cells: collect more, or remove "
                    "them",
                    stops=False,
                )
            ]
        )


def _check_measured(annotations, cells: dict[str, int], report: ScreenReport) -> None:
    """Perturbed genes (of the conditions ``cells``: those whose cells processing keeps)
    that ``var['gene_name']`` lacks are a warning (GEARS predicts them from the GO graph,
    but their own expression is not seen), naming a ``var`` column that holds more of them,
    if there is one."""
    perturbed = set(genes_of_conditions(cells))
    if not perturbed or "gene_name" not in annotations.var.columns:
        return
    columns = {
        f"var[{column!r}]": values
        for column, values in annotations.var.items()
        if not pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    }
    columns["var_names"] = annotations.var_names
    found = {column: perturbed & set(values.astype(str)) for column, values in columns.items()}
    measured = found["var['gene_name']"]
    unmeasured = sorted(perturbed - measured)
    report.fact("perturbed genes", f"{len(measured)} of {len(perturbed)} measured (var['gene_name'])")
    if not unmeasured:
        return
    best = max(found, key=lambda column: len(found[column]))
    hint = f" ({best} holds {len(found[best])} of the {len(perturbed)})" if len(found[best]) > len(measured) else ""
    report.add(
        [
            Problem(
                "perturbed genes",
                f"{len(unmeasured)} perturbed gene(s) are not among the measured genes "
                f"(var['gene_name']): {listed(unmeasured)}; GEARS predicts them from the "
                "GO graph, but their own expression is not seen: if var names them "
                f"otherwise, give var['gene_name'] the symbols the labels use{hint}",
                stops=False,
            )
        ]
    )


def _screen_vocabulary(annotations, vocabulary: Callable[[anndata.AnnData], GoVocabulary] | None) -> GoVocabulary:
    """The ``GoVocabulary`` ``vocabulary`` gives the screen's ``annotations``, or one that
    says why there is none to check against."""
    if vocabulary is None:
        return GoVocabulary(None, "no GO files were given")
    if "gene_name" not in annotations.var.columns:
        return GoVocabulary(None, "they are checked once var['gene_name'] is there")
    return vocabulary(annotations)


def _check_go_terms(
    cells: dict[str, int], vocabulary: GoVocabulary, name: str, drop_unannotated: bool, report: ScreenReport
) -> list[str]:
    """The conditions processing keeps (in order): those whose genes have GO terms
    (``go_coverage``), or all of them when the GO terms are not known; what a GO file of
    the user's adds to the data folder's GO files."""
    if vocabulary.genes is None:
        report.add(
            [Problem("GO terms", f"the perturbed genes' GO terms are not checked: {vocabulary.origin}", stops=False)]
        )
        return list(cells)
    coverage = go_coverage(cells, vocabulary.genes)
    covered = len(coverage.perturbed) - len(coverage.outside)
    report.fact(
        "GO terms",
        f"{covered} of {len(coverage.perturbed)} perturbed genes have GO terms in "
        f"{vocabulary.origin} (a perturbation vocabulary of {len(vocabulary.genes)} genes)",
    )
    earlier = vocabulary.replaces
    if earlier is not None and earlier.genes is not None:
        added = [gene for gene in coverage.perturbed if gene in vocabulary.genes and gene not in earlier.genes]
        lost = [gene for gene in coverage.perturbed if gene in earlier.genes and gene not in vocabulary.genes]
        report.fact(
            "GO terms",
            f"{vocabulary.origin} adds {len(added)} perturbed gene(s) that {earlier.origin} "
            f"leave(s) out"
            + (f": {listed(added)}" if added else "")
            + (f"; it leaves out {len(lost)} that they cover: {listed(lost)}" if lost else ""),
        )
    report.add(coverage_problems(coverage, name, vocabulary.origin, drop_unannotated))
    return coverage.kept


def _check_split(conditions: list[str], options: dict, report: ScreenReport) -> None:
    """How many perturbations each set of a split (``prepare_split``'s ``options``, all
    given) gets, the subgroups of a simulation split, and whether a set it needs is empty."""
    split, seed = options["split"], options["seed"]
    topic = f"split {split}, seed {seed}"
    problems = split_option_problems(split, seed, **{name: options[name] for name in SPLIT_FRACTIONS})
    if not problems:
        try:
            sets, subgroups = _split_sets(conditions, options)
        except (ValueError, FileNotFoundError) as refused:  # a split type the screen cannot have, a bad split file
            problems = [Problem("split", str(refused))]
        else:
            empty = sets_without_perturbations(sets, sets_of_split(split))
            problems = split_set_problems(
                sets,
                conditions,
                sets_of_split(split),
                f"split {split!r} with seed {seed}",
                _advice(conditions, options) if empty else TOO_FEW_PERTURBATIONS,
            )
            report.fact(topic, _split_summary(sets, subgroups))
            problems += _empty_subgroup_problems(conditions, subgroups)
    report.add(replace(problem, topic=topic) for problem in problems)


def _split_sets(conditions: list[str], options: dict) -> tuple[dict, dict | None]:
    """The sets (and the subgroups, for a simulation split) ``prepare_split`` would make."""
    if options["split"] == "custom":
        return read_custom_split(options["split_dict_path"]), None
    result = split_conditions(
        conditions,
        options["split"],
        options["seed"],
        options["train_gene_set_size"],
        options["combo_seen2_train_frac"],
        options["combo_single_split_test_set_fraction"],
        options["test_perts"],
        options["only_test_set_perts"],
        options["test_pert_genes"],
    )
    return result.set2conditions, result.subgroup


def _perturbations(conditions) -> int:
    return sum(condition != CONTROL for condition in conditions)


def _split_summary(sets: dict, subgroups: dict | None) -> str:
    """The perturbations of each set, then of each subgroup of a simulation split that has
    some: ``'train 16, val 2, test 6 perturbations; test: unseen_single 6; ...'``."""
    text = ", ".join(f"{name} {_perturbations(sets[name])}" for name in ALL_SETS if name in sets) + " perturbations"
    for where, groups in (subgroups or {}).items():  # test_subgroup, val_subgroup
        sizes = [f"{group} {len(members)}" for group, members in groups.items() if members]
        if sizes:
            text += f"; {where.removesuffix('_subgroup')}: {', '.join(sizes)}"
    return text


def _advice(conditions: list[str], options: dict) -> str:
    """What to do when a split leaves a set it needs empty: another split type for a screen
    without the combinations the split tests, the seeds that work, or more perturbations."""
    split = options["split"]
    if split in COMBINATION_SPLITS and not any(is_combo(condition) for condition in conditions):
        return (
            f"the screen has single-gene perturbations only, and a {split} split tests two-gene combinations: "
            "use split 'simulation' or 'single'"
        )
    if split == "custom":
        return CUSTOM_SPLIT_ADVICE
    working = []
    for seed in range(SEEDS_TRIED):
        try:
            sets, _ = _split_sets(conditions, {**options, "seed": seed})
        except ValueError:  # test genes this seed cannot make room for
            continue
        if not sets_without_perturbations(sets, sets_of_split(split)):
            working.append(seed)
    if working:
        return f"split seeds that give every set perturbations: {listed(working, 5)} (of 0 to {SEEDS_TRIED - 1})"
    return f"{TOO_FEW_PERTURBATIONS} (it has {_perturbations(conditions)} perturbations)"


def _empty_subgroup_problems(conditions: list[str], subgroups: dict | None) -> list[Problem]:
    """A simulation split of a screen with combinations whose test set lacks a subgroup:
    a warning, as the subgroup's metrics will be missing."""
    if not subgroups or not any(is_combo(condition) for condition in conditions):
        return []
    empty = [group for group in SUBGROUP_NAMES if not subgroups["test_subgroup"].get(group)]
    if not empty:
        return []
    return [
        Problem(
            "split",
            f"the test set has no {' and no '.join(empty)} perturbations, so their metrics will be "
            "missing; another split seed or train_gene_set_size may give them some",
            stops=False,
        )
    ]


def _check_expression(matrix, source: str, normalize: bool, n_top_genes: int | None, report: ScreenReport) -> None:
    """What the expression holds (read a block of cells at a time, as processing reads it),
    what normalisation will do with it, and its problems: those of raw counts with
    ``normalize``, of log-normalised expression without."""
    check = processing.ExpressionCheck()
    for _, block in row_blocks(matrix, dense=False):
        check.add(block)
    if check.maximum > -np.inf:
        report.fact(
            "expression",
            ("whole numbers" if check.whole else "values, not all whole numbers,")
            + f" up to {check.maximum:.4g}"
            + (" (raw counts)" if check.raw_counts else ""),
        )
    if normalize:
        report.fact(
            "expression",
            f"normalisation (--normalize) scales each cell to "
            f"{normalization.TARGET_SUM:.0e} counts, then takes log1p"
            + (
                f"; then {n_top_genes} highly variable genes ({normalization.HVG_FLAVOR}, on the "
                "counts) and every measured perturbed gene are kept"
                if n_top_genes
                else ""
            ),
        )
        report.add(normalization.counts_problems(check, source))
    else:
        report.fact("expression", "taken as log-normalised, as it is (no normalisation)")
        report.add(check.problems(source))


def log_warnings_processing_omits(report: ScreenReport) -> None:
    """Log the warnings of a screen's ``report`` that processing says in no other words
    (``PROCESSING_OMITS``), as it processes the screen."""
    for warning in report.warnings:
        if warning.topic in PROCESSING_OMITS:
            logger.warning("%s", warning)
