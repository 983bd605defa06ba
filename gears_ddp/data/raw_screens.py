"""A screen's own annotations in GEARS's terms: the ``condition`` and ``cell_type`` columns.

Screens name the perturbation of each cell in a column of their own (``target_gene``,
``gene``, ``perturbation``...), with a label of their own for control cells
(``non-targeting``, ``NT``, ``control``...) and, for combinations, genes joined by a
separator of their own (``FEV_SAMD1``, ``FEV+SAMD1``). GEARS reads ``obs['condition']``
written ``'ctrl'``, ``'A+ctrl'`` and ``'A+B'``, one ``obs['cell_type']`` and the gene symbols
in ``var['gene_name']``. ``add_gears_columns`` writes them from what the screen has.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.data.conditions import CONTROL
from gears_ddp.data.screen_report import Problem, listed, refuse

logger = get_logger(__name__)

MAX_LABEL_PROBLEMS = 10  # labels named one by one; the rest are counted


def gears_condition(label: str, control_label: str, separator: str | None) -> str:
    """The GEARS condition of one screen label: ``'ctrl'`` for the control label, ``'A+ctrl'``
    for one gene, ``'A+B'`` for two joined by ``separator``; a part equal to the control
    label (``'A_non-targeting'``) or to GEARS's ``'ctrl'`` stands for no gene. ``ValueError`` for a label of more than
    two genes, an empty gene, or one holding GEARS's ``'+'`` that no separator splits."""
    if label == control_label:
        return CONTROL
    parts = [part.strip() for part in (label.split(separator) if separator else [label])]
    genes = [part for part in parts if part not in (control_label, CONTROL)]
    if "" in genes:
        raise ValueError(f"label {label!r} has an empty gene name")
    if any("+" in gene for gene in genes):
        raise ValueError(
            f"label {label!r} holds '+', which GEARS reserves to join genes: give '+' as the "
            "combination separator if it joins two genes"
        )
    if len(genes) > 2:
        raise ValueError(f"label {label!r} names {len(genes)} genes; GEARS models one or two per cell")
    if len(genes) == 2 and genes[0] == genes[1]:
        raise ValueError(f"label {label!r} names gene {genes[0]!r} twice")
    if not genes:
        return CONTROL
    return genes[0] + "+" + (genes[1] if len(genes) == 2 else CONTROL)


def gears_conditions(
    obs: pd.DataFrame, column: str, control_label: str, separator: str | None, source: str
) -> tuple[pd.Categorical | None, list[Problem]]:
    """Each cell's GEARS condition from its label in ``obs[column]`` (see ``gears_condition``;
    missing where its label makes none), and the problems, whose texts name the column, the
    labels there are, or the labels at fault. The conditions are None when the column or its
    control label is missing."""
    if column not in obs.columns:
        return None, [
            Problem("condition column", f"{source} has no obs column {column!r}; its columns: {listed(obs.columns)}")
        ]
    labels = obs[column].astype("category").cat.remove_unused_categories()  # a string per label, not per cell
    problems = []
    missing = int(labels.isna().sum())
    if missing:
        problems.append(
            Problem(
                "condition column",
                f"{source}: {missing} cells have no label in obs[{column!r}]; "
                "label them (e.g. with the control label if they are controls) "
                "or remove them",
            )
        )
    counts = labels.value_counts()
    counts.index = counts.index.astype(str)
    has_control = control_label in counts.index
    if not has_control:
        shown = listed(f"{label} ({n})" for label, n in counts.items())
        problems.append(
            Problem(
                "control label",
                f"{source}: no cell of obs[{column!r}] has the control label "
                f"{control_label!r}; its labels, most frequent first: {shown}",
            )
        )
    conditions: list[str | None] = []
    bad: list[str] = []
    for label in labels.cat.categories.astype(str):
        try:
            conditions.append(gears_condition(label, control_label, separator))
        except ValueError as err:
            conditions.append(None)
            bad.append(f"{source} obs[{column!r}]: {err}")
    problems += [Problem("conditions", text) for text in bad[:MAX_LABEL_PROBLEMS]]
    if len(bad) > MAX_LABEL_PROBLEMS:
        problems.append(
            Problem(
                "conditions",
                f"{source} obs[{column!r}]: {len(bad) - MAX_LABEL_PROBLEMS} more "
                "labels make no GEARS condition; correct them as those above",
            )
        )
    if not has_control:
        return None, problems
    codes = labels.cat.codes.to_numpy()
    return pd.Categorical(np.asarray([*conditions, None], dtype=object)[codes]), problems


def gears_column_problems(
    adata,
    perturbation_column: str | None = None,
    control_label: str | None = None,
    combination_separator: str | None = None,
    source: str = "the AnnData",
) -> tuple[pd.Categorical | None, list[Problem]]:
    """The conditions of ``obs[perturbation_column]`` (None when it is not given, or cannot be
    read) and every problem of the options and of the column's labels; nothing is written."""
    if perturbation_column is None:
        if control_label is not None or combination_separator is not None:
            return None, [
                Problem(
                    "condition column",
                    "a control label or combination separator is read from a "
                    "perturbation column: give perturbation_column (gears-ddp process "
                    "--perturbation-column) too",
                )
            ]
        return None, []
    if control_label is None:
        return None, [
            Problem(
                "control label",
                f"perturbation_column {perturbation_column!r} needs the label of its "
                "control cells (control_label; gears-ddp process --control-label), "
                "e.g. 'non-targeting'",
            )
        ]
    return gears_conditions(adata.obs, perturbation_column, control_label, combination_separator, source)


def add_gears_columns(
    adata,
    cell_type: str,
    perturbation_column: str | None = None,
    control_label: str | None = None,
    combination_separator: str | None = None,
    source: str = "the AnnData",
) -> None:
    """Write ``obs['condition']`` from ``obs[perturbation_column]`` (when given, with its
    ``control_label`` and optional ``combination_separator``); when the screen has no
    ``obs['cell_type']``, one cell type ``cell_type`` for every cell; and, for a screen with
    its own perturbation column but no ``var['gene_name']`` (the Virtual Cell Challenge's
    file names its genes by ``var_names`` and keeps Ensembl ids in ``var['gene_id']``), the
    ``var_names`` as the gene symbols. Each filled-in column is logged. A problem of the
    options or the labels (``gears_column_problems``) is refused before anything is written."""
    conditions, problems = gears_column_problems(
        adata, perturbation_column, control_label, combination_separator, source
    )
    refuse(problems, source)
    if conditions is not None:
        logger.info(
            "%s: %d conditions from obs[%r] (control label %r%s)",
            source,
            len(conditions.categories),
            perturbation_column,
            control_label,
            f", combinations joined by {combination_separator!r}" if combination_separator else "",
        )
    for note in write_gears_columns(adata, cell_type, perturbation_column, conditions, source):
        logger.info("%s", note)


def write_gears_columns(
    adata,
    cell_type: str,
    perturbation_column: str | None,
    conditions: pd.Categorical | None,
    source: str = "the AnnData",
) -> list[str]:
    """``add_gears_columns``'s writing: ``conditions`` (of ``obs[perturbation_column]``: see
    ``gears_column_problems``) as ``obs['condition']``, then the cell type and gene names;
    returns a note of each column filled in or replaced."""
    notes = []
    if conditions is not None:
        if "condition" in adata.obs.columns and perturbation_column != "condition":
            notes.append(f"{source}: obs['condition'] is replaced by the conditions of obs[{perturbation_column!r}]")
        adata.obs["condition"] = conditions
    if "cell_type" not in adata.obs.columns:
        adata.obs["cell_type"] = pd.Categorical([cell_type] * adata.n_obs)
        notes.append(f"{source} has no obs['cell_type']: every cell is given the one cell type {cell_type!r}")
    if perturbation_column is not None and "gene_name" not in adata.var.columns:
        adata.var["gene_name"] = np.asarray(adata.var_names, dtype=str)
        notes.append(
            f"{source} has no var['gene_name']: its var_names are taken as the gene symbols "
            f"({listed(adata.var_names, 3)})"
        )
    return notes
