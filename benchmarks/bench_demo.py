"""What ``gears-ddp demo`` shows a new user, over several seeds, and how long it takes.

    python benchmarks/bench_demo.py [--data real|synthetic] [--seeds 1 2 3] [--epochs 10] [--record]

Runs the real command, ``gears-ddp demo --data D``, once per seed S, in a fresh working
folder (as from a fresh clone: the first run writes the demo's dataset, the later ones reuse
it), with ``--set split_config.seed=S --set args.seed=S``: the split, the initial weights,
the control pairing and the shuffling change with S. Each run's wall time is measured around
the command (the first one includes writing the data), and so is the CPU time (user +
system) of all its processes, which other work on a shared machine does not inflate as
much; its figures are read from the run folder's ``report.json``.

Printed: the machine's load; what the data is (the real screen: its cells, genes and
knockouts, and the knockouts each split seed holds out; the synthetic data: its calibration
statistics, at split seed 1, beside the Norman targets of the preset's documentation); per
seed, the training loss of the first and last epoch, the test ``mse``, ``mse_de`` and
``pearson_delta`` of GEARS (the kept model) and of the baselines (no change, mean effect and
the linear model of Ahlmann-Eltze et al.; the synthetic data's two-gene combinations add the
additive baseline), and the wall
time; then mean +- sample sd over the seeds and the checks the demo is meant to show:

- the training loss falls: last epoch below the first at every seed;
- for each metric and baseline (no change only on ``mse`` and ``mse_de``, where it is a
  verdict): the paired difference over the seeds and their test perturbations, its 95%
  interval, the perturbations GEARS won and the verdict, as the replicates' summary gives
  them (``report.replicate_summary``).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.machine import load_average
from harness.record import add_record_argument, recorded
from harness.spread import mean_sd
from harness.tables import print_table
from harness.timing import Stopwatch

BASELINES = {
    "real": ("no_change", "mean_effect", "linear"),
    "synthetic": ("no_change", "mean_effect", "additive", "linear"),
}
DATASETS = {"real": "papalexi2021", "synthetic": "synthetic"}
DATA_FOLDERS = {"real": "data/demo", "synthetic": "data/demo-synthetic"}
METRICS = ("mse", "mse_de", "pearson_delta")


def run_demo(folder: Path, data: str, seed: int, epochs: int) -> dict:
    """One ``gears-ddp demo`` in ``folder``: its report and wall seconds (None if it failed)."""
    command = [
        shutil.which("gears-ddp") or "gears-ddp",
        "demo",
        "--data",
        data,
        "--epochs",
        str(epochs),
        "--save-path",
        f"./runs/demo_{seed}",
        "--set",
        f"split_config.seed={seed}",
        "--set",
        f"args.seed={seed}",
    ]
    with Stopwatch(cpu_of="children") as watch:
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    seconds, cpu = watch.seconds, watch.cpu_seconds
    report_file = folder / "runs" / f"demo_{seed}" / "report.json"
    if proc.returncode != 0 or not report_file.exists():
        print(f"seed {seed}: gears-ddp demo failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {"seconds": seconds, "cpu_seconds": cpu, "report": None}
    print(f"seed {seed}: {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"seconds": seconds, "cpu_seconds": cpu, "report": json.loads(report_file.read_text())}


def figures(report: dict, baselines) -> dict:
    """First and last training loss; the test metrics of GEARS and of each baseline."""
    losses = [record["train_loss"] for record in report["history"]]
    out = {"first_loss": losses[0], "last_loss": losses[-1]}
    for metric in METRICS:
        out[f"GEARS {metric}"] = report["model"][f"test_{metric}"]
        for name in baselines:
            out[f"{name} {metric}"] = report["baselines"][name][f"test_{metric}"]
    return out


def _load(data_path: Path, data: str, split_seed: int):
    from gears_ddp import PertData

    pert_data = PertData(str(data_path))
    pert_data.load(data_path=str(data_path / DATASETS[data]))
    pert_data.prepare_split("simulation", seed=split_seed)
    return pert_data


def print_real_screen(data_path: Path, seeds) -> None:
    """The processed real screen's size and the test knockouts of each split seed."""
    pert_data = _load(data_path, "real", seeds[0])
    conditions = [c for c in pert_data.cells.conditions if c != "ctrl"]
    print(
        f"\nThe demo's data: the real screen (gears_ddp.datasets.papalexi2021), as processed: "
        f"{pert_data.cells.n_cells} cells x {len(pert_data.var)} genes, {len(conditions)} knockouts with GO terms.\n"
    )
    rows = []
    for seed in seeds:
        sets = _load(data_path, "real", seed).set2conditions
        rows.append(
            [
                str(seed),
                *(str(len([c for c in sets[name] if c != "ctrl"])) for name in ("train", "val", "test")),
                ", ".join(c.split("+")[0] for c in sets["test"]),
            ]
        )
    print_table(["split seed", "train knockouts", "val", "test", "test knockouts (unseen in training)"], rows)


def print_synthetic_data(data_path: Path) -> None:
    """The synthetic data's calibration statistics beside the Norman screen's."""
    from gears_ddp.evaluation.calibration import NORMAN_TARGETS, calibration_statistics

    statistics_ = calibration_statistics(_load(data_path, "synthetic", 1))
    print("\nThe demo's dataset (preset 'norman'), measured at split seed 1, beside the Norman screen:\n")
    rows = [
        [label, target, f"{low}-{high}", f"{statistics_[key]:.4g}"]
        for key, (label, target, (low, high)) in NORMAN_TARGETS.items()
    ]
    rows += [
        [key, "additive above mean effect", "", f"{statistics_[key]:.4g}"]
        for key in ("mean_effect_combo_seen2_pearson_delta", "additive_combo_seen2_pearson_delta")
    ]
    print_table(["statistic", "Norman", "held to", "demo dataset"], rows, left=3)


def print_runs(runs: dict, baselines) -> None:
    done = {seed: r for seed, r in runs.items() if r["report"] is not None}
    rows = {seed: figures(r["report"], baselines) for seed, r in done.items()}
    print(
        f"\nPer seed ({', '.join(map(str, runs))}); wall time of the whole command, the first with writing the data:\n"
    )
    sides = ("GEARS", *baselines)
    header = ["seed", "wall s", "CPU s", "loss epoch 1", "loss last epoch"] + [
        f"{who} {m}" for m in METRICS for who in sides
    ]
    table = [
        [
            str(seed),
            f"{runs[seed]['seconds']:.0f}",
            f"{runs[seed]['cpu_seconds']:.0f}",
            f"{row['first_loss']:.4f}",
            f"{row['last_loss']:.4f}",
        ]
        + [f"{row[f'{who} {m}']:.4f}" for m in METRICS for who in sides]
        for seed, row in rows.items()
    ]
    print_table(header, table)
    if len(rows) < len(runs):
        print(f"\n{len(runs) - len(rows)} run(s) failed; the summary covers the others.")
    if not rows:
        return
    print("\nMean +- sd over the seeds:\n")
    print_table(
        ["metric", *sides],
        [[m, *(mean_sd([r[f"{who} {m}"] for r in rows.values()]) for who in sides)] for m in METRICS],
    )
    print_checks({seed: runs[seed]["report"] for seed in rows}, baselines)
    seconds = [r["seconds"] for r in runs.values()]
    cpu = [r["cpu_seconds"] for r in runs.values()]
    print(
        f"\nWall time: first run (writes the data) {seconds[0]:.0f} s, the others "
        f"{', '.join(f'{s:.0f}' for s in seconds[1:]) or '-'} s, on {os.cpu_count()} CPU cores shared with other "
        f"work; CPU time of all the command's processes: {cpu[0]:.0f} s, then "
        f"{', '.join(f'{c:.0f}' for c in cpu[1:]) or '-'} s (on 2 idle cores a run takes at least half of it)."
    )


def print_checks(reports: dict, baselines) -> None:
    """The loss check, then GEARS against each baseline on each metric where it is a verdict:
    the replicates' summary of the seeds' reports (``report.replicate_summary``: the paired
    difference over the seeds and their test perturbations, its 95% interval, the
    perturbations won and the verdict)."""
    from gears_ddp.report.numbers import format_comparison
    from gears_ddp.report.replicate_summary import summarise_replicates

    values = [figures(report, baselines) for report in reports.values()]
    falls = sum(r["last_loss"] < r["first_loss"] for r in values)
    print(f"\nChecks:\n\n- the training loss falls at {falls} of {len(values)} seeds")
    rows = []
    for verdict in summarise_replicates(reports, metrics=METRICS, subgroups=(None,)):
        for name in baselines:
            comparison = verdict.differences.get(name)
            if comparison is not None and comparison.verdict != "n/a":
                rows.append([verdict.metric, name, format_comparison(comparison), comparison.verdict])
    print()
    print_table(["metric", "baseline", "difference [95% interval] won (+: GEARS better)", "over the seeds"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=list(DATASETS), default="real")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=10)
    add_record_argument(parser)
    args = parser.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = {seed: run_demo(folder, args.data, seed, args.epochs) for seed in args.seeds}
        with recorded(args.record):
            print(f"Load average (1 min) when the runs started: {load}; when they ended: {load_average()}.")
            if args.data == "real":
                print_real_screen(folder / DATA_FOLDERS["real"], args.seeds)
            else:
                print_synthetic_data(folder / DATA_FOLDERS["synthetic"])
            print_runs(runs, BASELINES[args.data])
    if any(r["report"] is None for r in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
