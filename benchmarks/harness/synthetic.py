"""The synthetic data of the benchmarks: the size options every script takes (each with its
own default sizes) and the data made from them, written, loaded or prepared the ways the
scripts start from (generator seed 0, the split of ``settings.SPLIT``)."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

from harness.settings import SPLIT

SIZE_OPTIONS = {
    "genes": "n_genes",
    "cells_per_condition": "cells_per_condition",  # argument -> generator option
    "perturbed_genes": "n_perturbed_genes",
    "combos": "n_combos",
    "control_cells": "n_control_cells",
}
GO_FILES = ("gene2go_all.pkl", "essential_all_data_pert_genes.pkl", "go_essential_all")


def add_size_arguments(
    parser: argparse.ArgumentParser,
    genes: int = 1000,
    cells_per_condition: int = 45,
    perturbed_genes: int = 60,
    combos: int = 80,
    control_cells: int = 1000,
) -> None:
    """The synthetic data's options of every benchmark, each with its own default sizes (if
    not given, the generator's defaults: 7,300 cells x 1,000 genes, 60 singles and 80 combos
    of 45 cells, 1,000 controls): ``--preset NAME`` takes every generator setting from that
    preset of ``gears_ddp.datasets.PRESETS`` instead; a size given explicitly wins either way."""
    from gears_ddp.datasets import PRESETS

    defaults = {
        "genes": genes,
        "cells_per_condition": cells_per_condition,
        "perturbed_genes": perturbed_genes,
        "combos": combos,
        "control_cells": control_cells,
    }
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a synthetic preset (default: the generator's defaults at the sizes below)",
    )
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default {default}, or the preset's")
    parser.set_defaults(size_defaults=defaults)


def synthetic_options(args) -> dict:
    """``make_synthetic_perturb_seq`` (or ``write_synthetic_dataset``) keywords of the data
    options (``add_size_arguments``), generator seed 0."""
    from gears_ddp.datasets import preset

    options = (
        preset(args.preset)
        if args.preset
        else {SIZE_OPTIONS[name]: value for name, value in args.size_defaults.items()}
    )
    options.update({key: getattr(args, name) for name, key in SIZE_OPTIONS.items() if getattr(args, name) is not None})
    return {**options, "seed": 0}


def prepared_synthetic(folder: Path, args, hidden_size: int):
    """The synthetic dataset of the size options written to ``folder/synthetic``, loaded and
    prepared as ``train_multi_gpu`` prepares it (split ``SPLIT``, graphs built and cached),
    in shared memory."""
    from gears_ddp.configuration.sections import SplitConfig, TrainingArgs
    from gears_ddp.datasets import write_synthetic_dataset
    from gears_ddp.launching.launchers import shared_data

    write_synthetic_dataset(folder, **synthetic_options(args))
    options = TrainingArgs.from_dict({"model_config": {"hidden_size": hidden_size}})
    return shared_data(folder, "synthetic", SplitConfig.from_dict(SPLIT), options)


def load_dataset(data_path, folder, split_seed: int = SPLIT["seed"], **pert_data_options):
    """The dataset written in ``folder`` (``write_synthetic_dataset``), loaded under
    ``data_path`` with its simulation split of ``split_seed``."""
    from gears_ddp import PertData

    pert_data = PertData(data_path, **pert_data_options)
    pert_data.load(data_path=folder)
    pert_data.prepare_split(SPLIT["split"], seed=split_seed)
    return pert_data


def synthetic_folder(data_path, args) -> Path:
    """The folder of the synthetic dataset of the size options, written once under
    ``data_path`` (one folder per set of options, reused as it is), the GO files beside it."""
    from gears_ddp.datasets import write_synthetic_dataset

    options = synthetic_options(args)
    name = "synthetic_" + "_".join(f"{key}{value}" for key, value in options.items())
    return write_synthetic_dataset(data_path, name=name, **options)


def load_synthetic(data_path, args):
    """The synthetic dataset of the size options (``synthetic_folder``), loaded with the
    split ``SPLIT``."""
    return load_dataset(data_path, synthetic_folder(data_path, args))


def write_raw_input(folder: Path, args, **generator_options) -> Path:
    """The raw AnnData (h5ad) and GO files that both packages start from, and the noise-free
    mean profile of every condition beside them (``read_true_means(folder)``); returns the
    h5ad's path. ``generator_options`` are more ``make_synthetic_perturb_seq`` settings."""
    from gears_ddp.data.graphs import jaccard_edge_list
    from gears_ddp.datasets import make_synthetic_perturb_seq
    from gears_ddp.datasets.synthetic_folder import TRUE_MEANS_FILE

    synthetic = make_synthetic_perturb_seq(**synthetic_options(args), **generator_options)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gene2go_all.pkl", "wb") as f:
        pickle.dump(synthetic.gene2go, f)
    with open(folder / "essential_all_data_pert_genes.pkl", "wb") as f:
        pickle.dump(synthetic.pert_genes, f)
    (folder / "go_essential_all").mkdir(exist_ok=True)
    jaccard_edge_list(synthetic.gene2go, synthetic.pert_genes).to_csv(
        folder / "go_essential_all" / "go_essential_all.csv", index=False
    )
    synthetic.true_means.to_csv(folder / TRUE_MEANS_FILE, compression="gzip")
    raw = folder / "raw.h5ad"
    synthetic.adata.write_h5ad(raw)
    return raw


def write_run_config(path: Path, data_path, dataset_name: str, args: dict, split: dict = SPLIT) -> Path:
    """A configuration file for ``gears-ddp train --config`` (and torchrun or srun running
    it) that trains ``dataset_name`` of ``data_path`` with ``args``, on the split ``split``
    (``SPLIT`` unless given)."""
    import yaml

    config = {"pert_data_path": str(data_path), "dataset_name": dataset_name, "split_config": dict(split), "args": args}
    Path(path).write_text(yaml.safe_dump(config), encoding="utf-8")
    return Path(path)


def work_folder(raw: Path, parent) -> Path:
    """A fresh data folder ``parent/data`` holding links to the GO files beside ``raw``: where
    a package processes ``raw`` (``PertData(folder).new_data_process``) without touching the
    input that the other package reads too."""
    folder = Path(parent) / "data"
    folder.mkdir()
    for name in GO_FILES:
        os.symlink(raw.parent / name, folder / name)
    return folder
