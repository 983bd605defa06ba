"""The part of a Gene Ontology annotation that a GEARS model reads for some perturbed genes.

GEARS's perturbation vocabulary is every gene of its GO files, and its GO graph joins each
gene to its ``k + 1`` most similar genes (Jaccard similarity of their GO terms). Built from
all of GO (about 15,000 human genes), that graph has millions of edges. A model trained on
a screen reads it only at the screen's perturbed genes, through ``layers`` graph
convolutions: the output at a gene depends on the embeddings of the genes up to ``layers``
steps upstream along the graph's edges, and on their degrees, each the summed weight of a
gene's own incoming edges, one step further. So the genes within ``layers + 1`` steps of the
perturbed genes are all the model uses.

Restricted to those genes, the annotation gives the same graph there: a pair's similarity
depends on the two genes' own terms only, and a gene whose ``k + 1`` sources are all kept
keeps them (ties resolve in the order of the gene names either way).
``restrict_gene_sets`` writes such a restricted GMT file.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from gears_ddp.data.gene_sets import GZIP_MAGIC, read_gene_sets
from gears_ddp.data.graphs import jaccard_edge_list, top_sources_per_target


def go_neighbourhood(gene2go: dict, genes, k: int, layers: int) -> set[str]:
    """The annotated ``genes`` and every gene within ``layers + 1`` steps upstream of them
    in the GO graph of ``gene2go`` (each gene's ``k + 1`` most similar sources)."""
    vocabulary = sorted(gene2go)
    edges = top_sources_per_target(jaccard_edge_list(gene2go, vocabulary), k)
    sources = edges.groupby("target")["source"].agg(set)
    reached = frontier = {gene for gene in genes if gene in gene2go}
    for _ in range(layers + 1):
        frontier = set().union(*(sources.get(gene, set()) for gene in frontier)) - reached
        reached = reached | frontier
    return reached


def restrict_gene_sets(gene_sets, genes, out) -> Path:
    """Write the GMT file ``gene_sets`` (plain or gzip) to ``out`` (gzip) with only ``genes``
    in each set, and without the sets left empty; names and descriptions are kept, so each
    kept gene has all its terms. Returns ``out``."""
    read_gene_sets(gene_sets)  # refuses a file that is no GMT, naming it
    keep, out = set(genes), Path(out)
    with open(gene_sets, "rb") as handle:
        compressed = handle.read(2) == GZIP_MAGIC
    lines = []
    with (gzip.open if compressed else open)(gene_sets, "rt", encoding="utf-8") as source:
        for line in source:
            fields = line.rstrip("\r\n").split("\t")
            kept = [gene for gene in fields[2:] if gene.split(",")[0].strip() in keep]
            if kept:
                lines.append("\t".join(fields[:2] + kept) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as compressed_out:
        compressed_out.write("".join(lines).encode("utf-8"))
    return out
