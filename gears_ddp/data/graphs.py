"""Gene graphs of GEARS: Gene Ontology similarity and co-expression.

- GO graph over the perturbation vocabulary: Jaccard similarity of two genes' GO term
  sets, pairs above 0.1 (self pairs included), then each target keeps its ``k + 1``
  highest-importance sources.
- Co-expression graph over measured genes: absolute Pearson correlation over the training
  cells of control and single-gene conditions; each target keeps its ``k + 1`` most
  correlated genes, edges above the threshold.

Edge lists are ``DataFrame(source, target, importance)`` as in the reference's CSV files;
``to_gene_graph`` turns one into tensors. Both computations are matrix products (sparse for
GO, chunked dense for correlations) rather than loops over gene pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.linalg import blas
import torch

GO_JACCARD_THRESHOLD = 0.1
EDGE_COLUMNS = ["source", "target", "importance"]


@dataclass(frozen=True)
class GeneGraph:
    """A weighted directed graph: ``edge_index`` (2 x E, long, source row first), ``edge_weight`` (E)."""

    edge_index: torch.Tensor
    edge_weight: torch.Tensor

    @property
    def num_edges(self) -> int:
        return int(self.edge_weight.numel())


def pert_vocabulary(gene2go: dict, candidate_genes) -> np.ndarray:
    """Sorted unique candidate genes that have GO annotations (the perturbation vocabulary)."""
    return np.unique([g for g in candidate_genes if g in gene2go]).astype(str)


def jaccard_edge_list(gene2go: dict, genes, threshold: float = GO_JACCARD_THRESHOLD) -> pd.DataFrame:
    """All gene pairs whose GO-term Jaccard similarity exceeds ``threshold`` (self pairs included)."""
    genes = [g for g in genes if g in gene2go and len(gene2go[g]) > 0]
    terms = sorted({t for g in genes for t in gene2go[g]})
    term_col = {t: i for i, t in enumerate(terms)}
    rows = np.repeat(np.arange(len(genes)), [len(gene2go[g]) for g in genes])
    cols = np.fromiter((term_col[t] for g in genes for t in gene2go[g]), dtype=np.int64, count=len(rows))
    membership = sp.csr_matrix((np.ones(len(rows), dtype=np.float64), (rows, cols)),
                               shape=(len(genes), len(terms)))
    intersection = (membership @ membership.T).tocoo()
    sizes = np.asarray(membership.sum(axis=1)).ravel()
    jaccard = intersection.data / (sizes[intersection.row] + sizes[intersection.col] - intersection.data)
    keep = jaccard > threshold
    names = np.asarray(genes, dtype=object)
    return pd.DataFrame({"source": names[intersection.row[keep]], "target": names[intersection.col[keep]],
                         "importance": jaccard[keep]})


def top_sources_per_target(edges: pd.DataFrame, k: int) -> pd.DataFrame:
    """Keep each target's ``k + 1`` highest-importance edges (ties: first listed wins)."""
    ordered = edges.sort_values(["target", "importance"], ascending=[True, False], kind="stable")
    return ordered.groupby("target", sort=False).head(k + 1).reset_index(drop=True)


def go_edge_list(go_edges: pd.DataFrame, vocabulary, k: int) -> pd.DataFrame:
    """GO edges restricted to the vocabulary, then the top ``k + 1`` sources per target."""
    known = set(vocabulary)
    inside = go_edges["source"].isin(known) & go_edges["target"].isin(known)
    return top_sources_per_target(go_edges.loc[inside, EDGE_COLUMNS], k)


def gene_correlation(expression, rows: np.ndarray, elements_per_chunk: int = 2**20) -> np.ndarray:
    """Absolute Pearson correlation between genes over the cells ``rows`` (NaN -> 0).

    ``expression`` is a (cells x genes) tensor or array. Cells are read in chunks of about
    ``elements_per_chunk`` values and the sums are accumulated in float64, so no dense copy
    of the selected cells is made; the (genes x genes) result is then formed in place, a
    block of genes at a time, so the peak is about one float64 genes x genes matrix instead
    of several.
    """
    n_genes = expression.shape[1]
    cells_per_chunk = max(1, elements_per_chunk // n_genes)
    total = np.zeros(n_genes)
    gram = np.zeros((n_genes, n_genes))
    for start in range(0, len(rows), cells_per_chunk):
        chunk = rows[start:start + cells_per_chunk]
        block = expression[torch.as_tensor(chunk)].numpy() if torch.is_tensor(expression) else expression[chunk]
        block = np.asarray(block, dtype=np.float64)
        total += block.sum(axis=0)
        # gram += block.T @ block in place (the symmetric gram's transpose is its Fortran-order view)
        blas.dgemm(1.0, block, block, beta=1.0, c=gram.T, trans_a=1, overwrite_c=1)
    n = len(rows)
    scale = np.sqrt(np.clip(np.diag(gram) - total * total / n, 0, None))
    scale[scale == 0] = np.inf  # a constant gene correlates 0 with every gene
    for genes in _row_blocks(gram, elements_per_chunk):
        gram[genes] -= np.outer(total[genes], total) / n
        gram[genes] /= np.outer(scale[genes], scale)
    np.clip(gram, -1.0, 1.0, out=gram)
    return np.abs(gram, out=gram)


def _row_blocks(matrix: np.ndarray, elements_per_block: int):
    """Slices of consecutive rows of ``matrix``, about ``elements_per_block`` values each."""
    rows_per_block = max(1, elements_per_block // matrix.shape[1])
    return [slice(start, start + rows_per_block) for start in range(0, matrix.shape[0], rows_per_block)]


def coexpression_edge_list(expression, rows: np.ndarray, gene_names, threshold: float, k: int,
                           elements_per_chunk: int = 2**20) -> pd.DataFrame:
    """For each target gene, its ``k + 1`` most correlated genes with correlation above
    ``threshold`` (``elements_per_chunk``: see ``gene_correlation``)."""
    corr = gene_correlation(expression, rows, elements_per_chunk)
    # per block of target genes; copied, as a view would keep the block's whole argsort alive
    top = np.concatenate([np.argsort(corr[genes], axis=1)[:, -(k + 1):].copy()
                          for genes in _row_blocks(corr, elements_per_chunk)])
    values = np.take_along_axis(corr, top, axis=1)
    targets = np.repeat(np.arange(corr.shape[0]), top.shape[1])
    sources, values = top.ravel(), values.ravel()
    keep = values > threshold
    names = np.asarray(gene_names, dtype=object)
    return pd.DataFrame({"source": names[sources[keep]], "target": names[targets[keep]],
                         "importance": values[keep]})


def read_edge_list(path, what: str, advice: str) -> pd.DataFrame:
    """The edge list (``source``, ``target``, ``importance``) in the CSV file ``path``; a file
    that is not one is refused with an error naming it, ``what`` it should be, and ``advice``."""
    try:
        edges = pd.read_csv(path)
    except Exception as err:  # pandas and codecs raise many types for a file of another kind
        raise ValueError(f"cannot read the {what} {path} ({type(err).__name__}: {err}); {advice}") from None
    missing = [column for column in EDGE_COLUMNS if column not in edges.columns]
    if missing or not pd.api.types.is_numeric_dtype(edges["importance"]):
        raise ValueError(f"{path} is not a {what}: it needs the columns {', '.join(EDGE_COLUMNS)} (numeric "
                         f"importance), and has {list(edges.columns)[:10]}; {advice}")
    return edges


def to_gene_graph(edges: pd.DataFrame, node_index: dict) -> GeneGraph:
    """Tensors of an edge list whose genes are all in ``node_index`` (gene -> node id)."""
    unknown = sorted((set(edges["source"]) | set(edges["target"])) - set(node_index))
    if unknown:
        raise ValueError(f"graph edges name genes outside the node set: {unknown[:10]}")
    edges = edges.drop_duplicates(["source", "target"])
    index = np.stack([edges["source"].map(node_index).to_numpy(np.int64),
                      edges["target"].map(node_index).to_numpy(np.int64)])
    return GeneGraph(torch.from_numpy(index),
                     torch.tensor(edges["importance"].to_numpy(np.float32)))
