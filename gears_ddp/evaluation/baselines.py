"""Baselines scored beside the model, so users see at a glance whether GEARS beat them.

Each baseline predicts a condition's mean expression from the training data only:

- ``no_change``: the control mean (the perturbation does nothing).
- ``mean_effect``: control mean + the mean effect (condition mean - control mean) over all
  perturbed training conditions.
- ``additive``: control mean + the sum, over the condition's genes, of that gene's single
  effect in training (``A+ctrl``); a gene without a training single gets the mean
  single-gene effect. For two-gene combinations this is the additive model; for singles
  of unseen genes it falls back to the mean single effect.
- ``linear``: the linear model of Ahlmann-Eltze, Huber and Anders (Nature Methods 2025)
  on the training conditions' means, each perturbation placed by the training data's own
  PCA (``linear_baseline``).
- ``linear_pretrained``: the same model with the perturbations placed by the PCA of another
  screen (their best model, with Replogle's K562 or RPE1 screens), where one is given
  (``linear_baseline.other_screen_embedding``; the ``linear_baseline_screen`` option).

A baseline is an ``EvaluationResult`` identical to the model's but for ``pred_mean``, so the
same metric functions score it. ``baseline_effects`` gives a baseline's predicted changes as
the model's come, so the cell-eval export writes a baseline's cells as it writes the model's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gears_ddp.data.conditions import CONTROL, condition_genes, is_single
from gears_ddp.data.grouped import condition_means
from gears_ddp.evaluation.linear_baseline import LinearModel, PerturbationEmbedding
from gears_ddp.evaluation.metrics import EvaluationResult

BASELINES = ("no_change", "mean_effect", "additive", "linear")
PRETRAINED = "linear_pretrained"  # the linear baseline placing perturbations by another screen's PCA


def training_condition_means(pert_data) -> dict[str, np.ndarray]:
    """Mean expression (float64) of every training condition, by a grouped sum over cells."""
    cells = pert_data.cells
    train = [c for c in pert_data.set2conditions["train"] if c in cells.conditions]
    train_codes = [cells.conditions.index(c) for c in train]
    all_codes = cells.condition_codes.numpy()
    codes = np.where(np.isin(all_codes, train_codes), all_codes, -1)
    means = condition_means(cells.expression.numpy(), codes, len(cells.conditions))
    return {c: means[code] for c, code in zip(train, train_codes)}


def baseline_predictions(
    pert_data, conditions: list[str], other_screen: PerturbationEmbedding | None = None
) -> dict[str, np.ndarray]:
    """Predicted mean expression (conditions x genes) of each baseline, from training data
    only; with ``other_screen`` (``linear_baseline.other_screen_embedding``) also
    ``linear_pretrained``'s."""
    means = training_condition_means(pert_data)
    if CONTROL not in means:
        raise ValueError("baselines need control cells in the training set")
    control = means[CONTROL]
    effects = {c: m - control for c, m in means.items() if c != CONTROL}
    single_effect = {condition_genes(c)[0]: e for c, e in effects.items() if is_single(c)}
    mean_effect: np.ndarray = np.mean(list(effects.values()), axis=0) if effects else np.zeros_like(control)
    mean_single: np.ndarray = np.mean(list(single_effect.values()), axis=0) if single_effect else mean_effect

    def additive(condition: str) -> np.ndarray:
        return control + sum(
            (single_effect.get(g, mean_single) for g in condition_genes(condition)), np.zeros_like(control)
        )

    predictions = {
        "no_change": np.tile(control, (len(conditions), 1)),
        "mean_effect": np.stack([control + (0 if c == CONTROL else mean_effect) for c in conditions]),
        "additive": np.stack([additive(c) for c in conditions]),
        "linear": LinearModel.fit(means, pert_data.gene_names).predict(conditions),
    }
    if other_screen is not None:
        predictions[PRETRAINED] = LinearModel.fit(means, pert_data.gene_names, other_screen).predict(conditions)
    return predictions


def baseline_results(
    pert_data, result: EvaluationResult, other_screen: PerturbationEmbedding | None = None
) -> dict[str, EvaluationResult]:
    """The model's evaluation result with each baseline's predictions in place of the model's
    (``other_screen``: see ``baseline_predictions``)."""
    return {
        name: dataclasses.replace(result, pred_mean=pred, logvar_mean=None)
        for name, pred in baseline_predictions(pert_data, result.conditions, other_screen).items()
    }


def baseline_effects(pert_data, name: str, other_screen: PerturbationEmbedding | None = None):
    """Baseline ``name``'s predictions in the form ``GEARS.perturbation_effects`` gives the
    model's: a function of perturbation sets (K x 2 perturbation-vocabulary indices, as
    ``CellTable.condition_pert_idx`` holds them) returning each set's predicted change over
    the training control mean (K x G float32) and no log-variance. An error names an unknown
    baseline, and ``linear_pretrained`` without ``other_screen``."""
    names = BASELINES + ((PRETRAINED,) if other_screen is not None else ())
    if name not in names:
        needs = f"; {PRETRAINED} needs another screen (linear_baseline_screen)" if name == PRETRAINED else ""
        raise ValueError(f"no baseline {name!r} here: the baselines are {', '.join(names)}{needs}")
    table = pert_data.cells
    condition_of = {
        tuple(pert_set): condition for condition, pert_set in zip(table.conditions, table.condition_pert_idx.tolist())
    }

    def effects(sets: torch.Tensor) -> tuple[torch.Tensor, None]:
        predictions = baseline_predictions(pert_data, [condition_of[tuple(s)] for s in sets.tolist()], other_screen)
        # no_change predicts the training control mean: the change is the difference from it
        return torch.as_tensor(predictions[name] - predictions["no_change"], dtype=torch.float32), None

    return effects
