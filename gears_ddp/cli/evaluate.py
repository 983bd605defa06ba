"""``gears-ddp evaluate``: a saved run's model scored on its test set beside the baselines,
with the verdicts logged; ``--out`` also writes the scores as JSON, with the split they are of."""

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
    scored_on = scored_split(gears)
    if scored_on["differences"]:
        print(
            f"these scores are of another split than the one {options.run} trained on "
            f"({'; '.join(scored_on['differences'])}): its test set may hold perturbations the model trained on"
        )
    if options.out:
        write_json(options.out, {**scores, "test_split": scored_on})
        print(f"scores written to {options.out}")
    return 0


def scored_split(gears) -> dict:
    """The split whose test set ``gears`` was scored on, as ``--out`` records it beside the
    scores: its settings, and how they differ from those the run trained on (empty when
    they do not), so that scores of another split (``--set split_config.seed=2``) stay
    marked as such wherever the file goes."""
    from gears_ddp.inference.trained_split import split_differences

    data = gears.pert_data
    return {
        "split": data.split,
        "seed": data.seed,
        "train_gene_set_size": data.train_gene_set_size,
        "differences": split_differences(gears.trained_split, data.split, data.seed, data.train_gene_set_size),
    }
