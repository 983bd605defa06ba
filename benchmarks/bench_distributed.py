"""Distributed-training benchmark on CPU: throughput, seconds per epoch, scaling efficiency
and memory per rank of ``gears_ddp``'s DDP training with 1, 2, ... gloo processes.

    python benchmarks/bench_distributed.py [--max-processes 2] [--epochs 2] [--batch-size 32]
                                           [--genes 1000 --cells-per-condition 45 ...]

The synthetic dataset (defaults: ``make_synthetic_perturb_seq``'s sizes, 7,300 cells x
1,000 genes) is written once with ``write_synthetic_dataset`` to a temporary folder and
loaded once, as ``train_multi_gpu`` does (``prepare_data``: split simulation, seed 1, and
the graphs; then ``share_memory_``). The same prepared data then trains with 1, 2, ...,
``--max-processes`` CPU processes in turn (``cpu_processes`` = N; published
hyperparameters, hidden size 64), the same per-process batch size and epochs each time,
so N processes see N times the cells per optimiser step and the same cells per epoch.
The benchmark starts the workers itself with ``launching.supervisor.spawn_workers``, as
``train_multi_gpu`` does, so that each worker can be wrapped (``measured_worker``) to
time its training loop and read its own memory; the library is not modified.

How each figure is measured (``time.perf_counter``):

- training loop (s / epoch): the epoch's optimisation loop over the rank's share of the
  training set (``train_seconds`` of rank 0's history records: batches, forward, loss,
  backward with the gradient all-reduce, optimiser steps, and the reduction of the loss
  over ranks, which waits for the slowest rank), without the per-epoch evaluation;
  reported as the mean over epochs.
- training throughput (training cells / s, all ranks together): cells per epoch x epochs /
  the summed training-loop seconds. Cells per epoch = train batches per rank x batch size
  x N (the distributed sampler and the loader both drop incomplete remainders).
- scaling efficiency = throughput(N) / (N x throughput(1)): 1.0 is perfect linear scaling.
- seconds per epoch incl. evaluation: the ``seconds`` of each record of the report's
  ``history`` (training loop + scheduler step + evaluation of the training and validation
  sets, which ranks split between them and merge), mean over epochs.
- peak RSS per rank: ``VmHWM`` (the kernel's peak resident set) of each worker at its end,
  from ``/proc/self/status``. Not ``getrusage(...).ru_maxrss``: it survives ``exec``, so a
  spawned worker would report its parent's peak if that were higher. RSS counts every page
  the process touched, including those it shares with the others: the shared expression
  data and the library files (one copy per node).
- peak private memory per rank: the maximum of ``RssAnon`` (anonymous resident memory:
  the process's own heap, model, optimiser, batches; not the shared data, not the library
  files) from ``/proc/self/status``, sampled every 10 ms by a thread in each worker; and,
  of it, the part already there when the worker starts (after the imports of torch,
  anndata, ... and unpickling the data handle), i.e. the per-process floor.
- shared data resident per rank: ``RssShmem`` of each worker at its end (the shared-memory
  tensors it reads), and whether the expression tensor it holds is the shared one.
- memory each added rank costs: the rise of the summed peak private memory of all ranks
  from N - 1 to N processes (the shared data and library pages exist once per node
  whatever N is; the parent's memory does not change with N). The target is under 0.3 GB.
- parent: its resident memory (``VmRSS``, and ``RssShmem``, the shared data it holds) after
  preparing the data, before the first spawn; the expression tensor's size
  (cells x genes x 4 bytes) and that of all the shared tensors of the cell table.

On a machine with C cores, N processes share those C cores: each rank runs C // N torch
threads, as ``train_multi_gpu`` gives CPU workers (printed per run; ``--threads-per-rank``
overrides it). With N >= C the scaling efficiency measures the
cost of the distribution (gradient all-reduce, synchronisation, splitting and merging the
evaluation, thread contention), not a speed-up. GPU figures need a GPU
(``examples/train_ddp_example.py`` on a GPU machine).
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from harness.memory import PeakSampler, status_mib
from harness.record import add_record_argument, recorded
from harness.settings import HIDDEN_SIZE, LR, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, prepared_synthetic
from harness.tables import per_rank, print_table

from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.launchers import local_placements
from gears_ddp.launching.rank_training import spawned_rank
from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.launching.worker_messages import RunReport

TARGET_EXTRA_RANK_MIB = 0.3e9 / 2**20  # 0.3 GB
PRIVATE_SAMPLING_S = 0.01


def measured_worker(local_rank: int, out_dir: str, threads: int | None, placements, pert_data, *worker_args) -> None:
    """``spawned_rank`` with its memory read (and, when ``threads`` is given, that many
    torch threads); writes ``out_dir/rank<r>.json``."""
    if threads:
        torch.set_num_threads(threads)
    start_private_mib = status_mib()["RssAnon"]  # imports done, data handle unpickled
    private = PeakSampler(lambda: {"RssAnon": status_mib()["RssAnon"]}, PRIVATE_SAMPLING_S)
    spawned_rank(local_rank, placements, pert_data, *worker_args)
    peak_private_mib = private.stop()["RssAnon"]
    status = status_mib()
    record = {
        "train_batches": len(pert_data.dataloader["train_loader"]),
        "peak_rss_mib": status["VmHWM"],
        "shared_mib": status["RssShmem"],
        "peak_private_mib": peak_private_mib,
        "start_private_mib": start_private_mib,
        "expression_shared": pert_data.cells.expression.is_shared(),
        "threads": torch.get_num_threads(),
    }
    (Path(out_dir) / f"rank{local_rank}.json").write_text(json.dumps(record))


def run(pert_data, n_processes: int, args, tmp: Path) -> dict:
    """Train with ``n_processes`` CPU ranks and return the run's figures (``derived``)."""
    options = TrainingArgs.from_dict(
        {
            "cpu_processes": n_processes,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": LR,
            "weight_decay": WEIGHT_DECAY,
            "model_config": {"hidden_size": HIDDEN_SIZE},
            "save_path": str(tmp / f"run{n_processes}"),
        }
    )
    out_dir = tmp / f"ranks{n_processes}"
    out_dir.mkdir()
    placements = local_placements([torch.device("cpu")] * n_processes, find_free_port())
    worker_args = (str(out_dir), args.threads_per_rank, placements, pert_data, options)
    messages = spawn_workers(measured_worker, worker_args, n_processes)
    report = next(message.report for message in messages if isinstance(message, RunReport))
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(n_processes)]
    return derived(report, ranks, args.batch_size)


def derived(report: dict, ranks: list[dict], batch_size: int) -> dict:
    """The figures of one run (see the module docstring)."""
    n = len(ranks)
    epochs = len(report["history"])
    loops = [h["train_seconds"] for h in report["history"]]
    cells_per_epoch = ranks[0]["train_batches"] * batch_size * n
    return {
        "processes": n,
        "cells_per_epoch": cells_per_epoch,
        "throughput": cells_per_epoch * epochs / sum(loops),
        "loop_s": sum(loops) / epochs,
        "epoch_s": sum(h["seconds"] for h in report["history"]) / epochs,
        "peak_rss_mib": [rank["peak_rss_mib"] for rank in ranks],
        "peak_private_mib": [rank["peak_private_mib"] for rank in ranks],
        "start_private_mib": [rank["start_private_mib"] for rank in ranks],
        "shared_mib": [rank["shared_mib"] for rank in ranks],
        "all_shared": all(rank["expression_shared"] for rank in ranks),
        "threads": ranks[0]["threads"],
        "test_mse_de": report["model"]["test_mse_de"],
    }


def print_figures(runs: list[dict], parent: dict, args) -> None:
    base = runs[0]["throughput"]
    print(
        f"\n{parent['cells']} cells x {parent['genes']} genes (synthetic), split simulation (seed 1), "
        f"{runs[0]['cells_per_epoch']} training cells per epoch; batch {args.batch_size} per process, "
        f"{args.epochs} epochs, hidden_size {HIDDEN_SIZE}; CPU, {os.cpu_count()} cores, gloo\n"
    )

    rows = [
        ("torch threads per rank", lambda r: str(r["threads"])),
        ("training throughput (train cells / s, all ranks)", lambda r: f"{r['throughput']:.4g}"),
        (
            "scaling efficiency, throughput(N) / (N x throughput(1))",
            lambda r: f"{r['throughput'] / (r['processes'] * base):.2f}",
        ),
        ("training loop (s / epoch)", lambda r: f"{r['loop_s']:.4g}"),
        ("seconds per epoch incl. train+val evaluation", lambda r: f"{r['epoch_s']:.4g}"),
        ("peak RSS per rank, VmHWM (MiB; rank 0 / 1 / ...)", lambda r: per_rank(r["peak_rss_mib"])),
        ("peak private memory per rank, RssAnon (MiB)", lambda r: per_rank(r["peak_private_mib"])),
        ("  of which at worker start, after imports (MiB)", lambda r: per_rank(r["start_private_mib"])),
        ("shared data resident per rank, RssShmem (MiB)", lambda r: per_rank(r["shared_mib"])),
        ("every rank reads the parent's shared expression", lambda r: "yes" if r["all_shared"] else "NO"),
        (
            "memory the added rank costs, rise of summed private (MiB)",
            lambda r: f"{r['extra_mib']:.0f}" if r["processes"] > 1 else "-",
        ),
        ("test mse_de of the best model", lambda r: f"{r['test_mse_de']:.4f}"),
    ]
    print_table(
        ["measure", *(f"{r['processes']} process{'es' if r['processes'] > 1 else ''}" for r in runs)],
        [[label, *(value(r) for r in runs)] for label, value in rows],
    )
    print(
        f"\nparent process after preparing the data: RSS {parent['rss_mib']:.0f} MiB, of which shared memory "
        f"(RssShmem) {parent['shared_mib']:.0f} MiB; expression tensor {parent['expression_mib']:.1f} MiB "
        f"(float32), all shared tensors of the cell table {parent['table_mib']:.1f} MiB"
    )
    if len(runs) > 1:
        worst = max(runs[1:], key=lambda r: r["extra_mib"])
        verdict = "met" if worst["extra_mib"] < TARGET_EXTRA_RANK_MIB else "NOT met"
        print(
            f"target: each extra rank on a node adds < 0.3 GB ({TARGET_EXTRA_RANK_MIB:.0f} MiB): {verdict}; "
            f"largest rise {worst['extra_mib']:.0f} MiB (at {worst['processes']} processes), of which "
            f"{worst['extra_start_mib']:.0f} MiB is the new process's private memory at start (imports) and "
            f"{worst['extra_mib'] - worst['extra_start_mib']:.0f} MiB its training. The data are shared, not "
            f"copied: {'every' if all(r['all_shared'] for r in runs) else 'NOT every'} rank's expression tensor "
            "is the parent's shared one."
        )
        print(
            f"\nnote: on {os.cpu_count()} cores, {runs[-1]['processes']} processes compete for the same cores, "
            "so the scaling efficiency measures the overhead of distribution (gradient all-reduce, "
            "synchronisation, split evaluation, thread contention), not a speed-up."
        )
    print(
        "Peak RSS counts shared pages (data, library files) in every rank; private memory does not. "
        "GPU figures need a GPU."
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument(
        "--threads-per-rank",
        type=int,
        default=None,
        help="torch threads in each worker (default: torch's default, as in train_multi_gpu)",
    )
    add_size_arguments(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pert_data = prepared_synthetic(tmp / "data", args, HIDDEN_SIZE)
        status = status_mib()
        expression = pert_data.cells.expression
        parent = {
            "rss_mib": status["VmRSS"],
            "shared_mib": status["RssShmem"],
            "expression_mib": expression.element_size() * expression.numel() / 2**20,
            "table_mib": pert_data.cells.nbytes() / 2**20,
            "cells": expression.shape[0],
            "genes": expression.shape[1],
        }
        runs = [run(pert_data, n, args, tmp) for n in range(1, args.max_processes + 1)]
    for fewer, more in zip(runs, runs[1:]):  # memory the added rank costs, and its per-process floor
        more["extra_mib"] = sum(more["peak_private_mib"]) - sum(fewer["peak_private_mib"])
        more["extra_start_mib"] = sum(more["start_private_mib"]) - sum(fewer["start_private_mib"])
    with recorded(args.record):
        print_figures(runs, parent, args)


if __name__ == "__main__":
    main()
