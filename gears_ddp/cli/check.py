"""``gears-ddp check``: a screen (``--adata``) read as ``gears-ddp process`` would, or a
processed dataset as ``gears-ddp train`` would, and nothing processed: what it holds that
matters to processing and training it, and every problem at once, each with its fix."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from gears_ddp.cli.exit_status import EXIT_BAD_INPUT
from gears_ddp.cli.screen_input import SCREEN_HELP, add_screen_reading_options, go_annotation, screen_reading_options
from gears_ddp.cli.shared_options import add_set
from gears_ddp.configuration.run_options import read_run_config, resolve_with_overrides
from gears_ddp.data.splits import SPLIT_TYPES

NAME = "check"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="check a screen whole before it is processed: every problem, each with its fix",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Read a screen as gears-ddp process would (--adata, with process's options), or a processed dataset as "
            "gears-ddp train would (--data-path and --name, or --config), and process nothing: report its "
            "conditions and their cells, its perturbed genes (measured? with GO terms?), its expression (raw "
            "counts or log-normalised, and what normalisation will do), repeated genes or cells, and the sets of "
            "each split asked for; then every problem at once, each with its fix. Exit status 0 when the screen "
            "would train (its warnings printed), 2 when a problem stops it.",
            100,
        ),
        epilog="example (the screen of gears-ddp process --help, three split seeds):\n"
        "  gears-ddp check --adata screen.h5ad --data-path ./data \\\n"
        "      --perturbation-column target_gene --control-label non-targeting --normalize \\\n"
        "      --go-gene-sets GO_Biological_Process_2021.gmt.gz --drop-unannotated --split-seeds 1 2 3",
    )
    parser.add_argument("--adata", help=SCREEN_HELP + "; without it, the processed dataset DATA_PATH/NAME")
    parser.add_argument(
        "--data-path",
        help="data folder: its GO files, and without --adata the dataset (default: --config's pert_data_path)",
    )
    parser.add_argument(
        "--name",
        help="dataset name (default: --config's dataset_name; with --adata, the file's "
        "name): with --adata, the cell type given to a screen without one",
    )
    parser.add_argument(
        "--config",
        help="a run's YAML file (gears-ddp train --config): its dataset, split_config, "
        "replicates.split_seeds and args.default_pert_graph",
    )
    add_screen_reading_options(parser, "check as if the GO files of --data-path were built from")
    splits = parser.add_argument_group(
        "splits (each type with each seed; default: --config's split_config, else "
        "the simulation split with seed 1, as gears-ddp train)"
    )
    splits.add_argument(
        "--split", nargs="+", choices=SPLIT_TYPES, metavar="TYPE", help=f"split types: {', '.join(SPLIT_TYPES)}"
    )
    splits.add_argument("--split-seeds", nargs="+", type=int, metavar="SEED", help="split seeds")
    add_set(parser)
    return parser


def run(options) -> int:
    """Report everything a screen (``--adata``) or processed dataset holds that matters to
    processing and training it, and every problem; 0 when it would train, else 2."""
    from gears_ddp.data.pertdata import PertData

    config, data_path, name = _check_config(options)
    adata, screen = _screen_to_check(options, data_path, name)
    gene2go, origin = go_annotation(options) or (None, "")
    seeds = (
        options.split_seeds or (config.get("replicates") or {}).get("split_seeds") or [config["split_config"]["seed"]]
    )
    splits = [
        {**config["split_config"], "split": split, "seed": seed}
        for split in options.split or [config["split_config"]["split"]]
        for seed in seeds
    ]
    pert_data = PertData(data_path, default_pert_graph=config["args"]["default_pert_graph"])
    report = pert_data.check_screen(
        adata, name, **screen, splits=splits, go_annotation=gene2go, go_annotation_origin=origin
    )
    print(report)
    return 0 if report.would_train else EXIT_BAD_INPUT


def _check_config(options) -> tuple[dict, str, str]:
    """The run configuration a check reads (``--config``, or one of ``--set`` alone), the
    data folder and the dataset's name."""
    if options.config is None and options.data_path is None:
        raise ValueError("give the data folder (--data-path: its GO files) or a run's configuration (--config)")
    if options.config is not None:
        config = read_run_config(options.config, options.overrides)
        return config, options.data_path or config["pert_data_path"], options.name or config["dataset_name"]
    if options.adata is None and options.name is None:
        raise ValueError("give the screen (--adata), or name the processed dataset of --data-path (--name)")
    name = options.name or Path(options.adata).stem
    config = resolve_with_overrides(
        {"pert_data_path": options.data_path, "dataset_name": name}, options.overrides, "--set"
    )
    return config, options.data_path, name


def _screen_to_check(options, data_path: str, name: str) -> tuple:
    """The screen to check (backed: its expression read a block at a time) and
    ``PertData.check_screen``'s options for it: the screen of ``--adata`` as ``gears-ddp
    process`` reads it, or the processed dataset ``data_path/name`` as ``PertData.load`` does."""
    from gears_ddp.data.download import DATASET_FILE_IDS
    from gears_ddp.data.io import PROCESSED_FILE, read_h5ad

    screen = screen_reading_options(options)
    if options.adata is not None:
        return read_h5ad(options.adata, backed=True), {**screen, "drop_unannotated": options.drop_unannotated}
    given = [f"--{key.replace('_', '-')}" for key, value in screen.items() if value not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)} read a screen as it comes: give it with --adata")
    processed = Path(data_path) / name / PROCESSED_FILE
    if not processed.is_file():
        raise FileNotFoundError(
            f"no processed dataset at {processed}: check the screen itself (--adata), or process "
            "it first (gears-ddp process)"
            + (
                f"; {name!r} is a published dataset, which gears-ddp train downloads"
                if name in DATASET_FILE_IDS
                else ""
            )
        )
    return read_h5ad(processed, backed=True), {"skip_calc_de": True}
