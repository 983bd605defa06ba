"""``gears-ddp screen``: the in-silico pair screen. Every single and pair of a gene set is
predicted with a saved model and each pair scored as ``GI_predict`` does, on every GPU (or
one process per CPU core); given replicates (or several run folders), every model screens
the pairs and the table says how far the models agree on each call."""

from __future__ import annotations

import argparse
from pathlib import Path

from gears_ddp.cli.shared_options import add_set, meanings_text
from gears_ddp.inference.pair_screen_options import PAIR_SCREEN_COMMAND
from gears_ddp.inference.prediction import CHANGE_MODES, DRAWN_CELLS_CHANGE, EXACT_CHANGE

NAME = "screen"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="score every pair of a gene set for genetic interactions",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=pair_screen_help(),
        description="Predict every single and pair of the genes with a saved model and score each pair as GI_predict "
        "does; writes the table (--out), its record (.json beside it) and a picture (.png). Given a "
        "replicates folder or several run folders, every model screens the pairs and the table says, per "
        "pair, how the models agree: mean, sd and 95% interval of every score, and which calls are "
        "confident. Run again after an interruption, it continues from the chunks it finished.",
    )
    parser.add_argument(
        "--run",
        required=True,
        nargs="+",
        metavar="RUN",
        help="a run folder (config.yaml and the saved model); or a replicates folder (gears-ddp train "
        "--seeds ...) or several run folders: a screen over replicates",
    )
    add_set(parser)
    genes = parser.add_mutually_exclusive_group(required=True)
    genes.add_argument("--genes", nargs="+", metavar="GENE", help="the genes whose pairs are screened")
    genes.add_argument("--genes-file", help="the genes: one per line, or a .npy array of names")
    genes.add_argument(
        "--all-perturbable",
        action="store_true",
        help="every gene of the model's perturbation vocabulary (n genes: n(n-1)/2 pairs)",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="the table (.csv), one row per pair; over replicates each model's table goes to a folder beside "
        "it (screens/x.models/ for screens/x.csv)",
    )
    parser.add_argument(
        "--gi-genes-file",
        help="take the scores on the genes listed here only (GI_predict's "
        "GI_genes_file: one per line, or a .npy array)",
    )
    parser.add_argument(
        "--change",
        choices=list(CHANGE_MODES),
        default=EXACT_CHANGE,
        help="; ".join(f"{mode}: {meaning}" for mode, meaning in CHANGE_MODES.items()),
    )
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        metavar="SEED",
        help=f"seed of the drawn control cells (--change {DRAWN_CELLS_CHANGE} only; default 0); "
        "over replicates several seeds measure the drawn cells' noise within each model",
    )
    parser.add_argument("--figure", help="the picture (default: --out with .png)")
    parser.add_argument(
        "--changes-out",
        help="also write the predicted changes (singles and pairs x genes) as AnnData (.h5ad); one run only",
    )
    parser.add_argument(
        "--cpu-processes",
        type=int,
        help="CPU worker processes, one thread each (default without GPUs: one per usable core)",
    )
    parser.add_argument("--gpu-ids", type=int, nargs="+", help="GPUs for the workers (default: every visible GPU)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing screen at --out")
    return parser


def pair_screen_help() -> str:
    """The meaning of every column of a pair screen's table, for ``gears-ddp screen --help``."""
    from gears_ddp.inference.pair_screen_job import PAIR_SCREEN_COLUMN_MEANINGS
    from gears_ddp.inference.pair_screen_statistics import SUMMARY_COLUMN_MEANINGS
    from gears_ddp.interactions.calls import INTERACTION_TYPE_MEANINGS
    from gears_ddp.interactions.scores import GI_SCORE_MEANINGS

    sections = (
        ("the table, one row per pair", PAIR_SCREEN_COLUMN_MEANINGS),
        (
            "its scores (A, B, AB: the changes over control of the singles and the double, one value per gene; "
            "docs/screens.md reads an example)",
            GI_SCORE_MEANINGS,
        ),
        ("the interaction types they imply (the published analysis's thresholds)", INTERACTION_TYPE_MEANINGS),
        (
            "a screen over replicates: the pair's columns, then for each score (<score>) and each type (<type>)",
            SUMMARY_COLUMN_MEANINGS,
        ),
    )
    return "\n\n".join(meanings_text(title, meanings) for title, meanings in sections)


def run(options) -> int:
    from gears_ddp.data.io import write_h5ad
    from gears_ddp.distributed.pair_screen_workers import pair_screen_checked
    from gears_ddp.inference.figures import plot_pair_screen
    from gears_ddp.inference.pair_screen_job import PairScreenFolder, checked_output_file, pair_screen_changes
    from gears_ddp.inference.replicate_pair_screen import ReplicatePairScreenFolder
    from gears_ddp.interactions.calls import read_gene_list
    from gears_ddp.runs.saved_runs import is_replicates_folder, load_run

    replicates = len(options.run) > 1 or is_replicates_folder(options.run[0])
    # bad names fail before the runs are loaded
    out = (ReplicatePairScreenFolder if replicates else PairScreenFolder)(options.out).table
    figure = checked_output_file(options.figure or out.with_suffix(".png"), "--figure", "a picture", figure_suffixes())
    if options.changes_out is not None:
        if replicates:
            raise ValueError(
                "--changes-out writes the changes one model predicts: give it with one run folder "
                "(e.g. one replicate's)"
            )
        checked_output_file(options.changes_out, "--changes-out", "AnnData", (".h5ad",))
    screen_options = pair_screen_options(options, out)
    genes = read_gene_list(options.genes_file) if options.genes_file else options.genes
    if genes is not None:
        refuse_genes_outside_the_model(genes, options.run)
    if replicates:
        return _pair_screen_replicates(options, None if options.all_perturbable else genes, screen_options, figure)
    screen_options = screen_options.with_one_draw(PAIR_SCREEN_COMMAND)
    gears = load_run(options.run[0], options.overrides)
    genes = gears.pert_list if options.all_perturbable else genes
    table = pair_screen_checked(gears, genes, screen_options)
    plot_pair_screen(table, figure)
    print(
        f"screen of {len(genes)} genes: {len(table)} pairs written to {out} (its record: "
        f"{out.with_suffix('.json')}), the picture to {figure}"
    )
    if options.changes_out:
        write_h5ad(
            pair_screen_changes(gears.pair_screen_job(genes, screen_options), gears.gene_list), options.changes_out
        )
        print(f"predicted changes of {len(genes)} singles and {len(table)} pairs written to {options.changes_out}")
    for title, row in (("highest mag", table["mag"].idxmax()), ("lowest mag", table["mag"].idxmin())):
        print(f"{title}: {table.at[row, 'pair']} (mag {table.at[row, 'mag']:.3f}, {table.at[row, 'magnitude_type']})")
    return 0


def refuse_genes_outside_the_model(genes, runs) -> None:
    """Refuse, before any model or data is loaded, genes outside the perturbation vocabulary
    of the first model of ``runs`` (its ``vocabulary.json``: replicates share theirs); a
    model folder without one is checked once loaded."""
    from gears_ddp.inference.prediction import refuse_unknown_genes
    from gears_ddp.model.model_folder import VOCABULARY_FILE, read_vocabulary
    from gears_ddp.runs.saved_runs import run_folders

    folder = next(iter(run_folders(runs).values()))
    vocabulary = read_vocabulary(folder)
    if vocabulary is not None:
        refuse_unknown_genes(
            genes, vocabulary["perturbations"], f"of the model in {folder} ({folder / VOCABULARY_FILE})"
        )


def pair_screen_options(options, out: Path):
    """The command's pair-screen options (``PairScreenOptions``), checked once here."""
    from gears_ddp.inference.pair_screen_options import PairScreenOptions

    given = {
        "GI_genes_file": options.gi_genes_file,
        "change": options.change,
        "seeds": options.seed,
        "out": out,
        "overwrite": options.overwrite,
        "cpu_processes": options.cpu_processes,
        "gpu_ids": options.gpu_ids,
    }
    return PairScreenOptions.from_dict(given, PAIR_SCREEN_COMMAND)


def _pair_screen_replicates(options, genes, screen_options, figure: Path) -> int:
    """A pair screen over replicates, its picture, and how many calls are confident."""
    from gears_ddp.inference.figures import plot_replicate_pair_screen
    from gears_ddp.inference.pair_screen_statistics import confident_counts
    from gears_ddp.runs.pair_screens import pair_screen_replicates_checked

    out = Path(screen_options.out)
    summary = pair_screen_replicates_checked(options.run, genes, screen_options, options.overrides)
    plot_replicate_pair_screen(summary, figure)
    models = int(summary["models"].iloc[0])
    print(
        f"screen over {models} models: {len(summary)} pairs summarised in {out} (its record: "
        f"{out.with_suffix('.json')}; each model's table in {out.with_suffix('.models')}), the picture to {figure}"
    )
    print(
        f"confident calls (every model agrees and the 95% interval over the models lies on the call's side), of "
        f"{len(summary)} pairs:"
    )
    for kind, counts in confident_counts(summary).items():
        print(f"  {kind}: " + ", ".join(f"{call} {count}" for call, count in counts.items()))
    return 0


def figure_suffixes() -> tuple[str, ...]:
    """The file suffixes matplotlib writes pictures as (.png, .pdf, .svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{suffix}" for suffix in FigureCanvasBase.get_supported_filetypes())
