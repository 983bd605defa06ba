"""``gears-ddp predict``: a saved run's predictions, of queries (``--perturbations``) or of
every cell of a set of its split (``--split``, the truth written beside them), or a
baseline's cells of that set built the same way."""

from __future__ import annotations

from pathlib import Path

from gears_ddp.cli.shared_options import add_run
from gears_ddp.data.io import atomic_path, make_folder, write_h5ad
from gears_ddp.evaluation.baselines import BASELINES, PRETRAINED
from gears_ddp.inference.prediction import checked_cell_count

NAME = "predict"
FORMATS = ("anndata", "cell-eval", "csv")


def add_parser(subparsers):
    parser = subparsers.add_parser(NAME, allow_abbrev=False, help="predict perturbations with a saved model")
    add_run(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--perturbations", nargs="+", metavar="GENES", help="queries: a gene (FEV) or two joined by + (FEV+SAMD1)"
    )
    what.add_argument(
        "--split",
        choices=("train", "val", "test"),
        help="every cell of this set of the run's split, with the truth written beside it",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="anndata: one row per query (mean); cell-eval: cells in cell-eval's layout; "
        "csv: one row per query (default: csv for an --out ending in .csv, else anndata)",
    )
    parser.add_argument(
        "--cells-per-perturbation",
        type=int,
        metavar="N",
        help="predict N cells per perturbation, from N control cells drawn at random (seed 0): "
        "with --split, instead of one per cell of the set; with --perturbations, instead of "
        "300",
    )
    parser.add_argument(
        "--baseline",
        choices=(*BASELINES, PRETRAINED),
        help="with --split: that baseline's cells instead of the model's, built the same way, to "
        "score with cell-eval beside the model's (linear_pretrained: the run's "
        "args.linear_baseline_screen)",
    )
    parser.add_argument("--out", required=True, help="the file to write (.h5ad, or .csv)")
    return parser


def run(options) -> int:
    from gears_ddp.runs.saved_runs import open_run

    if options.cells_per_perturbation is not None:
        checked_cell_count(options.cells_per_perturbation)  # before the run is loaded
    if options.baseline is not None and options.split is None:
        raise ValueError("--baseline writes a baseline's cells of a split: give --split too")
    out = Path(options.out)
    options.format = output_format(options.format, out)
    # its folder made before the run is loaded and the predictions made
    make_folder(out.parent, f"--out {out}: its folder {out.parent}", "give another --out")
    saved = open_run(options.run, options.overrides)
    gears = saved.gears
    if options.split is not None:
        return _predict_split(options, gears, saved.options.args.linear_baseline_screen)
    queries = [[gene for gene in query.split("+") if gene != "ctrl"] for query in options.perturbations]
    drawn = {} if options.cells_per_perturbation is None else {"cells_per_perturbation": options.cells_per_perturbation}
    if options.format == "csv":
        table = gears.predict(queries, return_type="anndata", **drawn).to_df()
        with atomic_path(out) as tmp:
            table.to_csv(tmp)
    else:
        write_h5ad(gears.predict(queries, return_type=options.format, **drawn), out)
    print(f"predictions for {len(queries)} perturbation(s) written to {out}")
    return 0


def output_format(given: str | None, out: Path) -> str:
    """The format of ``--out``: the one given, else csv for a ``.csv`` file and anndata for
    any other; a format its file's suffix contradicts (an AnnData written as .csv, a table as
    .h5ad) is refused, before the run is loaded."""
    table = out.suffix.lower() == ".csv"
    if given is None:
        return "csv" if table else "anndata"
    if (given == "csv") != table:
        wanted = ".csv" if given == "csv" else ".h5ad"
        raise ValueError(
            f"--format {given} writes {'a table' if given == 'csv' else 'an AnnData (HDF5)'}, but --out "
            f"{out} ends in {out.suffix or 'no suffix'}: name the file *{wanted}, or give the format "
            "its name says"
        )
    return given


def _predict_split(options, gears, linear_baseline_screen: str | None) -> int:
    """The predicted cells of ``--split`` (or a baseline's; ``linear_baseline_screen``: the
    run's option of that name) to ``--out``, the true cells beside them."""
    if options.format == "csv":
        raise ValueError("--split writes cells: use --format cell-eval or anndata")
    baseline = (
        {}
        if options.baseline is None
        else {"baseline": options.baseline, "linear_baseline_screen": linear_baseline_screen}
    )
    predicted, real = gears.predict_split(
        options.split, cells_per_perturbation=options.cells_per_perturbation, **baseline
    )
    out = Path(options.out)
    truth = out.with_name(out.name.replace(".h5ad", "") + ".truth.h5ad")
    write_h5ad(predicted, out)
    write_h5ad(real, truth)
    n_cells = options.cells_per_perturbation
    controls = int((predicted.obs["condition"] == "ctrl").sum())
    perturbations = predicted.obs["condition"].nunique() - 1
    what = (
        f"{predicted.n_obs - controls} cells of the {options.split} set"
        if n_cells is None
        else f"{perturbations} perturbations of the {options.split} set ({n_cells} cells each)"
    )
    print(
        f"predictions for the {what} and the dataset's {controls} control cells written to {out}, their true "
        f"expression to {truth}"
    )
    return 0
