"""A pair screen over saved replicates: every model of a replicates folder, or of several run
folders, loaded and its genes checked first, then screened as ``screen_on_devices`` screens
one (``distributed.pair_screen.replicate_pair_screen_on_devices``)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from gears_ddp.distributed.pair_screen import pair_screen_devices, replicate_pair_screen_on_devices
from gears_ddp.inference.pair_screen import PAIR_SCREEN_CHUNK_PAIRS
from gears_ddp.inference.prediction import EXACT_CHANGE
from gears_ddp.runs.saved_runs import load_run, run_folders


def screen_replicates(
    runs,
    genes,
    out=None,
    overwrite: bool = False,
    cpu_processes: int | None = None,
    gpu_ids=None,
    GI_genes_file=None,
    change: str = EXACT_CHANGE,
    seeds: Sequence[int] = (0,),
    chunk_pairs: int = PAIR_SCREEN_CHUNK_PAIRS,
    overrides: Sequence[str] = (),
) -> pd.DataFrame:
    """A screen over replicates (``inference.replicate_pair_screen``): every model of ``runs`` (a
    replicates folder, or several run folders: ``saved_runs.run_folders``) screens every
    pair of ``genes`` (None: every gene of the first model's perturbation vocabulary) as
    ``distributed.pair_screen.screen_on_devices`` does, its pairs shared among the workers, and
    the table summarises the models: per pair and score the mean, sd and 95% interval over
    the models, per interaction type the majority call, the models' agreement and whether it
    is confident (``inference.pair_screen_statistics``). With the drawn-cells ``change`` each model
    screens once per seed of ``seeds``, which measures the drawn cells' noise within a model.

    ``out`` (a .csv file): the summary, with each model's table under ``<out>.models/``;
    resumable as a screen is. Every model is loaded (``overrides`` as ``--set`` gives them)
    and its genes checked before any pair is computed. Needs ``if __name__ == "__main__":``
    in a script when several devices are used."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed of the drawn control cells")
    if change == EXACT_CHANGE and len(seeds) > 1:
        raise ValueError(
            f"several seeds ({seeds}) draw control cells for the drawn-cells change only; the exact change draws none"
        )
    folders = run_folders(runs)
    devices = pair_screen_devices(cpu_processes, gpu_ids)  # a bad request fails before any model is loaded
    jobs = {}
    for name, folder in folders.items():
        gears = load_run(folder, overrides)
        genes = list(gears.pert_list) if genes is None else genes
        job = gears.screen_job(genes, GI_genes_file, change, seeds[0], chunk_pairs)
        jobs[name] = [job] if change == EXACT_CHANGE else [job.with_draw_seed(seed) for seed in seeds]
    return replicate_pair_screen_on_devices(jobs, devices, out, overwrite)
