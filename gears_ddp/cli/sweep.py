"""``gears-ddp sweep``: a hyperparameter sweep of a run file over a search space (Optuna's TPE,
pruned on the validation metric, resumable), its trials placed over the devices as
replicates are; ``--join FOLDER`` adds this machine's devices to a sweep started elsewhere."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gears_ddp.cli.exit_status import EXIT_FAILED
from gears_ddp.cli.shared_options import add_set

NAME = "sweep"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="tune a run: trials over a search space",
        description="Train trials of the run file, each with settings Optuna draws from "
        "the search space (a YAML file: per option under args or "
        "args.model_config, {type: float|int, low, high, log} or {type: "
        "categorical, choices}), one per GPU (or CPU process) at once, each in "
        "its own folder under the run file's args.save_path; a trial behind "
        "the median on the validation mse_de is pruned. The same command again "
        "continues the sweep.",
    )
    parser.add_argument("--config", help="the run file, as gears-ddp train takes it")
    parser.add_argument("--space", help="the search space (YAML)")
    parser.add_argument("--trials", type=int, help="how many trials the sweep holds in all")
    parser.add_argument(
        "--storage",
        help="the study's storage: a database URL (postgresql://user@host/db) or a "
        "journal file on a shared filesystem (default: study.journal in the sweep "
        "folder)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    parser.add_argument(
        "--join",
        metavar="FOLDER",
        help="join the sweep in FOLDER (started elsewhere, on a shared "
        "filesystem): its run file, space and storage, this machine's "
        "devices (--set n_gpus=..., gpu_ids=..., "
        "args.cpu_processes=...)",
    )
    add_set(parser)
    return parser


def run(options) -> int:
    import yaml

    from gears_ddp.configuration.run_options import load_yaml, read_run_options, yaml_problem
    from gears_ddp.sweeps.space import SearchSpaceError
    from gears_ddp.sweeps.study import SweepError
    from gears_ddp.sweeps.train_sweep import joining_plan, plan_sweep, run_sweep

    if options.join:
        if options.config or options.space:
            raise SweepError(
                "--join takes the run file and the search space of the sweep it joins: leave --config and --space out"
            )
        summary = run_sweep(joining_plan(options.join, options.overrides, options.trials), joining=True)
    else:
        if not (options.config and options.space and options.trials is not None):
            raise SweepError("give --config run.yaml --space space.yaml --trials N (or --join FOLDER)")
        run_options = read_run_options(options.config, options.overrides)
        try:
            with open(options.space, encoding="utf-8") as file:
                space = load_yaml(file.read())
        except OSError as err:
            raise SweepError(f"cannot read the search space {options.space}: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise SweepError(f"{options.space} is not a YAML search space: it is not text (UTF-8)") from None
        except yaml.YAMLError as err:
            raise SweepError(f"{options.space} is not valid YAML: {yaml_problem(err)}") from None
        try:
            plan = plan_sweep(run_options, space, options.trials, options.storage, options.seed, options.config)
        except SearchSpaceError as err:
            raise SweepError(f"{options.space}: {err}") from None
        summary = run_sweep(plan)
    _print_summary(summary)
    unfinished = {"RUNNING", "WAITING"} & set(summary["counts"])  # trials other processes have yet to end
    if summary["best"] is None and not unfinished:  # every trial failed or was pruned: nothing to choose
        print(
            "gears-ddp sweep: no trial completed, so there is no best run (no run.yaml); "
            f"trials.csv in {Path(summary['report_path']).parent} says how each ended",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0


def _print_summary(summary: dict) -> None:
    counts = ", ".join(f"{count} {state.lower()}" for state, count in summary["counts"].items())
    retried = f"; {summary['retried']} more interrupted and retried" if summary["retried"] else ""
    trials = sum(summary["counts"].values())
    print(f"\n{trials} trial{'' if trials == 1 else 's'}: {counts}{retried}")
    best = summary["best"]
    if best is not None:
        settings = ", ".join(
            f"{key.split('.')[-1]}={value!r}" for key, value in best.items() if key.startswith("args.")
        )
        print(f"best: trial {best['number']}, validation mse_de {best['value']:.4g} ({settings}), in {best['folder']}")
    print(f"report: {summary['report_path']}")
