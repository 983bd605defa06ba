"""How ``gears-ddp process`` and ``gears-ddp check`` read a screen (the Perturb-seq data
given as an h5ad): its perturbation column, raw counts, and the GO annotation its GO files
are built from; the options and what they mean to ``PertData``."""

from __future__ import annotations

SCREEN_HELP = "the screen (h5ad): X log-normalised, or raw counts with --normalize; var['gene_name'] the gene symbols"


def add_screen_reading_options(parser, go_meaning: str) -> None:
    """The options that say how a screen is read; a GO file's ``go_meaning`` (what the
    command does with it)."""
    columns = parser.add_argument_group(
        "the screen's perturbations (default: obs['condition'] written 'ctrl', "
        "'A+ctrl', 'A+B'; without obs['cell_type'], one cell type is given)"
    )
    columns.add_argument(
        "--perturbation-column",
        metavar="COLUMN",
        help="the obs column naming each cell's perturbed gene(s), e.g. target_gene",
    )
    columns.add_argument("--control-label", metavar="LABEL", help="its label of control cells, e.g. non-targeting")
    columns.add_argument(
        "--combination-separator",
        metavar="TEXT",
        help="the text joining two genes in its labels, e.g. + or _ (default: one gene per label)",
    )
    counts = parser.add_argument_group("raw counts")
    counts.add_argument(
        "--normalize",
        action="store_true",
        help="X holds raw counts: normalise each cell to 1e4 counts, then log1p (scanpy's "
        "normalize_total and log1p); counts without it are refused",
    )
    counts.add_argument(
        "--n-top-genes",
        type=int,
        metavar="N",
        help="with --normalize: keep the N highly variable genes (scanpy, flavor seurat_v3, on the "
        "counts) and every perturbed gene",
    )
    go = parser.add_argument_group(
        "Gene Ontology (perturbed genes without GO terms are named and refused unless --drop-unannotated)"
    )
    go_source = go.add_mutually_exclusive_group()
    go_source.add_argument(
        "--go-annotation",
        metavar="FILE",
        help=f"{go_meaning} this gene-to-GO annotation (a GAF file, or a two-column table gene, GO id, "
        "with a header row or without)",
    )
    go_source.add_argument(
        "--go-gene-sets",
        metavar="FILE",
        help=f"{go_meaning} gene sets (GMT: name, description, genes; tab-separated; .gmt or "
        ".gmt.gz, as Enrichr and MSigDB publish them)",
    )
    go.add_argument(
        "--drop-unannotated",
        action="store_true",
        help="drop the cells of perturbed genes without GO terms (the published GEARS drops them)",
    )


def screen_reading_options(options) -> dict:
    """How the screen is read: ``new_data_process``'s options from the command line."""
    return {
        "perturbation_column": options.perturbation_column,
        "control_label": options.control_label,
        "combination_separator": options.combination_separator,
        "normalize": options.normalize,
        "n_top_genes": options.n_top_genes,
    }


def go_annotation(options) -> tuple[dict, str] | None:
    """The GO annotation (gene -> GO terms) of --go-annotation or --go-gene-sets and its file, or None."""
    from gears_ddp.data.gene_sets import read_gene_sets
    from gears_ddp.data.go_files import read_annotation

    path = options.go_annotation or options.go_gene_sets
    if path is None:
        return None
    return (read_annotation(path) if options.go_annotation else read_gene_sets(path)), path
