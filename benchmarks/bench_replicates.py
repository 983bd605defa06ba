"""Replicate throughput: does training several replicates at once, one per device, cost more
than training them one after another on their own?

    python benchmarks/bench_replicates.py [--replicates 4] [--processes 2] [--epochs 2] [--repeats 2] [--record]
    python benchmarks/bench_replicates.py --gpus 4 [--record]        # on a machine with 4 GPUs

On CPU, side by side in one run, each timed end to end around ``train_replicates`` (the
parent's data loading, the workers' start, training, testing, every replicate's run folder
and the summary), ``--repeats`` times in turn, the fastest of each kept (on a shared
machine, the run least disturbed by other work):

- ``--replicates`` replicates (seeds 1, 2, ...) on ``--processes`` CPU processes, one
  replicate per process at a time: each process gets its share of the cores,
  cores // processes threads, as ``train_replicates`` gives it;
- one replicate on one process with that same share of the cores (``OMP_NUM_THREADS``):
  the reference the target compares with, since a CPU process is one "device" here;
- one replicate on one process with every core, for information: how much one replicate
  gains from more threads (on a small model, far from linearly).

Target: replicates x time(one) / processes x 1.15 at most, i.e. 4 replicates on 2
processes within 1.15 x 2 x the time of one replicate on one process. The replicates share
nothing while they train (each has its own process group), the parent loads the data once
and shares it, so the only losses are the cores' shared caches and memory bandwidth, and
each process's start.

On GPUs (``--gpus N``): one replicate on ``cuda:0`` against N replicates on N GPUs, one
each. Expected: within 1.1 x of one. Each replicate has its own process, GPU and CUDA
context, no collective crosses replicates, and the expression is shared read-only (mapped
or in shared memory), so nothing but the host is shared: its cores, which assemble each
replicate's batches and launch its kernels, and its memory bandwidth; the batches cross the
PCIe links of their own GPUs. With a few cores per GPU, the N replicates run as one does.

The synthetic dataset (defaults: ``make_synthetic_perturb_seq``'s sizes, 7,300 cells x
1,000 genes) is written once to a temporary folder and its split and graphs cached before
any timing; published hyperparameters, hidden size 64, batch 32.
"""

import argparse
import contextlib
import json
import os
import statistics
import tempfile
from pathlib import Path

from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, HIDDEN_SIZE, LR, SPLIT, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, prepared_synthetic, synthetic_options
from harness.tables import print_table
from harness.timing import Stopwatch

from gears_ddp import train_replicates
from gears_ddp.runtime.threads import usable_cores

CPU_TARGET, GPU_TARGET = 1.15, 1.1


@contextlib.contextmanager
def threads_per_process(threads):
    """While active, worker processes started from here use ``threads`` torch threads (None:
    ``train_replicates``' own share of the cores)."""
    previous = os.environ.get("OMP_NUM_THREADS")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous


def timed(data_path: Path, save_path: Path, replicates: int, args: dict, devices: dict, threads=None) -> dict:
    """Wall time of ``train_replicates`` for seeds 1..replicates, and the CPU time of every
    worker it spawned (the parent's own work is left out: the replicates share it); each
    replicate's wall time (its workers' start to their end) and its seconds in its epochs
    (training and the per-epoch evaluation)."""
    options = {
        "epochs": args["epochs"],
        "batch_size": BATCH_SIZE,
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "model_config": {"hidden_size": HIDDEN_SIZE},
        "save_path": str(save_path),
        **devices.get("args", {}),
    }
    with threads_per_process(threads), Stopwatch(cpu_of="children") as watch:
        summary = train_replicates(
            data_path,
            "synthetic",
            SPLIT,
            options,
            {"seeds": list(range(1, replicates + 1))},
            gpu_ids=devices.get("gpu_ids"),
        )
    epochs = []
    for replicate in summary["replicates"]:
        history = json.loads((Path(replicate["folder"]) / "report.json").read_text())["history"]
        epochs.append(sum(record["seconds"] for record in history))
    return {
        "wall": watch.seconds,
        "cpu": watch.cpu_seconds,
        "epoch_seconds": epochs,
        "replicate_seconds": [r["seconds"] for r in summary["replicates"]],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2, help="CPU processes (devices) the replicates share")
    parser.add_argument("--gpus", type=int, default=None, help="N replicates on N GPUs against one on one GPU")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of each run; the fastest is kept")
    add_size_arguments(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepared_synthetic(tmp / "data", args, HIDDEN_SIZE)  # the split and graphs cached before any timing
        settings = {"epochs": args.epochs}
        load = os.getloadavg()
        if args.gpus:
            runs = {
                "1 replicate, 1 GPU": (1, {"gpu_ids": [0]}, None),
                f"{args.gpus} replicates, {args.gpus} GPUs": (args.gpus, {"gpu_ids": list(range(args.gpus))}, None),
            }
            rounds, bound = 1, GPU_TARGET
            target = f"{args.gpus} replicates on {args.gpus} GPUs within {GPU_TARGET} x the time of one on one GPU"
        else:
            cores = usable_cores()
            share = max(1, cores // args.processes)
            runs = {
                f"1 replicate, 1 process, {share} thread(s)": (1, {"args": {"cpu_processes": 1}}, share),
                f"{args.replicates} replicates, {args.processes} processes, {share} thread(s) each": (
                    args.replicates,
                    {"args": {"cpu_processes": args.processes}},
                    None,
                ),
                f"1 replicate, 1 process, {cores} thread(s) (information)": (1, {"args": {"cpu_processes": 1}}, cores),
            }
            rounds, bound = -(-args.replicates // args.processes), CPU_TARGET
            target = (
                f"{args.replicates} replicates on {args.processes} processes within {CPU_TARGET} x {rounds} x "
                "the time of one replicate on one process"
            )
        measured = {name: [] for name in runs}
        for repeat in range(args.repeats):  # interleaved, so that a change in the machine's load hits every run
            for index, (name, (replicates, devices, threads)) in enumerate(runs.items()):
                measured[name].append(
                    timed(tmp / "data", tmp / f"run{repeat}-{index}", replicates, settings, devices, threads)
                )
        load = (load, os.getloadavg())
    best = {name: min(results, key=lambda result: result["wall"]) for name, results in measured.items()}
    one, many = list(best.values())[:2]
    ratio = many["wall"] / (rounds * one["wall"])
    with recorded(args.record):
        print_figures(best, measured, ratio, bound, target, load, args)


def print_figures(best: dict, measured: dict, ratio: float, bound: float, target: str, load, args) -> None:
    sizes = synthetic_options(args)
    print(
        f"synthetic data ({sizes['n_genes']} genes, {sizes['cells_per_condition']} cells per condition), "
        f"split simulation (seed 1); {args.epochs} epochs, batch {BATCH_SIZE}, hidden {HIDDEN_SIZE}; "
        f"timed end to end around train_replicates, side by side in one run, "
        f"{args.repeats} interleaved repeat(s), the fastest kept\n"
    )
    rows = []
    for name, result in best.items():
        rows.append(
            [
                name,
                f"{result['wall']:.1f}",
                ", ".join(f"{r['wall']:.1f}" for r in measured[name]),
                f"{result['cpu'] / len(result['replicate_seconds']):.1f}",
                f"{statistics.mean(result['replicate_seconds']):.1f}",
                f"{statistics.mean(result['epoch_seconds']):.1f}",
            ]
        )
    print_table(
        [
            "run",
            "wall time (s)",
            "every repeat (s)",
            "workers' CPU time per replicate (s)",
            "per replicate: wall (s)",
            "of which epochs (s)",
        ],
        rows,
    )
    print(
        "\nworkers' CPU time: user + system of every worker process, divided by the replicates. Equal CPU time per "
        "replicate means that training several at once adds no work and that they do not slow each other through "
        "the memory (a core stalled on memory still counts as CPU time), whatever else shares the machine."
    )
    print(f"\ntarget: {target}: measured {ratio:.2f} x ({'met' if ratio <= bound else 'NOT met'}, bound {bound})")
    print(
        f"load average (1 min) before and after: {load[0][0]:.2f}, {load[1][0]:.2f} on {usable_cores()} core(s) "
        "(above 0: other work shared the machine, and the times are not reliable)"
    )


if __name__ == "__main__":
    main()
