"""The same workflow with either package, gears_ddp or the published GEARS, on the same raw
data, split and hyperparameters: its command-line options, and its steps
(``new_data_process`` on the raw h5ad, ``prepare_split``, ``get_dataloader``, ``GEARS`` and
``model_initialize``), seeded alike.

Without a seed, torch's generator is seeded with ``MODEL_SEED`` before ``model_initialize``
and the split is ``settings.SPLIT``'s. With a seed S (``args.seed``), Python's, numpy's and
torch's global generators are seeded with S before ``new_data_process`` (the published
package pairs each perturbed cell with a control cell drawn from numpy's global generator
there, otherwise unseeded) and again right before ``model_initialize`` (the initial
weights, and the published training shuffle, which draws from torch's global generator),
and the split is ``prepare_split('simulation', seed=S)``.

``--without-coexpression`` gives the model an empty co-expression graph
(``model_initialize(G_coexpress=<no edges>, ...)``; each gene then keeps its own positional
embedding). The published model runs its co-expression GNN with an edge index over one
cell's genes on a batch of cells, so only the first cell of a batch gets the messages; with
no edges the two models compute the same function for every cell.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness.settings import HIDDEN_SIZE, SPLIT
from harness.synthetic import add_size_arguments

MODEL_SEED = 0  # torch's seed before model_initialize without a seed


def add_workflow_options(parser: argparse.ArgumentParser) -> None:
    """The synthetic data's size (the generator's defaults unless given), the batch sizes and
    ``--without-coexpression``."""
    add_size_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=32)
    parser.add_argument(
        "--without-coexpression",
        action="store_true",
        help="give both models an empty co-expression graph (see the module docstring)",
    )


def split_seed(args) -> int:
    """The simulation split's seed: ``args.seed`` if given, else ``SPLIT``'s."""
    return SPLIT["seed"] if args.seed is None else args.seed


def _seed_globals(seed: int) -> None:
    """Seed Python's, numpy's and torch's global random generators."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_up(pert_data_class, gears_class, folder: Path, raw: Path, args, device: str = "cpu", **loader_options):
    """The same steps with either package's ``PertData`` and ``GEARS``: process ``raw`` in
    ``folder``, split, loaders (timed), then the model on ``device`` (timed, seeded as the
    module docstring says). ``args`` holds ``seed``, ``batch_size``, ``test_batch_size`` and
    ``without_coexpression``; ``loader_options`` go to ``get_dataloader``. Returns
    (pert_data, gears, data seconds, model seconds)."""
    import anndata
    import torch

    if args.seed is not None:
        _seed_globals(args.seed)
    start = time.perf_counter()
    pert_data = pert_data_class(str(folder))
    pert_data.new_data_process("bench", anndata.read_h5ad(raw))
    pert_data.prepare_split(SPLIT["split"], seed=split_seed(args))
    pert_data.get_dataloader(args.batch_size, test_batch_size=args.test_batch_size, **loader_options)
    data_s = time.perf_counter() - start
    start = time.perf_counter()
    gears = gears_class(pert_data, device=device)
    if args.seed is None:
        torch.manual_seed(MODEL_SEED)
    else:
        _seed_globals(args.seed)
    gears.model_initialize(hidden_size=HIDDEN_SIZE, **_coexpression_graph(args))
    return pert_data, gears, data_s, time.perf_counter() - start


def _coexpression_graph(args) -> dict:
    """``model_initialize`` arguments for ``--without-coexpression``: an empty graph."""
    if not args.without_coexpression:
        return {}
    import torch

    return {"G_coexpress": torch.zeros(2, 0, dtype=torch.long), "G_coexpress_weight": torch.zeros(0)}
