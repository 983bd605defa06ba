"""How far predicted genetic-interaction calls agree with the observed ones.

- ``compare_calls``: per score, the Pearson correlation and the mean absolute difference
  over the pairs; per interaction type, how many calls agree, with the confusion table
  (observed call x predicted call);
- ``consensus_calls``: the table of several models' mean scores and majority calls, which
  ``compare_calls`` reads as one model's;
- ``side_by_side``, ``agreement_lines`` and ``interaction_records``: the tables and the
  agreement shown (a table, lines of text, report.json's records).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from gears_ddp.interactions.calls import CALL_ORDER
from gears_ddp.interactions.pair_tables import TRAINING_COLUMNS
from gears_ddp.interactions.scores import GI_SCORE_NAMES

CALL_NAMES: dict[str | bool, str] = {True: "yes", False: "no"}  # how a yes/no type's calls are written in the agreement


def consensus_calls(summary: pd.DataFrame) -> pd.DataFrame:
    """A table of the pairs of a summary over models (``pair_screen_statistics.summarise_models``)
    whose scores are the models' means and whose calls are the models' majority calls, as
    ``compare_calls`` reads a model's table."""
    table = summary[["pair", "first_gene", "second_gene", *TRAINING_COLUMNS]].copy()
    for name in GI_SCORE_NAMES:
        table[name] = summary[f"{name}_mean"]
    for kind in CALL_ORDER:
        table[kind] = summary[kind]
    return table


def side_by_side(observed: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """One row per pair: its genes and set, what of it the model trained on (``predicted``'s
    ``TRAINING_COLUMNS``: one model's, or for several how many trained on the pair and
    their mean of its singles), then each score and each interaction call,
    ``observed_<name>`` beside ``predicted_<name>``."""
    if list(observed["pair"]) != list(predicted["pair"]):
        raise ValueError("the observed and predicted tables hold other pairs: score the observed table's pairs")
    table = observed[["pair", "first_gene", "second_gene", "set"]].copy()
    for name in TRAINING_COLUMNS:
        table[name] = predicted[name].to_numpy()
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
    return [
        {
            **{name: float(row[name]) for name in GI_SCORE_NAMES},
            **{kind: row[kind] if isinstance(row[kind], str) else bool(row[kind]) for kind in CALL_ORDER},
        }
        for row in table.to_dict("records")
    ]


def agreement_record(set_name: str, check: Mapping) -> dict:
    """The run report's record (``report['interactions']``) of an agreement check
    (``{'observed', 'predicted', 'agreement'}``) of the pairs of the set ``set_name``: the
    agreement, and each pair's observed and predicted scores and calls."""
    observed, predicted = check["observed"], check["predicted"]
    return {
        "set": set_name,
        "agreement": check["agreement"],
        "pairs": [
            {"pair": pair, "observed": seen, "predicted": called}
            for pair, seen, called in zip(
                observed["pair"], interaction_records(observed), interaction_records(predicted)
            )
        ],
    }


def agreement_lines(agreement: Mapping) -> list[str]:
    """``compare_calls``'s result as a few lines of text (the command prints them)."""
    lines = [f"{agreement['pairs']} observed pairs"]
    for name, values in agreement["scores"].items():
        lines.append(
            f"  {name}: Pearson r {values['pearson']:.3f}, mean absolute error "
            f"{values['mean_absolute_error']:.3f} ({values['pairs']} pairs)"
        )
    for kind, values in agreement["types"].items():
        cells = "; ".join(
            f"observed {seen}: " + ", ".join(f"{call} {count}" for call, count in row.items())
            for seen, row in values["confusion"].items()
        )
        lines.append(f"  {kind}: {values['agree']} of {agreement['pairs']} calls agree ({cells})")
    return lines
