"""``gears-ddp interactions``: the observed two-gene combinations scored for genetic
interactions from their observed changes, alone (a processed dataset) or beside a model's
calls of the same pairs (a run folder, replicates, or several run folders)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gears_ddp.cli.shared_options import add_set, meanings_text

NAME = "interactions"
# what a screen without the pairs the command scores lacks (a screen of single genes only)
_NO_PAIRS = "no two-gene combination A+B whose singles A and B were observed too"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="score the observed two-gene combinations for genetic interactions, beside a model's calls",
        epilog=interactions_help(),
        description="Score every observed two-gene combination A+B whose singles were observed too from its observed "
        "changes (its mean expression minus the mean of the control cells), with the scores and "
        "interaction types of a screen. Given a run folder, the model's predictions of the same pairs "
        "are scored beside them, and the agreement (per score the correlation and the mean absolute "
        "difference; per type how many calls agree, with the confusion table) is printed and written "
        "beside the table (.json); given a replicates folder or several run folders, the models' mean "
        "scores and majority calls are.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--run",
        nargs="+",
        metavar="RUN",
        help="a run folder, a replicates folder or several run folders: their models' calls beside the observed",
    )
    source.add_argument("--data-path", help="with --name: a processed dataset, its observed calls only")
    parser.add_argument("--name", help="with --data-path: the dataset (the folder under --data-path)")
    parser.add_argument(
        "--pairs",
        choices=("test", "all"),
        default="test",
        help="with --run: the combinations of the run's test set (default) or every observed one",
    )
    parser.add_argument(
        "--gi-genes-file",
        help="take the scores on the genes listed here only (GI_predict's "
        "GI_genes_file: one per line, or a .npy array)",
    )
    parser.add_argument("--out", required=True, help="the table (.csv), one row per pair")
    add_set(parser)
    return parser


def interactions_help() -> str:
    """The columns of ``gears-ddp interactions``'s table, for its ``--help``."""
    from gears_ddp.interactions.observed import OBSERVED_COLUMN_MEANINGS

    return meanings_text(
        "the table, one row per observed pair (with --run, observed_<name> beside predicted_<name>)",
        OBSERVED_COLUMN_MEANINGS,
    )


def run(options) -> int:
    from gears_ddp.inference.pair_screen_job import checked_output_file, write_table
    from gears_ddp.interactions.agreement import agreement_lines
    from gears_ddp.report.run_files import write_json
    from gears_ddp.runs.interaction_check import check_saved_runs

    out = checked_output_file(options.out, "--out", "CSV", (".csv",))
    if options.data_path is not None:
        return _observed_only(options, out)
    if options.name is not None:
        raise ValueError("--name goes with --data-path; a run folder says its dataset itself")
    table, agreement = check_saved_runs(
        options.run, None if options.pairs == "all" else "test", options.gi_genes_file, options.overrides
    )
    if not len(table):
        raise ValueError(
            f"{_NO_PAIRS} in {'the data of' if options.pairs == 'all' else 'the test set of'} "
            f"{' '.join(options.run)}: nothing to compare"
            + ("" if options.pairs == "all" else " (--pairs all takes every observed pair, of any set)")
        )
    write_table(table, out)
    write_json(out.with_suffix(".json"), agreement)
    print(f"observed and predicted calls written to {out}, their agreement to {out.with_suffix('.json')}")
    print("\n".join(agreement_lines(agreement)))
    return 0


def _observed_only(options, out: Path) -> int:
    """The observed calls of the processed dataset ``--data-path``/``--name``, and how many of each."""
    from gears_ddp.data.preparation import load_dataset
    from gears_ddp.inference.pair_screen_job import write_table
    from gears_ddp.interactions.agreement import CALL_NAMES
    from gears_ddp.interactions.calls import CALL_ORDER
    from gears_ddp.interactions.observed import observed_interactions

    if options.name is None:
        raise ValueError("--data-path needs --name: the dataset's folder under it")
    pert_data = load_dataset(options.data_path, options.name)  # a mistyped folder or name refused first
    table = observed_interactions(pert_data, None, options.gi_genes_file)
    if not len(table):
        raise ValueError(f"{_NO_PAIRS} in dataset {options.name!r}: nothing to score")
    write_table(table, out)
    print(f"{len(table)} observed pairs of {options.name} scored, written to {out}")
    for kind in CALL_ORDER:
        counts = table[kind].value_counts()
        print(
            f"  {kind}: "
            + ", ".join(f"{CALL_NAMES.get(call, call)} {counts.get(call, 0)}" for call in CALL_ORDER[kind])
        )
    return 0
