"""Million-cell screens: processing from the h5ad a block at a time, then training and
evaluating from the mapped expression, on 1 and 2 CPU ranks, spawned and under torchrun.

    python benchmarks/bench_scale.py [--cells 100000 1000000] [--genes 2000] [--steps 300]
                                     [--ranks 1 2] [--launchers spawn torchrun]
                                     [--data-path ./data/bench_scale] [--record]

For each size it writes a synthetic screen (``gears_ddp.datasets.write_synthetic_screen``,
a block of cells at a time: 500 perturbations, a tenth of the cells controls) once under
``--data-path/<cells>`` (kept for later runs, processed or not), and processes it in a child process exactly as a
user does:
``PertData(path).new_data_process(name, anndata.read_h5ad(raw, backed='r'))`` (DE genes,
gene sets, the expression map), ``prepare_split('simulation', seed=1)`` and the two gene
graphs. Then, for each launcher and number of ranks, it trains ``--steps`` optimiser steps
(batch 32 per rank, hidden 64), with the evaluation of train and val that ends an epoch,
and scores the test set: ``train_multi_gpu(..., cpu_processes=R)`` ("spawn": R workers, or
the calling process for one rank) or
``torchrun --nproc_per_node=R -m gears_ddp.launch --config`` ("torchrun"). At the smallest size
it also trains from an in-memory copy of the expression
(``expression_storage='memory'``), the comparison the throughput target is about.

Measured from outside, every 0.1 s, in every process of the run (``/proc``):

- peak private memory, ``RssAnon`` of ``/proc/<pid>/status``: of the processing child; of
  each rank (the worker processes, not the launcher or the parent, which is the rank of a
  one-rank ``train_multi_gpu``);
- the expression map's resident pages in each rank, and how many of them are shared with
  another process (``Shared_Clean`` of its mapping in ``/proc/<pid>/smaps``), at their peak;
- time to the first training step: from the launch to rank 0's log line of step 1;
- training cells / s: steps x batch x ranks over the ``train_seconds`` of the report's
  history (the loop and its loss reduction; the page cache is warm from processing).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.memory import per_process, sample_tree
from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, HIDDEN_SIZE, SPLIT
from harness.synthetic import write_run_config
from harness.tables import format_number, per_rank, print_table
from harness.timing import Stopwatch

GENES, PERTURBED, COMBOS = 2000, 200, 300
TARGET_PROCESSING_MIB = 2000
TARGET_RANK_RISE_MIB = 25  # a rank's peak private memory from the smallest screen to the largest
TIMESTAMP = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO gears_ddp\.training\.recipe: epoch 1 step 1:", re.M
)


def sizes(n_cells: int) -> dict:
    """Generator options for a screen of about ``n_cells`` cells."""
    controls = n_cells // 10
    return {
        "n_genes": GENES,
        "n_perturbed_genes": PERTURBED,
        "n_combos": COMBOS,
        "n_control_cells": controls,
        "cells_per_condition": (n_cells - controls) // (PERTURBED + COMBOS),
        "seed": 0,
    }


# ----------------------------------------------------------------------------- the runs


def make_screen(data_path: Path, n_cells: int) -> tuple[str, float]:
    """Write the raw screen once; returns its name and how long writing took (0 if it existed)."""
    from gears_ddp.datasets import write_synthetic_screen

    name = f"screen_{n_cells}"
    if (data_path / f"{name}.h5ad").exists():
        return name, 0.0
    with Stopwatch() as writing:
        write_synthetic_screen(data_path, name=name, **sizes(n_cells))
    return name, writing.seconds


def process(data_path: Path, name: str) -> dict:
    """Process the raw screen in a child process; its time and peak private memory."""
    done_marker = data_path / name / "perturb_processed.h5ad"
    if done_marker.exists():
        return {"seconds": None, "private": None}
    code = (
        "import sys, anndata; from gears_ddp import PertData; path, name = sys.argv[1:3];"
        "p = PertData(path); p.new_data_process(name, anndata.read_h5ad(f'{path}/{name}.h5ad', backed='r'));"
        f"p.prepare_split(**{SPLIT!r}); p.coexpression_graph(); p.go_graph()"
    )
    with Stopwatch() as processing:
        child = subprocess.Popen([sys.executable, "-c", code, str(data_path), name], stderr=subprocess.PIPE, text=True)
        sampler = sample_tree(child.pid, lambda cmdline: b"new_data_process" in cmdline)
        _, stderr = child.communicate()
        peaks = per_process(sampler.stop())
    if child.returncode:
        raise RuntimeError(f"processing failed:\n{stderr[-3000:]}")
    return {"seconds": processing.seconds, "private": max(peaks["private"])}


def train(data_path: Path, name: str, launcher: str, ranks: int, steps: int, storage: str, run: Path) -> dict:
    """One training run; its figures."""
    args = {
        "epochs": 1,
        "max_steps": steps,
        "batch_size": BATCH_SIZE,
        "test_batch_size": 1024,
        "model_config": {"hidden_size": HIDDEN_SIZE},
        "save_path": str(run),
        "overwrite_save_path": True,  # the run of an earlier benchmark in the kept data folder
        "expression_storage": storage,
    }
    if launcher == "spawn":
        code = (
            "import sys, json; from gears_ddp import train_multi_gpu, enable_console_logging\n"
            "if __name__ == '__main__':\n    enable_console_logging()\n"
            f"    r = train_multi_gpu(sys.argv[1], sys.argv[2], {SPLIT!r}, "
            "json.loads(sys.argv[3]))\n    print(json.dumps(r))"
        )
        command = [sys.executable, "-c", code, str(data_path), name, json.dumps({**args, "cpu_processes": ranks})]

        def is_rank(cmdline: bytes) -> bool:  # one rank trains in the calling process, several in its workers
            return b"spawn_main" in cmdline if ranks > 1 else b"train_multi_gpu" in cmdline
    else:
        config = write_run_config(run.parent / f"{run.name}.yaml", data_path, name, args)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            "-m",
            "gears_ddp.launch",
            "--config",
            str(config),
        ]

        def is_rank(cmdline: bytes) -> bool:
            return b"gears_ddp.launch" in cmdline and b"torch.distributed.run" not in cmdline

    started = datetime.datetime.now()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = sample_tree(child.pid, is_rank)
    stdout, stderr = child.communicate()
    peaks = per_process(sampler.stop())
    if child.returncode:
        raise RuntimeError(f"{launcher} x {ranks} failed:\n{stderr[-3000:]}")
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    first = TIMESTAMP.search(stderr)
    first_step = (
        (datetime.datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S,%f") - started).total_seconds()
        if first
        else float("nan")
    )
    loop = report["history"][0]["train_seconds"]
    return {
        "launcher": launcher,
        "ranks": ranks,
        "storage": storage,
        "first_step_s": first_step,
        "cells_per_s": steps * BATCH_SIZE * ranks / loop,
        **peaks,
        "test_pearson_delta": report["model"]["test_pearson_delta"],
    }


# ----------------------------------------------------------------------------- the tables


def print_tables(processing: dict, runs: dict, args) -> None:
    print(
        f"\nsynthetic screens of {GENES} genes, {PERTURBED} singles and {COMBOS} combos (a tenth of the cells "
        f"controls), simulation split; {args.steps} optimiser steps of batch {BATCH_SIZE} per rank, hidden "
        f"{HIDDEN_SIZE}, then the train / val evaluation and the test scoring; {os.cpu_count()} CPU cores, gloo\n"
    )
    print_table(
        ["cells", "writing the raw screen (s)", "processing (s)", "processing, peak private memory (MiB)"],
        [
            [
                f"{n:,}",
                f"{figures['writing']:.0f}" if figures["writing"] else "- (written before)",
                format_number(figures["seconds"], ".0f"),
                format_number(figures["private"], ".0f"),
            ]
            for n, figures in processing.items()
        ],
    )
    print()
    print_table(
        [
            "cells",
            "launcher",
            "ranks",
            "expression",
            "time to first step (s)",
            "training cells / s",
            "peak private memory per rank (MiB)",
            "map resident per rank (MiB)",
            "of which shared (MiB)",
            "test pearson_delta",
        ],
        [
            [
                f"{n:,}",
                r["launcher"],
                r["ranks"],
                r["storage"],
                f"{r['first_step_s']:.1f}",
                f"{r['cells_per_s']:.0f}",
                per_rank(r["private"]),
                per_rank(r["resident"]),
                per_rank(r["shared"]),
                f"{r['test_pearson_delta']:.4f}",
            ]
            for n, results in runs.items()
            for r in results
        ],
    )
    _verdicts(processing, runs)


def _verdicts(processing: dict, runs: dict) -> None:
    sizes_run = sorted(runs)
    small, large = sizes_run[0], sizes_run[-1]
    print()
    if len(sizes_run) > 1:
        for launcher, ranks in sorted({(r["launcher"], r["ranks"]) for r in runs[large]}):
            pick = [
                [r for r in runs[n] if (r["launcher"], r["ranks"], r["storage"]) == (launcher, ranks, "mapped")]
                for n in (small, large)
            ]
            if all(pick):
                growth = max(pick[1][0]["private"]) / max(pick[0][0]["private"]) - 1
                print(
                    f"private memory per rank, {launcher} x {ranks}, {small:,} -> {large:,} cells: "
                    f"{100 * growth:+.1f}% ({'met' if abs(growth) <= 0.10 else 'NOT met'}: within 10%)"
                )
                rises = [
                    large_peak - small_peak
                    for small_peak, large_peak in zip(pick[0][0]["private"], pick[1][0]["private"])
                ]
                print(
                    f"private memory per rank, {launcher} x {ranks}, {small:,} -> {large:,} cells, each rank's "
                    f"rise: {per_rank(rises, '+.0f')} MiB ({'met' if max(rises) < TARGET_RANK_RISE_MIB else 'NOT met'}"
                    f": under {TARGET_RANK_RISE_MIB} MiB a rank)"
                )
    for r in runs[small]:
        if r["storage"] == "memory":
            mapped = next(
                (
                    m
                    for m in runs[small]
                    if (m["launcher"], m["ranks"], m["storage"]) == (r["launcher"], r["ranks"], "mapped")
                ),
                None,
            )
            if mapped is None:  # that launcher did not run from the map
                continue
            ratio = mapped["cells_per_s"] / r["cells_per_s"]
            print(
                f"throughput, mapped / in memory, {r['launcher']} x {r['ranks']} at {small:,} cells: {ratio:.3f} "
                f"({'met' if ratio >= 0.9 else 'NOT met'}: within 10%)"
            )
    if processing.get(large, {}).get("private") is not None:
        peak = processing[large]["private"]
        print(
            f"processing {large:,} cells: peak private memory {peak:.0f} MiB "
            f"({'met' if peak < TARGET_PROCESSING_MIB else 'NOT met'}: under {TARGET_PROCESSING_MIB} MiB)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--launchers", nargs="+", default=["spawn", "torchrun"], choices=["spawn", "torchrun"])
    parser.add_argument("--data-path", default="./data/bench_scale")
    add_record_argument(parser)
    args = parser.parse_args()
    data_path = Path(args.data_path)
    data_path.mkdir(parents=True, exist_ok=True)
    processing, runs = {}, {}
    for n in sorted(args.cells):
        folder = data_path / str(n)  # the GO annotation of a synthetic screen depends on its size
        folder.mkdir(exist_ok=True)
        name, writing = make_screen(folder, n)
        processing[n] = {"writing": writing, **process(folder, name)}
        print(f"{n:,} cells: written in {writing:.0f} s, processed: {processing[n]}", file=sys.stderr, flush=True)
        runs[n] = []
        storages = ["mapped", "memory"] if n == min(args.cells) else ["mapped"]
        for storage in storages:
            for launcher in args.launchers if storage == "mapped" else ["spawn"]:
                for ranks in args.ranks:
                    run = folder / f"run_{launcher}_{ranks}_{storage}"
                    runs[n].append(train(folder, name, launcher, ranks, args.steps, storage, run))
                    print(f"  {runs[n][-1]}", file=sys.stderr, flush=True)
    with recorded(args.record):
        print_tables(processing, runs, args)


if __name__ == "__main__":
    main()
