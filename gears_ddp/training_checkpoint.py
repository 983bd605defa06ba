"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the model, optimizer, scheduler and gradient-scaler states, the next
epoch (the samplers reshuffle from ``seed + epoch``, so the epoch is the sampler position),
the outcome so far (``recipe.TrainingOutcome`` as a dict: best model, its val ``mse_de``,
history) and the random-number states. It is written atomically (temporary file, then
rename), so a run killed while saving keeps its previous checkpoint.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from gears_ddp.data import io

CHECKPOINT_FILE = "training_checkpoint.pt"
FORMAT_VERSION = 1


def capture_rng_states() -> dict:
    """Python, numpy, torch (and CUDA) random-number states."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_training_checkpoint(path, *, next_epoch: int, model: torch.nn.Module, optimizer, scheduler,
                             scaler, outcome: dict, args: dict, world_size: int) -> Path:
    """Write the training state to ``path`` atomically; returns the path."""
    payload = {"format": FORMAT_VERSION, "next_epoch": next_epoch,
               "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
               "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
               "scaler": scaler.state_dict() if scaler is not None else None,
               "outcome": outcome, "rng": capture_rng_states(), "args": args, "world_size": world_size}
    path = Path(path)
    with io.atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def load_training_checkpoint(path) -> dict:
    """Read a training checkpoint, with a clear error for a missing, corrupt or foreign file."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no training checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for damaged files
        raise ValueError(f"cannot read training checkpoint {path}: {type(err).__name__}: {err}") from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a gears_ddp training checkpoint (format {FORMAT_VERSION})")
    return payload
