"""Trained runs read back from their folders: a run folder's model with its data and split
(``open_run``, ``load_run``), and the run folders a list of paths stands for, a replicates folder standing
for its replicates (``run_folders``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gears_ddp.configuration.run_options import RunOptions, read_run_options
from gears_ddp.distributed.replicates import plan_replicates
from gears_ddp.model.model_folder import CONFIG_FILE as MODEL_CONFIG_FILE
from gears_ddp.model.model_folder import WEIGHTS_FILE
from gears_ddp.report.run_files import CONFIG_FILE
from gears_ddp.training.checkpoint import checkpoint_files
from gears_ddp.training.save_folder import finished_report

if TYPE_CHECKING:  # imported when a run is opened, not with this module
    from gears_ddp.gears import GEARS


@dataclass(frozen=True)
class SavedRun:
    """A run folder read back: its ``GEARS`` with the saved model, and the options its
    ``config.yaml`` holds, read and checked once (a command reads ``linear_baseline_screen``
    there, not from the file again)."""

    gears: GEARS
    options: RunOptions


def open_run(folder, overrides: Sequence[str] = ()) -> SavedRun:
    """The run folder ``folder``: its data and split as its ``config.yaml`` says (with the
    ``--set`` ``overrides``), its saved model loaded, and those options."""
    from gears_ddp.data.preparation import load_dataset
    from gears_ddp.gears import GEARS
    from gears_ddp.runtime.devices import cuda_or_cpu

    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{folder} is not a run folder: it has no {CONFIG_FILE}")
    run = read_run_options(folder / CONFIG_FILE, overrides)
    if run.replicates is not None:
        raise ValueError(
            f"{folder} holds replicates, not one run: name one of its run folders (e.g. "
            f"{folder / next(iter(replicate_folders(folder, run)))})"
        )
    refuse_a_run_without_a_model(folder)
    args = run.args
    pert_data = load_dataset(run.pert_data_path, run.dataset_name, **args.pert_data_options())
    pert_data.prepare_split(**run.split.options)
    assert args.batch_size is not None and args.seed is not None  # args give both (their defaults)
    pert_data.use_loaders(args.batch_size, args.test_batch_size, seed=args.seed)
    gears = GEARS(pert_data, device=cuda_or_cpu())
    gears.load_pretrained(folder)
    return SavedRun(gears, run)


def refuse_a_run_without_a_model(folder: Path) -> None:
    """Refuse a run folder that holds no saved model yet (its run still training, or stopped
    before its first epoch ended), saying which and how to go on: there is nothing to read."""
    if (folder / MODEL_CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
        return
    checkpoints = checkpoint_files(folder)
    state = (
        f"its run saved checkpoints (the newest {checkpoints[-1].name}) but no model: it is still training, or "
        f"was stopped before it finished; continue it with gears-ddp train --config {folder / CONFIG_FILE} --set "
        "args.resume_from=auto"
        if checkpoints
        else "its run has not saved a model (a run saves its model at the end of its first epoch): it is still "
        "training, or stopped before then"
    )
    raise FileNotFoundError(f"{folder} holds no model yet ({MODEL_CONFIG_FILE}, {WEIGHTS_FILE}): {state}")


def load_run(folder, overrides: Sequence[str] = ()) -> GEARS:
    """The ``GEARS`` of the run folder ``folder`` (``open_run``)."""
    return open_run(folder, overrides).gears


def is_replicates_folder(folder) -> bool:
    """Whether ``folder``'s ``config.yaml`` describes replicates (a ``replicates`` key)."""
    return replicates_options(folder) is not None


def replicates_options(folder) -> RunOptions | None:
    """The options of the replicates folder ``folder`` (its ``config.yaml``, read once), or
    None for a folder that holds no replicates."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return None
    run = read_run_options(path)
    return run if run.replicates is not None else None


def replicate_folders(folder, run: RunOptions | None = None) -> dict[str, Path]:
    """The run folder of each replicate of the replicates folder ``folder``, by name, in the
    order they were given (its ``config.yaml``, or ``run``, its options read before)."""
    folder = Path(folder)
    run = run or read_run_options(folder / CONFIG_FILE)
    if run.replicates is None:
        raise ValueError(f"{folder} holds one run, not replicates (its {CONFIG_FILE} has no replicates key)")
    return {
        replicate.name: folder / replicate.name for replicate in plan_replicates(run.replicates, run.split, run.args)
    }


def run_folders(paths) -> dict[str, Path]:
    """The run folders ``paths`` (one path or several) stand for, by name: a replicates folder
    stands for its replicates, each of which must have finished; any other path is a run
    folder, named by its folder (by its path where two names are the same). A folder given
    twice, or a replicate that has not finished, is an error naming it."""
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(path) for path in paths]
    if not paths:
        raise ValueError("no run folder given")
    folders, unfinished = [], []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"run folder {path} does not exist")
        run = replicates_options(path)
        if run is not None:
            replicates = replicate_folders(path, run)
            unfinished += [str(folder) for folder in replicates.values() if finished_report(folder) is None]
            folders += list(replicates.values())
        else:
            folders.append(path)
    if unfinished:
        finished = [str(folder) for folder in folders if str(folder) not in unfinished]
        raise ValueError(
            f"replicates that have not finished (no complete report): {', '.join(unfinished)}; finish "
            "them (run the same train command again), or screen the finished ones by naming their "
            f"folders: {' '.join(finished) or 'none has finished'}"
        )
    resolved = [folder.resolve() for folder in folders]
    twice = sorted({str(folder) for folder, real in zip(folders, resolved) if resolved.count(real) > 1})
    if twice:
        raise ValueError(f"run folders given more than once: {twice}; give each run once")
    names = [folder.name for folder in folders]
    if len(set(names)) < len(names):
        names = [str(folder).strip(os.sep).replace(os.sep, "_") for folder in folders]
    return dict(zip(names, folders))
