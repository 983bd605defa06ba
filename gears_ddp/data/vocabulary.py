"""The perturbation vocabulary of a dataset: the genes a model may perturb, and the cells it covers.

GEARS embeds a perturbed gene through the GO graph, so the genes it can perturb are the
candidate genes that have GO terms. The candidates are chosen by ``PertData``'s constructor:
a gene list of the user's (``gene_set_path``), the published GEARS list in the data folder
(``default_pert_graph``), or the dataset's own measured and perturbed genes. The GO terms
are those of the data folder's GO files, or of an annotation the GO files are about to be
built from. ``VocabularySource`` holds that choice; ``cells_in_vocabulary`` says which cells
of a screen the vocabulary covers, dropping or refusing the others (``go_coverage``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from gears_ddp._logging import get_logger, log_once
from gears_ddp.data import download, graphs, io
from gears_ddp.data.conditions import coded_conditions, genes_of_conditions
from gears_ddp.data.go_coverage import coverage_problems, go_coverage
from gears_ddp.data.go_files import ESSENTIAL_GENES_FILE, GENE2GO_FILE, GO_EDGES_NAME
from gears_ddp.data.screen_check import GoVocabulary
from gears_ddp.data.screen_report import refuse

if TYPE_CHECKING:  # the annotations' type only: every process that loads a dataset imports this module
    import anndata

logger = get_logger(__name__)


@dataclass(frozen=True)
class VocabularySource:
    """Where a dataset's perturbation vocabulary comes from: the GO files of ``data_path``,
    and the candidate genes, by ``PertData``'s constructor's choice (``gene_set_path``: a
    pickled gene list; ``default_pert_graph``: the published GEARS list and GO graph)."""

    data_path: str
    gene_set_path: str | None
    default_pert_graph: bool

    def vocabulary_files(self) -> list[str]:
        """The GO files the vocabulary is read from (names of ``download.GO_FILE_IDS``)."""
        return [GENE2GO_FILE] + ([ESSENTIAL_GENES_FILE] if self.default_pert_graph else [])

    def go_files(self) -> list[str]:
        """Every GO file a ``PertData`` reads: the vocabulary's, and the published GO edge
        list for the default graph."""
        return self.vocabulary_files() + ([GO_EDGES_NAME] if self.default_pert_graph else [])

    def candidates(self, adata, annotated: list[str] | None = None) -> list[str]:
        """Genes that may form the perturbation vocabulary of the screen ``adata`` (GEARS's
        columns); for the default graph, the list of ``data_path`` (downloaded if absent), or
        ``annotated`` when given (GO files built from an annotation list every annotated gene)."""
        if self.gene_set_path is not None:
            return list(io.read_pickle(self.gene_set_path, "perturbation gene set"))
        if not self.default_pert_graph:
            perturbed = genes_of_conditions(adata.obs["condition"].astype(str).unique())
            return list(adata.var["gene_name"].astype(str)) + [str(gene) for gene in perturbed]
        if annotated is not None:
            return annotated
        path = download.ensure_go_file(ESSENTIAL_GENES_FILE, self.data_path)
        return list(io.read_pickle(path, "default perturbation gene list"))

    def genes(self, adata, gene2go: dict, from_annotation: bool = False) -> np.ndarray:
        """The perturbation vocabulary of the screen ``adata``: its candidates that ``gene2go``
        gives GO terms, sorted. ``from_annotation``: ``gene2go`` is an annotation the GO files
        are about to be built from, whose gene list will hold every gene it annotates."""
        return graphs.pert_vocabulary(gene2go, self.candidates(adata, sorted(gene2go) if from_annotation else None))

    def screen_vocabulary(
        self, annotations, folder_gene2go: Callable[[], dict], gene2go: dict | None, origin: str
    ) -> GoVocabulary:
        """The ``GoVocabulary`` a check of the screen ``annotations`` holds it to: that of
        ``gene2go`` (an annotation named ``origin``) when given, as the GO files built from it
        would make it, beside that of the data folder's GO files (``folder_gene2go`` reads
        them); the folder's alone otherwise, unknown when they are absent (nothing is
        downloaded)."""
        absent = [name for name in self.vocabulary_files() if download.local_go_file(name, self.data_path) is None]
        if absent:
            local = GoVocabulary(
                None,
                f"{self.data_path} lacks {', '.join(absent)}, which processing downloads; give "
                "the data folder that holds the GO files, or a GO annotation (gears-ddp check "
                "--go-gene-sets FILE.gmt or --go-annotation FILE.gaf)",
            )
        else:
            local = GoVocabulary(
                frozenset(self.genes(annotations, folder_gene2go())), f"the GO files of {self.data_path}"
            )
        if gene2go is None:
            return local
        return GoVocabulary(frozenset(self.genes(annotations, gene2go, from_annotation=True)), origin, local)


def cells_in_vocabulary(
    adata: anndata.AnnData, name: str, node_map_pert: dict, where: str, drop_unannotated: bool = True
) -> np.ndarray:
    """Which cells of dataset ``name`` (``adata``, GEARS's columns) the perturbation
    vocabulary ``node_map_pert`` (of GO terms from ``where``) can represent. The others'
    conditions are dropped with a warning naming them, or (``drop_unannotated=False``)
    refused naming their genes and the ways to keep them (``go_coverage``). The warning, and
    the count of genes in the vocabulary, are logged once a process (``log_once``): a command
    that processes a screen and then trains on it reads it twice."""
    conditions, codes = coded_conditions(adata.obs["condition"], f"dataset {name!r} obs['condition']")
    coverage = go_coverage(dict(zip(conditions, np.bincount(codes, minlength=len(conditions)).tolist())), node_map_pert)
    log_once(
        logger,
        logging.INFO,
        "dataset %s: %d of %d perturbed genes are in the perturbation vocabulary (genes with GO annotations)",
        name,
        len(coverage.perturbed) - len(coverage.outside),
        len(coverage.perturbed),
    )
    problems = coverage_problems(coverage, name, where, drop_unannotated)
    refuse(problems, f"dataset {name!r}")
    for warning in problems:
        log_once(logger, logging.WARNING, "%s", warning)
    return np.isin(np.asarray(conditions, dtype=object), coverage.kept)[codes]
