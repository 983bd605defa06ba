"""A pair screen over saved replicates: every model of a replicates folder, or of several run
folders, loaded and its genes checked first, then screened as ``pair_screen_on_devices``
screens one (``distributed.pair_screen_workers.replicate_pair_screen_on_devices``)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from gears_ddp._options import signature_with
from gears_ddp.distributed.pair_screen_workers import pair_screen_devices, replicate_pair_screen_on_devices
from gears_ddp.inference.pair_screen_options import PairScreenOptions
from gears_ddp.runs.saved_runs import load_run, run_folders


def pair_screen_replicates(runs, genes, *, overrides: Sequence[str] = (), **options) -> pd.DataFrame:
    """A pair screen over replicates (``inference.replicate_pair_screen``): every model of
    ``runs`` (a replicates folder, or several run folders: ``saved_runs.run_folders``)
    screens every pair of ``genes`` (None: every gene of the first model's perturbation
    vocabulary) as ``distributed.pair_screen_workers.pair_screen_on_devices`` does, its pairs shared
    among the workers, and the table summarises the models: per pair and score the mean, sd
    and 95% interval over the models, per interaction type the majority call, the models'
    agreement and whether it is confident (``inference.pair_screen_statistics``). With the
    drawn-cells ``change`` each model screens once per seed of ``seeds``, which measures the
    drawn cells' noise within a model. ``options``: ``PairScreenOptions``.

    ``out`` (a .csv file): the summary, with each model's table under ``<out>.models/``;
    resumable as a pair screen is. Every model is loaded (``overrides`` as ``--set`` gives
    them) and its genes checked before any pair is computed. Needs ``if __name__ ==
    "__main__":`` in a script when several devices are used."""
    return pair_screen_replicates_checked(
        runs, genes, PairScreenOptions.from_dict(options, "pair_screen_replicates"), overrides
    )


pair_screen_replicates.__signature__ = signature_with(pair_screen_replicates, PairScreenOptions)  # type: ignore[attr-defined]


def pair_screen_replicates_checked(
    runs, genes, options: PairScreenOptions, overrides: Sequence[str] = ()
) -> pd.DataFrame:
    """``pair_screen_replicates`` of options checked before (``gears-ddp screen``)."""
    folders = run_folders(runs)
    devices = pair_screen_devices(options)  # a GPU this machine lacks fails before any model is loaded
    jobs = {}
    for name, folder in folders.items():
        gears = load_run(folder, overrides)
        genes = list(gears.pert_list) if genes is None else genes
        jobs[name] = gears.pair_screen_jobs(genes, options)
    return replicate_pair_screen_on_devices(jobs, devices, options.out, options.overwrite)
