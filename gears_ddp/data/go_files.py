"""The three Gene Ontology files GEARS reads, built from a gene-to-GO annotation.

``PertData`` reads, from its ``data_path`` (the published downloads use these names)::

    gene2go_all.pkl                          gene symbol -> set of GO term ids
    essential_all_data_pert_genes.pkl        the genes that may be perturbed (the vocabulary)
    go_essential_all/go_essential_all.csv    GO graph: Jaccard similarity of two genes' terms (> 0.1)

Offline, or for an organism or annotation of one's own, ``write_go_files`` builds them from
any annotation: ``read_annotation`` reads a GO Annotation File (GAF 2.x, as the GO
Consortium and UniProt publish them: ``.gaf`` or ``.gaf.gz``) or a two-column table (gene
symbol, GO id; comma- or tab-separated), with a header row or without one: a first row
whose second field is a GO id is data. ``gears-ddp process --go-annotation`` does both.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gears_ddp.data import io
from gears_ddp.data.graphs import jaccard_edge_list

GENE2GO_FILE = "gene2go_all.pkl"
ESSENTIAL_GENES_FILE = "essential_all_data_pert_genes.pkl"
GO_EDGES_NAME = "go_essential_all"
GAF_SYMBOL_COLUMN, GAF_GO_COLUMN, GAF_QUALIFIER_COLUMN = 2, 4, 3


def read_annotation(path) -> dict[str, set[str]]:
    """Gene symbol -> GO term ids from a GAF file or a two-column table, its header row
    optional (see module doc). GAF lines qualified ``NOT`` say a gene lacks the term, and
    are skipped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"GO annotation file {path} does not exist")
    gaf = ".gaf" in path.name
    try:
        if gaf:
            table = pd.read_csv(path, sep="\t", comment="!", header=None, dtype=str, usecols=range(5))
        else:
            table = pd.read_csv(path, sep=None, engine="python", dtype=str, header=None)
    except Exception as err:  # pandas, csv, gzip and codecs raise many types for a file of another kind
        raise ValueError(
            f"cannot read the GO annotation {path} ({type(err).__name__}: {err}): expected "
            + (
                "a GAF file (tab-separated, 15+ columns)"
                if gaf
                else "a text table of two columns, gene symbol and GO id (comma- or tab-separated)"
            )
        ) from None
    if gaf:
        table = table[~table[GAF_QUALIFIER_COLUMN].fillna("").str.contains("NOT")]
        pairs = table[[GAF_SYMBOL_COLUMN, GAF_GO_COLUMN]]
    else:
        if table.shape[1] < 2:
            raise ValueError(
                f"{path}: a GO annotation table needs two columns (gene symbol, GO id), found one: "
                f"{table.iloc[0].tolist()}"
            )
        pairs = table.iloc[:, :2]
        if not str(pairs.iloc[0, 1]).startswith("GO:"):  # a header row (gene, GO id), not an annotation
            pairs = pairs.iloc[1:]
    pairs = pairs.dropna()
    bad = pairs[~pairs.iloc[:, 1].str.startswith("GO:")]
    if len(bad):
        raise ValueError(
            f"{path}: {len(bad)} rows have no GO id (GO:nnnnnnn) in the "
            f"{'fifth' if gaf else 'second'} column, e.g. {bad.iloc[0].tolist()}"
        )
    gene2go: dict[str, set[str]] = {}
    for gene, term in pairs.itertuples(index=False):
        gene2go.setdefault(gene, set()).add(term)
    if not gene2go:
        raise ValueError(f"{path}: no gene-to-GO annotation found")
    return gene2go


def go_file_paths(data_path) -> list[Path]:
    """Where the three GO files lie in ``data_path``: gene2go, the perturbable genes, the GO graph."""
    data_path = Path(data_path)
    return [
        data_path / GENE2GO_FILE,
        data_path / ESSENTIAL_GENES_FILE,
        data_path / GO_EDGES_NAME / f"{GO_EDGES_NAME}.csv",
    ]


def write_go_files(data_path, gene2go: dict, pert_genes=None, overwrite: bool = False) -> None:
    """Write the three GO files into ``data_path``, all or none (``io.atomic_files``);
    ``pert_genes`` (default: every annotated gene) is the perturbation vocabulary. Different
    existing files are refused unless ``overwrite``; the same ones are kept."""
    existing = Path(data_path) / GENE2GO_FILE
    if existing.exists() and not overwrite:
        if io.read_pickle(existing, "gene -> GO terms mapping") != gene2go:
            raise FileExistsError(
                f"{existing} holds other GO annotations; write into another data folder "
                "(data_path; gears-ddp demo --data-path), or replace them (overwrite=True; "
                "gears-ddp process --go-annotation or --go-gene-sets replaces them with the "
                "GO files it builds)"
            )
        return
    with io.atomic_files(go_file_paths(data_path)) as paths:
        write_go_files_to(paths, gene2go, pert_genes)


def write_go_files_to(paths, gene2go: dict, pert_genes=None) -> None:
    """Write the GO files of ``gene2go`` (and ``pert_genes``, default every annotated gene)
    at ``paths``, in the order of ``go_file_paths``: the temporaries of ``io.atomic_files``,
    which renames them, with any other file that belongs with them, once all are written."""
    gene2go_path, pert_genes_path, edges_path = paths
    pert_genes = sorted(gene2go) if pert_genes is None else list(pert_genes)
    io.write_pickle(gene2go, gene2go_path)
    io.write_pickle(pert_genes, pert_genes_path)
    jaccard_edge_list(gene2go, pert_genes).to_csv(edges_path, index=False)
