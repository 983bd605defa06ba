"""Predictions in the layout of Arc Institute's ``cell-eval`` (the Virtual Cell Challenge
evaluator): predicted and real AnnData files with each cell's perturbation in
``obs[PERT_COLUMN]`` (``'target_gene'``), controls labelled ``CONTROL_LABEL``
(``'non-targeting'``), genes matched by ``var_names`` and the provenance in
``uns['gears_ddp']``, so that ``cell-eval run`` scores them with its defaults.

A predicted cell is a real control cell shifted by its condition's predicted change (GEARS
predicts a mean change, not a distribution), written as ``max(prediction, 0)`` by default
because cell-eval refuses negative expression. ``split_predictions`` puts every control cell
in both files and pairs cells as the loader does, so on unclipped predictions cell-eval's
``pearson_delta`` and ``mse`` equal ours to float32 rounding.

docs/evaluation.md ("cell-eval's layout and metrics, in detail") lists the columns written
and every way cell-eval's scores differ from ours.
"""

from __future__ import annotations

import copy
from typing import Sequence

import anndata
import numpy as np
import pandas as pd
import torch

from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.inference.prediction import checked_cell_count, drawn_controls
from gears_ddp.runtime.memory_budget import FLOAT32_BYTES, refuse_beyond_memory

PERT_COLUMN = "target_gene"  # the default --pert-col of `cell-eval run`
CONTROL_LABEL = "non-targeting"  # cell-eval's default control_pert
PROVENANCE_KEY = "gears_ddp"
GENE_ID_COLUMN = "gene_id"  # the data's var_names, where they are not the gene names
ROWS_PER_BLOCK = 4096  # cells shifted at a time (bounds the temporary of a shift)


# ---------------------------------------------------------------------------- names
def target_of(condition: str) -> str:
    """cell-eval's name of a condition's perturbation: its genes joined by ``+`` in written
    order (``A`` for ``A+ctrl``, ``A+B`` for ``A+B``), ``CONTROL_LABEL`` for control."""
    return "+".join(condition_genes(condition)) or CONTROL_LABEL


def _targets(conditions: Sequence[str]) -> list[str]:
    """``target_of`` each of the distinct ``conditions``; an error names two conditions that
    would share a target (``A+ctrl`` and ``ctrl+A``), which cell-eval would merge."""
    targets = [target_of(c) for c in conditions]
    first: dict[str, str] = {}
    for condition, target in zip(conditions, targets):
        other = first.setdefault(target, condition)
        if other != condition:
            raise ValueError(
                f"conditions {other!r} and {condition!r} both perturb {target!r}; cell-eval's "
                f"{PERT_COLUMN!r} column would merge them: write one spelling in obs['condition']"
            )
    return targets


def condition_obs(conditions: Sequence[str], index: Sequence[str]) -> pd.DataFrame:
    """``obs`` of rows with the given conditions (as the data writes them): categorical
    columns ``condition``, ``target`` (cell-eval's perturbation), ``gene_1`` and ``gene_2``
    (``'ctrl'`` where the condition perturbs fewer genes), indexed by ``index``."""
    rows = pd.Categorical(list(conditions))
    distinct = list(rows.categories)
    genes = [(condition_genes(c) + [CONTROL, CONTROL])[:2] for c in distinct]
    columns = {
        "condition": distinct,
        PERT_COLUMN: _targets(distinct),
        "gene_1": [g[0] for g in genes],
        "gene_2": [g[1] for g in genes],
    }
    return pd.DataFrame(
        {name: pd.Categorical(np.asarray(values, dtype=object)[rows.codes]) for name, values in columns.items()},
        index=pd.Index(list(index), dtype=str),
    )


def query_conditions(pert_data, pert_list: Sequence[Sequence[str]]) -> list[str]:
    """The condition of each query as the data writes it (``ctrl+A`` or ``B+A`` if that is
    the data's spelling of the query's genes); a query the data lacks is ``A+ctrl`` or
    ``A+B`` in query order."""
    spelled: dict[frozenset[str], str] = {}
    for condition in pert_data.cells.conditions:
        if condition != CONTROL:
            spelled.setdefault(frozenset(condition_genes(condition)), condition)
    return [spelled.get(frozenset(query), "+".join(list(query) + [CONTROL] * (2 - len(query)))) for query in pert_list]


def gene_var(pert_data) -> pd.DataFrame:
    """The data's ``var`` indexed by gene name; ``var_names`` that are not the gene names
    (e.g. Ensembl ids) move to the column ``gene_id`` unless ``var`` has one."""
    var = pert_data.var.copy()
    names = pd.Index(np.asarray(pert_data.gene_names, dtype=str), dtype=str)
    if not var.index.equals(names) and GENE_ID_COLUMN not in var.columns:
        var[GENE_ID_COLUMN] = np.asarray(var.index, dtype=str)
    var.index = names
    return var


# ---------------------------------------------------------------------------- GEARS.predict
def mean_predictions(
    pert_data,
    provenance: dict,
    pert_list,
    prediction: np.ndarray,
    uncertainty: np.ndarray | None,
    seed: int,
    control_cells: int,
) -> anndata.AnnData:
    """``GEARS.predict(..., return_type='anndata')``: one row per query, its mean prediction
    (Q x G) over ``control_cells`` control cells drawn with ``seed``, named by its condition
    as the data writes it (``A+ctrl``, ``A+B``), with the queried genes and cell-eval's
    target in ``obs`` (and ``uncertainty``, exp(-mean log-variance), in uncertainty mode),
    the genes as ``var`` and ``provenance`` (``GEARS.provenance()``) in ``uns['gears_ddp']``."""
    conditions = query_conditions(pert_data, pert_list)
    obs = condition_obs(conditions, index=conditions)
    if uncertainty is not None:
        obs["uncertainty"] = uncertainty
    uns = {PROVENANCE_KEY: {**provenance, "seed": seed, "control_cells": control_cells}}
    return anndata.AnnData(X=prediction, obs=obs, var=gene_var(pert_data), uns=uns)


def cell_predictions(
    pert_data, provenance: dict, pert_list, controls: torch.Tensor, effect: torch.Tensor, seed: int
) -> anndata.AnnData:
    """``GEARS.predict(..., return_type='cell-eval')``: for each query, the drawn control
    cells ``controls`` (N x G, drawn with ``seed``) each with the query's predicted change
    ``effect`` (Q x G), clipped at 0; then the same control cells unchanged, as
    ``non-targeting``. Where nothing is clipped a query's mean is its ``'dict'`` prediction.

    Memory: (Q + 1) x N x G float32 (N = 300: 1,000 queries of 5,000 genes take 6 GB).
    """
    conditions = query_conditions(pert_data, pert_list)
    n_cells = len(controls)
    shifted = (controls.unsqueeze(0) + effect.unsqueeze(1)).clamp_(min=0).reshape(-1, controls.shape[1])
    rows = [c for c in conditions for _ in range(n_cells)] + [CONTROL] * n_cells
    obs = condition_obs(rows, index=[f"{c}:{k % n_cells}" for k, c in enumerate(rows)])
    uns = {PROVENANCE_KEY: {**provenance, "seed": seed, "control_cells": n_cells, "clipped_at_zero": True}}
    return anndata.AnnData(X=torch.cat((shifted, controls)).numpy(), obs=obs, var=gene_var(pert_data), uns=uns)


# ---------------------------------------------------------------------------- a split
def _refuse_files_beyond_memory(
    split: str, n_perturbations: int, n_cells: int | None, real_cells: int, control_cells: int, n_genes: int
) -> None:
    """Refuse, before anything is made, the two files of ``split_predictions`` when the
    machine cannot hold them: each file's rows are made once and copied once into the file's
    matrix (predicted: ``n_cells`` per perturbation, or one per real cell; real: the real
    cells; both: the control cells), float32 x ``n_genes``."""
    predicted = real_cells if n_cells is None else n_perturbations * n_cells
    cells = f"{n_cells:,} cells for each of the {n_perturbations:,} perturbations" if n_cells else "its cells"
    refuse_beyond_memory(
        2 * FLOAT32_BYTES * n_genes * (predicted + real_cells + 2 * control_cells),
        f"predicting split {split!r} for cell-eval ({cells}: {predicted:,} predicted and {real_cells:,} real cells "
        f"x {n_genes:,} genes, and the {control_cells:,} control cells in each file)",
        "ask for fewer cells per perturbation (cells_per_perturbation; gears-ddp predict --cells-per-perturbation)"
        if n_cells
        else "ask for a number of cells per perturbation instead of each cell of the split (cells_per_perturbation; "
        "gears-ddp predict --cells-per-perturbation), or predict on a machine with more memory",
    )


def _split_dataset(loaders: dict, split: str):
    """The cells of ``split`` and their control partners, as its evaluation loader holds them
    (``train``: the training cells in evaluation order, whose pairing does not resample)."""
    key = "train_eval_loader" if split == "train" else f"{split}_loader"
    if key not in loaders:
        sets = sorted(k.removesuffix("_loader") for k in loaders if k != "train_eval_loader")
        raise ValueError(f"split={split!r}: the loaders have no {key!r}; this split's sets are {sets}")
    return loaders[key].dataset


def _add_effects(rows: torch.Tensor, effect: torch.Tensor, which: torch.Tensor) -> None:
    """``rows[i] += effect[which[i]]`` in place for the first ``len(which)`` rows, a block of
    rows at a time."""
    for start in range(0, len(which), ROWS_PER_BLOCK):
        block = which[start : start + ROWS_PER_BLOCK]
        rows[start : start + len(block)] += effect[block]


def split_predictions(
    pert_data,
    loaders: dict,
    effects,
    provenance: dict,
    split: str = "test",
    clip_at_zero: bool = True,
    cells_per_perturbation: int | None = None,
    seed: int = 0,
) -> tuple[anndata.AnnData, anndata.AnnData]:
    """Predicted and real AnnData of the perturbations of ``split`` (``'train'``, ``'val'`` or
    ``'test'``) in cell-eval's layout (what ``gears-ddp predict --format cell-eval --split``
    writes); score them with ``cell-eval run -ap pred.h5ad -ar real.h5ad``. ``loaders`` are
    the data's loaders (``PertData.dataloader``), ``effects`` maps perturbation sets to the
    model's predicted changes (``GEARS.perturbation_effects``) and ``provenance`` says what
    made them (``GEARS.provenance()``).

    - predicted, by default: each perturbed cell of the split is the control cell its loader
      pairs it with plus its condition's predicted change (the best model in evaluation
      mode), so a condition's mean is the one ``GEARS.test`` scores;
    - predicted, with ``cells_per_perturbation`` N (a challenge asks for a number of cells
      per perturbation): each perturbation of the split gets N cells, the N control cells
      drawn with ``seed`` (``prediction.drawn_controls``, the cells ``GEARS.predict(...,
      return_type='cell-eval', seed=seed, cells_per_perturbation=N)`` starts from) each plus
      its predicted change, whatever the number of its cells in the data;
    - ``clip_at_zero`` writes ``max(prediction, 0)``, as cell-eval refuses negative
      expression (module docstring);
    - real: the true expression of every perturbed cell of the split;
    - both end with every control cell of the dataset, unchanged, as ``non-targeting``: the
      same cells in both files, so cell-eval's control mean is the dataset's control mean
      that our ``pearson_delta`` uses. Control cells of the split itself are not repeated.

    ``obs`` index: the cell's row in ``pert_data.cells`` (by default the same in both files;
    a cell predicted from a drawn control cell is ``<condition>:<k>``); ``obs`` and ``var``
    as the module docstring describes; ``uns['gears_ddp']``: provenance with the split, the
    loader's pairing seed (or the number of cells per perturbation and their draw's seed)
    and the number of control cells.

    Memory: each file is (predicted or real cells + control cells) x genes float32, both held
    at once (e.g. 20,000 test cells + 10,000 controls x 5,000 genes: 600 MB each).
    """
    table = pert_data.cells
    controls = table.control_cells()
    if len(controls) == 0:
        raise ValueError("the dataset has no control cells ('ctrl'); cell-eval measures changes from control")
    dataset = _split_dataset(loaders, split)
    cells = dataset.cell_indices[table.condition_codes[dataset.cell_indices] != table.conditions.index(CONTROL)]
    if len(cells) == 0:
        raise ValueError(f"split={split!r} has no perturbed cells to predict")
    codes, which = torch.unique(table.condition_codes[cells], return_inverse=True)
    effect, _ = effects(table.condition_pert_idx[codes])
    conditions = [table.conditions[c] for c in codes.tolist()]
    n_cells = None if cells_per_perturbation is None else checked_cell_count(cells_per_perturbation)
    _refuse_files_beyond_memory(split, len(codes), n_cells, len(cells), len(controls), len(pert_data.gene_names))
    if n_cells is None:
        starts, shifts, names = table.rows(dataset.partners[cells]), which, [str(i) for i in cells.tolist()]
        drawn = {"pairing_seed": dataset.pairing_seed}
    else:
        starts = table.rows(drawn_controls(table, seed, n_cells)).repeat(len(codes), 1)
        shifts = torch.arange(len(codes)).repeat_interleave(n_cells)
        names = [f"{condition}:{k}" for condition in conditions for k in range(n_cells)]
        drawn = {"cells_per_perturbation": n_cells, "seed": seed}
    _add_effects(starts, effect.cpu(), shifts)
    if clip_at_zero:
        starts.clamp_(min=0)
    control_rows, control_names = table.rows(controls), [str(i) for i in controls.tolist()]
    var = gene_var(pert_data)
    uns = {
        PROVENANCE_KEY: {
            **provenance,
            "split": split,
            "split_mode": pert_data.split,
            "split_seed": pert_data.seed,
            **drawn,
            "control_cells": len(controls),
            "clipped_at_zero": clip_at_zero,
        }
    }
    controls_of = [CONTROL] * len(controls)
    predicted_obs = condition_obs([conditions[i] for i in shifts.tolist()] + controls_of, index=names + control_names)
    real_obs = condition_obs(
        [conditions[i] for i in which.tolist()] + controls_of, index=[str(i) for i in cells.tolist()] + control_names
    )
    return (
        anndata.AnnData(X=torch.cat((starts, control_rows)).numpy(), obs=predicted_obs, var=var, uns=uns),
        anndata.AnnData(
            X=torch.cat((table.rows(cells), control_rows)).numpy(), obs=real_obs, var=var.copy(), uns=copy.deepcopy(uns)
        ),
    )
