"""Model benchmark: training throughput, seconds per epoch, test-set evaluation time, a whole
``train()`` call and where its time went, peak memory and test metrics of gears_ddp and
(when installed) the published GEARS, side by side on the same data, split,
hyperparameters and device.

    python benchmarks/bench_model.py [--epochs 3] [--genes 1000 --cells-per-condition 45 ...]
                                     [--batch-size 32 --test-batch-size 32] [--seed S]
                                     [--device cpu] [--eval-repeats 3] [--skip-reference]
                                     [--with-report] [--json F] [--record]

The data are made once, in the parent, by ``gears_ddp.datasets.make_synthetic_perturb_seq``
(defaults: 7,300 cells x 1,000 genes; 60 singles and 80 combos of 45 cells, 1,000 controls)
and written, with the GO files, by ``harness.synthetic.write_raw_input``. Each
implementation then runs in its own subprocess (so that its peak memory is its own), with
``torch.set_num_threads(os.cpu_count())``, and does the whole published workflow with its
own library: ``PertData(...).new_data_process`` on the raw h5ad,
``prepare_split('simulation', seed=1)``, ``get_dataloader(batch_size, test_batch_size)``,
``GEARS(pert_data, device=D)`` (``--device``, the CPU by default; both packages on the same
one), ``torch.manual_seed(0)``, ``model_initialize(hidden_size=64)`` (all other model
options default) and ``train(epochs, lr=1e-3, weight_decay=5e-4)``. Results come back as
one JSON line; ``--json F`` writes both sides' figures to ``F``
(``harness.record.write_figures``).

``--without-coexpression`` gives both models an empty co-expression graph
(``harness.side_by_side``; each gene then keeps its own positional embedding). The
published model runs its co-expression GNN with an edge index over one cell's genes on a
batch of cells, so only the first cell of a batch gets the messages; with
no edges the two models compute the same function for every cell, which isolates that
difference in quality comparisons.

``--seed S`` (used by ``bench_quality.py``) makes a run reproducible and varies it with S
(``harness.side_by_side`` seeds both packages alike): Python's, numpy's and torch's global
generators are seeded with S before ``new_data_process`` (the published package pairs each perturbed cell with a
control cell
drawn from numpy's global generator there, otherwise unseeded) and again right before
``model_initialize`` (in place of ``torch.manual_seed(0)``; initial weights, and the
published training shuffle, which draws from torch's global generator), the split is
``prepare_split('simulation', seed=S)``, and gears_ddp's loaders get ``seed=S`` (its
control pairing and shuffle; without ``--seed`` they use its default, 0).

How each figure is measured (``time.perf_counter``; neither library is modified, timers are
monkeypatched into the child process only):

- training loop (s / epoch): the time spent in the epoch's optimisation loop over the
  training loader (batches, forward, loss, backward, clipping, optimiser steps), without
  the per-epoch evaluation.
  gears_ddp: the ``train_seconds`` of each ``GEARS.history`` record (the loop and the
  reduction of its loss, which waits for the last step). Published: the loop is not a function, so it is delimited by
  two hooks: its start
  is when iteration over ``dataloader['train_loader']`` begins while the model is in
  training mode (the loader is wrapped in a proxy that records that moment; evaluation
  iterates the same loader in eval mode and is not counted), its end is the
  ``StepLR.step()`` call right after the loop (``gears.gears.StepLR`` replaced by a subclass
  whose ``step`` records the time; the step the scheduler's constructor makes is ignored).
- training throughput (cells / s): training cells seen in the loops / seconds in the loops,
  over all epochs. Cells per epoch = number of train batches x batch size (both drop the
  last incomplete batch).
- seconds per epoch incl. evaluation: from the start of the training loop to the end of
  ``compute_metrics`` on val, i.e. training loop + ``scheduler.step`` + evaluation of the
  train and val sets + ``compute_metrics`` of both; the best-model copy that follows is
  excluded in both. gears_ddp: the ``seconds`` of each ``GEARS.history`` record (measured
  exactly so by ``recipe.TrainingRecipe``). Published: ``gears.gears.compute_metrics`` is
  wrapped to record when it returns; the epoch ends when the second call after that
  epoch's ``StepLR.step`` returns. Reported as the mean over epochs.
- per-epoch evaluation (s / epoch) = seconds per epoch - training loop, and, inside it, the
  model passes alone (the two ``evaluate`` calls on train and val: gears_ddp
  ``gears_ddp.training.recipe.evaluate`` wrapped; published ``gears.gears.evaluate`` wrapped).
  Note: the published package evaluates the training set through its shuffled,
  drop-last training loader; gears_ddp through ``train_eval_loader`` (every training
  cell once, in order), so it evaluates up to batch_size - 1 more cells.
- test-set evaluation (s): after training, one evaluation pass over
  ``dataloader['test_loader']`` with the best model, median of ``--eval-repeats`` passes.
  gears_ddp: ``GEARS.new_accumulator()`` then
  ``gears_ddp.training.engine.evaluate(best_model, test_loader, accumulator, False, device)`` (the
  accumulator's construction is inside the timed region, as the published ``evaluate``
  builds its result containers inside its own call). Published:
  ``gears.inference.evaluate(test_loader, best_model, False, device)``.
  ``compute_metrics`` on that result is timed separately (median of as many calls).
- ``train()`` in all (s): the wall time of the ``train(epochs, ...)`` call, and its parts.
  gears_ddp: the ``timing`` of its report (``runtime.phase_clock``: set-up, epochs, test,
  baselines, interactions and, with ``--with-report``, which gives it a ``save_path``, the
  report). Published: set-up from the call to the first training loop's start, epochs from
  there to the end of the last epoch's val ``compute_metrics``, test the rest (its test
  evaluation, ``compute_metrics``, ``deeper_analysis`` and subgroup analysis). Outside the
  epochs: the call less its epochs.
- data + model setup (s): raw h5ad -> loaders (``new_data_process`` + ``prepare_split`` +
  ``get_dataloader``), and ``GEARS(...)`` + ``model_initialize`` (graphs + network).
- peak GPU memory (on a GPU): ``torch.cuda.max_memory_allocated`` of the child, in MiB.
- peak memory: max RSS of the child process at its end (``getrusage``), in MiB; and the
  same minus the process's RSS right after its imports (torch; ``torch._dynamo``, which any
  torch optimizer imports when built and the published stack imports through
  torch_geometric; gears_ddp, whose helpers both children use; and, in the published
  package's child, ``gears`` with what it imports, scanpy and torch_geometric), i.e. the
  memory of data, model and training.
- test metrics: of the best model (lowest val ``mse_de``) after ``--epochs`` epochs.
  gears_ddp: the summary ``GEARS.train`` returns (``test_mse_de``, ``test_pearson_delta``,
  ``test_<subgroup>_pearson_delta``). Published: ``compute_metrics`` (``mse_de``) and
  ``deeper_analysis`` (per-condition ``pearson_delta``) on the test evaluation above,
  averaged over all test conditions and over the conditions of each subgroup of
  ``pert_data.subgroup['test_subgroup']`` (as its ``train()`` logs them); a subgroup with no
  condition is shown as '-'. gears_ddp's child also returns the same figures of the
  baselines that ``GEARS.train`` scores beside the model (not printed here; used by
  ``bench_quality.py``).

The published package, on current scipy, fails in ``GEARS.__init__`` (gears.py line 87:
a pandas boolean Series indexes a scipy CSR matrix, "'Series' object has no attribute
'nonzero'"). Its child process therefore patches ``__getitem__`` of scipy's CSR classes to
turn pandas Series / Index keys into numpy arrays before indexing (only in that process).
Its import seeds torch (``torch.manual_seed(0)``) and it prints freely: its stdout and
stderr are discarded. Also note: the published ``get_dataloader`` ignores
``test_batch_size`` (its val and test loaders use ``batch_size``).
"""

import argparse
import contextlib
import importlib
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from harness.child import quiet, run_in_child
from harness.memory import peak_rss_mib, status_mib
from harness.published import patch_csr_indexing, published_test_figures, reference_available
from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import HIDDEN_SIZE, LR, SUBGROUPS, WEIGHT_DECAY
from harness.side_by_side import add_workflow_options, set_up, split_seed
from harness.synthetic import work_folder, write_raw_input
from harness.tables import format_number, print_table
from harness.timing import Stopwatch, median_seconds, timed_calls


def run_ours(raw: Path, workdir: Path, args) -> dict:
    import gears_ddp.training.recipe as recipe
    from gears_ddp import PertData
    from gears_ddp.evaluation.metrics import compute_metrics
    from gears_ddp.gears import GEARS
    from gears_ddp.training.engine import evaluate

    evals = []
    recipe.evaluate = timed_calls(recipe.evaluate, evals)

    loader_seed = {} if args.seed is None else {"seed": args.seed}
    pert_data, g, data_s, model_s = set_up(PertData, GEARS, workdir, raw, args, args.device, **loader_seed)

    run_folder = {"save_path": workdir / "run"} if args.with_report else {}
    with Stopwatch(args.device) as train_call:
        report = g.train(epochs=args.epochs, lr=LR, weight_decay=WEIGHT_DECAY, **run_folder)

    loader = pert_data.dataloader["test_loader"]
    test_eval_s, result = median_seconds(
        lambda: evaluate(g.best_model, loader, g.new_accumulator(), False, g.device), args.eval_repeats
    )
    metrics_s, _ = median_seconds(lambda: compute_metrics(result), args.eval_repeats)

    n_epochs = len(g.history)
    return {
        "paired_controls": _test_figures(_paired_controls_summary(g, loader)),
        "epoch_s": [r["seconds"] for r in g.history],
        "loop_s": [r["train_seconds"] for r in g.history],
        "eval_pass_s": [
            evals[2 * e][1] - evals[2 * e][0] + evals[2 * e + 1][1] - evals[2 * e + 1][0] for e in range(n_epochs)
        ],
        "val_mse_de": [r["val_mse_de"] for r in g.history],
        "cells_per_epoch": len(pert_data.dataloader["train_loader"]) * args.batch_size,
        "test_eval_s": test_eval_s,
        "compute_metrics_s": metrics_s,
        "data_s": data_s,
        "model_s": model_s,
        "train_s": train_call.seconds,
        "train_parts": report["timing"],
        "test_cells": sum(len(b) for b in loader),
        **_test_figures(report["model"]),
        "baselines": {name: _test_figures(summary) for name, summary in report["baselines"].items()},
        "subgroup_sizes": {name: len(pert_data.subgroup["test_subgroup"].get(name, [])) for name in SUBGROUPS},
        **_common(pert_data.adata),
    }


def _paired_controls_summary(g, loader) -> dict:
    """gears_ddp's test summary of a zero effect: each test cell predicted by its paired
    control cell (the model's prediction without its effect), scored as the model is."""
    from gears_ddp.evaluation.metrics import MetricContext
    from gears_ddp.evaluation.scoring import score

    accumulator = g.new_accumulator()
    for batch in loader:  # the summed inputs are the predictions of a zero effect
        accumulator.add_inputs(batch.condition, batch.x, batch.y)
    result = accumulator.result()
    return score(result, MetricContext.from_pert_data(g.pert_data, result.conditions), g.subgroup["test_subgroup"])[0]


def _test_figures(summary: dict) -> dict:
    """``mse``, ``mse_de``, ``pearson_delta`` and the subgroups' ``pearson_delta`` (NaN for a subgroup
    without conditions) from a gears_ddp test summary (``GEARS.test``)."""
    return {
        "mse": summary["test_mse"],
        "mse_de": summary["test_mse_de"],
        "pearson_delta": summary["test_pearson_delta"],
        "subgroups": {name: summary.get(f"test_{name}_pearson_delta", math.nan) for name in SUBGROUPS},
    }


def run_reference(raw: Path, workdir: Path, args) -> dict:
    patch_csr_indexing()
    import gears.gears as reference
    from gears import GEARS, PertData
    from gears.inference import compute_metrics, deeper_analysis, evaluate

    loop_starts, steps, evals, metric_calls, val_mse_de = [], [], [], [], []

    class TimedStepLR(reference.StepLR):
        """Records the time of each ``step`` but the one its constructor makes."""

        def __init__(self, *a, **k):
            self._constructed = False
            super().__init__(*a, **k)
            self._constructed = True

        def step(self, *a, **k):
            if self._constructed:
                steps.append(time.perf_counter())
            return super().step(*a, **k)

    def metrics_hook(res):
        out = compute_metrics(res)
        metric_calls.append(time.perf_counter())
        val_mse_de.append(float(out[0]["mse_de"]))  # a numpy float32 under numpy 1
        return out

    reference.StepLR = TimedStepLR
    reference.evaluate = timed_calls(reference.evaluate, evals)
    reference.compute_metrics = metrics_hook

    pert_data, g, data_s, model_s = set_up(PertData, GEARS, workdir, raw, args, args.device)

    train_loader = pert_data.dataloader["train_loader"]
    g.dataloader["train_loader"] = _LoopStartProxy(train_loader, g.model, loop_starts)
    with Stopwatch(args.device) as train_call:
        g.train(epochs=args.epochs, lr=LR, weight_decay=WEIGHT_DECAY)

    # the epoch's two compute_metrics calls (train, val) follow its StepLR.step; the val one ends the epoch
    epoch_ends = [[t for t in metric_calls if t > step][1] for step in steps]
    train_parts = {
        "set-up": loop_starts[0] - train_call.started,
        "epochs": epoch_ends[-1] - loop_starts[0],
        "test": train_call.started + train_call.seconds - epoch_ends[-1],
    }
    epoch_evals = [[(b, e) for b, e in evals if step < b < end] for step, end in zip(steps, epoch_ends)]
    loader = pert_data.dataloader["test_loader"]
    test_eval_s, result = median_seconds(lambda: evaluate(loader, g.best_model, False, args.device), args.eval_repeats)
    metrics_s, (overall, _) = median_seconds(lambda: compute_metrics(result), args.eval_repeats)
    subgroups = pert_data.subgroup["test_subgroup"]
    return {
        **published_test_figures(pert_data, result, overall, compute_metrics, deeper_analysis),
        "paired_controls": published_test_figures(
            pert_data, *_reference_paired_controls(loader, compute_metrics), compute_metrics, deeper_analysis
        ),
        "epoch_s": [end - begin for begin, end in zip(loop_starts, epoch_ends)],
        "loop_s": [step - begin for begin, step in zip(loop_starts, steps)],
        "eval_pass_s": [sum(e - b for b, e in calls) for calls in epoch_evals],
        "val_mse_de": val_mse_de[1 : 2 * len(steps) : 2],
        "cells_per_epoch": len(train_loader) * args.batch_size,
        "test_eval_s": test_eval_s,
        "compute_metrics_s": metrics_s,
        "data_s": data_s,
        "model_s": model_s,
        "train_s": train_call.seconds,
        "train_parts": train_parts,
        "test_cells": len(result["pert_cat"]),
        "subgroup_sizes": {name: len(subgroups.get(name, [])) for name in SUBGROUPS},
        **_common(pert_data.adata),
    }


def _reference_paired_controls(loader, compute_metrics) -> tuple[dict, dict]:
    """The published evaluation result of a zero effect, each test cell predicted by its
    paired control cell (built as ``gears.inference.evaluate`` builds it), and its
    ``compute_metrics`` overall figures."""
    import numpy as np
    import torch

    pert_cat, pred, truth, pred_de, truth_de = [], [], [], [], []
    for batch in loader:
        x = batch.x.view(len(batch.pert), -1)
        pert_cat.extend(batch.pert)
        pred.append(x)
        truth.append(batch.y)
        for i, de_idx in enumerate(batch.de_idx):
            pred_de.append(x[i, de_idx])
            truth_de.append(batch.y[i, de_idx])
    result = {
        "pert_cat": np.array(pert_cat),
        "pred": torch.cat(pred).numpy(),
        "truth": torch.cat(truth).numpy(),
        "pred_de": torch.stack(pred_de).numpy(),
        "truth_de": torch.stack(truth_de).numpy(),
    }
    return result, compute_metrics(result)[0]


class _LoopStartProxy:
    """A loader that records when iteration starts with ``model`` in training mode (the
    published training loop; its evaluation iterates the same loader in eval mode)."""

    def __init__(self, loader, model, starts: list):
        self.loader, self.model, self.starts = loader, model, starts

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        if self.model.training:
            self.starts.append(time.perf_counter())
        return iter(self.loader)


def _common(adata) -> dict:
    import torch

    n_cells, n_genes = adata.shape
    return {"cells": n_cells, "genes": n_genes, "threads": torch.get_num_threads()}


def measured_run(impl: str, raw: str, options: dict) -> dict:
    """In a child process of its own (``run_in_child``): one package's run (``impl``: 'ours'
    or 'reference') on ``raw`` with the command-line options ``options`` (``vars(args)``);
    its figures."""
    import torch

    args = argparse.Namespace(**options)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # import the libraries' whole stacks before reading the baseline, including
        # torch._dynamo, which every torch.optim optimizer imports when it is built
        importlib.import_module("gears_ddp.gears")
        importlib.import_module("torch._dynamo")
        if impl != "ours":
            importlib.import_module("gears")
    import_rss = status_mib()["VmRSS"]
    torch.set_num_threads(os.cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
        folder = work_folder(Path(raw), tmp)
        if impl == "ours":
            result = run_ours(Path(raw), folder, args)
        else:
            with quiet():
                result = run_reference(Path(raw), folder, args)
    result["peak_rss_mib"] = peak_rss_mib()
    result["peak_above_imports_mib"] = result["peak_rss_mib"] - import_rss
    if torch.device(args.device).type == "cuda":
        result["peak_gpu_mib"] = torch.cuda.max_memory_allocated(args.device) / 2**20
    return result


def measure(impl: str, raw: Path, args) -> dict | None:
    """``measured_run`` in a child process (None if it failed)."""
    return run_in_child(__file__, "measured_run", impl, str(raw), vars(args), label=impl)


def _derived(r: dict) -> dict:
    loops, epochs = sum(r["loop_s"]), len(r["epoch_s"])
    return {
        "throughput": r["cells_per_epoch"] * epochs / loops,
        "loop": loops / epochs,
        "epoch": sum(r["epoch_s"]) / epochs,
        "epoch_eval": (sum(r["epoch_s"]) - loops) / epochs,
        "eval_pass": sum(r["eval_pass_s"]) / epochs,
    }


def _figure(value) -> str:
    return format_number(value, ".4g")


def print_tables(ours: dict, reference: dict | None, args) -> None:
    mine, theirs = _derived(ours), _derived(reference) if reference else None
    epochs = len(ours["epoch_s"])
    test_cells = f"{ours['test_cells']} test cells"
    if reference and reference["test_cells"] != ours["test_cells"]:
        test_cells += f" (published: {reference['test_cells']})"
    print(
        f"\n{ours['cells']} cells x {ours['genes']} genes; split simulation (seed {split_seed(args)}); "
        f"batch {args.batch_size}, test batch {args.test_batch_size}; "
        f"hidden_size {HIDDEN_SIZE}, lr {LR:g}, weight_decay {WEIGHT_DECAY:g}; "
        f"{epochs} epochs of {ours['cells_per_epoch']} training cells; {test_cells}; "
        f"device {args.device}; CPU, {os.cpu_count()} cores, torch threads {ours['threads']}\n"
    )
    rows = [
        ("training throughput (train cells / s) [ours/published]", "throughput", True),
        ("training loop (s / epoch)", "loop", False),
        ("seconds per epoch incl. train+val evaluation", "epoch", False),
        ("  of which per-epoch evaluation (s)", "epoch_eval", False),
        ("    of which evaluate() passes, train+val (s)", "eval_pass", False),
    ]
    not_run = "not run" if reference is None else None

    def row(label, a, b, higher_is_better=False):
        ratio = "-" if b is None or not a or not b else f"{(a / b if higher_is_better else b / a):.1f}x"
        return [label, _figure(a), not_run or _figure(b), ratio]

    table = [row(label, mine[key], theirs[key] if theirs else None, higher) for label, key, higher in rows]
    memory = [
        ("peak memory, max RSS (MiB)", "peak_rss_mib"),
        ("peak memory above the RSS after imports (MiB)", "peak_above_imports_mib"),
    ]
    if "peak_gpu_mib" in ours:
        memory.append(("peak GPU memory, allocated (MiB)", "peak_gpu_mib"))
    table += [
        row(label, ours[key], reference[key] if reference else None)
        for label, key in (
            (f"test-set evaluation pass (s, median of {args.eval_repeats})", "test_eval_s"),
            ("compute_metrics on it (s)", "compute_metrics_s"),
            ("raw h5ad -> loaders (s)", "data_s"),
            ("GEARS(...) + model_initialize (s)", "model_s"),
            *memory,
        )
    ]
    print_table(["measure", "gears_ddp", "published GEARS", "ratio"], table)
    print(
        "\nratio = published / gears_ddp for times and memory, gears_ddp / published for throughput "
        "(above 1: gears_ddp is better)."
    )
    print_train_parts(ours, reference, args)
    for r, name in ((ours, "gears_ddp"), (reference, "published")):
        if r:
            print(
                f"{name}: seconds per epoch {[round(s, 2) for s in r['epoch_s']]}, training loops "
                f"{[round(s, 2) for s in r['loop_s']]}, val mse_de {[round(v, 4) for v in r['val_mse_de']]}"
            )

    print(f"\nTest metrics of the best model (lowest val mse_de) after {epochs} epochs:\n")
    n_test = sum(ours["subgroup_sizes"].values())
    metric_rows = [
        ("test mse_de", n_test, lambda r: r["mse_de"]),
        ("test pearson_delta", n_test, lambda r: r["pearson_delta"]),
    ]
    metric_rows += [
        (f"test {name} pearson_delta", ours["subgroup_sizes"][name], lambda r, name=name: r["subgroups"][name])
        for name in SUBGROUPS
    ]
    print_table(
        ["metric", "conditions", "gears_ddp", "published GEARS"],
        [
            [label, str(n), _figure(value(ours)), not_run or _figure(value(reference))]
            for label, n, value in metric_rows
        ],
    )
    if reference and reference["subgroup_sizes"] != ours["subgroup_sizes"]:
        print(f"\nconditions per subgroup differ; published: {reference['subgroup_sizes']}")


TRAIN_PARTS = (
    ("set-up: from the call to the first epoch", "set-up"),
    ("epochs: training and the per-epoch evaluation", "epochs"),
    ("test: the kept model's test evaluation and scores", "test"),
    ("baselines: their predictions and scores", "baselines"),
    ("interactions: observed and predicted, of the test pairs", "interactions"),
    ("report: the model and the run report written", "report"),
)


def print_train_parts(ours: dict, reference: dict | None, args) -> None:
    """``train()``'s wall time and where it went (gears_ddp: its ``timing``; published: the
    hooks' moments), and the share of the run outside the epochs."""

    def outside(r):
        return r["train_s"] - r["train_parts"]["epochs"]

    rows = [
        [
            f"train(epochs={args.epochs}) in all",
            _figure(ours["train_s"]),
            _figure(reference["train_s"]) if reference else "not run",
            f"{reference['train_s'] / ours['train_s']:.2f}x" if reference else "-",
        ]
    ]
    for label, key in TRAIN_PARTS:
        theirs = reference["train_parts"].get(key) if reference else None
        if key in ours["train_parts"] or theirs is not None:
            rows.append(
                [
                    f"  {label}",
                    _figure(ours["train_parts"].get(key, math.nan)),
                    _figure(theirs) if theirs is not None else "-",
                    "-",
                ]
            )
    rows.append(
        ["outside the epochs (s)", _figure(outside(ours)), _figure(outside(reference)) if reference else "-", "-"]
    )
    rows.append(
        [
            "outside the epochs, share of train()",
            f"{outside(ours) / ours['train_s']:.1%}",
            f"{outside(reference) / reference['train_s']:.1%}" if reference else "-",
            "-",
        ]
    )
    print(
        f"\ntrain(): wall time and its parts (s){'; gears_ddp writes its run report' if args.with_report else ''}"
        "; the published train()'s test includes its deeper and subgroup analyses:\n"
    )
    print_table(["train()", "gears_ddp", "published GEARS", "published / gears_ddp"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workflow_options(parser)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, help="seed of the split, the models and the pairing (see above)")
    parser.add_argument("--eval-repeats", type=int, default=3, help="test-set evaluation passes (median)")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--device", default="cpu", help="both packages' device (default: the CPU)")
    parser.add_argument(
        "--with-report",
        action="store_true",
        help="gears_ddp's train() writes its run folder and report (save_path), as gears-ddp train does",
    )
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    published_installed = reference_available()
    run_published = published_installed and not args.skip_reference
    if not published_installed:
        print("published GEARS not installed, or not runnable here (pandas 3): gears_ddp alone")

    def write_json(ours: dict, reference: dict | None) -> None:
        if args.json:
            write_figures(
                args.json,
                {
                    "device": args.device,
                    "published_installed": published_installed,
                    "gears_ddp": {**ours, **_derived(ours)},
                    "published": reference and {**reference, **_derived(reference)},
                },
            )

    with tempfile.TemporaryDirectory() as tmp:
        raw = write_raw_input(Path(tmp) / "input", args)
        ours = measure("ours", raw, args)
        if ours is None:
            sys.exit(1)
        write_json(ours, None)  # kept if the published side is cut short
        reference = measure("reference", raw, args) if run_published else None
    with recorded(args.record):
        print_tables(ours, reference, args)
    write_json(ours, reference)
    if run_published and reference is None:
        sys.exit(1)  # the published side failed (its error is above)


if __name__ == "__main__":
    main()
