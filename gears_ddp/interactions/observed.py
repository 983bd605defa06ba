"""Genetic-interaction scores of the observed two-gene combinations, and of the same pairs
from predicted changes.

The GEARS paper checks the interactions it predicts against those of the combinations that
were measured: it writes each observed condition's true mean expression into
``saved_pred`` and scores it with ``GI_predict`` (its Ext_Fig_7). Here that is one call:

- ``observed_interactions``: every two-gene condition A+B of a dataset whose singles (A+ctrl
  or ctrl+A, and B's) were observed too, scored from the observed changes (each condition's
  mean expression minus the mean of all control cells) with the scores and interaction
  types of a pair screen (``scores``, ``calls.interaction_types``);
- ``predicted_interactions``: the same pairs scored from predicted changes (a model's).

How far the two agree is ``agreement``'s.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.grouped import condition_means
from gears_ddp.interactions.pair_tables import pair_table, score_gene_positions, with_training_columns
from gears_ddp.interactions.scores import GI_SCORE_NAMES, interaction_scores

SPLIT_SETS = ("train", "val", "test")
OBSERVED_COLUMN_MEANINGS = {
    "pair, first_gene, second_gene": "the observed condition A+B and its genes, as the data writes them",
    "set": "which set of the split holds the condition (train, val or test; empty without a split)",
    "seen_in_training, singles_in_training": "with --run: whether the model trained on the pair and how many of "
    "its singles (0-2), as in a screen's table; of several models, how many trained on the pair and their mean",
    "<score>, <type>": "the GI_predict scores of the observed changes (the condition's mean expression minus the "
    "mean of all control cells) and the interaction types they imply, as in a screen's table",
}


def single_condition(gene: str, conditions) -> str | None:
    """The condition of ``gene`` perturbed alone among ``conditions`` (``A+ctrl`` or
    ``ctrl+A``), or None."""
    for name in (f"{gene}+{CONTROL}", f"{CONTROL}+{gene}"):
        if name in conditions:
            return name
    return None


def observed_pairs(conditions: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(A+B, A+ctrl, B+ctrl)`` condition names of each two-gene condition of
    ``conditions`` whose two singles are among them too, in the order given."""
    present = set(conditions)
    pairs = []
    for condition in conditions:
        genes = condition_genes(condition)
        if len(genes) != 2:
            continue
        first, second = (single_condition(gene, present) for gene in genes)
        if first is not None and second is not None:
            pairs.append((condition, first, second))
    return pairs


def observed_changes(cell_table, conditions: Sequence[str]) -> np.ndarray:
    """(conditions x genes) float64 mean expression of each condition's cells minus the mean
    of all control cells (``CellTable.control_mean``, as ``GI_predict`` subtracts it)."""
    distinct = list(dict.fromkeys(conditions))
    code_of = {condition: code for code, condition in enumerate(cell_table.conditions)}
    row_of_code = np.full(len(cell_table.conditions), -1, dtype=np.int64)
    row_of_code[[code_of[condition] for condition in distinct]] = np.arange(len(distinct))
    means = condition_means(cell_table.expression, row_of_code[cell_table.condition_codes.numpy()], len(distinct))
    return means[[distinct.index(condition) for condition in conditions]] - cell_table.control_mean().double().numpy()


def _scored(first: np.ndarray, second: np.ndarray, double: np.ndarray, score_genes: np.ndarray | None, device) -> dict:
    """``interaction_scores`` of (pairs x genes) changes, on ``score_genes`` only when given,
    computed on ``device``."""
    if score_genes is not None:
        first, second, double = first[:, score_genes], second[:, score_genes], double[:, score_genes]
    return interaction_scores(
        torch.from_numpy(first), torch.from_numpy(second), torch.from_numpy(double), device=device
    )


def observed_interactions(pert_data, split: str | None = None, GI_genes_file=None, device=None) -> pd.DataFrame:
    """One row per observed pair (``observed_pairs``) of ``pert_data`` (loaded; with
    ``split``, a set of its split: ``'train'``, ``'val'`` or ``'test'``), scored from the
    observed changes: ``OBSERVED_COLUMN_MEANINGS``. Scores are taken on the genes listed in
    ``GI_genes_file`` only, when given, as ``GI_predict`` takes them, and computed on
    ``device`` (default: the CPU; a model's GPU scores them many times faster)."""
    cells, sets = pert_data.cells, pert_data.set2conditions or {}
    if split is not None and split not in SPLIT_SETS:
        raise ValueError(f"split must be one of {SPLIT_SETS} or None (every condition), got {split!r}")
    if split is not None and split not in sets:
        raise ValueError(f"the data has no {split} set: prepare a split with one (pert_data.prepare_split)")
    set_of = {condition: name for name in SPLIT_SETS for condition in sets.get(name, [])}
    pairs = [pair for pair in observed_pairs(cells.conditions) if split is None or set_of.get(pair[0]) == split]
    score_genes = score_gene_positions(list(pert_data.gene_names), GI_genes_file)
    if not pairs:
        table = pair_table([], [], {name: np.empty(0) for name in GI_SCORE_NAMES})
    else:
        doubles, firsts, seconds = (observed_changes(cells, list(column)) for column in zip(*pairs))
        genes = [condition_genes(pair[0]) for pair in pairs]
        table = pair_table(
            [g[0] for g in genes], [g[1] for g in genes], _scored(firsts, seconds, doubles, score_genes, device)
        )
    table.insert(3, "set", [set_of.get(f"{a}+{b}", "") for a, b in zip(table["first_gene"], table["second_gene"])])
    return table


def predicted_interactions(
    observed: pd.DataFrame,
    predicted_changes: Callable[[list[list[str]]], torch.Tensor],
    gene_list: Sequence[str],
    GI_genes_file=None,
    train_conditions: Sequence[str] = (),
    device=None,
) -> pd.DataFrame:
    """The pairs of ``observed`` (``observed_interactions``) scored from the changes over
    control that ``predicted_changes`` gives for queries (``[['A'], ['B'], ['A', 'B']]``:
    one row per query, one column per gene of ``gene_list``), computed on ``device``: the
    same columns, and a pair screen's ``seen_in_training`` and ``singles_in_training`` (of
    ``train_conditions``). Whatever predicts the changes (a model, exact or with the
    published sampling noise) is the caller's: these are scores of changes."""
    first, second = list(observed["first_gene"]), list(observed["second_gene"])
    score_genes = score_gene_positions(list(gene_list), GI_genes_file)
    if not first:
        table = pair_table([], [], {name: np.empty(0) for name in GI_SCORE_NAMES})
    else:
        queries = [[a] for a in first] + [[b] for b in second] + [[a, b] for a, b in zip(first, second)]
        changes = predicted_changes(queries).double().cpu().numpy()
        singles_a, singles_b, doubles = np.split(changes, 3)
        table = pair_table(first, second, _scored(singles_a, singles_b, doubles, score_genes, device))
    table.insert(3, "set", list(observed["set"]))
    return with_training_columns(table, train_conditions)
