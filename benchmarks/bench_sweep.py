"""What a sweep costs beside its trials: Optuna (drawing, reporting, pruning, telling), the
placement of trials and the report, against the trials' own training time.

    python benchmarks/bench_sweep.py [--trials 12] [--epochs 3] [--processes 2] [--data-path ./data/demo] [--record]

The demo's screen (written once, as ``gears-ddp demo`` writes it), its run (10 epochs there,
``--epochs`` here), 2 CPU processes: 2 trials at once. The search space plants a bad
learning rate: ``lr`` among 0.001, 0.003 and 10, and ``hidden_size`` from 32 to 128 on a log
scale. Timed in this process (``time.perf_counter``): every call of the sweep's own work
(drawing a trial and building its run, reading each running trial's epochs and asking the
pruner, telling the study how a trial ended, opening the storage and the study, writing the
report), and each trial's wall time from its start to its end (``trials.csv``'s seconds).
Printed: the sweep's wall time, the trials' seconds summed and per process, the sweep's own
seconds by part, and their share of the trials' time per process.
"""

from __future__ import annotations

import argparse
import collections
import csv
import functools
import tempfile
import time
from pathlib import Path

from harness.record import add_record_argument, recorded
from harness.tables import print_table

SPACE = {
    "args": {
        "lr": {"type": "categorical", "choices": [0.001, 0.003, 10.0]},
        "model_config": {"hidden_size": {"type": "int", "low": 32, "high": 128, "log": True}},
    }
}


def timed(spent: dict, part: str, function):
    @functools.wraps(function)
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - started

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--data-path", help="where the demo's screen is (written there when it is not)")
    add_record_argument(parser)
    options = parser.parse_args()

    from gears_ddp.datasets import write_papalexi2021_dataset
    from gears_ddp.datasets.real_screen import NAME
    from gears_ddp.sweeps import report, study, train_sweep

    spent = collections.defaultdict(float)
    train_sweep._Trials.next_run = timed(spent, "drawing a trial and building its run", train_sweep._Trials.next_run)
    train_sweep._Trials.watch = timed(spent, "reading epochs, asking the pruner", train_sweep._Trials.watch)
    train_sweep._Trials.settled = timed(spent, "telling the study how a trial ended", train_sweep._Trials.settled)
    train_sweep.open_storage = timed(spent, "opening the storage and the study", study.open_storage)
    train_sweep.load_or_create_study = timed(spent, "opening the storage and the study", study.load_or_create_study)
    report.write_sweep_report = timed(spent, "writing the report", report.write_sweep_report)
    with tempfile.TemporaryDirectory() as work:
        data = Path(options.data_path or Path(work) / "data")
        write_papalexi2021_dataset(data)
        folder = Path(work) / "sweep"
        args = {"epochs": options.epochs, "cpu_processes": options.processes, "save_path": str(folder)}
        started = time.perf_counter()
        summary = train_sweep.train_sweep(data, NAME, {"split": "simulation", "seed": 1}, args, SPACE, options.trials)
        wall = time.perf_counter() - started
        with open(folder / report.TRIALS_FILE, newline="") as table:
            rows = list(csv.DictReader(table))
    trials = sum(float(row["seconds"]) for row in rows if row["seconds"])
    own = sum(spent.values())
    per_process = trials / options.processes
    with recorded(options.record):
        counts = ", ".join(f"{count} {state.lower()}" for state, count in summary["counts"].items())
        print(
            f"The demo's screen, {options.trials} trials of {options.epochs} epochs ({counts}), "
            f"{options.processes} at once on {options.processes} CPU processes; lr among 0.001, 0.003 and 10 "
            "(planted), hidden_size 32-128 (log)\n"
        )
        print_table(
            ["", "seconds", "share of the trials' time per process"],
            [
                ["the sweep, start to end (wall)", f"{wall:.1f}", "-"],
                ["the trials, each start to end, summed", f"{trials:.1f}", "-"],
                [f"  per process ({options.processes})", f"{per_process:.1f}", "-"],
                *[
                    [f"sweep's own: {part}", f"{seconds:.3f}", f"{seconds / per_process:.2%}"]
                    for part, seconds in spent.items()
                ],
                ["sweep's own work in all", f"{own:.3f}", f"{own / per_process:.2%}"],
            ],
        )
        pruned = ", ".join(
            "trial {number} (lr {lr}, after {epochs} epochs)".format(
                number=row["number"], lr=row["args.lr"], epochs=row["epochs"]
            )
            for row in rows
            if row["state"] == "PRUNED"
        )
        best = summary["best"]
        print(
            f"\npruned: {pruned or 'none'} (of {options.epochs}); best: trial {best['number']}, validation mse_de "
            f"{best['value']:.4g}"
        )


if __name__ == "__main__":
    main()
