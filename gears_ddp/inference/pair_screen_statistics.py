"""Genetic-interaction calls over several models: how far the scores and the interaction
types of each pair of a screen agree across independently trained models (replicates), and
how far they move within one model when its changes carry the published drawn-cells noise.

The input is each model's screen tables (``inference.pair_screen_job.pair_screen_table``) over the same
pairs in the same order: one table per model with the exact change, one per draw of control
cells (one seed each) with the drawn-cells change. A model's value of a score is the mean
over its draws. Two kinds of uncertainty, in columns of their own:

- across models: ``<score>_mean``, ``<score>_sd_models`` (n - 1) and the 95% t-interval
  of the mean over the models, ``<score>_ci_low`` and ``<score>_ci_high``
  (``report.replicate_summary.t_interval``). What the model seeds and split seeds change.
  A score that is not finite for some model (degenerate changes) has no mean or interval;
- within one model: ``<score>_sd_draws``, the standard deviation over the draws of control
  cells, pooled over the models (the root of the mean variance): the sampling noise of the
  drawn-cells change. 0 with the exact change, which draws nothing; NaN (not measured) with
  a single draw. Every model draws the same cells for a perturbation set (the draw depends
  on the seed and the genes only), so that noise shifts all models alike and does not show
  in the spread across models.

For each interaction type (``calls.interaction_types``), from each model's own call:
``<type>`` is the call most models make (a tie goes to the first call of ``CALL_ORDER``: no
interaction before one), ``<type>_agreement`` the share of models making it, and
``<type>_confident`` whether the call holds across the models (``CONFIDENT_RULE``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from gears_ddp.inference.prediction import EXACT_CHANGE
from gears_ddp.interactions.calls import CALL_ORDER, TYPE_SCORES, interaction_types
from gears_ddp.interactions.scores import GI_SCORE_NAMES
from gears_ddp.report.replicate_summary import standard_deviation, t_interval

PAIR_COLUMNS = ("pair", "first_gene", "second_gene")
SPREAD_STATISTICS = ("mean", "sd_models", "ci_low", "ci_high", "sd_draws")
CONFIDENT_RULE = (
    "a call is confident when every model makes it and the 95% t-interval over the models of the "
    "score it rests on lies wholly where the call holds: magnitude_type on mag (synergy: the whole "
    "interval above 1.3; suppressor: below 0.7; additive: within 0.7 to 1.3), neomorphic on "
    "corr_fit (0.85), redundant on dcor (0.8), epistasis on dominance (0.25)"
)
SUMMARY_COLUMN_MEANINGS = {
    "models": "how many models the row summarises",
    "<score>_mean": "the score's mean over the models",
    "<score>_sd_models": "its standard deviation across the models (n - 1): what model and split seeds change",
    "<score>_ci_low, <score>_ci_high": "the 95% t-interval of its mean over the models",
    "<score>_sd_draws": "its standard deviation within one model, over draws of control cells (pooled over the "
    "models): the drawn-cells change's sampling noise; 0 with the exact change, NaN with one draw",
    "seen_in_training": "in how many models' train sets the pair is",
    "singles_in_training": "how many of its two singles are in a model's train set, on average over the models",
    "<type>": "the call most models make (a tie goes to the first of additive, synergy, suppressor; False before True)",
    "<type>_agreement": "the share of models making that call",
    "<type>_confident": "every model makes the call and the interval of the score it rests on lies where the call "
    "holds",
}
PAIR_SCREEN_INTERVAL = (
    "95% t-interval of a score's mean over the models: mean ± t(0.975, n - 1) x sd / sqrt(n), where sd "
    "is the models' standard deviation (n - 1 in the denominator) and n the number of models"
)


def summarise_models(tables: Mapping[str, Sequence[pd.DataFrame]], change: str = EXACT_CHANGE) -> pd.DataFrame:
    """One row per pair: its genes, the number of models, for every score its spread across
    the models and within them (``SPREAD_STATISTICS``), in how many models' train sets the
    pair is (``seen_in_training``) and the mean number of its singles there
    (``singles_in_training``), then for every interaction type the majority call, the share
    of models making it and whether it is confident.

    ``tables`` maps each model's name to its screen tables, one per draw of control cells
    (exactly one with the exact ``change``). Fewer than 2 models, or tables over other pairs,
    are refused."""
    if len(tables) < 2:
        raise ValueError(f"an interval over models needs at least 2 models, got {len(tables)}: {list(tables)}")
    draws = {len(model_tables) for model_tables in tables.values()}
    if len(draws) != 1 or 0 in draws or (change == EXACT_CHANGE and draws != {1}):
        raise ValueError(
            f"every model needs one table per draw of control cells, the same number for each (one "
            f"with the exact change); got {[len(model_tables) for model_tables in tables.values()]}"
        )
    reference = next(iter(tables.values()))[0]
    for name, model_tables in tables.items():
        for table in model_tables:
            if list(table["pair"]) != list(reference["pair"]):
                raise ValueError(
                    f"the tables of {name} hold other pairs than those of {next(iter(tables))}: every "
                    "model must screen the same genes in the same order"
                )
    summary = reference[list(PAIR_COLUMNS)].reset_index(drop=True)
    summary["models"] = len(tables)
    model_scores = {}
    for score in GI_SCORE_NAMES:
        values = np.stack(
            [
                np.stack([table[score].to_numpy(dtype=np.float64) for table in model_tables], axis=-1)
                for model_tables in tables.values()
            ],
            axis=1,
        )  # pairs x models x draws
        with np.errstate(invalid="ignore"):
            model_scores[score] = values.mean(axis=-1)
        mean, sd, low, high = t_interval(model_scores[score])
        summary[f"{score}_mean"], summary[f"{score}_sd_models"] = mean, sd
        summary[f"{score}_ci_low"], summary[f"{score}_ci_high"] = low, high
        summary[f"{score}_sd_draws"] = _within_model_sd(values, change)
    trained = [model_tables[0] for model_tables in tables.values()]
    summary["seen_in_training"] = np.sum([table["seen_in_training"].to_numpy(dtype=int) for table in trained], axis=0)
    summary["singles_in_training"] = np.mean(
        [table["singles_in_training"].to_numpy(dtype=float) for table in trained], axis=0
    )
    low_types = interaction_types({score: summary[f"{score}_ci_low"] for score in TYPE_SCORES.values()})
    high_types = interaction_types({score: summary[f"{score}_ci_high"] for score in TYPE_SCORES.values()})
    for kind, calls in interaction_types(model_scores).items():
        order = CALL_ORDER[kind]
        counts = np.stack([(calls == call).sum(axis=1) for call in order])  # calls x pairs
        majority = np.asarray(order)[counts.argmax(axis=0)]  # the first of tied calls
        agreement = counts.max(axis=0) / len(tables)
        score = TYPE_SCORES[kind]
        finite = np.isfinite(summary[f"{score}_ci_low"]) & np.isfinite(summary[f"{score}_ci_high"])
        summary[kind], summary[f"{kind}_agreement"] = majority, agreement
        summary[f"{kind}_confident"] = (
            (agreement == 1) & finite & (low_types[kind] == majority) & (high_types[kind] == majority)
        )
    return summary


def _within_model_sd(values: np.ndarray, change: str) -> np.ndarray:
    """The sd over draws (last axis of pairs x models x draws), pooled over the models: 0
    with the exact change, NaN with one draw."""
    if change == EXACT_CHANGE:
        return np.zeros(values.shape[0])
    with np.errstate(invalid="ignore"):
        return np.sqrt(np.mean(standard_deviation(values) ** 2, axis=1))


def _call_name(call: str | bool) -> str:
    """A call as the counts name it: ``'yes'`` and ``'no'`` for the True/False types."""
    if isinstance(call, bool):
        return "yes" if call else "no"
    return call


def confident_counts(summary: pd.DataFrame) -> dict[str, dict[str, int]]:
    """How many confident calls of each kind ``summary`` holds, per interaction type:
    ``{'magnitude_type': {'additive': 40, 'synergy': 3, 'suppressor': 7}, 'neomorphic':
    {'no': 12, 'yes': 0}, ...}``."""
    counts = {}
    for kind, order in CALL_ORDER.items():
        confident = summary[kind][summary[f"{kind}_confident"].astype(bool)]
        counts[kind] = {_call_name(call): int((confident == call).sum()) for call in order}
    return counts
