"""Screens over replicates: every model of several runs (the replicates of one configuration,
or any run folders) screens the same pairs, and one table summarises them across the models
(``pair_screen_statistics``): per pair and score the mean, sd and 95% interval, per interaction
type the majority call, the models' agreement with it and whether it is confident.

Each model's screen is an ordinary screen (``pair_screen_job.run_pair_screen``), resumable as any; with
an output file ``<out>`` it is written to ``<out>.models/<model>.csv`` (with the
drawn-cells change one per draw of control cells, ``<model>.draw-<seed>.csv``), with its
record and, while it runs, its partial folder. The summary is computed from those tables:
``<out>`` and its record ``<out>.json`` (the models, genes and options, the interval, the
confidence rule and how many calls are confident). Run again after an interruption, it
reads the finished models' tables back and continues the one under way; with other models
(seeds added, say) the summary is computed anew, the models already screened read back.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.inference.pair_screen_job import (
    PairScreenFolder,
    PairScreenJob,
    checked_output_file,
    held_output,
    read_record,
    run_pair_screen,
    score_chunks_here,
    write_table,
)
from gears_ddp.inference.pair_screen_statistics import (
    CONFIDENT_RULE,
    PAIR_SCREEN_INTERVAL,
    confident_counts,
    summarise_models,
)
from gears_ddp.report.run_files import write_json

logger = get_logger(__name__)

REPLICATE_RECORD_FORMAT = "gears_ddp replicate screen 1"


class ReplicatePairScreenFolder:
    """Where a screen over replicates writing to ``out`` (a .csv file) keeps its work: the
    models' screens under ``<out>.models/``, the summary at ``out``, its record beside it."""

    def __init__(self, out):
        self.table = checked_output_file(out, "the screen's table", "CSV", (".csv",))
        self.record_file = self.table.with_suffix(".json")
        self.models = self.table.with_suffix(".models")

    def model_table(self, name: str, job: PairScreenJob) -> Path:
        """Where model ``name`` writes the screen ``job`` (one draw of control cells)."""
        seed = job.record()["seed"]
        return self.models / (f"{name}.csv" if seed is None else f"{name}.draw-{seed}.csv")

    def prepare(self, overwrite: bool) -> None:
        """Refuse an output that holds something else than a screen over replicates (a screen
        of one model, a file of another kind) unless ``overwrite``, which removes it."""
        if overwrite:
            shutil.rmtree(self.models, ignore_errors=True)
            shutil.rmtree(PairScreenFolder(self.table).partial, ignore_errors=True)
            self.record_file.unlink(missing_ok=True)
            return
        if self.record_file.exists():
            found = read_record(self.record_file).get("format")
            if found != REPLICATE_RECORD_FORMAT:
                raise FileExistsError(
                    f"{self.record_file} is the record of another kind of screen ({found!r}, not "
                    f"{REPLICATE_RECORD_FORMAT!r}): pass overwrite=True (--overwrite) to replace "
                    "it, or write to another file"
                )
        elif self.table.exists():
            raise FileExistsError(
                f"{self.table} exists and is not a screen's table (no {self.record_file.name} "
                "beside it): pass overwrite=True (--overwrite) to replace it"
            )

    def finish(self, summary: pd.DataFrame, record: dict) -> None:
        write_table(summary, self.table)
        write_json(self.record_file, record)
        logger.info(
            "summary over %d models written to %s (%d pairs), its record to %s",
            len(record["models"]),
            self.table,
            len(summary),
            self.record_file,
        )


def run_replicate_pair_screen(
    jobs: Mapping[str, Sequence[PairScreenJob]],
    out=None,
    overwrite: bool = False,
    execute: Callable = score_chunks_here,
) -> pd.DataFrame:
    """The summary over models (``pair_screen_statistics.summarise_models``) of the screens
    ``jobs`` describes: for each model (by name) one job per draw of control cells (one with
    the exact change), every job of the same genes and options. Each is computed by
    ``pair_screen_job.run_pair_screen`` with ``execute``; with ``out``, each model's table is written
    under ``<out>.models/`` (resumable) and the summary to ``out`` (``ReplicatePairScreenFolder``)."""
    first = check_same_pair_screen(jobs)
    folder = None if out is None else ReplicatePairScreenFolder(out)
    with contextlib.nullcontext() if folder is None else held_output(folder.table):
        return _run_replicate_pair_screen(jobs, first, folder, overwrite, execute)


def _run_replicate_pair_screen(
    jobs: Mapping[str, Sequence[PairScreenJob]],
    first: PairScreenJob,
    folder: ReplicatePairScreenFolder | None,
    overwrite: bool,
    execute,
) -> pd.DataFrame:
    if folder is not None:
        folder.prepare(overwrite)
    started = time.perf_counter()
    tables = {}
    for number, (name, model_jobs) in enumerate(jobs.items(), 1):
        logger.info(
            "screen over replicates: model %d of %d, %s (%s)", number, len(jobs), name, model_jobs[0].model.get("from")
        )
        tables[name] = [
            run_pair_screen(job, None if folder is None else folder.model_table(name, job), overwrite, execute)
            for job in model_jobs
        ]
    summary = summarise_models(tables, first.predictor.change)
    if folder is not None:
        folder.finish(summary, replicate_record(jobs, folder, summary, time.perf_counter() - started))
    return summary


def check_same_pair_screen(jobs: Mapping[str, Sequence[PairScreenJob]]) -> PairScreenJob:
    """The first job, once every model's jobs are known to screen the same genes with the
    same options, each draw with its own seed, and no two models to have the same weights;
    else an error naming the model that differs."""
    if len(jobs) < 2:
        raise ValueError(
            f"a screen over replicates needs at least 2 models (an interval over models), got {len(jobs)}: {list(jobs)}"
        )
    first_name, first_jobs = next(iter(jobs.items()))
    if not first_jobs:
        raise ValueError(f"model {first_name} has no screen to compute")
    shared = _shared_record(first_jobs[0])
    weights: dict[str | None, str] = {}
    for name, model_jobs in jobs.items():
        if [_shared_record(job) for job in model_jobs] != [shared] * len(first_jobs):
            raise ValueError(
                f"the screens of {name} differ from those of {first_name}: every model screens the same "
                "genes with the same options and draws"
            )
        seeds = [job.record()["seed"] for job in model_jobs]
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"the draws of {name} repeat a seed ({seeds}): each draw needs its own seed")
        digest = model_jobs[0].model.get("weights")
        if digest in weights:
            raise ValueError(
                f"models {weights[digest]} and {name} have the same weights: an interval over models "
                "needs independently trained ones (give each run folder once)"
            )
        weights[digest] = name
    return first_jobs[0]


def _shared_record(job: PairScreenJob) -> dict:
    """What every model's screen must share: its record but for the model and the draw's seed."""
    return {key: value for key, value in job.record().items() if key not in ("model", "seed")}


def replicate_record(
    jobs: Mapping[str, Sequence[PairScreenJob]],
    folder: ReplicatePairScreenFolder,
    summary: pd.DataFrame,
    seconds: float,
) -> dict:
    """What a screen over replicates is: the models (weights, folder and tables), the genes
    and options the screens share, the draws' seeds, how the summary reads the models and how
    many of its calls are confident."""
    first = next(iter(jobs.values()))[0]
    record = _shared_record(first)
    draw_seeds = [job.record()["seed"] for job in next(iter(jobs.values()))]
    return {
        **record,
        "format": REPLICATE_RECORD_FORMAT,
        "models": {
            name: {**model_jobs[0].model, "tables": [str(folder.model_table(name, job)) for job in model_jobs]}
            for name, model_jobs in jobs.items()
        },
        "draw_seeds": None if draw_seeds == [None] else draw_seeds,
        "interval": PAIR_SCREEN_INTERVAL,
        "confident_rule": CONFIDENT_RULE,
        "confident": confident_counts(summary),
        "seconds": round(seconds, 1),
    }
