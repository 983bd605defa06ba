"""A GEARS on the benchmarks' data, made, seeded and trained as a user does it, with the
published hyperparameters (``settings``)."""

from __future__ import annotations

from pathlib import Path

from harness.settings import BATCH_SIZE, HIDDEN_SIZE, LR, WEIGHT_DECAY
from harness.synthetic import load_dataset

TEST_BATCH_SIZE = 256


def new_model(pert_data, seed: int = 0, device="cpu", hidden_size: int = HIDDEN_SIZE):
    """``GEARS(pert_data, device)`` with ``model_initialize(hidden_size)`` after
    ``torch.manual_seed(seed)`` (the initial weights)."""
    import torch

    from gears_ddp import GEARS

    torch.manual_seed(seed)
    gears = GEARS(pert_data, device=str(device))
    gears.model_initialize(hidden_size=hidden_size)
    return gears


def trained_model(pert_data, epochs: int, seed: int = 0, loader_seed: int | None = None, **train_options):
    """(GEARS, its training report): loaders of batch ``BATCH_SIZE`` (``loader_seed``: their
    pairing and shuffle, None: gears_ddp's default), ``new_model(pert_data, seed)`` and
    ``train(epochs, LR, WEIGHT_DECAY, **train_options)``."""
    loader_options = {} if loader_seed is None else {"seed": loader_seed}
    pert_data.get_dataloader(batch_size=BATCH_SIZE, test_batch_size=TEST_BATCH_SIZE, **loader_options)
    gears = new_model(pert_data, seed)
    return gears, gears.train(epochs=epochs, lr=LR, weight_decay=WEIGHT_DECAY, **train_options)


def trained_synthetic_model(data_path: Path, name: str, dataset: dict, epochs: int = 1, max_steps: int | None = None):
    """(GEARS, its training report) on the synthetic dataset ``dataset``
    (``write_synthetic_dataset``'s options, written once as ``data_path/name``), trained
    ``epochs`` epochs or ``max_steps`` optimiser steps (``trained_model``)."""
    from gears_ddp.datasets import write_synthetic_dataset

    folder = write_synthetic_dataset(data_path, name=name, **dataset)
    return trained_model(load_dataset(data_path, folder), epochs, max_steps=max_steps)


def perturbed_genes(gears) -> list[str]:
    """The genes perturbed in the data (singly or in a combination), in vocabulary order."""
    from gears_ddp.data.conditions import condition_genes

    perturbed = {gene for condition in gears.pert_data.cells.conditions for gene in condition_genes(condition)}
    return [gene for gene in gears.pert_list if gene in perturbed]
