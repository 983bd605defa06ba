"""``gears-ddp evaluate``: a saved run's model scored on its test set beside the baselines,
with the verdicts logged; ``--out`` also writes the scores as JSON."""

from __future__ import annotations

from gears_ddp.cli.shared_options import add_run

NAME = "evaluate"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME, allow_abbrev=False, help="score a saved model on the test set beside the baselines"
    )
    add_run(parser)
    parser.add_argument("--out", help="also write the scores as JSON here")
    return parser


def run(options) -> int:
    from gears_ddp.report.run_files import write_json
    from gears_ddp.runs.saved_runs import open_run

    saved = open_run(options.run, options.overrides)
    gears = saved.gears
    if "test_loader" not in gears.dataloader:
        raise ValueError(f"the split of {options.run} has no test set to score")
    scores = gears.test(linear_baseline_screen=saved.options.args.linear_baseline_screen)  # logs the verdicts
    if options.out:
        write_json(options.out, scores)
        print(f"scores written to {options.out}")
    return 0
