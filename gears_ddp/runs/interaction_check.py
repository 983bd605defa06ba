"""The observed combinations' interaction calls beside those of saved runs: one run's model,
or several (a replicates folder, or run folders), whose mean scores and majority calls are
compared (``interactions.agreement``; ``gears-ddp interactions``)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from gears_ddp.inference.pair_screen_statistics import summarise_models
from gears_ddp.inference.prediction import EXACT_CHANGE
from gears_ddp.interactions.agreement import compare_calls, consensus_calls, side_by_side
from gears_ddp.runs.saved_runs import load_run, run_folders


def check_saved_runs(
    paths, split: str | None = "test", GI_genes_file=None, overrides: Sequence[str] = ()
) -> tuple[pd.DataFrame, dict]:
    """The observed pairs of ``split`` (None: every observed pair) beside the predictions of
    the runs ``paths`` stands for (``saved_runs.run_folders``), and their agreement
    (``compare_calls``). With several models the predictions are their mean scores and
    majority calls (``pair_screen_statistics.summarise_models``) and the agreement also holds each
    model's own (``'models'``); their pairs must be the same (the same split)."""
    checks = {
        name: load_run(folder, overrides).interaction_agreement(split, GI_genes_file)
        for name, folder in run_folders(paths).items()
    }
    (first_name, first), *others = checks.items()
    for name, check in others:
        if list(check["observed"]["pair"]) != list(first["observed"]["pair"]):
            raise ValueError(
                f"the {split} pairs of {name} differ from those of {first_name} (another split): compare "
                "runs of the same split, or every observed pair (--pairs all)"
            )
    if not others:
        return side_by_side(first["observed"], first["predicted"]), first["agreement"]
    summary = summarise_models({name: [check["predicted"]] for name, check in checks.items()}, EXACT_CHANGE)
    predicted = consensus_calls(summary)
    agreement = {
        **compare_calls(first["observed"], predicted),
        "models": {name: check["agreement"] for name, check in checks.items()},
    }
    return side_by_side(first["observed"], predicted), agreement
