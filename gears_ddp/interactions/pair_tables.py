"""The tables every set of scored pairs is written as: one row per pair A+B with its genes,
the ``GI_predict`` scores and the interaction types they imply (``pair_table``), whether
the pair and its singles were trained on (``with_training_columns``), and the genes scores
are taken on (``score_gene_positions``). A pair screen's table, the observed pairs' and the
predicted pairs' all share these columns."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.interactions.calls import interaction_types, read_gene_list
from gears_ddp.interactions.scores import GI_SCORE_NAMES, MIN_GI_GENES

# what a table of a model's pairs says of its training (``with_training_columns``), in order
TRAINING_COLUMNS = ("seen_in_training", "singles_in_training")


def score_gene_positions(gene_list: Sequence[str], genes_file) -> np.ndarray | None:
    """Positions of the data's genes listed in ``genes_file`` (``read_gene_list``), which
    scores are restricted to, as the published ``GI_genes_file`` does; None (every gene)
    without a file. Fewer than ``MIN_GI_GENES`` matches is an error naming the file."""
    if genes_file is None:
        return None
    wanted = set(read_gene_list(genes_file))
    positions = np.array([i for i, gene in enumerate(gene_list) if gene in wanted], dtype=np.int64)
    if len(positions) < MIN_GI_GENES:
        raise ValueError(
            f"gene list file {genes_file} names {len(positions)} of the data's genes; genetic-"
            f"interaction scores need at least {MIN_GI_GENES}"
        )
    return positions


def trained_conditions(set2conditions: Mapping[str, Sequence[str]] | None) -> list[str]:
    """The perturbed conditions of a split's train set (none without a split): those a
    pair's ``seen_in_training`` and ``singles_in_training`` look in."""
    train = set2conditions.get("train", []) if set2conditions else []
    return [condition for condition in train if condition != CONTROL]


def with_training_columns(table: pd.DataFrame, train_conditions: Sequence[str]) -> pd.DataFrame:
    """``table`` (``pair_table``) with, after the scores, ``seen_in_training`` (A+B or B+A is
    one of ``train_conditions``) and ``singles_in_training`` (how many of A+ctrl and B+ctrl
    are)."""
    trained = [set(condition_genes(c)) for c in train_conditions]
    seen_pairs = {frozenset(genes) for genes in trained if len(genes) == 2}
    seen_singles = {next(iter(genes)) for genes in trained if len(genes) == 1}
    pairs = list(zip(table["first_gene"], table["second_gene"]))
    position = table.columns.get_loc(GI_SCORE_NAMES[-1]) + 1
    seen, singles = TRAINING_COLUMNS
    table.insert(position, seen, [frozenset(pair) in seen_pairs for pair in pairs])
    table.insert(position + 1, singles, [int(a in seen_singles) + int(b in seen_singles) for a, b in pairs])
    return table


def pair_table(first: Sequence[str], second: Sequence[str], scores: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """One row per pair A+B: ``pair`` (``'A+B'``), ``first_gene``, ``second_gene``, the
    ``GI_predict`` scores and the interaction types they imply
    (``calls.interaction_types``): the columns every table of scored pairs has."""
    table = pd.DataFrame(
        {
            "pair": [f"{a}+{b}" for a, b in zip(first, second)],
            "first_gene": list(first),
            "second_gene": list(second),
            **{name: scores[name] for name in GI_SCORE_NAMES},
        }
    )
    for name, values in interaction_types(scores).items():
        table[name] = values
    return table
