"""``gears-ddp process``: a screen (h5ad) turned into a GEARS-format dataset folder, as
``PertData.new_data_process`` does, with the GO files built from an annotation if given."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gears_ddp.cli.screen_input import SCREEN_HELP, add_screen_reading_options, go_annotation, screen_reading_options
from gears_ddp.data import stop_signals
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, STOP_SIGNALS

NAME = "process"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        NAME,
        allow_abbrev=False,
        help="turn a screen (h5ad) into a GEARS-format dataset folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Process a screen into DATA_PATH/NAME/perturb_processed.h5ad, as PertData.new_data_process "
        "does. The screen may come as screens come: its perturbations in a column of its own, raw "
        "counts, no cell type; GO files may be built from a GAF annotation or from GMT gene sets.",
        epilog="example (a screen with raw counts, its targets in obs['target_gene'], GO from Enrichr gene sets):\n"
        "  gears-ddp process --adata screen.h5ad --data-path ./data --name my_screen \\\n"
        "      --perturbation-column target_gene --control-label non-targeting --normalize \\\n"
        "      --go-gene-sets GO_Biological_Process_2021.gmt.gz --drop-unannotated",
    )
    parser.add_argument("--adata", required=True, help=SCREEN_HELP)
    parser.add_argument("--data-path", required=True, help="data folder (GO files, datasets)")
    parser.add_argument("--name", required=True, help="dataset name: the folder under --data-path")
    add_screen_reading_options(parser, "build the GO files of --data-path from")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing processed dataset")
    return parser


def run(options) -> int:
    """Process a screen; the GO files of --go-annotation or --go-gene-sets are checked with it
    and written with it, all or none, so a refused screen leaves the data folder as it was.
    A stop signal (SIGINT: Ctrl-C; SIGTERM) ends it as a stopped training run ends, with
    ``EXIT_INTERRUPTED`` (75: run it again) and one line saying whether the dataset had been
    written; its temporary files are removed first (``stop_signals``)."""
    from gears_ddp.data.io import PROCESSED_FILE

    target = Path(options.data_path) / options.name.lower() / PROCESSED_FILE
    before = _file_identity(target)
    try:
        with stop_signals.stops_raised((signal.SIGINT, *STOP_SIGNALS)):
            return _process(options)
    except stop_signals.Stopped as stop:
        files = f"{target}" + (" and the GO files" if options.go_annotation or options.go_gene_sets else "")
        written = _file_identity(target) not in (None, before)
        outcome = (
            f"after {files} had been written whole"
            if written
            else f"before {files} had been written: none is left; run the same command again"
        )
        print(f"gears-ddp {NAME}: {stop} {outcome}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _file_identity(path: Path) -> tuple[int, int] | None:
    """What tells a file renamed into ``path`` from the one there before (inode, time), or None."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


def _process(options) -> int:
    """``run``'s work: read, check and process the screen, and say what was written."""
    from gears_ddp.data.conditions import genes_of_conditions
    from gears_ddp.data.io import read_h5ad
    from gears_ddp.data.pertdata import PertData

    source = Path(options.adata)
    if not source.exists():
        raise FileNotFoundError(f"--adata {source} does not exist")
    # a file that is no h5ad fails here, before anything is written; its expression stays on
    # disk, read a block of cells at a time
    adata = read_h5ad(source, backed=True)
    gene2go, origin = go_annotation(options) or (None, "")
    pert_data = PertData(options.data_path)
    pert_data.new_data_process(
        options.name,
        adata,
        overwrite=options.overwrite,
        **screen_reading_options(options),
        drop_unannotated=options.drop_unannotated,
        go_annotation=gene2go,
        go_annotation_origin=str(origin),
    )
    if gene2go is not None:
        print(f"GO files built from {origin} ({len(gene2go)} genes) in {options.data_path}")
    perturbed = genes_of_conditions(adata.obs["condition"].astype(str).unique())
    cells = pert_data.require_data()
    dropped = [gene for gene in perturbed if gene not in pert_data.node_map_pert]
    print(
        f"dataset {options.name}: {cells.n_cells} cells x {len(pert_data.gene_names)} genes, "
        f"{len(cells.conditions)} conditions, written to {pert_data.dataset_path}; "
        f"{len(perturbed) - len(dropped)} of {len(perturbed)} perturbed genes have GO terms"
        + (f" (cells dropped: {', '.join(dropped)})" if dropped else "")
    )
    return 0
