"""Data-layer benchmark: raw AnnData -> ready loaders, one pass over the training loader,
peak memory and in-memory dataset size, for gears_ddp and (when installed) the published
GEARS, side by side on the same file and split.

    python benchmarks/bench_data.py [--genes 2000 --cells-per-condition 100 ...]

Each implementation runs in its own subprocess so that peak memory (max RSS) is its own.
The published package's import seeds torch and prints freely; its output is discarded.
"""
import argparse
import contextlib
import io
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import add_record_argument, recorded

BATCH_SIZE = 32
SPLIT = {"split": "simulation", "seed": 1}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SIZE_OPTIONS = {"genes": "n_genes", "cells_per_condition": "cells_per_condition",  # argument -> generator option
                "perturbed_genes": "n_perturbed_genes", "combos": "n_combos", "control_cells": "n_control_cells"}


def add_size_arguments(parser: argparse.ArgumentParser, genes: int, cells_per_condition: int,
                       perturbed_genes: int, combos: int, control_cells: int) -> None:
    """The synthetic data's options of every benchmark (each with its own default sizes):
    ``--preset NAME`` takes every generator setting from that preset of
    ``gears_ddp.datasets.PRESETS`` instead; a size given explicitly wins either way."""
    from gears_ddp.datasets import PRESETS

    defaults = {"genes": genes, "cells_per_condition": cells_per_condition, "perturbed_genes": perturbed_genes,
                "combos": combos, "control_cells": control_cells}
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="a synthetic preset (default: the generator's defaults at the sizes below)")
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default {default}, or the preset's")
    parser.set_defaults(size_defaults=defaults)


def synthetic_options(args) -> dict:
    """``make_synthetic_perturb_seq`` (or ``write_synthetic_dataset``) keywords of the data
    options (``add_size_arguments``), generator seed 0."""
    from gears_ddp.datasets import preset

    options = preset(args.preset) if args.preset else {SIZE_OPTIONS[name]: value
                                                       for name, value in args.size_defaults.items()}
    options.update({key: getattr(args, name) for name, key in SIZE_OPTIONS.items() if getattr(args, name) is not None})
    return {**options, "seed": 0}


def prepared_synthetic(folder: Path, args, hidden_size: int):
    """The synthetic dataset of the size options written to ``folder/synthetic``, loaded and
    prepared as ``train_multi_gpu`` prepares it (split ``SPLIT``, graphs built and cached),
    in shared memory."""
    from gears_ddp.datasets import write_synthetic_dataset
    from gears_ddp.distributed.config import SplitConfig, TrainingArgs
    from gears_ddp.distributed.spawn import prepare_data

    write_synthetic_dataset(folder, **synthetic_options(args))
    options = TrainingArgs.from_dict({"model_config": {"hidden_size": hidden_size}})
    return prepare_data(folder, "synthetic", SplitConfig.from_dict(SPLIT), options).share_memory_()


def load_synthetic(data_path, args):
    """The synthetic dataset of the size options, written once under ``data_path`` (one
    folder per set of options, reused as it is) and loaded with its simulation split (seed 1)."""
    from gears_ddp import PertData
    from gears_ddp.datasets import write_synthetic_dataset

    options = synthetic_options(args)
    name = "synthetic_" + "_".join(f"{key}{value}" for key, value in options.items())
    folder = write_synthetic_dataset(data_path, name=name, **options)
    pert_data = PertData(data_path)
    pert_data.load(data_path=folder)
    pert_data.prepare_split(split="simulation", seed=1)
    return pert_data


def make_input(folder: Path, args) -> Path:
    """The raw AnnData (h5ad) and GO files both implementations start from, and the
    noise-free mean profile of every condition beside them (``read_true_means(folder)``)."""
    from gears_ddp.data.graphs import jaccard_edge_list
    from gears_ddp.datasets import make_synthetic_perturb_seq
    from gears_ddp.datasets.folder import TRUE_MEANS_FILE

    synthetic = make_synthetic_perturb_seq(**synthetic_options(args))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gene2go_all.pkl", "wb") as f:
        pickle.dump(synthetic.gene2go, f)
    with open(folder / "essential_all_data_pert_genes.pkl", "wb") as f:
        pickle.dump(synthetic.pert_genes, f)
    (folder / "go_essential_all").mkdir(exist_ok=True)
    jaccard_edge_list(synthetic.gene2go, synthetic.pert_genes).to_csv(
        folder / "go_essential_all" / "go_essential_all.csv", index=False)
    synthetic.true_means.to_csv(folder / TRUE_MEANS_FILE, compression="gzip")
    raw = folder / "raw.h5ad"
    synthetic.adata.write_h5ad(raw)
    return raw


def run_ours(raw: Path, workdir: Path) -> dict:
    import anndata

    from gears_ddp import PertData

    start = time.perf_counter()
    pert_data = PertData(workdir)
    pert_data.new_data_process("bench", anndata.read_h5ad(raw))
    pert_data.prepare_split(**SPLIT)
    loaders = pert_data.get_dataloader(BATCH_SIZE)
    ready = time.perf_counter() - start
    n_cells, n_genes = pert_data.adata.shape
    return {"ready_s": ready, **_time_pass(loaders["train_loader"]), "copy_floor_s": _copy_floor(loaders),
            "peak_rss_mib": peak_rss_mib(),
            "dataset_mib": pert_data.cells.nbytes() / 2**20, "x_float32_mib": n_cells * n_genes * 4 / 2**20,
            "cells": n_cells, "genes": n_genes}


def run_reference(raw: Path, workdir: Path) -> dict:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import anndata
        from gears import PertData

        start = time.perf_counter()
        pert_data = PertData(str(workdir))
        pert_data.new_data_process("bench", anndata.read_h5ad(raw))
        pert_data.prepare_split(**SPLIT)
        pert_data.get_dataloader(BATCH_SIZE)
        ready = time.perf_counter() - start
        timing = _time_pass(pert_data.dataloader["train_loader"])
    tensors = [t for graphs in pert_data.dataset_processed.values() for g in graphs for t in (g.x, g.y)]
    n_cells, n_genes = pert_data.adata.shape
    return {"ready_s": ready, **timing, "peak_rss_mib": peak_rss_mib(),
            "dataset_mib": sum(t.element_size() * t.numel() for t in tensors) / 2**20,
            "x_float32_mib": n_cells * n_genes * 4 / 2**20, "cells": n_cells, "genes": n_genes}


def _time_pass(loader, repeats: int = 3) -> dict:
    """Median seconds of ``repeats`` full passes (gather + collate) over ``loader``."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        n_batches = sum(1 for _ in loader)
        seconds.append(time.perf_counter() - start)
    return {"train_pass_s": statistics.median(seconds), "train_batches": n_batches}


def _copy_floor(loaders) -> float:
    """Median seconds to only copy the pass's input and target rows (one ``index_select`` per
    batch, nothing else): the memory-bandwidth floor of any loader that materialises batches."""
    import torch

    loader = loaders["train_loader"]
    dataset = loader.dataset
    cells = dataset.cell_indices[torch.as_tensor(list(loader.sampler))]
    rows = [torch.cat((dataset.partners[c], c)) for c in cells.split(BATCH_SIZE)][:len(loader)]
    expression = dataset.table.expression
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for r in rows:
            expression.index_select(0, r)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def child(impl: str, raw: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "data"
        workdir.mkdir()
        for name in ("gene2go_all.pkl", "essential_all_data_pert_genes.pkl"):
            os.symlink(Path(raw).parent / name, workdir / name)
        os.symlink(Path(raw).parent / "go_essential_all", workdir / "go_essential_all")
        result = (run_ours if impl == "ours" else run_reference)(Path(raw), workdir)
    print("RESULT " + json.dumps(result))


def measure(impl: str, raw: Path) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--child", impl, "--raw", str(raw)],
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"{impl} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT "):])


def reference_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import gears"], capture_output=True)
    return probe.returncode == 0


def print_table(ours: dict, reference: dict | None) -> None:
    rows = [("raw AnnData -> ready loaders (s)", lambda r: r["ready_s"]),
            ("one pass over the train loader (s, median of 3)", lambda r: r["train_pass_s"]),
            ("peak memory, max RSS (MiB)", lambda r: r["peak_rss_mib"]),
            ("in-memory dataset (MiB)", lambda r: r["dataset_mib"]),
            ("in-memory dataset / one float32 copy of X", lambda r: r["dataset_mib"] / r["x_float32_mib"])]
    print(f"\n{ours['cells']} cells x {ours['genes']} genes, batch {BATCH_SIZE}, {ours['train_batches']} train "
          f"batches; float32 X = {ours['x_float32_mib']:.0f} MiB; {os.cpu_count()} CPU cores\n")
    print(f"| {'measure':48} | {'gears_ddp':>10} | {'published GEARS':>15} | {'ratio':>7} |")
    print(f"|{'-' * 50}|{'-' * 12}|{'-' * 17}|{'-' * 9}|")
    for label, value in rows:
        mine, theirs = value(ours), value(reference) if reference else None
        ratio = f"{theirs / mine:.1f}x" if theirs is not None else "-"
        theirs_text = f"{theirs:.4g}" if theirs is not None else "not installed"
        print(f"| {label:48} | {mine:10.4g} | {theirs_text:>15} | {ratio:>7} |")
    print(f"\nratio = published / gears_ddp (higher is better for gears_ddp). Memory-copy floor of the "
          f"train pass (a bare index_select of its rows): {ours['copy_floor_s']:.4g} s.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_arguments(parser, genes=2000, cells_per_condition=100, perturbed_genes=120, combos=60,
                       control_cells=3000)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--child", choices=["ours", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.raw)
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = make_input(Path(tmp) / "input", args)
        ours = measure("ours", raw)
        reference = None if args.skip_reference or not reference_available() else measure("reference", raw)
    if ours is None:
        sys.exit(1)
    with recorded(args.record):
        print_table(ours, reference)


if __name__ == "__main__":
    main()
