"""A run's ``save_path``, taken before training writes anything there.

``held_save_path`` is the one way in, on every entry path (``GEARS.train``, the launcher of
``train_multi_gpu``, ``gears-ddp train``, torchrun and srun's rank 0, each replicate): it
makes the folder, takes it for this run (``runtime.folder_lock``: a second run on it stops
at once, naming this one), keeps a finished run from being overwritten unasked, and checks
that the folder is writable with room for checkpoints (a full disk must not surface after
hours of training). Reading a folder in use (``load_pretrained``, ``gears-ddp evaluate``,
``predict --run``) takes nothing: every file a run writes is replaced atomically.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
from pathlib import Path
from typing import Iterator

import yaml

from gears_ddp._logging import get_logger
from gears_ddp.data.io import left_temporaries, make_folder
from gears_ddp.model.model_folder import CONFIG_FILE as MODEL_CONFIG_FILE
from gears_ddp.model.model_folder import VOCABULARY_FILE, WEIGHTS_FILE
from gears_ddp.report.run_files import (
    CONFIG_FILE,
    LOG_FILE,
    METRICS_FILE,
    PAGE_FILE,
    PICTURES,
    REPORT_FILE,
    SWEEP_FILE,
    read_settings,
)
from gears_ddp.runtime.folder_lock import FolderLock
from gears_ddp.training.checkpoint import CHECKPOINT_FOLDER, checkpoint_files

logger = get_logger(__name__)

MIN_FREE_BYTES = 50 * 2**20  # room a save folder needs for checkpoints
# what a run writes in its folder: an overwrite removes these (and nothing else the user keeps there)
RUN_FILES = (
    WEIGHTS_FILE,
    MODEL_CONFIG_FILE,
    VOCABULARY_FILE,
    REPORT_FILE,
    PAGE_FILE,
    METRICS_FILE,
    LOG_FILE,
    CONFIG_FILE,
)
PICTURES_FOLDER = str(Path(next(iter(PICTURES.values()))).parent)  # plots/
IN_USE_ADVICE = (
    "or give this run another save_path (reading the folder: load_pretrained, gears-ddp evaluate, "
    "predict --run is not blocked)"
)


def make_save_folder(save_path) -> Path:
    """Create the save folder; a file standing where it (or a folder above it) would go is
    refused, naming it."""
    path = Path(save_path)
    return make_folder(path, f"save_path {path}", "choose another save_path (a run writes its folder there)")


def check_save_path(save_path) -> Path:
    """Create the save folder and make sure it is writable with room for checkpoints."""
    path = make_save_folder(save_path)
    try:
        probe = path / ".gears_ddp_write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"cannot write to save_path {path}: {err}") from err
    free = shutil.disk_usage(path).free
    if free < MIN_FREE_BYTES:
        raise OSError(
            f"save_path {path} has only {free / 2**20:.0f} MiB free; checkpoints need at least "
            f"{MIN_FREE_BYTES / 2**20:.0f} MiB"
        )
    return path


def earlier_run(folder) -> str | None:
    """What an earlier run left in ``folder`` that a new run would overwrite (a model, a
    report, checkpoints, an epoch history), described; None when there is nothing."""
    folder = Path(folder)
    checkpoints = checkpoint_files(folder)
    if (folder / WEIGHTS_FILE).is_file() or (folder / REPORT_FILE).is_file():
        written = max(
            (folder / name).stat().st_mtime for name in (WEIGHTS_FILE, REPORT_FILE) if (folder / name).is_file()
        )
        when = datetime.datetime.fromtimestamp(written).strftime("%Y-%m-%d %H:%M")
        return f"a finished run (its model and report written {when})"
    if checkpoints:
        return f"an unfinished run's checkpoints (the newest {checkpoints[-1].name})"
    if (folder / METRICS_FILE).is_file():
        return f"an unfinished run's epochs ({METRICS_FILE})"
    return None


def finished_report(folder: Path) -> dict | None:
    """The run's report when it is complete (``report.json`` readable and the page, written
    after it, present), else None."""
    if not (folder / PAGE_FILE).is_file():
        return None
    try:
        report = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "history" in report else None


def clear_earlier_run(folder) -> None:
    """Remove what a run writes in ``folder`` (``RUN_FILES``, its checkpoints and its
    pictures), so that nothing of the earlier run mixes with the new one; other files stay."""
    folder = Path(folder)
    for name in RUN_FILES:
        (folder / name).unlink(missing_ok=True)
    for path in checkpoint_files(folder):
        path.unlink()
    for path in (folder / Path(PICTURES_FOLDER)).glob("*.png"):  # the pictures, however many the run drew
        path.unlink()
    for name in (CHECKPOINT_FOLDER, PICTURES_FOLDER):
        with contextlib.suppress(OSError):  # kept when it holds something else
            (folder / name).rmdir()


def folder_of_runs(folder) -> str | None:
    """What ``folder`` holds when it is the folder of several runs (a sweep, replicates),
    described; None otherwise. A run of its own never goes there: it would take the place of
    the sweep's or the replicates' own report and configuration, and a run trained there
    would be mistaken for one of theirs."""
    folder = Path(folder)
    if (folder / SWEEP_FILE).is_file():
        return f"a sweep (its {SWEEP_FILE})"
    try:
        settings = read_settings(folder)
    except (OSError, yaml.YAMLError):  # an unreadable config.yaml: not the replicates' (they wrote it)
        return None
    if isinstance(settings, dict) and "replicates" in settings:
        return f"replicates (its {CONFIG_FILE} has a replicates section)"
    return None


def refuse_a_folder_of_runs(folder, replicates: bool = False) -> None:
    """Refuse a single run in a folder of several runs (``folder_of_runs``), or
    ``replicates`` in a sweep's folder (their report would replace the sweep's), naming what
    holds it; neither ``resume_from`` nor ``overwrite_save_path`` lets it in."""
    held = folder_of_runs(folder)
    if held is None or (replicates and not (Path(folder) / SWEEP_FILE).is_file()):
        return
    refused = ("replicates", "replicates") if replicates else ("one run", "a single run")
    raise FileExistsError(
        f"save_path {folder} holds {held}, not {refused[0]}: {refused[1]} cannot be trained there, nor replace it "
        "(not with overwrite_save_path or resume_from either); choose another save_path"
    )


def refuse_or_clear_earlier_run(folder, resume_from, overwrite: bool) -> None:
    """An earlier run in ``folder`` is continued (``resume_from`` set), replaced
    (``overwrite``: its files removed, said in the log) or refused with a FileExistsError
    naming the ways on. A finished run without checkpoints (its report complete:
    ``finished_report``) cannot be continued: ``resume_from='auto'`` would find nothing and
    train it again from the beginning over its model, so that is refused too, and not
    offered."""
    found = earlier_run(folder)
    if found is None or resume_from not in (None, "auto"):
        return
    continued = bool(checkpoint_files(folder)) or finished_report(Path(folder)) is None
    if resume_from == "auto" and continued:
        return
    if overwrite:
        logger.warning("save_path %s holds %s: this run replaces it (overwrite_save_path)", folder, found)
        clear_earlier_run(folder)
        return
    if not continued:
        raise FileExistsError(
            f"save_path {folder} holds {found} without checkpoints, which cannot be continued"
            f"{': resume_from=auto would train it again from the beginning over it' if resume_from else ''}; "
            "replace it with overwrite_save_path=True (gears-ddp train: --overwrite), or choose another "
            "save_path (a run that may be continued later trains with checkpoint_every)"
        )
    raise FileExistsError(
        f"save_path {folder} holds {found}: continue it with resume_from='auto' (more epochs "
        "train further), replace it with overwrite_save_path=True (gears-ddp train: --set "
        "args.resume_from=auto, or --overwrite), or choose another save_path"
    )


def remove_left_temporaries(folder: Path) -> None:
    """Remove the partly written files (``io.left_temporaries``) that a run killed outright
    left in ``folder``, its checkpoints' folder and its pictures' folder, saying how many
    and their size: a job killed at each checkpoint would otherwise keep a partial
    checkpoint per kill. Only for a folder this process holds (``held_save_path``)."""
    left = [path for place in ("", CHECKPOINT_FOLDER, PICTURES_FOLDER) for path in left_temporaries(folder / place)]
    if not left:
        return
    size = 0
    for path in left:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: left as it is
            size += path.stat().st_size
            path.unlink()
    logger.warning(
        "save_path %s: removed %d partly written file(s) (%.1f MiB) left by a run that was killed while writing",
        folder,
        len(left),
        size / 2**20,
    )


@contextlib.contextmanager
def held_save_path(
    save_path, what: str, resume_from=None, overwrite: bool = False, check: bool = True, of_runs: bool = False
) -> Iterator[Path]:
    """While active, this process holds ``save_path`` (``FolderLock``); on entry, before
    anything is written there, a folder of several runs is refused unless this is its own
    (``of_runs``: the replicates' top folder, refused in a sweep's), an earlier run is
    refused or replaced (``refuse_or_clear_earlier_run``) and, with ``check``, the folder is
    checked for write access and free space (``check_save_path``); the temporary files a
    killed run left are removed (``remove_left_temporaries``). ``what`` names the holder to
    a refused run."""
    folder = make_save_folder(save_path)
    with FolderLock(folder, what, IN_USE_ADVICE):
        refuse_a_folder_of_runs(folder, replicates=of_runs)
        refuse_or_clear_earlier_run(folder, resume_from, overwrite)
        remove_left_temporaries(folder)
        if check:
            check_save_path(folder)
        yield folder
