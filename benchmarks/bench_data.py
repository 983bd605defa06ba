"""Data-layer benchmark: raw AnnData -> ready loaders, one pass over the training loader,
peak memory and in-memory dataset size, for gears_ddp and (when installed) the published
GEARS, side by side on the same file and split.

    python benchmarks/bench_data.py [--genes 2000 --cells-per-condition 100 ...] [--repeats 9]

Each implementation runs in its own subprocess so that peak memory (max RSS) is its own.
The published package's import seeds torch and prints freely; its output is discarded.
The children take torch's threads from the environment (``OMP_NUM_THREADS=1`` for one).

gears_ddp's pass is every batch as training gets it (the epoch's plan laid out, each
batch's rows gathered, its perturbation sets included). Its floor, measured in the same
process and alternating with the pass (medians of ``--repeats`` each), is a bare
``index_select`` of the same rows per batch: the memory copy any loader that materialises
batches makes. The pass / floor ratio is what the data layer adds to that copy.
"""

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

from harness.child import run_in_child
from harness.machine import load_average
from harness.memory import peak_rss_mib
from harness.published import reference_available
from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, SPLIT
from harness.synthetic import add_size_arguments, work_folder, write_raw_input
from harness.tables import print_table
from harness.timing import Stopwatch, alternating_medians, median_seconds


def _ready_loaders(pert_data_class, raw: Path, folder: Path):
    """(pert_data, seconds): either package's ``PertData`` from ``raw`` to loaders of batch
    ``BATCH_SIZE``, split ``SPLIT``, processed in ``folder``."""
    import anndata

    with Stopwatch() as watch:
        pert_data = pert_data_class(str(folder))
        pert_data.new_data_process("bench", anndata.read_h5ad(raw))
        pert_data.prepare_split(**SPLIT)
        pert_data.get_dataloader(BATCH_SIZE)
    return pert_data, watch.seconds


def _sizes(pert_data) -> dict:
    n_cells, n_genes = pert_data.adata.shape
    return {"x_float32_mib": n_cells * n_genes * 4 / 2**20, "cells": n_cells, "genes": n_genes}


def run_ours(raw: Path, folder: Path, repeats: int) -> dict:
    from gears_ddp import PertData

    pert_data, ready = _ready_loaders(PertData, raw, folder)
    return {
        "ready_s": ready,
        **_pass_and_floor(pert_data.dataloader["train_loader"], repeats),
        "peak_rss_mib": peak_rss_mib(),
        "dataset_mib": pert_data.cells.nbytes() / 2**20,
        **_sizes(pert_data),
    }


def run_reference(raw: Path, folder: Path) -> dict:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from gears import PertData

        pert_data, ready = _ready_loaders(PertData, raw, folder)
        timing = _time_pass(pert_data.dataloader["train_loader"])
    tensors = [t for graphs in pert_data.dataset_processed.values() for g in graphs for t in (g.x, g.y)]
    return {
        "ready_s": ready,
        **timing,
        "peak_rss_mib": peak_rss_mib(),
        "dataset_mib": sum(t.element_size() * t.numel() for t in tensors) / 2**20,
        **_sizes(pert_data),
    }


def _time_pass(loader, repeats: int = 3) -> dict:
    """Median seconds of ``repeats`` full passes (gather + collate) over ``loader``."""
    seconds, n_batches = median_seconds(lambda: sum(1 for _ in loader), repeats)
    return {"train_pass_s": seconds, "train_batches": n_batches}


def _pass_and_floor(loader, repeats: int) -> dict:
    """Median seconds of full passes over ``loader`` and of its floor, only copying the
    pass's input and target rows (one ``index_select`` per batch, of the rows laid out
    beforehand), ``repeats`` of each, alternating; with freed memory retained, as the
    training loop on a CPU runs its loader (``retained_host_memory``)."""
    import torch

    from gears_ddp.runtime.host_memory import retained_host_memory

    dataset = loader.dataset
    cells = dataset.cell_indices[loader.sampler.positions()]
    rows = [torch.cat((dataset.partners[c], c)) for c in cells.split(BATCH_SIZE)][: len(loader)]
    expression = dataset.table.expression

    def copy_rows():
        for r in rows:
            expression.index_select(0, r)

    with retained_host_memory():
        seconds = alternating_medians({"pass": lambda: sum(1 for _ in loader), "floor": copy_rows}, repeats)
    return {
        "train_pass_s": seconds["pass"],
        "train_batches": len(rows),
        "copy_floor_s": seconds["floor"],
        "threads": torch.get_num_threads(),
    }


def measured_run(impl: str, raw: str, repeats: int) -> dict:
    """In a child process of its own (``run_in_child``): one package's data layer (``impl``:
    'ours' or 'reference') on ``raw``; its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        if impl == "ours":
            return run_ours(Path(raw), work_folder(Path(raw), tmp), repeats)
        return run_reference(Path(raw), work_folder(Path(raw), tmp))


def print_figures(ours: dict, reference: dict | None) -> None:
    rows = [
        ("raw AnnData -> ready loaders (s)", lambda r: r["ready_s"]),
        ("one pass over the train loader (s, median)", lambda r: r["train_pass_s"]),
        ("peak memory, max RSS (MiB)", lambda r: r["peak_rss_mib"]),
        ("in-memory dataset (MiB)", lambda r: r["dataset_mib"]),
        ("in-memory dataset / one float32 copy of X", lambda r: r["dataset_mib"] / r["x_float32_mib"]),
    ]
    print(
        f"\n{ours['cells']} cells x {ours['genes']} genes, batch {BATCH_SIZE}, {ours['train_batches']} train "
        f"batches; float32 X = {ours['x_float32_mib']:.0f} MiB; {os.cpu_count()} CPU cores\n"
    )
    table = []
    for label, value in rows:
        mine, theirs = value(ours), value(reference) if reference else None
        table.append(
            [
                label,
                f"{mine:.4g}",
                f"{theirs:.4g}" if theirs is not None else "not installed",
                f"{theirs / mine:.1f}x" if theirs is not None else "-",
            ]
        )
    print_table(["measure", "gears_ddp", "published GEARS", "ratio"], table)
    print(
        f"\nratio = published / gears_ddp (higher is better for gears_ddp).\n\n"
        f"gears_ddp's train pass against its floor (a bare index_select of the same rows per batch), "
        f"alternating in one process, medians: {ours['train_pass_s']:.4g} s / {ours['copy_floor_s']:.4g} s = "
        f"{ours['train_pass_s'] / ours['copy_floor_s']:.2f}x; {ours['threads']} torch threads, load average "
        f"{load_average()}."
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_arguments(parser, genes=2000, cells_per_condition=100, perturbed_genes=120, combos=60, control_cells=3000)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--repeats", type=int, default=9, help="passes and floors timed, alternating (default 9)")
    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = write_raw_input(Path(tmp) / "input", args)
        ours = run_in_child(__file__, "measured_run", "ours", str(raw), args.repeats, label="ours")
        reference = (
            None
            if args.skip_reference or not reference_available()
            else run_in_child(__file__, "measured_run", "reference", str(raw), args.repeats, label="reference")
        )
    if ours is None:
        sys.exit(1)
    with recorded(args.record):
        print_figures(ours, reference)


if __name__ == "__main__":
    main()
