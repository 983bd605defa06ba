"""Time to the first optimiser step of a torchrun job on a fresh data folder, with 1 and 2
ranks on the machine: what preparing the data (the expression map, the split file, the
graphs) adds to the start, and that the ranks of a machine prepare it once between them.

    python benchmarks/bench_startup.py [--ranks 1 2] [--genes 2000 --cells-per-condition 100 ...] [--record]

The synthetic dataset is written once (``write_synthetic_dataset``: the processed h5ad and
the GO files). Each run copies those files alone into a fresh folder (no expression map, no
split file, no graphs), starts ``torchrun --standalone --nproc_per_node=N`` on this script,
which runs the rank of ``gears-ddp train --config`` with timers around it, and then starts
the same job again on the folder it prepared (warm). Each job trains one optimiser step
(batch 32 per rank, hidden 64; then it evaluates and writes its run folder, which no figure
includes). Measured in each rank (``time.time``, one clock
for the processes of one machine; ``time.process_time``):

- time to first step: from just before torchrun starts to the end of the first optimiser
  step, the latest rank's (the step waits for every rank);
- preparation: ``prepare_data``'s wall time, the longest rank's, and its CPU seconds summed
  over the ranks;
- builds: how many times the ranks together wrote the expression map, wrote a split file
  and computed the co-expression graph (1 each on a fresh folder, 0 on a warm one).

``--without-prepare-lock`` also runs the fresh jobs with the lock of ``prepare_data``
switched off in the ranks (what they did before it: the map had a lock of its own, the split
and the graphs none), beside the same jobs with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
from harness.machine import describe_machine
from harness.record import add_record_argument, recorded
from harness.settings import HIDDEN_SIZE
from harness.synthetic import add_size_arguments, synthetic_options, write_run_config
from harness.tables import print_table
from harness.torchrun import job_environment, torchrun_command

RANK_REPORTS = "GEARS_DDP_BENCH_RANK_REPORTS"  # where each rank writes its figures
WITHOUT_LOCK = "GEARS_DDP_BENCH_WITHOUT_PREPARE_LOCK"


def rank() -> None:
    """Run this process's rank of ``gears-ddp train --config`` with timers: write the
    figures to ``$GEARS_DDP_BENCH_RANK_REPORTS/rank<r>.json`` at the end of the first step."""
    import gears_ddp.data.graphs as graphs
    import gears_ddp.data.preparation as preparation
    import gears_ddp.data.split_cache as split_cache
    import gears_ddp.launching.launchers as launchers
    import gears_ddp.training.recipe as recipe
    from gears_ddp.cli import main
    from gears_ddp.data import expression_map

    figures = {"builds": {"map": 0, "split": 0, "co-expression graph": 0}}

    def counted(module, name, what):
        original = getattr(module, name)

        def call(*args, **kwargs):
            figures["builds"][what] += 1
            return original(*args, **kwargs)

        setattr(module, name, call)

    counted(expression_map, "_write_map", "map")
    counted(split_cache, "split_conditions", "split")
    counted(graphs, "coexpression_edge_list", "co-expression graph")
    if os.environ.get(WITHOUT_LOCK):
        preparation.file_lock = lambda path: contextlib.nullcontext()
    prepare = launchers.prepare_data

    def timed_prepare(*args, **kwargs):
        wall, cpu = time.time(), time.process_time()
        try:
            return prepare(*args, **kwargs)
        finally:
            figures.update(prepare_s=time.time() - wall, prepare_cpu_s=time.process_time() - cpu)

    launchers.prepare_data = timed_prepare
    steps = recipe.optimizer_steps

    def report_first_step(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            if number == 1:  # the step is done when its loss comes out
                figures["first_step_at"] = time.time()
                path = Path(os.environ[RANK_REPORTS]) / f"rank{os.environ['RANK']}.json"
                path.write_text(json.dumps(figures))
            yield loss

    recipe.optimizer_steps = report_first_step
    main(["train", *sys.argv[2:]])


def job(data_path: Path, ranks: int, without_lock: bool, work: Path) -> dict:
    """One torchrun job of ``ranks`` processes on ``data_path``: its figures (see the module doc)."""
    reports = work / f"reports-{time.monotonic_ns()}"
    reports.mkdir()
    args = {
        "epochs": 1,
        "max_steps": 1,
        "batch_size": 32,
        "model_config": {"hidden_size": HIDDEN_SIZE},
        "save_path": str(work / "run"),
    }
    environment = job_environment({RANK_REPORTS: reports, "OMP_WAIT_POLICY": "PASSIVE"})
    if without_lock:
        environment[WITHOUT_LOCK] = "1"
    config = write_run_config(reports / "run.yaml", data_path, "synthetic", args)
    command = torchrun_command(ranks, __file__, "--rank", "--config", str(config))
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    if done.returncode:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = [json.loads(path.read_text()) for path in sorted(reports.glob("rank*.json"))]
    assert len(figures) == ranks, done.stderr[-3000:]
    return {
        "first_step_s": max(f["first_step_at"] for f in figures) - started,
        "prepare_s": max(f["prepare_s"] for f in figures),
        "prepare_cpu_s": sum(f["prepare_cpu_s"] for f in figures),
        "builds": {what: sum(f["builds"][what] for f in figures) for what in figures[0]["builds"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="processes on the machine")
    parser.add_argument(
        "--without-prepare-lock",
        action="store_true",
        help="also run the fresh jobs with prepare_data's lock switched off",
    )
    add_size_arguments(parser, genes=2000, cells_per_condition=100, perturbed_genes=60, combos=80, control_cells=2000)
    add_record_argument(parser)
    if sys.argv[1:2] == ["--rank"]:
        rank()
        return
    args = parser.parse_args()
    from gears_ddp.datasets import write_synthetic_dataset

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"  # the GO files and the processed h5ad, nothing that preparing writes
        folder = write_synthetic_dataset(source, **synthetic_options(args))
        with h5py.File(folder / "perturb_processed.h5ad", "r") as handle:
            matrix = handle["X"]
            shape = tuple(int(n) for n in (matrix.attrs["shape"] if isinstance(matrix, h5py.Group) else matrix.shape))
        for ranks in args.ranks:
            fresh = shutil.copytree(source, Path(tmp) / f"data-{ranks}")
            rows.append((ranks, "fresh", job(fresh, ranks, False, Path(tmp))))
            if args.without_prepare_lock:
                unlocked = shutil.copytree(source, Path(tmp) / f"data-{ranks}-unlocked")
                rows.append((ranks, "fresh, no prepare lock", job(unlocked, ranks, True, Path(tmp))))
            rows.append((ranks, "warm (prepared)", job(fresh, ranks, False, Path(tmp))))
    with recorded(args.record):
        print(
            f"\ntime to the first optimiser step of `torchrun --standalone --nproc_per_node=N -m gears_ddp.launch`, "
            f"synthetic data {shape[0]:,} cells x {shape[1]:,} genes (map {shape[0] * shape[1] * 4 / 2**20:.0f} MiB), "
            f"CPU ranks; {describe_machine()}\n"
        )
        print_table(
            [
                "ranks",
                "folder",
                "time to first step (s)",
                "preparation (s, slowest rank)",
                "preparation CPU (s, all ranks)",
                "map builds",
                "split builds",
                "co-expression graph builds",
            ],
            [
                [
                    ranks,
                    kind,
                    f"{figures['first_step_s']:.1f}",
                    f"{figures['prepare_s']:.2f}",
                    f"{figures['prepare_cpu_s']:.2f}",
                    figures["builds"]["map"],
                    figures["builds"]["split"],
                    figures["builds"]["co-expression graph"],
                ]
                for ranks, kind, figures in rows
            ],
            left=2,
        )


if __name__ == "__main__":
    main()
