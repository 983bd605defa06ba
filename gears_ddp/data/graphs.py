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
import torch

GO_JACCARD_THRESHOLD = 0.1
PANEL_ELEMENTS = 2**25  # gene correlations held at a time (128 MiB of float32)
MERGE_ROWS = 2048  # rows of correlations merged into the top lists at a time
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
    membership = sp.csr_matrix((np.ones(len(rows), dtype=np.float64), (rows, cols)), shape=(len(genes), len(terms)))
    intersection = (membership @ membership.T).tocoo()
    sizes = np.asarray(membership.sum(axis=1)).ravel()
    jaccard = intersection.data / (sizes[intersection.row] + sizes[intersection.col] - intersection.data)
    keep = jaccard > threshold
    names = np.asarray(genes, dtype=object)
    return pd.DataFrame(
        {"source": names[intersection.row[keep]], "target": names[intersection.col[keep]], "importance": jaccard[keep]}
    )


def top_sources_per_target(edges: pd.DataFrame, k: int) -> pd.DataFrame:
    """Keep each target's ``k + 1`` highest-importance edges (ties: first listed wins),
    ordered by target, then by importance."""
    targets = pd.factorize(edges["target"], sort=True)[0]
    return edges.iloc[_top_rows_per_target(targets, edges["importance"].to_numpy(), k)].reset_index(drop=True)


def _top_rows_per_target(targets: np.ndarray, importance: np.ndarray, k: int) -> np.ndarray:
    """Positions of each target's ``k + 1`` highest-importance rows (ties: first listed
    wins), ordered by target code, then by importance.

    Two stable sorts, by importance and then by target code (a radix sort for codes that
    fit 16 bits), give the order of one lexicographic sort at about half its time."""
    by_importance = np.argsort(-importance, kind="stable")
    codes = targets[by_importance]
    if len(codes) and 0 <= codes.min() and codes.max() < 2**16:
        codes = codes.astype(np.uint16)
    order = by_importance[np.argsort(codes, kind="stable")]
    sorted_targets = targets[order]
    rank_within_target = np.arange(len(order)) - np.searchsorted(sorted_targets, sorted_targets)
    return order[rank_within_target <= k]


def go_edge_list(go_edges: pd.DataFrame, vocabulary, k: int) -> pd.DataFrame:
    """GO edges restricted to the vocabulary, then the top ``k + 1`` sources per target
    (ordered by target, then by importance)."""
    known = pd.Index(vocabulary)
    sources, targets = _positions_in(known, go_edges["source"]), _positions_in(known, go_edges["target"])
    inside = np.flatnonzero((sources >= 0) & (targets >= 0))
    importance = go_edges["importance"].to_numpy()[inside]
    name_order = np.empty(len(known), dtype=np.int64)
    name_order[known.argsort()] = np.arange(len(known))  # targets ordered by name
    top = inside[_top_rows_per_target(name_order[targets[inside]], importance, k)]
    return pd.DataFrame(
        {
            "source": known[sources[top]].to_numpy(object),
            "target": known[targets[top]].to_numpy(object),
            "importance": go_edges["importance"].to_numpy()[top],
        }
    )


def _positions_in(index: pd.Index, column: pd.Series) -> np.ndarray:
    """Each value's position in ``index`` (-1 when absent); a categorical column is looked
    up by its categories, once each."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        positions = np.append(index.get_indexer(column.cat.categories), -1)  # code -1 (missing) -> -1
        return positions[codes]
    return index.get_indexer(column)


def top_correlations(expression, rows: np.ndarray, n_top: int, cells_per_block: int = 2048):
    """Each gene's ``n_top`` most correlated genes (itself among them) by absolute Pearson
    correlation over the cells ``rows`` (NaN -> 0): float32 values and gene indices, genes x
    ``n_top``, each row from the most to the least correlated.

    In float32 from centred values, as the published GEARS computes the correlation, without
    ever holding the genes x genes matrix (1.2 GiB at 18,000 genes, 3.6 at 30,000): the genes
    are taken a panel at a time (``PANEL_ELEMENTS`` correlations), a panel's correlations with
    itself and the genes after it summed over blocks of ``cells_per_block`` cells (a pass over
    the cells per panel; the selected cells are never copied whole), and each correlation
    counts for both its genes' lists, which are kept as running top lists. Memory: a panel, a
    block of cells and the lists, whatever the numbers of genes and cells.
    """
    n_genes = expression.shape[1]
    blocks = [rows[start : start + cells_per_block] for start in range(0, len(rows), cells_per_block)]

    def shifted_blocks(shift: np.ndarray):
        """The blocks of cells, float32, each value minus ``shift`` (its gene's): the copy that
        indexing by rows makes, shifted in place."""
        for block in blocks:
            values = expression[torch.as_tensor(block)].numpy() if torch.is_tensor(expression) else expression[block]
            values = np.asarray(values, dtype=np.float32)
            values -= shift
            yield torch.from_numpy(values)

    cells = max(len(rows), 1)
    mean = (sum(block.sum(0, dtype=torch.float64) for block in shifted_blocks(np.float32(0))) / cells).float().numpy()
    scale = sum(block.square().sum(0, dtype=torch.float64) for block in shifted_blocks(mean)).sqrt().float()
    scale[scale == 0] = torch.inf  # a constant gene correlates 0 with every gene
    top_values = torch.full((n_genes, n_top), -1.0)  # below any correlation: replaced first
    top_genes = torch.full((n_genes, n_top), -1, dtype=torch.long)
    panel_genes = max(1, PANEL_ELEMENTS // n_genes)
    for first in range(0, n_genes, panel_genes):
        last = min(first + panel_genes, n_genes)
        panel = torch.zeros(last - first, n_genes - first)  # genes first:last x genes first:
        for block in shifted_blocks(mean):
            _add_panel_products(panel, block, first, last)
        panel.div_(torch.outer(scale[first:last], scale[first:])).clamp_(-1.0, 1.0).abs_()
        later = torch.arange(first, n_genes)
        _keep_top(top_values, top_genes, slice(first, last), panel, later)  # the panel's genes: now complete
        _keep_top(top_values, top_genes, slice(last, n_genes), panel[:, last - first :].T, later[: last - first])
    return top_values, top_genes


def _add_panel_products(panel: torch.Tensor, block: torch.Tensor, first: int, last: int) -> None:
    """``panel += block[:, first:last].T @ block[:, first:]``: a block of centred cells' share of
    the panel's sums of products (the correlations' matrix products, BLAS sgemm)."""
    panel.addmm_(block[:, first:last].T, block[:, first:])


def _keep_top(top_values, top_genes, genes: slice, values: torch.Tensor, columns: torch.Tensor) -> None:
    """Merge the correlations ``values`` (rows ``genes`` x ``columns``, their gene indices) into
    the rows' running top lists, in place, ``MERGE_ROWS`` rows at a time (a merge copies its
    rows)."""
    n_top = top_values.shape[1]
    for start in range(0, values.shape[0], MERGE_ROWS):
        part = slice(genes.start + start, min(genes.start + start + MERGE_ROWS, genes.stop))
        rows = values[start : start + MERGE_ROWS]
        best = torch.cat([top_values[part], rows], dim=1).topk(n_top, dim=1)
        kept = best.indices < n_top  # from the list, else from ``rows``
        top_genes[part] = torch.where(
            kept,
            top_genes[part].gather(1, best.indices.clamp(max=n_top - 1)),
            columns[(best.indices - n_top).clamp(min=0)],
        )
        top_values[part] = best.values


def coexpression_edge_list(
    expression, rows: np.ndarray, gene_names, threshold: float, k: int, cells_per_block: int = 2048
) -> pd.DataFrame:
    """For each target gene, its ``k + 1`` most correlated genes with correlation above
    ``threshold``, listed per target from the least to the most correlated, as the published
    GEARS lists them (``cells_per_block``: see ``top_correlations``)."""
    values, sources = (part.flip(1).numpy() for part in top_correlations(expression, rows, k + 1, cells_per_block))
    targets = np.repeat(np.arange(values.shape[0]), values.shape[1])
    sources, values = sources.ravel(), values.ravel()
    keep = values > threshold  # with fewer than k + 1 genes the lists' unused places hold -1: never kept
    names = np.asarray(gene_names, dtype=object)
    return pd.DataFrame({"source": names[sources[keep]], "target": names[targets[keep]], "importance": values[keep]})


def read_edge_list(path, what: str, advice: str) -> pd.DataFrame:
    """The edge list (``source``, ``target``, ``importance``) in the CSV file ``path``; a file
    that is not one is refused with an error naming it, ``what`` it should be, and ``advice``."""
    try:
        # in one piece (low_memory=False): no chunks of categories to merge after the parse
        edges = pd.read_csv(path, dtype={"source": "category", "target": "category"}, low_memory=False)
    except Exception as err:  # pandas and codecs raise many types for a file of another kind
        # pandas 3's parser errors end with a line break: the message stays on one line
        raise ValueError(
            f"cannot read the {what} {path} ({type(err).__name__}: {str(err).strip()}); {advice}"
        ) from None
    missing = [column for column in EDGE_COLUMNS if column not in edges.columns]
    if missing or not pd.api.types.is_numeric_dtype(edges["importance"]):
        raise ValueError(
            f"{path} is not a {what}: it needs the columns {', '.join(EDGE_COLUMNS)} (numeric "
            f"importance), and has {list(edges.columns)[:10]}; {advice}"
        )
    return edges


def write_edge_list(edges: pd.DataFrame, path) -> None:
    """Write ``edges`` to ``path`` as the CSV that ``read_edge_list`` and the published GEARS
    read (``source,target,importance``, names quoted only where CSV needs it): each
    importance as the shortest text that reads back to its value, as pandas writes a
    float64, in a third of ``DataFrame.to_csv``'s time (one formatted line per edge)."""
    codes, names = pd.factorize(
        pd.concat([edges["source"].astype(object), edges["target"].astype(object)], ignore_index=True)
    )
    fields = [_csv_field(str(name)) for name in names]
    sources, targets = codes[: len(edges)].tolist(), codes[len(edges) :].tolist()
    with open(path, "w", encoding="utf-8") as file:
        file.write(",".join(EDGE_COLUMNS) + "\n")
        file.writelines(
            f"{fields[source]},{fields[target]},{importance!r}\n"
            for source, target, importance in zip(sources, targets, edges["importance"].tolist())
        )


def _csv_field(text: str) -> str:
    """``text`` as one CSV field: quoted, its quotes doubled, when it holds a comma, a quote
    or a line break (pandas' and the csv module's minimal quoting)."""
    if any(character in text for character in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def to_gene_graph(edges: pd.DataFrame, node_index: dict) -> GeneGraph:
    """Tensors of an edge list whose genes are all in ``node_index`` (gene -> node id)."""
    unknown = sorted((set(edges["source"]) | set(edges["target"])) - set(node_index))
    if unknown:
        raise ValueError(f"graph edges name genes outside the node set: {unknown[:10]}")
    edges = edges.drop_duplicates(["source", "target"])
    index = np.stack(
        [edges["source"].map(node_index).to_numpy(np.int64), edges["target"].map(node_index).to_numpy(np.int64)]
    )
    return GeneGraph(torch.from_numpy(index), torch.tensor(edges["importance"].to_numpy(np.float32)))
