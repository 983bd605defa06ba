"""``gears-ddp train``: train from a YAML configuration, as ``train_multi_gpu`` does (spawned
workers), as this process's rank under torchrun or srun, or replicates (``--seeds``) as
``train_replicates`` does; then the summary: did the model learn, and where the run is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gears_ddp.cli.exit_status import EXIT_FAILED
from gears_ddp.cli.shared_options import add_set
from gears_ddp.configuration.run_options import (
    RunConfigError,
    RunOptions,
    option_help,
    read_run_options,
    run_options_with_overrides,
)
from gears_ddp.report.run_files import CONFIG_FILE, PAGE_FILE

NAME = "train"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="train from a YAML configuration",
        epilog=option_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train GEARS as train_multi_gpu does, from a YAML file whose top-level "
        "keys are train_multi_gpu's parameters: pert_data_path, dataset_name, "
        "split_config, args, n_gpus, gpu_ids.",
    )
    parser.add_argument("--config", help="the YAML file (a run folder's config.yaml repeats that run)")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="replicates: one run per model seed in save_path/seed-N, summarised in save_path (replicates.seeds)",
    )
    parser.add_argument(
        "--split-seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="replicates: one run per split seed (replicates.split_seeds); with --seeds, the lists pair up",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="train into a save_path that holds an earlier run, replacing it "
        "(args.overwrite_save_path); without it such a folder is refused. It sets aside the run "
        "file's args.resume_from (a run file that continues its run, as config.yaml of a run "
        "started with resume_from=auto does, can replace it)",
    )
    add_set(parser)
    return parser


def run(options) -> int:
    if options.config is None and not options.overrides:
        raise RunConfigError("give --config run.yaml (or at least --set pert_data_path=... --set dataset_name=...)")
    overrides = list(options.overrides)
    for key, seeds in (("seeds", options.seeds), ("split_seeds", options.split_seeds)):
        if seeds is not None:
            overrides.append(f"replicates.{key}={seeds}")
    if options.overwrite:
        overrides.append("args.overwrite_save_path=true")
        if not any(override.startswith("args.resume_from=") for override in options.overrides):
            overrides.append("args.resume_from=null")  # the command line's choice wins over the file's
    run_options = (
        read_run_options(options.config, overrides)
        if options.config
        else run_options_with_overrides({}, overrides, "--set")
    )
    return run_training(run_options)


def run_training(run: RunOptions, note: str | None = None) -> int:
    """Train with options read and checked once: replicates (``train_checked_replicates``),
    else the run, started where its environment says (``launching.choose.launch``: this
    rank under torchrun or srun, else spawned workers), none checking again; the summary
    ends with ``note``."""
    if run.replicates is not None:
        return _train_replicates(run)
    from gears_ddp.launching.choose import launch

    report = launch(run)
    if report is not None:
        _print_summary(report, note)
    return 0


def _train_replicates(run: RunOptions) -> int:
    """Train the replicates and print their summary; 1 when some did not finish."""
    from gears_ddp.distributed.replicates import ReplicatesFailed, train_checked_replicates
    from gears_ddp.report.replicate_summary import replicate_table

    try:
        summary, status = train_checked_replicates(run), 0
    except ReplicatesFailed as failure:
        print(f"gears-ddp train: {failure}", file=sys.stderr)
        summary, status = failure.summary, EXIT_FAILED
    print(f"\n{summary['finished']} of {len(summary['replicates'])} replicates finished")
    overall = [record for record in summary["metrics"] if record["subgroup"] is None]
    if overall:
        print(replicate_table(overall))
    print(f"\nsummary with every subgroup, plots and each replicate's report: {summary['report_path']}")
    return status


def _print_summary(report: dict, note: str | None = None) -> None:
    from gears_ddp.report.learning import learning_checks

    print(f"\nbest epoch {report['best_epoch']} of {len(report['history'])}, {report['world_size']} process(es)")
    if "model" in report:  # the log above shows the test table, once
        run_path = Path(report.get("model_path", "."))
        print(
            f"The intervals above cover the test perturbations of one seed; for intervals that cover seeds too: "
            f"gears-ddp train --config {run_path / CONFIG_FILE} --seeds 1 2 3 4 5 --set "
            f"args.save_path={run_path}-replicates"
        )
    print("\n" + "\n".join(learning_checks(report) + ([note] if note else [])))
    if "model_path" in report:
        print(f"\nmodel and run report in {report['model_path']} (open {Path(report['model_path']) / PAGE_FILE})")
