"""Seconds per epoch of gears_ddp at Norman size (about 90,000 cells x 5,000 genes) on the
device at hand, for a few batch sizes and precisions, with training steps replayed from a
CUDA graph or launched eagerly.

    python benchmarks/bench_epoch.py [--device cuda] [--batch-sizes 32 256] [--amp off bf16]
                                     [--cuda-graphs on off] [--epochs 3]
                                     [--genes 5000 --cells-per-condition 350 ...]
                                     [--json results.json] [--data-only]

The GPU target of the model work is under 5 s per epoch on this data. The dataset is the
built-in synthetic one (``write_synthetic_dataset``, seed 0) at Norman size by default: 100
single-gene and 130 two-gene perturbations of 350 cells each and 10,000 control cells
(90,500 cells), 5,000 genes. It is written once under ``--data-path`` (kept for later runs)
and loaded with ``PertData.load``; ``prepare_split('simulation', seed=1)``; ``--data-only``
writes and loads it once (its expression map and split files too) and stops, for a later
run to reuse. For each batch
size, precision and ``--cuda-graphs`` setting: ``torch.manual_seed(0)``,
``model_initialize(hidden_size=64)`` and ``train(epochs, lr=1e-3, weight_decay=5e-4,
amp=..., cuda_graphs=...)``, as a user runs it. ``--cuda-graphs on`` (the default, as
``train``'s) replays each optimiser step from one CUDA graph, ``off`` launches its operators
one by one; the steps column says what ran (``graph`` once a step was captured, ``eager``
otherwise, ``eager, capture failed`` when capture was tried and failed), read from the log
of ``gears_ddp.training.cuda_graphs``. On a CPU the option changes nothing: every step runs
eagerly.

Per run it prints, over the epochs after the first (the first pays for one-time set-up:
CUDA context, kernel selection, the allocator's first blocks), the mean of:

- loop s: the training loop alone (``train_seconds`` of the ``GEARS.history`` records,
  which end after the epoch's loss is read back, so after the device finished the loop);
- epoch s: the loop plus the per-epoch evaluation of the train and val sets (``seconds`` of
  the ``GEARS.history`` records), the figure the target is about;
- cells/s: training cells per second of loop (train batches x batch size per epoch);

and the first epoch's seconds, the test-set evaluation of the best model (s, after a
``torch.cuda.synchronize``), the peak memory (GPU: ``torch.cuda.max_memory_allocated``
during the run; CPU: the process's max RSS so far, earlier runs included) and the test
``pearson_delta``.
"""

import argparse
import contextlib
import logging
import statistics

import torch
from harness.memory import peak_rss_mib
from harness.models import new_model
from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import LR, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import StreamedTable
from harness.timing import Stopwatch

from gears_ddp import PertData
from gears_ddp.training import cuda_graphs
from gears_ddp.training.engine import evaluate


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


class _Messages(logging.Handler):
    """Keeps the messages of the log records it receives."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def steps_that_ran(outcome: dict):
    """Within, the log of ``gears_ddp.training.cuda_graphs`` is read; on exit
    ``outcome['steps']`` says how the training steps ran: 'graph', 'eager, capture failed'
    or 'eager'."""
    handler, logger = _Messages(), cuda_graphs.logger
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        text = "\n".join(handler.messages)
        outcome["steps"] = (
            "graph"
            if "training steps replay" in text
            else "eager, capture failed"
            if "could not be captured" in text
            else "eager"
        )


def run(pert_data: PertData, device: torch.device, batch_size: int, amp: str, graphs: str, epochs: int) -> dict:
    """Train one model as a user does and return its figures (see the module docstring)."""
    pert_data.get_dataloader(batch_size=batch_size, test_batch_size=max(batch_size, 256))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gears, outcome = new_model(pert_data, device=device), {}
    with steps_that_ran(outcome):
        report = gears.train(epochs=epochs, lr=LR, weight_decay=WEIGHT_DECAY, amp=amp, cuda_graphs=graphs == "on")
    test_loader = pert_data.dataloader["test_loader"]
    with Stopwatch(device) as test_eval:
        evaluate(gears.best_model, test_loader, gears.new_accumulator(), False, device)
    epoch_s = [record["seconds"] for record in gears.history]
    loop_s = [record["train_seconds"] for record in gears.history]
    steady = slice(1, None) if epochs > 1 else slice(None)
    cells_per_epoch = len(pert_data.dataloader["train_loader"]) * batch_size
    return {
        "batch_size": batch_size,
        "amp": amp,
        "cuda_graphs": graphs,
        "steps": outcome["steps"],
        "epochs": epochs,
        "first_epoch_s": epoch_s[0],
        "epoch_s": statistics.fmean(epoch_s[steady]),
        "loop_s": statistics.fmean(loop_s[steady]),
        "cells_per_s": cells_per_epoch / statistics.fmean(loop_s[steady]),
        "cells_per_epoch": cells_per_epoch,
        "test_eval_s": test_eval.seconds,
        "peak_mib": peak_memory_mib(device),
        "test_pearson_delta": report["model"]["test_pearson_delta"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--amp", nargs="+", default=["off", "bf16"], choices=["off", "bf16", "fp16"])
    parser.add_argument(
        "--cuda-graphs",
        nargs="+",
        default=["on"],
        choices=["on", "off"],
        help="train's cuda_graphs: steps replayed from a CUDA graph (on) or eager (off); on a CPU both are eager",
    )
    parser.add_argument("--epochs", type=int, default=3)
    add_size_arguments(
        parser, genes=5000, cells_per_condition=350, perturbed_genes=100, combos=130, control_cells=10000
    )
    parser.add_argument("--data-path", default="./data/bench_epoch")
    parser.add_argument("--data-only", action="store_true", help="write and load the dataset once, and stop")
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.data_only:
        print(f"dataset ready: {load_synthetic(args.data_path, args).adata.shape}")
        return
    device = torch.device(args.device)

    with recorded(args.record):
        measure_epochs(args, device)


def measure_epochs(args, device: torch.device) -> None:
    """Write (once) and load the dataset, then train and print a row per batch size and precision."""
    with Stopwatch() as loading:
        pert_data = load_synthetic(args.data_path, args)
    print(
        f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes, ready in "
        f"{loading.seconds:.0f} s; device {device}"
        + (
            f" ({torch.cuda.get_device_name(device)})"
            if device.type == "cuda"
            else f" ({torch.get_num_threads()} threads; CUDA graphs change nothing on a CPU: every step is eager)"
        ),
        flush=True,
    )

    results = []
    table = StreamedTable(
        [
            "batch",
            "amp",
            "graphs",
            "steps",
            "epoch s",
            "loop s",
            "cells/s",
            "1st epoch s",
            "test eval s",
            "peak MiB",
            "pearson_delta",
        ],
        left=0,
    )
    for batch_size in args.batch_sizes:
        for amp in args.amp:
            for graphs in args.cuda_graphs:
                r = run(pert_data, device, batch_size, amp, graphs, args.epochs)
                results.append(r)
                table.add(
                    [
                        r["batch_size"],
                        r["amp"],
                        r["cuda_graphs"],
                        r["steps"],
                        f"{r['epoch_s']:.2f}",
                        f"{r['loop_s']:.2f}",
                        f"{r['cells_per_s']:.0f}",
                        f"{r['first_epoch_s']:.2f}",
                        f"{r['test_eval_s']:.2f}",
                        f"{r['peak_mib']:.0f}",
                        f"{r['test_pearson_delta']:.4f}",
                    ]
                )
                if args.json:  # after each run: a run cut short keeps the rows before it
                    write_figures(
                        args.json,
                        {
                            "device": str(device),
                            "cells": pert_data.adata.n_obs,
                            "genes": pert_data.adata.n_vars,
                            "results": results,
                        },
                    )


if __name__ == "__main__":
    main()
