"""Test-quality benchmark on CPU: is gears_ddp's test ``pearson_delta``, overall and per
subgroup, no worse than the published GEARS's beyond seed-to-seed noise? Both
implementations are trained over several seeds on the same data, split and hyperparameters,
and their test metrics of the best-val model are compared seed by seed.

    python benchmarks/bench_quality.py [--seeds 1 2 3] [--epochs 10] [--skip-reference]
                                       [--genes 1000 --cells-per-condition 45 ...]
                                       [--batch-size 32 --test-batch-size 32]
                                       [--without-coexpression]

The data are made once, in the parent, by ``harness.synthetic.write_raw_input`` (the data of
``bench_model.py``: by default 7,300 cells x 1,000 genes, 60 singles and 80 combos of 45
cells, 1,000 controls, generator seed 0) and are the same for every seed. For each seed S,
each implementation then runs in its own child process exactly as
``bench_model.py --seed S --epochs E --eval-repeats 1`` runs it (``bench_model.measured_run``,
in a child process of its own; its docstring describes the workflow, the seeding and the patch the published package
needs on current scipy): its own ``PertData.new_data_process`` on the raw h5ad,
``prepare_split('simulation', seed=S)``, ``get_dataloader(32, test_batch_size=32)``
(gears_ddp's with ``seed=S``), ``GEARS(pert_data, device='cpu')``, Python's, numpy's and
torch's global generators seeded with S, ``model_initialize(hidden_size=64)`` and
``train(E, lr=1e-3, weight_decay=5e-4)``. The global generators are also seeded with S
before ``new_data_process``, where the published package pairs each perturbed cell with a
control cell drawn from numpy's global generator. So a seed fixes the split, the initial
weights, the control pairing and the training shuffle of both implementations (each draws
them with its own generators, so the two runs of a seed share only the split and the data);
the seeds vary all four. Timings are not reported here (``bench_model.py`` measures them).

How each figure is measured:

- best-val model: the model after the epoch with the lowest val ``mse_de``, as both
  libraries' ``train`` keep it. The val ``mse_de`` of each epoch is printed under the
  per-seed table (gears_ddp: ``GEARS.history``; published: its ``compute_metrics`` calls on
  val, recorded by ``bench_model.py``).
- test ``mse_de``: mean over test conditions of the mean squared error, on the condition's
  top-20 DE genes, between the predicted and the true mean expression of the condition's
  test cells (``compute_metrics``). gears_ddp: ``test_mse_de`` of the summary
  ``GEARS.train`` returns. Published: ``gears.inference.compute_metrics`` on
  ``gears.inference.evaluate(test_loader, best_model)``.
- test ``mse``: the same over all genes (``compute_metrics``'s ``mse``).
- test ``pearson_delta``: per test condition, the Pearson correlation over all genes of
  (predicted mean - control mean) with (true mean - control mean) (``deeper_analysis``),
  averaged over all test conditions. gears_ddp: ``test_pearson_delta`` of the summary.
  Published: ``gears.inference.deeper_analysis`` on the same evaluation, averaged.
- subgroup ``pearson_delta`` (combo_seen0, combo_seen1, combo_seen2, unseen_single): the
  same average over the test conditions of each subgroup of
  ``pert_data.subgroup['test_subgroup']`` (gears_ddp: ``test_<subgroup>_pearson_delta``).
  'conditions' is the number of test conditions in it (gears_ddp's split; the published
  package's is shown too where it differs). A subgroup with no test condition at a seed has
  no value ('-').
- baselines, for context: ``no_change`` (control mean), ``mean_effect`` (control mean + mean
  effect of the training perturbations) and ``additive`` (control mean + the sum of the
  genes' training single effects), as ``gears_ddp.evaluation.baselines`` defines them, scored by
  gears_ddp's ``GEARS.train`` with the same metric code as its model (``baselines`` of its
  return value). They depend on the split only, not on any model. ``no_change`` predicts no
  change, so its ``pearson_delta`` is undefined and scored 0 (as the published package sets
  an undefined correlation).

Summary, per metric, over the seeds:

- mean +- sd of each implementation (and of each baseline): mean and sample standard
  deviation (n - 1) over the seeds where it has a value.
- difference: per seed d = gears_ddp - published, over the seeds where both have a value
  ('seeds' counts them); shown as mean(d) +- its standard error sd(d) / sqrt(n). Pairing by
  seed removes the split's effect (both see the same split at a seed).
- gain over paired controls: each implementation's metric minus that of a zero effect with
  the same test pairing (each test cell predicted by the control cell its package paired
  it with; see ``bench_model.py``). The test predictions of both packages include the mean
  of the paired control cells, which each package draws with its own generator; on this
  data that pairing alone moves ``pearson_delta`` by a few hundredths. The gains are
  compared seed by seed like the metrics.
- verdict: 'within noise' when |mean(d)| <= 2 standard errors, otherwise which
  implementation is better (higher ``pearson_delta``, lower ``mse_de``); '-' with fewer than
  two paired seeds. With three seeds the standard error is itself rough (2 SE is a loose
  screen, not a test at a stated level: a t interval with 2 degrees of freedom would need
  4.3 SE for 95%).

The published package prints freely and seeds torch on import; its child's output is
discarded (``bench_model.measured_run``). A child that fails is reported on stderr with its exit
status and its stderr's end, and its figures are shown as 'failed'.
"""

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from harness.child import run_in_child
from harness.published import reference_available
from harness.record import add_record_argument, recorded
from harness.settings import HIDDEN_SIZE, LR, SUBGROUPS, WEIGHT_DECAY
from harness.side_by_side import add_workflow_options
from harness.spread import mean_sd, paired_difference
from harness.synthetic import write_raw_input
from harness.tables import format_number, print_table
from harness.timing import Stopwatch

BENCH_MODEL = Path(__file__).resolve().with_name("bench_model.py")  # whose run each seed repeats
IMPLEMENTATIONS = {"ours": "gears_ddp", "reference": "published"}
BASELINES = ("no_change", "mean_effect", "additive")
# (metric, higher is better)
METRICS = (
    ("mse", False),
    ("mse_de", False),
    ("pearson_delta", True),
    *((f"{name} pearson_delta", True) for name in SUBGROUPS),
)


def figures(result: dict) -> dict:
    """The metrics of one child's result (or of one baseline in it), by METRICS name."""
    return {
        "mse": result["mse"],
        "mse_de": result["mse_de"],
        "pearson_delta": result["pearson_delta"],
        **{f"{name} pearson_delta": result["subgroups"][name] for name in SUBGROUPS},
    }


def run_seeds(raw: Path, args) -> dict:
    """``{seed: {impl: result}}`` for the implementations run ('ours', and 'reference'
    unless skipped or not installed); a result is what ``bench_model.measured_run`` returns
    plus its wall seconds, None where the child failed."""
    implementations = ["ours"] if args.skip_reference or not reference_available() else ["ours", "reference"]
    runs = {}
    for seed in args.seeds:
        seed_args = argparse.Namespace(**vars(args), seed=seed)
        runs[seed] = {}
        for impl in implementations:
            with Stopwatch() as watch:
                result = run_in_child(BENCH_MODEL, "measured_run", impl, str(raw), vars(seed_args), label=impl)
            seconds = watch.seconds
            if result is not None:
                result["wall_s"] = seconds
            runs[seed][impl] = result
            print(
                f"seed {seed}: {IMPLEMENTATIONS[impl]} {'failed' if result is None else 'done'} in {seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def _value(seed_runs: dict, impl: str, metric: str, baseline: str | None = None) -> float:
    """A metric of ``impl``'s result (or of one baseline in it) at one seed; NaN if missing."""
    result = seed_runs.get(impl)
    if result is None:
        return math.nan
    return figures(result["baselines"][baseline] if baseline else result)[metric]


def _gain(seed_runs: dict, impl: str, metric: str) -> float:
    """``impl``'s metric at one seed minus that of its own paired controls (zero effect)."""
    result = seed_runs.get(impl)
    if result is None:
        return math.nan
    return figures(result)[metric] - figures(result["paired_controls"])[metric]


def _cell(seed_runs: dict, impl: str, metric: str) -> str:
    if impl not in seed_runs:
        return "not run"
    return "failed" if seed_runs[impl] is None else format_number(_value(seed_runs, impl, metric))


def _conditions(seed_runs: dict, metric: str) -> str:
    """Test conditions the metric averages over (gears_ddp's split; the published package's
    where it differs)."""
    name = metric.split()[0]

    def count(result):
        sizes = result["subgroup_sizes"]
        return sizes[name] if name in SUBGROUPS else sum(sizes.values())

    ours, theirs = seed_runs.get("ours"), seed_runs.get("reference")
    if ours is None:
        return "-"
    if theirs is not None and count(theirs) != count(ours):
        return f"{count(ours)} (published {count(theirs)})"
    return str(count(ours))


def _paired_rows(runs: dict, value_of) -> list[list[str]]:
    """Per metric of METRICS: its name, which way is better, each implementation's mean +- sd
    over the seeds, the paired difference and its verdict; ``value_of(seed_runs, impl,
    metric)`` gives the figure compared."""
    rows = []
    for metric, higher_is_better in METRICS:
        ours = [value_of(r, "ours", metric) for r in runs.values()]
        published = [value_of(r, "reference", metric) for r in runs.values()]
        n, diff, verdict = paired_difference(ours, published, higher_is_better, ("gears_ddp", "published"))
        rows.append(
            [
                f"test {metric}",
                "higher" if higher_is_better else "lower",
                mean_sd(ours),
                mean_sd(published),
                str(n),
                diff,
                verdict,
            ]
        )
    return rows


def print_tables(runs: dict, args) -> None:
    """The header, the per-seed table with each seed's val mse_de by epoch, and the summary."""
    first = next((r["ours"] for r in runs.values() if r.get("ours")), None)
    if first is not None:
        print(
            f"\n{first['cells']} cells x {first['genes']} genes; split simulation, seeds "
            f"{' '.join(map(str, args.seeds))}; batch {args.batch_size}, test batch {args.test_batch_size}; "
            f"hidden_size {HIDDEN_SIZE}, lr {LR:g}, weight_decay {WEIGHT_DECAY:g}; {args.epochs} epochs; "
            f"CPU, {os.cpu_count()} cores, torch threads {first['threads']}"
            + ("; both models without co-expression edges" if args.without_coexpression else "")
        )
    print(f"\nTest metrics of the best-val model after {args.epochs} epochs, per seed:\n")
    rows = []
    for seed, seed_runs in runs.items():
        for metric, _ in METRICS:
            diff = _value(seed_runs, "ours", metric) - _value(seed_runs, "reference", metric)
            rows.append(
                [
                    str(seed),
                    f"test {metric}",
                    _conditions(seed_runs, metric),
                    _cell(seed_runs, "ours", metric),
                    _cell(seed_runs, "reference", metric),
                    "-" if math.isnan(diff) else f"{diff:+.4f}",
                    *(format_number(_value(seed_runs, "ours", metric, name)) for name in BASELINES),
                ]
            )
    print_table(
        ["seed", "metric", "conditions", "gears_ddp", "published", "gears_ddp - published", *BASELINES], rows, 2
    )
    print()
    for seed, seed_runs in runs.items():
        parts = []
        for impl, result in seed_runs.items():
            if result is not None:
                val = result["val_mse_de"]
                best = min(range(len(val)), key=val.__getitem__) + 1
                parts.append(
                    f"{IMPLEMENTATIONS[impl]} {[round(v, 4) for v in val]} "
                    f"(best epoch {best}; run {result['wall_s']:.0f} s)"
                )
        print(f"seed {seed}, val mse_de by epoch: " + "; ".join(parts))

    print(
        f"\nSummary over seeds {' '.join(map(str, args.seeds))} (mean +- sd; difference: mean +- standard "
        "error of the per-seed gears_ddp - published):\n"
    )
    rows = [
        row + [mean_sd([_value(r, "ours", metric, name) for r in runs.values()]) for name in BASELINES]
        for (metric, _), row in zip(METRICS, _paired_rows(runs, _value))
    ]
    print_table(
        ["metric", "better", "gears_ddp", "published", "seeds", "gears_ddp - published", "verdict", *BASELINES], rows, 2
    )
    print("\nverdict: 'within noise' when |mean difference| <= 2 standard errors, else the better side.")

    print(
        "\nGain over each implementation's paired controls (per seed: model - zero effect, each test cell "
        "predicted by its paired control; this cancels which control cells each package paired with the "
        "test cells):\n"
    )
    print_table(
        ["metric", "better", "gears_ddp gain", "published gain", "seeds", "gears_ddp - published", "verdict"],
        _paired_rows(runs, _gain),
        2,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workflow_options(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--skip-reference", action="store_true")
    parser.set_defaults(eval_repeats=1)  # the children's test-evaluation timing, not reported here
    add_record_argument(parser)
    args = parser.parse_args()
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must differ")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        raw = write_raw_input(Path(tmp) / "input", args)
        runs = run_seeds(raw, args)
    with recorded(args.record):
        print_tables(runs, args)
        print(f"\nwall time: {time.perf_counter() - start:.0f} s")
    if any(r["ours"] is None for r in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
