"""The ``gears-ddp`` command's parser, assembled from one module per command, and the exit
status of each kind of error. ``gears-ddp --help`` prints ``DESCRIPTION``."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import sys

from gears_ddp._logging import enable_console_logging
from gears_ddp.cli import check, demo, evaluate, interactions, pair_screen, predict, process, sweep, train
from gears_ddp.cli.exit_status import EXIT_BAD_INPUT, EXIT_FAILED
from gears_ddp.configuration.run_options import RunConfigError
from gears_ddp.data.download import DownloadError
from gears_ddp.data.stop_signals import Stopped, stops_raised
from gears_ddp.runtime.folder_lock import FolderInUse
from gears_ddp.runtime.memory_budget import BeyondMemory
from gears_ddp.runtime.process_end import heap_frozen_for_exit
from gears_ddp.runtime.stopping import CTRL_C, EXIT_INTERRUPTED, STOP_SIGNALS, TrainingInterrupted
from gears_ddp.training.finite_loss import NonFiniteLoss

DESCRIPTION = """The ``gears-ddp`` command (``python -m gears_ddp`` does the same).

    gears-ddp demo [--data synthetic]               the README's main job, no download
    gears-ddp train --config run.yaml [--set args.epochs=5 ...]
    gears-ddp train --config run.yaml --seeds 1 2 3 4 5 [--split-seeds 1 2 3 4 5]   replicates
    gears-ddp sweep --config run.yaml --space space.yaml --trials 12 [--storage URL]   tune: Optuna trials
    gears-ddp evaluate --run ./runs/my_run [--out scores.json]          test metrics beside the baselines
    gears-ddp predict --run ./runs/my_run --perturbations FEV FEV+SAMD1 --out predictions.h5ad
    gears-ddp predict --run ./runs/my_run --split test --format cell-eval [--cells-per-perturbation 100] --out test.h5ad
    gears-ddp predict --run ./runs/my_run --split test --format cell-eval --baseline linear --out test.linear.h5ad
    gears-ddp screen --run ./runs/my_run --genes FEV SAMD1 CBL --out screen.csv
    gears-ddp screen --run ./runs/my_replicates --genes FEV SAMD1 CBL --out screen.csv   intervals over models
    gears-ddp check --adata screen.h5ad --data-path ./data [--normalize --go-gene-sets go.gmt --split-seeds 1 2 3]
    gears-ddp check --config run.yaml                 the processed dataset and the splits a run would use
    gears-ddp interactions --run ./runs/my_run --out interactions.csv   observed calls beside predicted ones
    gears-ddp interactions --data-path ./data --name my_screen --out observed.csv   observed calls only
    gears-ddp process --adata screen.h5ad --data-path ./data --name my_screen [--normalize --go-gene-sets go.gmt]

``train`` on one machine starts one worker per GPU (or ``args.cpu_processes`` CPU
processes) as ``train_multi_gpu`` does; under torchrun or srun it runs this process's rank,
with the same configuration. ``--seeds`` (or a ``replicates`` key) trains one run per seed
concurrently over the devices, as ``train_replicates`` does, and summarises them.
``evaluate`` and ``predict`` read a run folder: its
``config.yaml`` says where the data is and how it was split, its model folder holds the
weights; so does ``screen``, which scores every pair of a gene set for genetic
interactions on every GPU (or one process per CPU core), and given replicates (or several
run folders) says how far the models agree on each call. ``check`` reads a screen (or a
processed dataset) as ``process`` and ``train`` would, processes nothing, and lists every
problem at once, each with its fix. Exit status: 0 done (``check``: the screen would
train), 2 a bad configuration, input or path, or a run folder in use by another run
(``check``: a problem stops the screen), 75 stopped by a signal (continue with ``--set
args.resume_from=auto`` where it left checkpoints; replicates and sweeps: the same command), 1 anything else (a replicate that
failed, or a sweep whose trials all failed or were pruned, included).
"""  # noqa: E501 (the --help text, as it reads)

# one module per command, in the order --help lists them: each has NAME, add_parser(subparsers) and run(options)
COMMANDS = (train, demo, sweep, evaluate, predict, pair_screen, interactions, process, check)
# what a stop signal (Ctrl-C too) ends with one line and exit 75 (stops_raised), by command, and
# what the line says: outside the training commands' steps (in them a run stops at the next one,
# with a checkpoint: runtime.stopping), and anywhere in a screen run in this process (its workers,
# when it has several, stop as spawn_workers says)
TRAINING_STOPPED = (
    " outside the training steps (while preparing or starting the run, or while scoring and reporting after its "
    "last step): the checkpoints written so far are kept; run the same command again (with --set "
    "args.resume_from=auto where the run folder holds checkpoints)"
)
STOPPED = {
    train.NAME: TRAINING_STOPPED,
    demo.NAME: TRAINING_STOPPED,
    sweep.NAME: TRAINING_STOPPED,
    pair_screen.NAME: ": the chunks finished so far are kept beside the table; run the same command again to continue",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``gears-ddp`` parser: each command's module adds its own subcommand."""
    # no abbreviated options: `train --seed 3` must not be read as `--seeds 3`
    parser = argparse.ArgumentParser(
        prog="gears-ddp",
        description=DESCRIPTION,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
        subparsers.choices[command.NAME].set_defaults(command_parser=subparsers.choices[command.NAME])
    return parser


def parsed_options(argv=None) -> argparse.Namespace:
    """The options of ``argv`` (default: the command line). An option the command does not
    take is refused by the command's own parser (its usage, not the top level's), with
    the options it takes that are nearest in spelling."""
    options, unknown = build_parser().parse_known_args(argv)
    if unknown:
        command_parser = options.command_parser
        taken = [name for action in command_parser._actions for name in action.option_strings]
        nearest = sorted(
            {
                match
                for given in unknown
                if given.startswith("-")
                for match in difflib.get_close_matches(given.split("=")[0], taken, n=1)
            }
        )
        command_parser.error(
            f"unrecognized arguments: {' '.join(unknown)}"
            + (f" (did you mean {' or '.join(nearest)}?)" if nearest else "")
        )
    return options


def command(argv=None) -> int:
    """The ``gears-ddp`` command's process (the console script, ``python -m gears_ddp``, and
    ``python -m gears_ddp.launch`` under torchrun or srun): ``main(argv)``, its heap frozen as
    the process ends (``runtime.process_end``); ``main`` itself, which tests and scripts call
    in a process that goes on, leaves the heap as it is."""
    try:
        return main(argv)
    finally:
        heap_frozen_for_exit()


def main(argv=None) -> int:
    """Run ``gears-ddp`` with the arguments ``argv`` (default: the command line); the exit status."""
    options = parsed_options(argv)
    enable_console_logging(logging.WARNING if options.command == "check" else logging.INFO)  # check: its report
    run = {command.NAME: command.run for command in COMMANDS}[options.command]
    try:
        with stops_raised((CTRL_C, *STOP_SIGNALS)) if options.command in STOPPED else contextlib.nullcontext():
            return run(options) or 0
    except Stopped as stop:
        print(f"gears-ddp {options.command}: {stop}{STOPPED[options.command]}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (
        RunConfigError,
        FileNotFoundError,
        FileExistsError,
        PermissionError,
        ValueError,
        DownloadError,
        FolderInUse,
        BeyondMemory,
    ) as err:
        print(f"gears-ddp {options.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingInterrupted as stop:
        print(f"gears-ddp {options.command}: {stop}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except NonFiniteLoss as diverged:
        print(f"gears-ddp {options.command}: {diverged}", file=sys.stderr)
        return EXIT_FAILED
