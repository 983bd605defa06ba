"""The Virtual Cell Challenge's training file at its size (221,273 cells x 18,080 genes of raw
counts): the memory and time of processing it, what its expression map costs on disk and to
read, and the memory of training on it, at several numbers of cells.

    python benchmarks/bench_vcc_memory.py [--cells 55318 221273] [--genes 18080] [--steps 50]
                                          [--work ./data/bench_vcc] [--screen PATH ...]
                                          [--n-top-genes 2000] [--graph-up-to CELLS] [--small] [--record]

For each number of cells (ascending) it:

1. writes a synthetic screen shaped as the challenge's file, ``--work/<cells>/screen.h5ad`` with
   its GO files beside it (``write_synthetic_screen``, ``layout='screen'``: raw counts, 150
   CRISPRi knock-downs, the challenge's share of control cells, 38,176 of 221,273, a median
   depth of 54,000 counts per cell), once, kept for later runs; writing is measured in a child
   process when it happens. ``--screen PATH`` takes a screen as it is instead (GO files beside
   it, perturbations in ``obs['target_gene']``, controls ``non-targeting``);
2. processes it as a user does, ``gears-ddp process --normalize`` (a child process), and again
   with ``--n-top-genes``: peak resident and private memory, wall time;
3. prices the expression map: its bytes on disk in float32 (built by processing), beside the
   same values as CSR; at the smallest size it builds the float16 map (timed, then removed;
   elsewhere its size is computed) and reads the batches of one training epoch (32 cells and
   their control partners a batch, in the loader's order) from the float32 and float16 maps
   and from the CSR form (data, indices and row pointers as ``.npy`` maps, written, timed,
   then removed), each twice, keeping the second pass (page cache warm);
4. prepares the data for training as ``train_multi_gpu``'s parent does (map, split
   ``simulation_single``, seed 1, the GO and co-expression graphs: a child process) and trains
   (``gears-ddp train`` on one CPU process, which reads the prepared data and trains in the
   same process) ``--steps`` optimiser steps of batch 32, then the epoch's evaluation and the
   test: the peak resident and private memory of that process and the pages of the map it
   holds, the seconds per step, and the epoch's time estimated from them.

The co-expression graph (the correlation of every gene pair over the training cells,
``gears_ddp/data/graphs.py``) is built by the preparation at the sizes up to
``--graph-up-to`` (all by default); a larger size reuses the graph cached at the largest of
them (the same knock-downs, so the same training conditions): at the challenge's size it would
take hours on 2 cores. The tables say which. Each processed dataset is removed when its size
is measured (``--keep`` keeps them); the screens are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from harness.machine import load_average
from harness.memory import per_process, sample_tree
from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, HIDDEN_SIZE
from harness.synthetic import write_run_config
from harness.tables import format_number, print_table
from harness.timing import Stopwatch

VCC_CELLS, VCC_GENES, VCC_CONTROLS, VCC_KNOCKDOWNS = 221_273, 18_080, 38_176, 150
SPLIT = {"split": "simulation_single", "seed": 1}  # the VCC workflow's (docs/vcc.md)
NAME = "vcc"
SCREEN_COLUMNS = ["--perturbation-column", "target_gene", "--control-label", "non-targeting"]
MAP_NAMES = {"float32": "perturb_processed.expression.float32", "float16": "perturb_processed.expression.float16"}
MIB = 2**20
HEADER_BYTES = 128  # of a .npy map of two dimensions


def screen_options(n_cells: int, n_genes: int) -> dict:
    """``write_synthetic_screen`` options of a screen shaped as the challenge's, of ``n_cells``."""
    controls = round(VCC_CONTROLS * n_cells / VCC_CELLS)
    return {
        "layout": "screen",
        "n_genes": n_genes,
        "n_modules": 60,
        "n_perturbed_genes": VCC_KNOCKDOWNS,
        "n_combos": 0,
        "cells_per_condition": (n_cells - controls) // VCC_KNOCKDOWNS,
        "n_control_cells": n_cells - (n_cells - controls) // VCC_KNOCKDOWNS * VCC_KNOCKDOWNS,
        "frac_activation": 0.0,
        "shared_response": 1.0,
        "library_size": 54000.0,
        "seed": 1,
    }


def measured(command: list[str], is_counted=lambda cmdline: True, **popen) -> dict:
    """Run ``command``; its wall seconds and the peaks of every process of its tree that
    ``is_counted`` picks (``harness.memory.per_process``: private, rss, resident, shared),
    the command's own process first."""
    with Stopwatch() as watch:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        sampler = sample_tree(child.pid, is_counted)
        stdout, stderr = child.communicate()
        peaks = per_process(sampler.stop())
    if child.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{stderr[-3000:]}")
    return {"seconds": watch.seconds, "stdout": stdout, **peaks}


def python_command(code: str, *arguments: str) -> list[str]:
    return [sys.executable, "-c", code, *arguments]


def gears_ddp_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "gears_ddp", *arguments]


# ----------------------------------------------------------------------------- 1. the screen


def write_screen(folder: Path, n_cells: int, n_genes: int) -> dict | None:
    """The screen's figures of writing, or None when it was written before."""
    if (folder / "screen.h5ad").exists():
        return None
    code = (
        "import sys, json; from gears_ddp.datasets import write_synthetic_screen;"
        "write_synthetic_screen(sys.argv[1], 'screen', **json.loads(sys.argv[2]))"
    )
    return measured(python_command(code, str(folder), json.dumps(screen_options(n_cells, n_genes))))


def screen_shape(path: Path) -> tuple[int, int, int]:
    """Cells, genes and stored values of the screen's counts, read without reading them."""
    import h5py

    with h5py.File(path, "r") as handle:
        n_cells, n_genes = (int(v) for v in handle["X"].attrs["shape"])
        return n_cells, n_genes, int(handle["X/data"].shape[0])


# ----------------------------------------------------------------------------- 2. processing


def process(screen: Path, name: str, *options: str) -> dict:
    """``gears-ddp process --normalize`` of the screen into ``<its folder>/<name>``."""
    return measured(
        gears_ddp_command(
            "process",
            "--adata",
            str(screen),
            "--data-path",
            str(screen.parent),
            "--name",
            name,
            *SCREEN_COLUMNS,
            "--normalize",
            "--overwrite",
            *options,
        )
    )


# ----------------------------------------------------------------------------- 3. the map


def csr_bytes(h5ad: Path) -> tuple[int, int]:
    """Bytes of the processed values as CSR (values, column indices, row pointers) and how many values."""
    import h5py

    with h5py.File(h5ad, "r") as handle:
        parts = [handle["X"][key] for key in ("data", "indices", "indptr")]
        return sum(part.size * part.dtype.itemsize for part in parts), int(parts[0].size)


def build_float16_map(dataset: Path) -> dict:
    """Build the float16 map of the processed dataset (a child process), time it, size it, keep it."""
    code = (
        "import sys; from gears_ddp import PertData;"
        "PertData(sys.argv[1], expression_dtype='float16').load(data_path=sys.argv[2])"
    )
    figures = measured(python_command(code, str(dataset.parent), str(dataset)))
    figures["bytes"] = (dataset / f"{MAP_NAMES['float16']}.npy").stat().st_size
    return figures


def write_csr_map(dataset: Path, folder: Path) -> float:
    """The processed values as CSR ``.npy`` files in ``folder``, copied a block at a time; seconds taken."""
    import h5py

    folder.mkdir(exist_ok=True)
    with Stopwatch() as watch, h5py.File(dataset / "perturb_processed.h5ad", "r") as handle:
        for key in ("data", "indices", "indptr"):
            source = handle["X"][key]
            out = np.lib.format.open_memmap(folder / f"{key}.npy", mode="w+", dtype=source.dtype, shape=source.shape)
            step = 2**26
            for start in range(0, source.shape[0], step):
                out[start : start + step] = source[start : start + step]
            out.flush()
            del out
    return watch.seconds


def epoch_batches(dataset: Path) -> tuple[list[np.ndarray], int]:
    """The rows an epoch reads, batch by batch (its cells and their control partners, in the
    training loader's order), and the number of genes."""
    from gears_ddp import PertData

    pert_data = PertData(dataset.parent)
    pert_data.load(data_path=dataset)
    pert_data.prepare_split(**SPLIT)
    loader = pert_data.get_dataloader(batch_size=BATCH_SIZE)["train_loader"]
    plan_cells = loader.sampler.positions()
    train_cells = loader.dataset.cell_indices[plan_cells]
    partners = loader.dataset.partners
    n_batches = len(train_cells) // BATCH_SIZE
    batches = [
        np.concatenate([partners[cells].numpy(), cells.numpy()])
        for cells in train_cells[: n_batches * BATCH_SIZE].split(BATCH_SIZE)
    ]
    return batches, pert_data.cells.expression.shape[1]


def read_dense(path: Path, batches: list[np.ndarray]) -> float:
    """Seconds to gather every batch's rows of the dense map as float32 (as the loader gathers them)."""
    import torch

    from gears_ddp.data.expression_map import as_tensor, open_map

    values = as_tensor(open_map(path))
    with Stopwatch() as watch:
        for rows in batches:
            values.index_select(0, torch.from_numpy(rows)).float()
    return watch.seconds


def read_csr(folder: Path, batches: list[np.ndarray], n_genes: int) -> float:
    """Seconds to gather every batch's rows of the CSR map into dense float32 rows."""
    data, indices, indptr = (np.load(folder / f"{key}.npy", mmap_mode="r") for key in ("data", "indices", "indptr"))
    with Stopwatch() as watch:
        for rows in batches:
            out = np.zeros((len(rows), n_genes), dtype=np.float32)
            for i, row in enumerate(rows):
                start, stop = indptr[row], indptr[row + 1]
                out[i, indices[start:stop]] = data[start:stop]
    return watch.seconds


def read_speeds(dataset: Path) -> dict:
    """Seconds to read one epoch's batches from the float32 and float16 maps and from CSR
    (second of two passes), the CSR form's writing time, and the number of batches."""
    batches, n_genes = epoch_batches(dataset)
    csr = dataset / "csr_map"
    figures = {"batches": len(batches), "csr_write_s": write_csr_map(dataset, csr)}
    for dtype in ("float32", "float16"):
        path = dataset / f"{MAP_NAMES[dtype]}.npy"
        figures[dtype] = [read_dense(path, batches) for _ in range(2)][-1]
    figures["csr"] = [read_csr(csr, batches, n_genes) for _ in range(2)][-1]
    shutil.rmtree(csr)
    return figures


# ----------------------------------------------------------------------------- 4. training


def graph_files(dataset: Path) -> list[Path]:
    return sorted(dataset.glob("*co_expression_network*"))


def prepare(dataset: Path) -> dict:
    """Prepare the data as ``train_multi_gpu``'s parent does (a child process)."""
    code = (
        "import sys; from gears_ddp.data.preparation import prepare_data;"
        "from gears_ddp.configuration.sections import TrainingArgs;"
        f"options = TrainingArgs.from_dict({{'model_config': {{'hidden_size': {HIDDEN_SIZE}}}}});"
        f"prepare_data(sys.argv[1], sys.argv[2], {SPLIT!r}, options.model_config)"
    )
    return measured(python_command(code, str(dataset.parent), dataset.name))


def train(dataset: Path, steps: int) -> dict:
    """``gears-ddp train`` of ``steps`` steps and the epoch's evaluation, on 1 CPU process (the
    command's own: a run on one device trains where it was started)."""
    run = dataset / "bench_run"
    shutil.rmtree(run, ignore_errors=True)
    args = {
        "epochs": 1,
        "max_steps": steps,
        "batch_size": BATCH_SIZE,
        "test_batch_size": 256,
        "cpu_processes": 1,
        "model_config": {"hidden_size": HIDDEN_SIZE},
        "save_path": str(run),
    }
    config = write_run_config(dataset / "bench_run.yaml", dataset.parent, dataset.name, args, SPLIT)
    figures = measured(
        gears_ddp_command("train", "--config", str(config)),
        lambda cmdline: b"gears_ddp" in cmdline,
    )
    history = json.loads((run / "report.json").read_text(encoding="utf-8"))["history"][0]
    figures.update(step_s=history["train_seconds"] / steps, evaluation_s=history["seconds"] - history["train_seconds"])
    shutil.rmtree(run)
    return figures


def steps_per_epoch(dataset: Path) -> int:
    from gears_ddp import PertData

    pert_data = PertData(dataset.parent)
    pert_data.load(data_path=dataset)
    pert_data.prepare_split(**SPLIT)
    return len(pert_data.get_dataloader(batch_size=BATCH_SIZE)["train_loader"])


# ----------------------------------------------------------------------------- the tables


def mib(value) -> str:
    return format_number(value, ",.0f")


def gib(n_bytes) -> str:
    return format_number(None if n_bytes is None else n_bytes / 2**30, ".2f")


def minutes(seconds) -> str:
    return "-" if seconds is None else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def print_tables(sizes: dict, args) -> None:
    print(
        f"\nSynthetic screens shaped as the Virtual Cell Challenge's training file (raw counts, "
        f"{VCC_KNOCKDOWNS} knock-downs, 54,000 counts per control cell; `write_synthetic_screen`, "
        f"layout 'screen'); {os.cpu_count()} CPU cores shared with other work (1-minute load at the end: "
        f"{load_average()}). Memory in MiB: peak resident (RSS) and peak private (RssAnon) of each process.\n"
    )
    print_table(
        ["cells x genes", "counts as CSR (GiB)", "values not zero", "writing the screen", "peak RSS", "peak private"],
        [
            [
                f"{n:,} x {s['genes']:,}",
                gib(s["counts_bytes"]),
                f"{s['nonzero']:.1%}",
                minutes(s["writing"]["seconds"]) if s["writing"] else "- (written before)",
                mib(s["writing"]["rss"][0]) if s["writing"] else "-",
                mib(s["writing"]["private"][0]) if s["writing"] else "-",
            ]
            for n, s in sizes.items()
        ],
    )
    print("\n`gears-ddp process --normalize` (all genes; then keeping the highly variable ones):\n")
    rows = []
    for n, s in sizes.items():
        for label, figures in (("all genes", s["process"]), (f"--n-top-genes {args.n_top_genes}", s.get("hvg"))):
            if figures:
                rows.append(
                    [
                        f"{n:,}",
                        label,
                        minutes(figures["seconds"]),
                        mib(figures["rss"][0]),
                        mib(figures["private"][0]),
                        f"{figures['rss'][0] * MIB / s['counts_bytes']:.2f}",
                    ]
                )
    print_table(["cells", "genes kept", "wall time", "peak RSS", "peak private", "peak RSS / counts' CSR"], rows)
    print("\nThe expression map on disk (the processed values; float16 built, timed and removed):\n")
    print_table(
        [
            "cells",
            "float32 map (GiB)",
            "float16 map (GiB)",
            "float16 build",
            "float16 build, peak RSS",
            "CSR, float32 values + int32 indices (GiB)",
        ],
        [
            [
                f"{n:,}",
                gib(s["map_bytes"]),
                gib(s["float16"]["bytes"]) + ("" if "seconds" in s["float16"] else " (computed)"),
                minutes(s["float16"].get("seconds")),
                mib(s["float16"]["rss"][0]) if "rss" in s["float16"] else "-",
                gib(s["processed_csr_bytes"]),
            ]
            for n, s in sizes.items()
        ],
    )
    smallest, speeds = next(iter(sizes.items()))
    speeds = speeds["reads"]
    print(
        f"\nReading one epoch's batches at {smallest:,} cells ({speeds['batches']:,} batches of "
        f"{2 * BATCH_SIZE} rows: {BATCH_SIZE} cells and their control partners; second of two passes, page cache "
        f"warm); writing the CSR form took {minutes(speeds['csr_write_s'])}:\n"
    )
    print_table(
        ["stored as", "seconds per epoch", "ms per batch"],
        [
            [label, f"{speeds[key]:.1f}", f"{1000 * speeds[key] / speeds['batches']:.2f}"]
            for key, label in (
                ("float32", "dense float32 map"),
                ("float16", "dense float16 map"),
                ("csr", "CSR (.npy maps), made dense per batch"),
            )
        ],
    )
    print(
        f"\nTraining: preparing (map, split {SPLIT['split']} seed {SPLIT['seed']}, GO and co-expression graphs) in "
        f"a process of its own, then one CPU process reads it and trains {args.steps} steps of batch {BATCH_SIZE} "
        f"(hidden {HIDDEN_SIZE}), then the epoch's evaluation and the test. Map pages: its resident pages of the map, "
        "of which shared.\n"
    )
    print_table(
        [
            "cells",
            "preparing",
            "co-expression graph",
            "preparing, peak RSS",
            "preparing, peak private",
            "training run",
            "training: peak RSS / private",
            "training: map pages / shared",
            "s / step",
            "evaluation",
            "steps / epoch",
            "epoch, estimated",
        ],
        [
            [
                f"{n:,}",
                minutes(s["prepare"]["seconds"]),
                s["graph"],
                mib(s["prepare"]["rss"][0]),
                mib(s["prepare"]["private"][0]),
                minutes(s["train"]["seconds"]),
                f"{mib(max(s['train']['rss']))} / {mib(max(s['train']['private']))}",
                f"{mib(max(s['train']['resident']))} / {mib(max(s['train']['shared']))}",
                f"{s['train']['step_s']:.2f}",
                minutes(s["train"]["evaluation_s"]),
                f"{s['steps_per_epoch']:,}",
                minutes(s["steps_per_epoch"] * s["train"]["step_s"] + s["train"]["evaluation_s"]),
            ]
            for n, s in sizes.items()
        ],
    )
    if len(sizes) > 1:
        (small, a), (large, b) = list(sizes.items())[0], list(sizes.items())[-1]
        print()
        for label, x, y in (
            ("processing, peak RSS", a["process"]["rss"][0], b["process"]["rss"][0]),
            ("training, peak private", max(a["train"]["private"]), max(b["train"]["private"])),
        ):
            print(f"{label}, {small:,} -> {large:,} cells: {mib(x)} -> {mib(y)} MiB ({100 * (y / x - 1):+.1f}%)")
    largest = sizes[max(sizes)]["process"]["rss"][0]
    print(
        f"processing {max(sizes):,} cells: peak RSS {mib(largest)} MiB "
        f"({'met' if largest < 4096 else 'NOT met'}: under 4 GiB)"
    )


# ----------------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, nargs="*", default=[55_318, VCC_CELLS])
    parser.add_argument("--genes", type=int, default=VCC_GENES)
    parser.add_argument("--screen", type=Path, nargs="*", default=[], help="screens to take as they are")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--n-top-genes", type=int, default=2000)
    parser.add_argument(
        "--graph-up-to", type=int, help="build the co-expression graph at sizes up to this (default: all)"
    )
    parser.add_argument("--work", type=Path, default=Path("./data/bench_vcc"))
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep each processed dataset (removed by default: tens of GB at the challenge's size)",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="a quick run: 3,000 and 6,000 cells x 2,000 genes, 20 steps, 500 highly variable genes",
    )
    add_record_argument(parser)
    args = parser.parse_args()
    if args.small:
        args.cells, args.genes, args.steps, args.n_top_genes = [3000, 6000], 2000, 20, 500
    screens = {}
    for n in sorted(args.cells):
        folder = args.work / str(n)
        folder.mkdir(parents=True, exist_ok=True)
        screens[folder / "screen.h5ad"] = write_screen(folder, n, args.genes)
    screens.update({path: None for path in args.screen})
    sizes, graphs, built_at = {}, args.work / "co_expression_graph", None
    for screen, writing in sorted(screens.items(), key=lambda item: screen_shape(item[0])[0]):
        n_cells, n_genes, stored = screen_shape(screen)
        dataset = screen.parent / NAME
        shutil.rmtree(dataset, ignore_errors=True)  # (a processed copy beside the new one would double the disk)
        figures = {
            "genes": n_genes,
            "writing": writing,
            "nonzero": stored / (n_cells * n_genes),
            "counts_bytes": csr_bytes(screen)[0],
        }
        figures["hvg"] = process(screen, f"{NAME}_hvg", "--n-top-genes", str(args.n_top_genes))
        shutil.rmtree(screen.parent / f"{NAME}_hvg")
        figures["process"] = process(screen, NAME)
        figures["map_bytes"] = (dataset / f"{MAP_NAMES['float32']}.npy").stat().st_size
        figures["processed_csr_bytes"] = csr_bytes(dataset / "perturb_processed.h5ad")[0]
        if not sizes:  # the float16 map and the reads at the smallest size; elsewhere its size is computed
            figures["float16"] = build_float16_map(dataset)
            figures["reads"] = read_speeds(dataset)
            for suffix in (".npy", ".json"):
                (dataset / f"{MAP_NAMES['float16']}{suffix}").unlink()
        else:
            figures["float16"] = {"bytes": figures["map_bytes"] - (figures["map_bytes"] - HEADER_BYTES) // 2}
        if built_at is None or args.graph_up_to is None or n_cells <= args.graph_up_to:
            figures["graph"] = "built"
            figures["prepare"] = prepare(dataset)
            shutil.rmtree(graphs, ignore_errors=True)
            graphs.mkdir()
            for path in graph_files(dataset):
                shutil.copy2(path, graphs / path.name)
            built_at = n_cells
        else:
            for path in graph_files(graphs):
                shutil.copy2(path, dataset / path.name)
            figures["graph"] = f"reused from {built_at:,} cells"
            figures["prepare"] = prepare(dataset)
        figures["train"] = train(dataset, args.steps)
        figures["steps_per_epoch"] = steps_per_epoch(dataset)
        sizes[n_cells] = figures
        if not args.keep:
            shutil.rmtree(dataset)
        print(f"{n_cells:,} cells: {time.strftime('%H:%M')} done", file=sys.stderr, flush=True)
    with recorded(args.record):
        print_tables(sizes, args)


if __name__ == "__main__":
    main()
