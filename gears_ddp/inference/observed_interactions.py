"""Genetic-interaction calls of the observed two-gene combinations, and how far a model's
calls of the same pairs agree with them.

The GEARS paper checks the interactions it predicts against those of the combinations that
were measured: it writes each observed condition's true mean expression into
``saved_pred`` and scores it with ``GI_predict`` (its Ext_Fig_7). Here that is one call:

- ``observed_interactions``: every two-gene condition A+B of a dataset whose singles (A+ctrl
  or ctrl+A, and B's) were observed too, scored from the observed changes (each condition's
  mean expression minus the mean of all control cells) with the scores and interaction
  types of a screen (``evaluation.interaction_scores``, ``interactions.interaction_types``);
- ``predicted_interactions``: the same pairs scored from a model's predicted changes
  (``consensus_calls``: from several models' mean scores and majority calls);
- ``compare_calls``: per score, the Pearson correlation and the mean absolute difference
  over the pairs; per interaction type, how many calls agree, with the confusion table
  (observed call x predicted call). ``side_by_side``, ``agreement_lines`` and
  ``interaction_records`` show the tables and the agreement.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.grouped import condition_means
from gears_ddp.evaluation.interaction_scores import GI_SCORE_NAMES, interaction_scores
from gears_ddp.inference.prediction import ChangePredictor, query_sets
from gears_ddp.inference.screen import pair_table, score_gene_positions, with_training_columns
from gears_ddp.inference.screen_statistics import CALL_ORDER

SPLIT_SETS = ("train", "val", "test")
CALL_NAMES = {True: "yes", False: "no"}  # how a yes/no type's calls are written in the agreement
OBSERVED_COLUMN_MEANINGS = {
    "pair, first_gene, second_gene": "the observed condition A+B and its genes, as the data writes them",
    "set": "which set of the split holds the condition (train, val or test; empty without a split)",
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
        singles = [single_condition(gene, present) for gene in genes]
        if len(genes) == 2 and None not in singles:
            pairs.append((condition, *singles))
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


def _scored(first: np.ndarray, second: np.ndarray, double: np.ndarray, score_genes: np.ndarray | None,
            device) -> dict:
    """``interaction_scores`` of (pairs x genes) changes, on ``score_genes`` only when given,
    computed on ``device``."""
    if score_genes is not None:
        first, second, double = first[:, score_genes], second[:, score_genes], double[:, score_genes]
    return interaction_scores(torch.from_numpy(first), torch.from_numpy(second), torch.from_numpy(double),
                              device=device)


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
        table = pair_table([g[0] for g in genes], [g[1] for g in genes],
                           _scored(firsts, seconds, doubles, score_genes, device))
    table.insert(3, "set", [set_of.get(f"{a}+{b}", "") for a, b in zip(table["first_gene"], table["second_gene"])])
    return table


def predicted_interactions(observed: pd.DataFrame, predictor: ChangePredictor, node_map_pert: Mapping[str, int],
                           gene_list: Sequence[str], GI_genes_file=None,
                           train_conditions: Sequence[str] = ()) -> pd.DataFrame:
    """The pairs of ``observed`` (``observed_interactions``) scored from the changes
    ``predictor`` predicts for A, B and A+B (on its device): the same columns, and a
    screen's ``seen_in_training`` and ``singles_in_training`` (of ``train_conditions``)."""
    first, second = list(observed["first_gene"]), list(observed["second_gene"])
    score_genes = score_gene_positions(list(gene_list), GI_genes_file)
    if not first:
        table = pair_table([], [], {name: np.empty(0) for name in GI_SCORE_NAMES})
    else:
        queries = [[a] for a in first] + [[b] for b in second] + [[a, b] for a, b in zip(first, second)]
        changes = predictor.changes(query_sets(queries, node_map_pert)).double().cpu().numpy()
        singles_a, singles_b, doubles = np.split(changes, 3)
        table = pair_table(first, second, _scored(singles_a, singles_b, doubles, score_genes, predictor.device))
    table.insert(3, "set", list(observed["set"]))
    return with_training_columns(table, train_conditions)


def consensus_calls(summary: pd.DataFrame) -> pd.DataFrame:
    """A table of the pairs of a summary over models (``screen_statistics.summarise_models``)
    whose scores are the models' means and whose calls are the models' majority calls, as
    ``compare_calls`` reads a model's table."""
    table = summary[["pair", "first_gene", "second_gene"]].copy()
    for name in GI_SCORE_NAMES:
        table[name] = summary[f"{name}_mean"]
    for kind in CALL_ORDER:
        table[kind] = summary[kind]
    return table


def side_by_side(observed: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """One row per pair: its genes and set, then each score and each interaction call,
    ``observed_<name>`` beside ``predicted_<name>``."""
    if list(observed["pair"]) != list(predicted["pair"]):
        raise ValueError("the observed and predicted tables hold other pairs: score the observed table's pairs")
    table = observed[["pair", "first_gene", "second_gene", "set"]].copy()
    for name in (*GI_SCORE_NAMES, *CALL_ORDER):
        table[f"observed_{name}"] = observed[name].to_numpy()
        table[f"predicted_{name}"] = predicted[name].to_numpy()
    return table


def compare_calls(observed: pd.DataFrame, predicted: pd.DataFrame) -> dict:
    """How far ``predicted`` (a table of the same pairs, in the same order) agrees with
    ``observed``, as plain data (report.json holds it):

    - ``pairs``: how many;
    - ``scores``: per score, ``pearson`` (over the pairs where both values are finite; NaN
      for fewer than 2 or a constant score), ``mean_absolute_error`` and ``pairs`` (how many
      were finite);
    - ``types``: per interaction type, ``agree`` (pairs called the same), ``share``, and
      ``confusion``: ``{observed call: {predicted call: pairs}}`` (``yes``/``no`` for the
      yes-or-no types)."""
    if list(observed["pair"]) != list(predicted["pair"]):
        raise ValueError("the observed and predicted tables hold other pairs: score the observed table's pairs")
    scores = {}
    for name in GI_SCORE_NAMES:
        ours, theirs = observed[name].to_numpy(np.float64), predicted[name].to_numpy(np.float64)
        finite = np.isfinite(ours) & np.isfinite(theirs)
        pearson = float("nan")
        if finite.sum() >= 2 and np.ptp(ours[finite]) > 0 and np.ptp(theirs[finite]) > 0:
            pearson = float(np.corrcoef(ours[finite], theirs[finite])[0, 1])
        error = float(np.abs(ours[finite] - theirs[finite]).mean()) if finite.any() else float("nan")
        scores[name] = {"pearson": pearson, "mean_absolute_error": error, "pairs": int(finite.sum())}
    types = {}
    for kind, order in CALL_ORDER.items():
        seen, called = observed[kind].tolist(), predicted[kind].tolist()
        names = [CALL_NAMES.get(call, call) for call in order]
        confusion = {name: dict.fromkeys(names, 0) for name in names}
        for a, b in zip(seen, called):
            confusion[CALL_NAMES.get(a, a)][CALL_NAMES.get(b, b)] += 1
        agree = sum(a == b for a, b in zip(seen, called))
        types[kind] = {"agree": agree, "share": agree / len(seen) if seen else float("nan"), "confusion": confusion}
    return {"pairs": len(observed), "scores": scores, "types": types}


def interaction_records(table: pd.DataFrame) -> list[dict]:
    """Each row's scores (floats) and interaction calls (strings, booleans) as plain data,
    for report.json."""
    return [{**{name: float(row[name]) for name in GI_SCORE_NAMES},
             **{kind: row[kind] if isinstance(row[kind], str) else bool(row[kind]) for kind in CALL_ORDER}}
            for row in table.to_dict("records")]


def agreement_lines(agreement: Mapping) -> list[str]:
    """``compare_calls``'s result as a few lines of text (the command prints them)."""
    lines = [f"{agreement['pairs']} observed pairs"]
    for name, values in agreement["scores"].items():
        lines.append(f"  {name}: Pearson r {values['pearson']:.3f}, mean absolute error "
                     f"{values['mean_absolute_error']:.3f} ({values['pairs']} pairs)")
    for kind, values in agreement["types"].items():
        cells = "; ".join(f"observed {seen}: " + ", ".join(f"{call} {count}" for call, count in row.items())
                          for seen, row in values["confusion"].items())
        lines.append(f"  {kind}: {values['agree']} of {agreement['pairs']} calls agree ({cells})")
    return lines
