"""Why GEARS learns so little on a synthetic dataset: the figures that settle it, for
gears_ddp and the published GEARS side by side on the same data, split and options.

    python benchmarks/bench_learning.py [--epochs 10] [--seed 1] [--skip-reference]
                                        [--genes 1000 --cells-per-condition 45 ...] [--record]

The data are made once, in the parent, by ``harness.synthetic.write_raw_input`` (by default
the synthetic data of ``bench_model.py``: 7,300 cells x 1,000 genes, 60 singles and 80 combos of
45 cells, 1,000 controls, generator seed 0), with the noise-free mean profile of every
condition beside them. Each implementation then trains in its own child process exactly as
``bench_model.py --seed S`` sets it up (``harness.side_by_side.set_up``: its own
``new_data_process``, ``prepare_split('simulation', seed=S)``, loaders of batch 32, the
global generators seeded with S, ``model_initialize(hidden_size=64)``) and runs its own
``train(epochs, lr=1e-3, weight_decay=WEIGHT_DECAY)``: every option is the published default.

What is measured, and how:

- **Optimiser steps and learning rate.** Steps per epoch of this run (one process, batch
  32), of ``gears-ddp demo`` on the same data (2 ranks of batch 32: each rank takes half of
  the training cells), and of an epoch of the Norman screen at batch 32 (2,800 steps). The
  published schedule halves the learning rate every epoch, so the sum of the learning rate
  over all steps (the distance Adam can move each weight, in units of its step size) is
  ``steps per epoch x lr x (2 - 2^(1 - epochs))``: at most two epochs at the full rate,
  however many epochs run. The 'full-rate steps' column is that sum divided by lr.
- **True effects against per-cell noise, per gene** (package-neutral, from the processed
  data and the generator's noise-free profiles). A condition's true effect on gene g is its
  noise-free profile minus the control's. The per-cell noise of gene g is the standard
  deviation of its expression over control cells; the noise of a condition's mean over n
  cells is that divided by sqrt(n) (n: the median cells per perturbed condition). On the
  training conditions, the noise-free truth is also scored as a prediction (control mean
  plus true effect) against each condition's observed mean: its ``pearson_delta`` and
  ``mse`` are the best any model can reach there, and its ``mse`` is the part of the
  observed ``mse`` that is noise in the observed means; the mean observed effect of the
  training conditions is scored the same way (in sample). Both packages predict a condition's
  mean as the mean of its cells' paired control cells plus the predicted effect (their test
  metrics are computed so), which adds the noise of that mean to every prediction; the
  no-change baseline, the control mean, does not carry it. So the same figures are also
  given with the partners of one pass of the training loader (gears_ddp's, batch 32) plus
  a zero and the noise-free effect.
- **The loss's exponent on noisy genes.** One pass over the training loader of gears_ddp
  (batch 32, the split's seed; each perturbed cell paired with a random control cell, as both
  packages pair them), scored with the GEARS loss (``gears_ddp.model.losses.gears_loss``, the
  published value, tested) for three predictions of each cell: its control partner plus
  zero (no change), plus the condition's noise-free effect, and plus its observed training
  effect (condition mean minus control mean). The loss is shown as its two terms: the
  error term, ``|pred - y|^(2 + gamma)``, and the direction term (the loss with
  ``direction_lambda = 0`` is the error term). The 'reducible' share is how much of the
  no-change error term the noise-free effect removes; the rest is noise no model can fit.
  The same with the exponent 2 (squared error) in place of the published 2 + gamma = 4, for
  comparison only. The error term is a sum over genes, so the share of each group of genes
  (grouped by the fraction of control cells in which the gene is zero) is the error term
  with the prediction set to the truth outside the group. Last, per training condition and
  gene, the constant effect that minimises each error term over the condition's cells of
  that pass (what a model free to fit every condition would learn from the loss): the
  quartic term's minimiser is a root found by bisection, the squared term's is the mean
  shift; both are scored as the training-set fit below is.
- **Training-set fit over optimiser steps.** At the start, at every quarter of the first
  two epochs and at the end of every epoch, the model's predicted effect of each training
  condition is read in evaluation mode: gears_ddp's ``set_effects`` for the condition's
  perturbation set; the published model's prediction minus its input on up to 32 of the
  condition's cells (in batches of 32 in cell order, as its ``evaluate`` runs them),
  averaged. With the control mean plus that effect as the prediction of each training
  condition's mean, against its observed mean: ``pearson_delta`` (per condition, Pearson
  over genes of predicted and observed change from the control mean, averaged), ``mse``
  (mean over conditions and genes) divided by the ``mse`` of no change, and the Pearson of
  the predicted effect with the noise-free effect ('true r'). 'loss' is the mean training
  loss of the steps since the previous row. The user-facing metrics add the noise of the
  paired control cells to the prediction; the effect read here leaves it out.
- **The uncertainty-free model at initialisation.** Row 0 of the same table, and the
  root-mean-square of the predicted effect beside that of the noise-free effect.
"""

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
from harness.child import run_in_child
from harness.published import patch_csr_indexing, published_test_figures, reference_available
from harness.record import add_record_argument, recorded
from harness.settings import HIDDEN_SIZE, LR, SPLIT, WEIGHT_DECAY
from harness.side_by_side import add_workflow_options, set_up
from harness.synthetic import work_folder, write_raw_input
from harness.tables import print_table

NORMAN_STEPS_PER_EPOCH = 2800  # the Norman screen's training cells at batch 32
PUBLISHED_EPOCHS = 20  # the published default of train()
DEMO_RANKS = 2  # gears-ddp demo without a GPU
PROBE_CELLS = 32  # cells per training condition the published model is read on
TEST_METRICS = ("mse", "mse_de", "pearson_delta")
ZERO_FRACTION_GROUPS = (
    (0.9, 1.01, "zero in >= 90% of control cells"),
    (0.5, 0.9, "zero in 50-90%"),
    (0.0, 0.5, "zero in < 50%"),
)


# ----------------------------------------------------------------------------- package-neutral


def lr_sum(steps_per_epoch: int, epochs: int, lr: float = LR) -> float:
    """The sum of the learning rate over every step when it halves every epoch."""
    return steps_per_epoch * lr * sum(0.5**e for e in range(epochs))


def probe_steps(steps_per_epoch: int, epochs: int) -> list[int]:
    """Step 0, every quarter of the first two epochs, the end of every epoch."""
    quarters = [round(steps_per_epoch * q / 4) for q in range(1, 9)]
    ends = [steps_per_epoch * e for e in range(1, epochs + 1)]
    return sorted({0, *[s for s in quarters if s <= steps_per_epoch * epochs], *ends})


def fit_figures(effects: np.ndarray, truth: dict) -> dict:
    """Training-set figures of predicted effects (conditions x genes, in ``truth``'s order)."""
    observed = truth["observed"] - truth["control"]
    pearson = [np.nan_to_num(np.corrcoef(e, o)[0, 1]) if e.std() > 0 else 0.0 for e, o in zip(effects, observed)]
    true_r = [
        np.nan_to_num(np.corrcoef(e, t)[0, 1]) if e.std() > 0 else 0.0 for e, t in zip(effects, truth["true_effect"])
    ]
    return {
        "pearson_delta": float(np.mean(pearson)),
        "mse": float(np.mean((effects - observed) ** 2)),
        "true_r": float(np.mean(true_r)),
        "effect_rms": float(np.sqrt(np.mean(effects**2))),
    }


def training_truth(pert_data, true_means) -> dict:
    """Control mean, observed means and noise-free effects of the perturbed training
    conditions of gears_ddp's split (the published split is the same, tested)."""
    cells = pert_data.cells
    expression = cells.expression.numpy()
    codes = cells.condition_codes.numpy()
    conditions = [c for c in pert_data.set2conditions["train"] if c != "ctrl"]
    observed = np.stack([expression[codes == cells.conditions.index(c)].mean(0, dtype=np.float64) for c in conditions])
    true_effect = true_means.loc[conditions].to_numpy() - true_means.loc["ctrl"].to_numpy()
    return {
        "conditions": conditions,
        "control": cells.control_mean().numpy().astype(np.float64),
        "observed": observed,
        "true_effect": true_effect,
    }


def effects_and_noise(pert_data, true_means, truth: dict) -> dict:
    """Per-gene true effects against per-cell noise; the noise-free truth scored as a
    prediction of the training conditions."""
    cells = pert_data.cells
    expression = cells.expression.numpy()
    control = expression[cells.control_cells().numpy()]
    per_cell_sd = control.std(0)
    counts = np.bincount(cells.condition_codes.numpy(), minlength=len(cells.conditions))
    n = float(np.median([counts[i] for i, c in enumerate(cells.conditions) if c != "ctrl"]))
    effect = np.abs(true_means.drop(index="ctrl").to_numpy() - true_means.loc["ctrl"].to_numpy())
    mean_noise = per_cell_sd / math.sqrt(n)
    rms_over_conditions = np.sqrt((effect**2).mean(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(per_cell_sd > 0, rms_over_conditions / per_cell_sd, np.nan)
    no_change_mse = float(np.mean((truth["observed"] - truth["control"]) ** 2))
    noise_free = fit_figures(truth["true_effect"], truth)
    observed = truth["observed"] - truth["control"]
    mean_effect = fit_figures(np.tile(observed.mean(0), (len(observed), 1)), truth)
    return {
        "mean_effect": mean_effect,
        "cells_per_condition": n,
        "per_cell_sd": np.quantile(per_cell_sd, [0.1, 0.5, 0.9]).tolist(),
        "effect": np.quantile(effect, [0.5, 0.9, 0.99]).tolist(),
        "ratio": np.nanquantile(ratio, [0.5, 0.9, 0.99]).tolist(),
        "above_mean_noise": float((effect > mean_noise).mean()),
        "above_cell_noise": float((effect > per_cell_sd).mean()),
        "genes_never_above_mean_noise": float((~(effect > mean_noise).any(0)).mean()),
        "no_change_mse": no_change_mse,
        "noise_free": noise_free,
        "true_effect_rms": float(np.sqrt(np.mean(truth["true_effect"] ** 2))),
    }


def paired_controls(pert_data, truth: dict, batches: list) -> dict:
    """The noise a prediction of the published form carries: each cell is predicted as its
    paired control cell plus the effect, so a condition's predicted mean is the mean of its
    cells' partners plus the effect. Over the training conditions: the ``mse`` of a zero
    effect so predicted, and the ``pearson_delta`` and ``mse`` of the noise-free effect."""
    import torch

    names = pert_data.cells.conditions
    sums = torch.zeros(len(names), len(pert_data.var), dtype=torch.float64)
    counts = torch.zeros(len(names), dtype=torch.float64)
    for batch in batches:
        sums.index_add_(0, batch.condition, batch.x.double())
        counts.index_add_(0, batch.condition, torch.ones(len(batch.condition), dtype=torch.float64))
    codes = [names.index(c) for c in truth["conditions"]]
    partners = (sums[codes] / counts[codes, None]).numpy() - truth["control"]  # the partners' mean, less control
    noise_free = fit_figures(partners + truth["true_effect"], truth)
    return {
        "zero_mse": fit_figures(partners, truth)["mse"],
        "noise_free_pearson_delta": noise_free["pearson_delta"],
        "noise_free_mse": noise_free["mse"],
    }


def loss_optimal_effects(pert_data, truth: dict, batches: list) -> dict:
    """Per training condition and gene, the effect e that minimises the published error term
    over the condition's cells of one pass, ``sum_i |x_i + e - y_i|^4`` (x_i the cell's
    control partner; the unique root of ``sum_i (x_i + e - y_i)^3``, by bisection), and the
    one that minimises the squared error (``mean(y) - mean(x)``); each scored as the
    training-set fit is (control mean plus the effect against the observed means)."""
    import torch

    names = pert_data.cells.conditions
    x = torch.cat([b.x for b in batches]).double()
    y = torch.cat([b.y for b in batches]).double()
    condition = torch.cat([b.condition for b in batches])
    quartic, squared = [], []
    for name in truth["conditions"]:
        cells = condition == names.index(name)
        gap = x[cells] - y[cells]
        low, high = -gap.max(0).values, -gap.min(0).values  # the root lies between
        for _ in range(60):
            middle = (low + high) / 2
            above = ((gap + middle) ** 3).sum(0) > 0
            high, low = torch.where(above, middle, high), torch.where(above, low, middle)
        quartic.append(((low + high) / 2).numpy())
        squared.append((-gap.mean(0)).numpy())
    return {"quartic": fit_figures(np.array(quartic), truth), "squared": fit_figures(np.array(squared), truth)}


def loss_shares(pert_data, true_means, truth: dict, batches: list) -> dict:
    """The GEARS loss of no change, of the noise-free effect and of the observed training
    effect over one pass of the training loader, with exponents 4 (published) and 2: its
    error term, its direction term, and the error term per group of genes (see the module
    docstring)."""
    import dataclasses

    import torch

    import gears_ddp.model.losses as losses

    cells = pert_data.cells
    names = cells.conditions
    true_effect = torch.zeros(len(names), len(pert_data.var))
    observed_effect = torch.zeros_like(true_effect)
    control_true = true_means.loc["ctrl"].to_numpy()
    for code, condition in enumerate(names):
        true_effect[code] = torch.as_tensor(true_means.loc[condition].to_numpy() - control_true)
    for condition, observed in zip(truth["conditions"], truth["observed"]):
        observed_effect[names.index(condition)] = torch.as_tensor(observed - truth["control"])
    context = losses.LossContext.from_pert_data(pert_data)
    error_only = dataclasses.replace(context, direction_lambda=0.0)
    control = cells.expression[cells.control_cells()].numpy()
    zero_fraction = torch.as_tensor((control == 0).mean(0))
    groups = {label: (zero_fraction >= low) & (zero_fraction < high) for low, high, label in ZERO_FRACTION_GROUPS}

    def loss(effect, loss_context, genes=None):
        total = 0.0
        for batch in batches:
            pred = batch.x + effect[batch.condition]
            if genes is not None:
                pred = torch.where(genes, pred, batch.y)
            total += float(losses.gears_loss(pred, batch.y, batch.condition, loss_context))
        return total / len(batches)

    shares = {}
    original = losses.GAMMA
    try:
        for exponent in (4, 2):
            losses.GAMMA = exponent - 2
            effects = {
                "no_change": torch.zeros_like(true_effect),
                "noise_free": true_effect,
                "observed": observed_effect,
            }
            error = {name: loss(effect, error_only) for name, effect in effects.items()}
            direction = {name: loss(effect, context) - error[name] for name, effect in effects.items()}
            groups_share = {
                label: {
                    "genes": float(genes.float().mean()),
                    "noise_free_share": loss(true_effect, error_only, genes) / error["noise_free"],
                }
                for label, genes in groups.items()
            }
            shares[exponent] = {"error": error, "direction": direction, "groups": groups_share}
    finally:
        losses.GAMMA = original
    return shares


# ----------------------------------------------------------------------------- children


class StepProbe:
    """Called after every optimiser step: records the step's learning rate and, at the
    probe steps, the training-set figures of the model's predicted effects."""

    def __init__(self, read_effects, truth: dict, steps: list[int], steps_per_epoch: int):
        self.read_effects, self.truth, self.steps = read_effects, truth, set(steps)
        self.steps_per_epoch = steps_per_epoch
        self.lr, self.losses, self.rows = [], [], []

    def probe(self) -> None:
        step = len(self.lr)
        self.rows.append(
            {
                "step": step,
                "epoch": step / self.steps_per_epoch,
                "lr_sum": float(sum(self.lr)),
                **fit_figures(self.read_effects(), self.truth),
            }
        )

    def after_step(self, optimizer, *_) -> None:
        self.lr.append(optimizer.param_groups[0]["lr"])
        if len(self.lr) in self.steps:
            self.probe()

    def result(self) -> dict:
        """The rows, each with the mean training loss of the steps since the row before."""
        previous = 0
        for row in self.rows:
            window = self.losses[previous : row["step"]]
            row["loss"] = float(np.mean(window)) if window else math.nan
            previous = row["step"]
        return {"steps_per_epoch": self.steps_per_epoch, "steps": len(self.lr), "rows": self.rows}


def run_ours(raw: Path, workdir: Path, truth: dict, args) -> dict:
    import torch

    import gears_ddp.training.recipe as recipe
    from gears_ddp import PertData
    from gears_ddp.gears import GEARS
    from gears_ddp.inference.prediction import set_effects

    pert_data, g, _, _ = set_up(PertData, GEARS, workdir, raw, args, seed=args.seed)
    cells = pert_data.cells
    sets = cells.condition_pert_idx[[cells.conditions.index(c) for c in truth["conditions"]]]

    @torch.no_grad()
    def read_effects():
        training = g.model.training
        effect, _ = set_effects(g.model, sets, "cpu")
        g.model.train(training)
        return effect.double().numpy()

    steps_per_epoch = len(pert_data.dataloader["train_loader"])
    passes = args.epochs * args.passes_per_epoch
    probe = StepProbe(read_effects, truth, probe_steps(steps_per_epoch, passes), steps_per_epoch)
    make_optimizer, optimizer_steps = recipe.make_optimizer, recipe.optimizer_steps

    def probed_optimizer(*a, **k):
        optimizer, scheduler = make_optimizer(*a, **k)
        optimizer.register_step_post_hook(probe.after_step)
        if args.passes_per_epoch > 1:  # the halving once per passes_per_epoch passes over the cells
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.passes_per_epoch, gamma=0.5)
        return optimizer, scheduler

    def recorded_steps(*a, **k):
        for loss in optimizer_steps(*a, **k):
            probe.losses.append(float(loss))
            yield loss

    recipe.make_optimizer, recipe.optimizer_steps = probed_optimizer, recorded_steps
    probe.probe()
    report = g.train(epochs=passes, lr=LR, weight_decay=WEIGHT_DECAY)

    def test_figures(summary):
        return {metric: summary[f"test_{metric}"] for metric in TEST_METRICS}

    return {
        **probe.result(),
        "test": test_figures(report["model"]),
        "baselines": {name: test_figures(summary) for name, summary in report["baselines"].items()},
    }


def run_reference(raw: Path, workdir: Path, truth: dict, args) -> dict:
    import torch
    from torch_geometric.loader import DataLoader

    patch_csr_indexing()
    import gears.gears as reference
    from gears import GEARS, PertData

    pert_data, g, _, _ = set_up(PertData, GEARS, workdir, raw, args)
    probe_cells = [cell for c in truth["conditions"] for cell in pert_data.dataset_processed[c][:PROBE_CELLS]]
    index = {c: i for i, c in enumerate(truth["conditions"])}

    @torch.no_grad()
    def read_effects():
        training = g.model.training
        g.model.eval()
        total = np.zeros((len(index), g.num_genes))
        count = np.zeros(len(index))
        for batch in DataLoader(probe_cells, batch_size=32, shuffle=False):
            effect = (g.model(batch) - batch.x.view(len(batch.pert), -1)).double().numpy()
            rows = [index[p] for p in batch.pert]
            np.add.at(total, rows, effect)
            np.add.at(count, rows, 1)
        g.model.train(training)
        return total / count[:, None]

    steps_per_epoch = len(pert_data.dataloader["train_loader"])
    probe = StepProbe(read_effects, truth, probe_steps(steps_per_epoch, args.epochs), steps_per_epoch)
    adam, loss_fct = torch.optim.Adam, reference.loss_fct

    def probed_adam(*a, **k):
        optimizer = adam(*a, **k)
        optimizer.register_step_post_hook(probe.after_step)
        return optimizer

    def recorded_loss(*a, **k):
        loss = loss_fct(*a, **k)
        probe.losses.append(loss.item())
        return loss

    reference.optim = types.SimpleNamespace(Adam=probed_adam)
    reference.loss_fct = recorded_loss
    probe.probe()
    g.train(epochs=args.epochs, lr=LR, weight_decay=WEIGHT_DECAY)
    from gears.inference import compute_metrics, deeper_analysis, evaluate

    result = evaluate(pert_data.dataloader["test_loader"], g.best_model, False, "cpu")
    overall = compute_metrics(result)[0]
    pearson = published_test_figures(pert_data, result, overall, compute_metrics, deeper_analysis)["pearson_delta"]
    return {
        **probe.result(),
        "test": {"mse": float(overall["mse"]), "mse_de": float(overall["mse_de"]), "pearson_delta": pearson},
    }


def measured_run(impl: str, raw: str, truth_file: str, options: dict) -> dict:
    """In a child process of its own (``run_in_child``): one package's training (``impl``:
    'ours' or 'reference') on ``raw`` with the command-line options ``options``
    (``vars(args)``), probed against the training truth in ``truth_file``; its figures."""
    import torch

    args = argparse.Namespace(**options)
    torch.set_num_threads(os.cpu_count())
    with np.load(truth_file, allow_pickle=False) as data:
        truth = {key: data[key] for key in data.files}
    truth["conditions"] = truth["conditions"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        folder = work_folder(Path(raw), tmp)
        if impl == "ours":
            return run_ours(Path(raw), folder, truth, args)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return run_reference(Path(raw), folder, truth, args)


def measure(impl: str, raw: Path, truth_file: Path, args) -> dict | None:
    """``measured_run`` in a child process whose OpenMP threads sleep while they wait (threads
    that spin slow a shared machine down), unless the environment says otherwise."""
    environment = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    return run_in_child(
        __file__, "measured_run", impl, str(raw), str(truth_file), vars(args), environment=environment, label=impl
    )


# ----------------------------------------------------------------------------- report


def print_steps(steps_per_epoch: int, train_cells: int, args) -> None:
    demo = train_cells // (args.batch_size * DEMO_RANKS)
    k = args.passes_per_epoch
    runs = [
        (
            f"this run (1 process, batch 32{f', {k} passes per epoch' if k > 1 else ''})",
            steps_per_epoch * k,
            args.epochs,
        ),
        (f"gears-ddp demo ({DEMO_RANKS} ranks x batch 32)", demo, args.epochs),
        ("Norman, batch 32, 1 epoch", NORMAN_STEPS_PER_EPOCH, 1),
        (f"Norman, batch 32, {PUBLISHED_EPOCHS} epochs", NORMAN_STEPS_PER_EPOCH, PUBLISHED_EPOCHS),
    ]
    print("\nOptimiser steps and learning rate (published schedule: lr 1e-3 halved every epoch):\n")
    print_table(
        ["run", "steps / epoch", "epochs", "steps", "sum of lr", "full-rate steps", "of them in epochs 1-3"],
        [
            [
                name,
                str(n),
                str(e),
                str(n * e),
                f"{lr_sum(n, e):.3f}",
                f"{lr_sum(n, e) / LR:.0f}",
                f"{min(1.0, lr_sum(n, min(e, 3)) / lr_sum(n, e)):.1%}",
            ]
            for name, n, e in runs
        ],
    )


def print_noise(stats: dict) -> None:
    q = lambda values: " / ".join(f"{v:.3g}" for v in values)  # noqa: E731
    print(
        f"\nTrue effects against per-cell noise, per gene ({stats['cells_per_condition']:.0f} cells per perturbed "
        "condition; quantiles 50% / 90% / 99% unless said):\n"
    )
    noise_free = stats["noise_free"]
    rows = [
        ["|true effect| over (condition, gene)", q(stats["effect"])],
        ["per-cell sd of a gene in control cells (10% / 50% / 90%)", q(stats["per_cell_sd"])],
        ["rms true effect over conditions / per-cell sd, per gene", q(stats["ratio"])],
        ["(condition, gene) with |true effect| > noise of its condition mean", f"{stats['above_mean_noise']:.2%}"],
        ["(condition, gene) with |true effect| > per-cell sd", f"{stats['above_cell_noise']:.2%}"],
        [
            "genes whose true effect never exceeds the noise of a condition mean",
            f"{stats['genes_never_above_mean_noise']:.1%}",
        ],
        ["train: noise-free truth as prediction, pearson_delta", f"{noise_free['pearson_delta']:.4f}"],
        ["train: noise-free truth as prediction, mse (noise of the observed means)", f"{noise_free['mse']:.4f}"],
        [
            "train: the mean training effect as prediction, pearson_delta / mse",
            f"{stats['mean_effect']['pearson_delta']:.4f} / {stats['mean_effect']['mse']:.4f}",
        ],
        ["train: no change (the control mean), mse", f"{stats['no_change_mse']:.4f}"],
        [
            "train: zero effect on the paired control cells (as evaluation predicts), mse",
            f"{stats['paired']['zero_mse']:.4f}",
        ],
        [
            "train: noise-free effect on the paired control cells, pearson_delta",
            f"{stats['paired']['noise_free_pearson_delta']:.4f}",
        ],
        ["train: noise-free effect on the paired control cells, mse", f"{stats['paired']['noise_free_mse']:.4f}"],
        ["rms of the true effect (train conditions)", f"{stats['true_effect_rms']:.4f}"],
    ]
    print_table(["measure", "value"], rows)


def print_loss(shares: dict) -> None:
    print(
        "\nThe GEARS loss over one pass of the training cells, each predicted as its control partner plus "
        "an effect: its error term, and its direction term (weight 0.1, the published default); "
        "'reducible' is the share of the error term that the noise-free effect removes:\n"
    )
    rows = []
    for exponent, label in ((4, "|err|^4 (published, gamma = 2)"), (2, "|err|^2 (for comparison)")):
        for term in ("error", "direction"):
            s = shares[exponent][term]
            reducible = (s["no_change"] - s["noise_free"]) / s["no_change"] if term == "error" else None
            rows.append(
                [
                    label if term == "error" else "",
                    f"{term} term",
                    f"{s['no_change']:.4f}",
                    f"{s['noise_free']:.4f}",
                    f"{s['observed']:.4f}",
                    "" if reducible is None else f"{reducible:.2%}",
                ]
            )
    print_table(["loss", "term", "zero effect", "noise-free effect", "observed train effect", "reducible"], rows)
    print("\nShare of the error term left with the noise-free effect (noise no model can fit), by group of genes:\n")
    rows = [
        [
            label,
            f"{shares[4]['groups'][label]['genes']:.1%}",
            f"{shares[4]['groups'][label]['noise_free_share']:.1%}",
            f"{shares[2]['groups'][label]['noise_free_share']:.1%}",
        ]
        for _, _, label in ZERO_FRACTION_GROUPS
    ]
    print_table(["genes", "share of genes", "share of |err|^4", "share of |err|^2"], rows)
    optimal = shares["optimal"]
    print(
        "\nThe effect that minimises each error term, per training condition and gene, over the condition's "
        "cells and their control partners, scored as the training-set fit is:\n"
    )
    rows = [
        [label, *(f"{optimal[key][figure]:.4f}" for figure in ("pearson_delta", "mse", "true_r"))]
        for key, label in (
            ("quartic", "minimises |err|^4 (published)"),
            ("squared", "minimises |err|^2 (the mean shift)"),
        )
    ]
    print_table(["effect", "pearson_delta", "mse", "true r"], rows)


def print_fit(results: dict, stats: dict) -> None:
    names = {"ours": "gears_ddp", "reference": "published"}
    print(
        "\nTraining-set fit of the predicted effect over optimiser steps (see the module docstring; "
        "mse / no change below 1 is better than no change):\n"
    )
    header = ["step", "passes", "sum of lr"]
    for impl in results:
        header += [
            f"{names[impl]} loss",
            f"{names[impl]} pearson_delta",
            f"{names[impl]} mse / no change",
            f"{names[impl]} true r",
        ]
    first = next(iter(results.values()))
    rows = []
    for i, base in enumerate(first["rows"]):
        row = [str(base["step"]), f"{base['epoch']:.2f}", f"{base['lr_sum']:.4f}"]
        for result in results.values():
            r = result["rows"][i] if i < len(result["rows"]) else None
            row += (
                ["-"] * 4
                if r is None
                else [
                    "-" if math.isnan(r["loss"]) else f"{r['loss']:.3f}",
                    f"{r['pearson_delta']:.4f}",
                    f"{r['mse'] / stats['no_change_mse']:.3f}",
                    f"{r['true_r']:.4f}",
                ]
            )
        rows.append(row)
    print_table(header, rows)
    print(
        "\nAt initialisation, rms of the predicted effect: "
        + ", ".join(f"{names[impl]} {r['rows'][0]['effect_rms']:.4f}" for impl, r in results.items())
        + f"; of the noise-free effect: {stats['true_effect_rms']:.4f}. At the end: "
        + ", ".join(f"{names[impl]} {r['rows'][-1]['effect_rms']:.4f}" for impl, r in results.items())
        + "."
    )


def print_test(results: dict) -> None:
    """The test metrics of each package's kept model (lowest val mse_de) beside the baselines."""
    names = {"ours": "gears_ddp", "reference": "published"}
    baselines = results["ours"].get("baselines", {})
    print("\nTest metrics of the kept model (lowest val mse_de), beside the baselines (gears_ddp's scoring):\n")
    header = ["metric", *(names[impl] for impl in results), *baselines]
    rows = [
        [
            metric,
            *(f"{r['test'][metric]:.4f}" if "test" in r else "-" for r in results.values()),
            *(f"{b[metric]:.4f}" for b in baselines.values()),
        ]
        for metric in TEST_METRICS
    ]
    print_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workflow_options(parser)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=SPLIT["seed"], help="split, weights, pairing and shuffling")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument(
        "--passes-per-epoch",
        type=int,
        default=1,
        help="gears_ddp only (implies --skip-reference): halve the learning rate once every this "
        "many passes over the training cells, as the published schedule would on a training set "
        "this many times larger (a diagnostic; the published schedule is 1)",
    )
    add_record_argument(parser)
    args = parser.parse_args()

    import anndata

    from gears_ddp import PertData
    from gears_ddp.datasets import read_true_means

    with tempfile.TemporaryDirectory() as tmp:
        raw = write_raw_input(Path(tmp) / "input", args)
        true_means = read_true_means(raw.parent)
        pert_data = PertData(work_folder(raw, tmp))
        pert_data.new_data_process("bench", anndata.read_h5ad(raw))
        pert_data.prepare_split(SPLIT["split"], seed=args.seed)
        truth = training_truth(pert_data, true_means)
        truth_file = Path(tmp) / "truth.npz"
        np.savez(truth_file, **{**truth, "conditions": np.array(truth["conditions"])})
        stats = effects_and_noise(pert_data, true_means, truth)
        batches = list(pert_data.get_dataloader(args.batch_size, seed=args.seed)["train_loader"])
        stats["paired"] = paired_controls(pert_data, truth, batches)
        shares = loss_shares(pert_data, true_means, truth, batches)
        shares["optimal"] = loss_optimal_effects(pert_data, truth, batches)
        train_cells = len(pert_data.cells.cells_of(pert_data.set2conditions["train"]))
        implementations = (
            ["ours"]
            if args.skip_reference or args.passes_per_epoch > 1 or not reference_available()
            else ["ours", "reference"]
        )
        results = {impl: measure(impl, raw, truth_file, args) for impl in implementations}
    results = {impl: r for impl, r in results.items() if r is not None}
    if "ours" not in results:
        sys.exit(1)
    with recorded(args.record):
        print(
            f"\n{pert_data.cells.n_cells} cells x {len(pert_data.var)} genes; split simulation, seed {args.seed}; "
            f"{len(truth['conditions'])} perturbed training conditions, {train_cells} training cells; batch "
            f"{args.batch_size}, hidden_size {HIDDEN_SIZE}, lr {LR:g}, weight_decay {WEIGHT_DECAY:g}, "
            f"{args.epochs} epochs"
            + (
                f" of {args.passes_per_epoch} passes over the training cells each (diagnostic)"
                if args.passes_per_epoch > 1
                else ""
            )
            + "; CPU"
        )
        print_steps(results["ours"]["steps_per_epoch"], train_cells, args)
        print_noise(stats)
        print_loss(shares)
        print_fit(results, stats)
        print_test(results)


if __name__ == "__main__":
    main()
