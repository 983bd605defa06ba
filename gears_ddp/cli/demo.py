"""``gears-ddp demo``: the main job on a screen that ships with gears_ddp (the real one, or
synthetic data calibrated to the Norman screen), trained with DDP, then the summary and
what was measured on that data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gears_ddp.cli.shared_options import add_set
from gears_ddp.cli.train import run_training
from gears_ddp.configuration.run_options import DEVICE_SETTINGS, RunOptions, run_options_with_overrides

NAME = "demo"
DEMO_PRESET, DEMO_SYNTHETIC_NAME = "norman", "synthetic"
DEMO_DATA_PATHS = {"real": "./data/demo", "synthetic": "./data/demo-synthetic"}
# each data's own run folder, as its own data folder: one demo never refuses to run beside the other
DEMO_RUN_PATHS = {"real": "./runs/demo", "synthetic": "./runs/demo-synthetic"}
DEMO_DATA = {
    "real": "the real screen of Papalexi et al. (Nature Genetics 2021): CRISPR knockouts in THP-1 cells, single "
    "genes only, its raw counts packaged with gears_ddp (gears_ddp.datasets.papalexi2021)",
    "synthetic": "synthetic data calibrated to the Norman screen, with two-gene combinations "
    "(gears_ddp.datasets.write_synthetic_dataset, preset 'norman')",
}
DEMO_FINDINGS = {
    "real": (
        "Measured over 3 seeds (replicates of split and model seeds 1-3: 14 test knockouts; benchmarks/"
        "RESULTS.md): GEARS loses to the mean-effect baseline on pearson_delta and mse (their 95% intervals lie "
        "below 0), and shows no clear difference from predicting no change on mse_de (better on 8 of 14 "
        "knockouts, but the interval holds 0) nor from the linear baseline on any metric. Why, measured beside "
        "the published GEARS: the test knockouts' GO neighbours are genes no training knockout reads; with a GO "
        "graph of the screen's own genes (--set args.default_pert_graph=false) GEARS scores higher, as the "
        "published GEARS does on a graph of the knockouts alone (docs/demo.md)."
    ),
    "synthetic": (
        "Measured over 3 seeds (replicates of split and model seeds 1-3: 86 test perturbations; "
        "benchmarks/RESULTS.md): on this Norman-calibrated data GEARS beats predicting no change on mse_de "
        "but loses to it on mse, and loses to the mean-effect baseline on pearson_delta (95% intervals); "
        "the published GEARS scored alike on the same data, also when trained with a Norman run's learning "
        "budget."
    ),
}


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="train on a built-in screen (no download) and write a run report",
        description="Train GEARS with DDP on a screen that ships with gears_ddp: by default "
        "the real one (Papalexi et al. 2021, CRISPR knockouts), processed from "
        "its raw counts as gears-ddp process does; --data synthetic for the "
        "synthetic data calibrated to the Norman screen, which has two-gene "
        "combinations.",
    )
    parser.add_argument(
        "--data",
        choices=list(DEMO_DATA),
        default="real",
        help="; ".join(f"{name}: {meaning}" for name, meaning in DEMO_DATA.items()),
    )
    parser.add_argument(
        "--data-path",
        help=f"where the dataset is written (default: {_per_data(DEMO_DATA_PATHS)})",
    )
    parser.add_argument("--save-path", help=f"the run folder (default: {_per_data(DEMO_RUN_PATHS)})")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cpu-processes", type=int, default=2, help="CPU processes when no GPU is visible")
    add_set(parser)
    return parser


def _per_data(paths: dict[str, str]) -> str:
    """Each data's default folder of ``paths``, as the options' help lists them."""
    return ", ".join(f"{path} for {name}" for name, path in paths.items())


def run(options) -> int:
    """The main job: a built-in screen, 2 CPU processes (or every GPU), a run report, and
    whether the model learned. Its configuration is checked before the data is written."""
    from gears_ddp.datasets import preset, write_papalexi2021_dataset, write_synthetic_dataset
    from gears_ddp.datasets.real_screen import NAME as REAL_SCREEN_NAME
    from gears_ddp.runtime.devices import cuda_or_cpu

    data_path = options.data_path or DEMO_DATA_PATHS[options.data]
    args = {"epochs": options.epochs, "save_path": options.save_path or DEMO_RUN_PATHS[options.data]}
    if cuda_or_cpu().type == "cpu":
        args["cpu_processes"] = options.cpu_processes
    config = {
        "pert_data_path": data_path,
        "dataset_name": REAL_SCREEN_NAME if options.data == "real" else DEMO_SYNTHETIC_NAME,
        "split_config": {"split": "simulation", "seed": 1},
        "args": args,
    }
    run = run_options_with_overrides(config, options.overrides, "its options")
    run = replacing_earlier_demo(run)
    if options.data == "real":
        folder = write_papalexi2021_dataset(data_path)
    else:
        folder = write_synthetic_dataset(data_path, name=DEMO_SYNTHETIC_NAME, **preset(DEMO_PRESET))
    print(f"Data: {DEMO_DATA[options.data]}, in {folder}.")
    return run_training(run, note=DEMO_FINDINGS[options.data])


# what may differ between two demo runs of one folder: the demo's own options and where it trains
DEMO_VARIABLES = {("args", "epochs"), *(tuple(setting.split(".")) for setting in DEVICE_SETTINGS)}


def replacing_earlier_demo(run: RunOptions) -> RunOptions:
    """``run`` set to replace an earlier demo run in its save_path (a demo always runs; the
    log says so when the run takes the folder). An earlier demo run is one whose
    ``config.yaml`` is this demo's configuration but for ``DEMO_VARIABLES`` (settings this
    version has and that folder's predates are not compared). A folder that holds any other
    run (another model, other options, checkpoints of a run trained with ``gears-ddp
    train``) is kept, and the demo refused there as any run is."""
    import yaml

    from gears_ddp.report.run_files import read_settings

    args = run.args
    if (
        args.save_path is None
        or args.resume_from is not None
        or args.overwrite_save_path
        or not Path(args.save_path).is_dir()
    ):
        return run
    try:
        held = read_settings(args.save_path)
    except (OSError, yaml.YAMLError):  # an unreadable config.yaml: not a demo's
        return run
    if not isinstance(held, dict) or "replicates" in held or not _same_settings(held, run.config()):
        return run
    return dataclasses.replace(run, args=dataclasses.replace(args, overwrite_save_path=True))


def _same_settings(held: dict, ours: dict, where: tuple = ()) -> bool:
    """Whether every setting of ``held`` (nested) equals ``ours``'s, ``DEMO_VARIABLES`` and
    settings ``ours`` lacks aside."""
    for key, value in held.items():
        place = (*where, key)
        if place in DEMO_VARIABLES or key not in ours:
            continue
        if isinstance(value, dict) and isinstance(ours[key], dict):
            if not _same_settings(value, ours[key], place):
                return False
        elif value != ours[key]:
            return False
    return True
