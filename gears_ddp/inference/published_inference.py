"""The published package's ``gears.inference`` functions, under their names and signatures:
``evaluate``, ``compute_metrics``, ``deeper_analysis`` and ``non_dropout_analysis``, so that
code written for it (``from gears.inference import evaluate, compute_metrics,
deeper_analysis``) runs with ``gears_ddp.inference`` instead.

``evaluate`` returns the published per-cell dict: ``pert_cat``, ``pred``, ``truth``,
``pred_de``, ``truth_de`` and, in uncertainty mode, ``logvar``, one row per cell of the
loader, in its order. In evaluation mode a cell's prediction is its control expression plus
the change its perturbation set causes, so the network runs once per condition
(``prediction.set_effects_in_passes``) and each cell adds its condition's change: the
values of the network run on every cell. The other three read that dict (and the dataset's
AnnData) and give the published keys and values, computed by ``evaluation.metrics`` from
each condition's means (``evaluation.per_cell``).

Published quirks kept, so that numbers compare with published ones: ``pred_de`` and
``truth_de`` of a cell whose condition has fewer than 20 DE genes (control: none) repeat
the last gene's value where the DE list is padded (the published ``de_idx`` pads with -1);
the metrics' own quirks are ``evaluation.metrics``'s.
"""

from __future__ import annotations

import numpy as np
import torch

from gears_ddp.data.processing import RANK_KEY
from gears_ddp.evaluation.metrics import deeper_analysis as condition_deeper_analysis
from gears_ddp.evaluation.metrics import non_dropout_analysis as condition_non_dropout_analysis
from gears_ddp.evaluation.per_cell import CellResults, analysis_inputs
from gears_ddp.inference.prediction import set_effects_in_passes

PUBLISHED_DE_PREFIX = "rank_genes_groups_cov"


@torch.no_grad()
def evaluate(loader, model, uncertainty, device) -> dict[str, np.ndarray]:
    """Run ``model`` (a ``GEARSModel``, e.g. ``gears_model.model``) in evaluation mode on
    every cell of ``loader`` (e.g. ``gears_model.dataloader['test_loader']``), on ``device``;
    return the published per-cell dict (see the module docstring), ``logvar`` with
    ``uncertainty``."""
    if not hasattr(model, "set_effects"):
        raise TypeError(f"model must be a gears_ddp network (gears_model.model), got a {type(model).__name__}")
    if uncertainty and not model.uncertainty:
        raise ValueError(
            "uncertainty=True needs a model built in uncertainty mode "
            "(model_initialize(uncertainty=True)); pass gears_model.config['uncertainty']"
        )
    device = torch.device(device)
    model.to(device)
    code_parts, input_parts, truth_parts, de_parts = [], [], [], []
    sets: dict[int, torch.Tensor] = {}
    names = None
    for batch in loader:
        code_parts.append(batch.condition)
        input_parts.append(batch.x)
        truth_parts.append(batch.y)
        de_parts.append(batch.de_idx)
        names = batch.condition_names
        for code, perturbed in zip(batch.condition.tolist(), batch.pert_idx):
            sets.setdefault(code, perturbed)
    if names is None:
        raise ValueError("the loader holds no cells to evaluate")
    codes = torch.cat(code_parts)
    present = sorted(sets)
    effects, logvar = set_effects_in_passes(model, torch.stack([sets[code] for code in present]), device)
    row_of = torch.full((len(names),), -1, dtype=torch.long)
    row_of[present] = torch.arange(len(present))
    rows = row_of[codes]
    pred = (torch.cat(input_parts).float() + effects.float().cpu()[rows]).numpy()
    truth = torch.cat(truth_parts).float().numpy()
    de_idx = torch.cat(de_parts).numpy()  # -1 padded: -1 reads the last gene, as the published de_idx does
    results = {
        "pert_cat": np.array([names[code] for code in codes.tolist()]),
        "pred": pred,
        "truth": truth,
        "pred_de": np.take_along_axis(pred, de_idx, axis=1),
        "truth_de": np.take_along_axis(truth, de_idx, axis=1),
    }
    if uncertainty:
        assert logvar is not None  # a network in uncertainty mode (checked above) gives it
        results["logvar"] = logvar.float().cpu()[rows].numpy()
    return results


def compute_metrics(results) -> tuple[dict, dict]:
    """The published ``compute_metrics``: ``(metrics, metrics_pert)``, ``mse``, ``pearson``,
    ``mse_de`` and ``pearson_de`` of each condition's mean prediction against its mean truth
    (per condition) and their means over the conditions, of ``evaluate``'s dict."""
    return CellResults.of(results).metrics()


def deeper_analysis(
    adata, test_res, de_column_prefix: str = PUBLISHED_DE_PREFIX, most_variable_genes=None
) -> dict[str, dict]:
    """The published ``deeper_analysis``: per condition of ``test_res`` (``evaluate``'s
    dict), its direction, in-range, sigma, delta-correlation, fold-change, top-200 HVG and
    top 20/50/100/200 DE metrics against the dataset ``adata`` (``gears_model.adata``).

    The published function ignores ``de_column_prefix`` and always reads
    ``uns['rank_genes_groups_cov_all']``; so does this one, and it refuses another prefix
    rather than let it seem to be used."""
    if de_column_prefix != PUBLISHED_DE_PREFIX:
        raise ValueError(
            f"de_column_prefix={de_column_prefix!r}: the published deeper_analysis always reads "
            f"uns['{RANK_KEY}'] whatever the prefix, and so does this one; leave it at "
            f"{PUBLISHED_DE_PREFIX!r} (to analyse another ranking, store it under uns['{RANK_KEY}'])"
        )
    return condition_deeper_analysis(*analysis_inputs(adata, test_res, most_variable_genes))


def non_dropout_analysis(adata, test_res) -> dict[str, dict]:
    """The published ``non_dropout_analysis``: per condition of ``test_res`` (``evaluate``'s
    dict), direction, in-range, sigma, Pearson and MSE metrics at its top 20 non-dropout DE
    genes and over its non-zero and non-dropout gene sets, against ``adata``."""
    return condition_non_dropout_analysis(*analysis_inputs(adata, test_res))
