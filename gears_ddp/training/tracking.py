"""Experiment tracking with Weights & Biases (the optional ``wandb`` package)."""

from __future__ import annotations


def start_wandb(project: str = "GEARS", name: str = "GEARS", **settings):
    """Start a Weights & Biases run and return the ``wandb`` module that logs to it.
    ``settings`` are passed to ``wandb.init`` (``entity``, ``tags``, ``mode``, ...)."""
    try:
        import wandb
    except ImportError as err:
        raise ImportError("Weights & Biases tracking needs the wandb package: pip install wandb") from err
    wandb.init(project=project, name=name, **settings)
    return wandb
