"""What ``gears-ddp demo`` shows a new user, over several seeds, and how long it takes.

    python benchmarks/bench_demo.py [--seeds 1 2 3] [--epochs 10] [--record]

Runs the real command, ``gears-ddp demo``, once per seed S, in a fresh working folder (as
from a fresh clone: the first run writes the demo's dataset, the later ones reuse it), with
``--set split_config.seed=S --set args.seed=S``: the split, the initial weights, the
control pairing and the shuffling change with S. Each run's wall time is measured around the
command (the first one includes writing the data), and so is the CPU time (user + system)
of all its processes, which other work on a shared machine does not inflate as much; its
figures are read from the run folder's ``report.json``.

Printed: the calibration statistics of the demo's dataset (``gears_ddp.evaluation.calibration``,
at split seed 1) beside the Norman targets of the preset's documentation; per seed, the
training loss of the first and last epoch, the test ``mse``, ``mse_de`` and
``pearson_delta`` of GEARS (the kept model) and of the no-change, mean-effect and additive
baselines, and the wall time; then mean +- sample sd over the seeds and the three checks
the demo is meant to show:

- the training loss falls: last epoch below the first at every seed;
- GEARS beats no change on ``mse`` and on ``mse_de`` at every seed;
- GEARS's ``pearson_delta`` is within the seed spread of the mean-effect baseline's, or
  better: its mean over the seeds is at least the baseline's mean minus the baseline's sd.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.record import add_record_argument, recorded
from harness.spread import mean_sd
from harness.tables import print_table
from harness.timing import Stopwatch

BASELINES = ("no_change", "mean_effect", "additive")
METRICS = ("mse", "mse_de", "pearson_delta")


def run_demo(folder: Path, seed: int, epochs: int) -> dict:
    """One ``gears-ddp demo`` in ``folder``: its report and wall seconds (None if it failed)."""
    command = [shutil.which("gears-ddp") or "gears-ddp", "demo", "--epochs", str(epochs),
               "--save-path", f"./runs/demo_{seed}", "--set", f"split_config.seed={seed}", "--set", f"args.seed={seed}"]
    with Stopwatch(cpu_of="children") as watch:
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    seconds, cpu = watch.seconds, watch.cpu_seconds
    report_file = folder / "runs" / f"demo_{seed}" / "report.json"
    if proc.returncode != 0 or not report_file.exists():
        print(f"seed {seed}: gears-ddp demo failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {"seconds": seconds, "cpu_seconds": cpu, "report": None}
    print(f"seed {seed}: {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"seconds": seconds, "cpu_seconds": cpu, "report": json.loads(report_file.read_text())}


def figures(report: dict) -> dict:
    """First and last training loss; the test metrics of GEARS and of each baseline."""
    losses = [record["train_loss"] for record in report["history"]]
    out = {"first_loss": losses[0], "last_loss": losses[-1]}
    for metric in METRICS:
        out[f"GEARS {metric}"] = report["model"][f"test_{metric}"]
        for name in BASELINES:
            out[f"{name} {metric}"] = report["baselines"][name][f"test_{metric}"]
    return out


def dataset_statistics(data_path: Path) -> dict:
    from gears_ddp import PertData
    from gears_ddp.evaluation.calibration import calibration_statistics

    pert_data = PertData(str(data_path))
    pert_data.load(data_path=str(data_path / "synthetic"))
    pert_data.prepare_split("simulation", seed=1)
    return calibration_statistics(pert_data)


def print_report(statistics_: dict, runs: dict) -> None:
    from gears_ddp.evaluation.calibration import NORMAN_TARGETS

    print("\nThe demo's dataset (preset 'norman'), measured at split seed 1, beside the Norman screen:\n")
    rows = [[label, target, f"{low}-{high}", f"{statistics_[key]:.4g}"]
            for key, (label, target, (low, high)) in NORMAN_TARGETS.items()]
    rows += [[key, "additive above mean effect", "", f"{statistics_[key]:.4g}"]
             for key in ("mean_effect_combo_seen2_pearson_delta", "additive_combo_seen2_pearson_delta")]
    print_table(["statistic", "Norman", "held to", "demo dataset"], rows, left=3)

    done = {seed: r for seed, r in runs.items() if r["report"] is not None}
    rows = {seed: figures(r["report"]) for seed, r in done.items()}
    print(f"\nPer seed ({', '.join(map(str, runs))}); wall time of the whole command, the first with writing "
          "the data:\n")
    header = ["seed", "wall s", "CPU s", "loss epoch 1", "loss last epoch"]
    header += [f"{who} {m}" for m in METRICS for who in ("GEARS", *BASELINES)]
    table = []
    for seed, row in rows.items():
        cells = [str(seed), f"{runs[seed]['seconds']:.0f}", f"{runs[seed]['cpu_seconds']:.0f}",
                 f"{row['first_loss']:.4f}", f"{row['last_loss']:.4f}"]
        table.append(cells + [f"{row[f'{who} {m}']:.4f}" for m in METRICS for who in ("GEARS", *BASELINES)])
    print_table(header, table)
    if len(rows) < len(runs):
        print(f"\n{len(runs) - len(rows)} run(s) failed; the summary covers the others.")
    if not rows:
        return
    print("\nMean +- sd over the seeds:\n")
    print_table(["metric", "GEARS", *BASELINES],
                [[m, *(mean_sd([r[f"{who} {m}"] for r in rows.values()]) for who in ("GEARS", *BASELINES))]
                 for m in METRICS])

    values = list(rows.values())
    falls = all(r["last_loss"] < r["first_loss"] for r in values)
    beats = {m: all(r[f"GEARS {m}"] < r[f"no_change {m}"] for r in values) for m in ("mse", "mse_de")}
    ours = [r["GEARS pearson_delta"] for r in values]
    theirs = [r["mean_effect pearson_delta"] for r in values]
    spread = statistics.stdev(theirs) if len(theirs) > 1 else 0.0
    within = statistics.mean(ours) >= statistics.mean(theirs) - spread
    seconds = [r["seconds"] for r in runs.values()]
    cpu = [r["cpu_seconds"] for r in runs.values()]
    print("\nChecks:\n")
    print(f"- training loss falls at every seed: {'yes' if falls else 'no'}")
    for m in ("mse", "mse_de"):
        print(f"- GEARS beats no change on {m} at every seed: {'yes' if beats[m] else 'no'}")
    print(f"- GEARS pearson_delta {statistics.mean(ours):.4f} against the mean-effect baseline's "
          f"{statistics.mean(theirs):.4f} +- {spread:.4f}: {'within its seed spread or better' if within else 'below'}")
    print(f"- wall time: first run (writes the data) {seconds[0]:.0f} s, the others "
          f"{', '.join(f'{s:.0f}' for s in seconds[1:]) or '-'} s, on {os.cpu_count()} CPU cores shared with other "
          f"work; CPU time of all the command's processes: {cpu[0]:.0f} s, then "
          f"{', '.join(f'{c:.0f}' for c in cpu[1:]) or '-'} s (on 2 idle cores a run takes at least half of it)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=10)
    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = {seed: run_demo(folder, seed, args.epochs) for seed in args.seeds}
        statistics_ = dataset_statistics(folder / "data" / "demo")
    with recorded(args.record):
        print_report(statistics_, runs)
    if any(r["report"] is None for r in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
