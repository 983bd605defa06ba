"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is written at an optimiser-step boundary. It holds the model, optimiser,
schedule and gradient-scaler states, the position in training (epoch, optimiser steps done
in it, steps done in all, and the epoch's loss so far: the sampler reshuffles from
``seed + epoch``, so epoch and step are the sampler position), the outcome so far
(``recipe.TrainingOutcome`` as a dict: best model, its val ``mse_de``, history), the
random-number states and the options of the run.

Checkpoints go to ``<save_path>/checkpoints/checkpoint-<step>.pt``, the last ``keep`` of
them are kept, and each is written atomically and flushed to disk before it is renamed
into place. They hold plain types and tensors only, so ``torch.load(...,
weights_only=True)`` reads them and no code in the file is ever run. ``latest_checkpoint``
finds the newest one that can be read, skipping (with a warning naming it) one that cannot.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import cast

import numpy as np
import torch

from gears_ddp._logging import get_logger
from gears_ddp.data import io
from gears_ddp.report.run_files import CONFIG_FILE
from gears_ddp.training.training_options import TrainingOptions, changed_on_resume

logger = get_logger(__name__)

CHECKPOINT_FOLDER = "checkpoints"
FORMAT_VERSION = 2
_NAME = re.compile(r"checkpoint-(\d+)\.pt")


def capture_rng_states() -> dict:
    """Python, numpy, torch (and CUDA) random-number states, as plain types and tensors."""
    # the legacy state of numpy's global MT19937 generator: always this tuple, never a dict
    kind, keys, position, has_gauss, cached_gaussian = cast(
        tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True)
    )
    states = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian],
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    kind, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def checkpoint_folder(save_path) -> Path:
    return Path(save_path) / CHECKPOINT_FOLDER


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder (``save_path``) a checkpoint file was written in: ``checkpoint_folder``'s inverse."""
    return Path(checkpoint).parent.parent  # SAVE_PATH/checkpoints/checkpoint-N.pt


def checkpoint_files(save_path) -> list[Path]:
    """The checkpoint files in ``save_path``, oldest first (a folder named like one is not)."""
    folder = checkpoint_folder(save_path)
    found = [
        (int(m.group(1)), path)
        for path in folder.glob("checkpoint-*.pt")
        if (m := _NAME.fullmatch(path.name)) and path.is_file()
    ]
    return [path for _, path in sorted(found)]


def save_training_checkpoint(save_path, payload: dict, keep: int) -> Path:
    """Write ``payload`` (with ``payload['position']['global_step']``) as the newest
    checkpoint in ``save_path`` and delete all but the newest ``keep`` (and any file a killed
    run left half-written); returns its path. Only one process writes checkpoints."""
    path = checkpoint_folder(save_path) / f"checkpoint-{payload['position']['global_step']:09d}.pt"
    with io.atomic_path(path) as tmp:
        torch.save({"format": FORMAT_VERSION, **payload, "rng": capture_rng_states()}, tmp)
    for old in checkpoint_files(save_path)[:-keep]:
        old.unlink(missing_ok=True)
    for unfinished in path.parent.glob(".checkpoint-*.tmp"):  # left by a run killed while writing
        unfinished.unlink(missing_ok=True)
    return path


def load_training_checkpoint(path) -> dict:
    """Read one checkpoint file, with a clear error for a missing, damaged or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training checkpoint at {path}")
    payload = io.read_torch_file(path, "training checkpoint")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a gears_ddp training checkpoint (format {FORMAT_VERSION})")
    return payload


def latest_checkpoint(save_path) -> tuple[Path, dict] | None:
    """The newest checkpoint in ``save_path`` that can be read, and its contents; None when
    there is none. An unreadable newer one is skipped with a warning naming it."""
    for path in reversed(checkpoint_files(save_path)):
        try:
            return path, load_training_checkpoint(path)
        except ValueError as err:
            logger.warning("skipping checkpoint %s, which cannot be read (%s); trying the one before it", path, err)
    return None


def resolve_resume(resume_from, save_path) -> tuple[Path, dict] | None:
    """The checkpoint a run continues from: ``resume_from`` a file, a save folder (its latest
    checkpoint), or ``'auto'`` (the latest in ``save_path``, or None to start fresh)."""
    if resume_from is None:
        return None
    if resume_from == "auto":
        return latest_checkpoint(save_path) if save_path is not None else None
    path = Path(resume_from)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"resume_from={str(path)!r}: no readable checkpoint in {checkpoint_folder(path)}")
        return found
    return path, load_training_checkpoint(path)


def refuse_other_training_options(checkpoint: Path, state: dict, options: TrainingOptions) -> None:
    """Refuse to continue from ``checkpoint`` (its contents: ``state``) with ``options`` that
    differ from those it was written with in one that must match (``RESUME_OPTIONS``): the
    restored optimiser and position would be mixed with the new values, and the run would end
    neither as the run it continues nor as a fresh one with them. Checked before any rank starts
    (``launchers.opening``), and by each rank and ``GEARS.train`` (``recipe.TrainingRecipe``)."""
    differing = changed_on_resume(state.get("options") or {}, options)
    if differing:
        config = run_folder_of(checkpoint) / CONFIG_FILE
        holder = str(config) if config.is_file() else "the checkpoint's 'options'"
        raise ValueError(
            f"resume_from: {checkpoint} was written by a run with other training options ({'; '.join(differing)}): "
            f"give the options it was trained with ({holder} holds them), or start afresh (overwrite_save_path=True; "
            "gears-ddp train --overwrite)"
        )
