"""A dataset's gene graphs, built once and cached in its folder.

``graphs`` computes the two graphs GEARS reads; this module keeps them in the dataset
folder, so that the ranks of a run and later runs read them instead of building them again.
A cache's name holds only some of what it was built from, so the rest is written beside it
(``cache_settings``) and a cache built from other inputs is built again:

- the co-expression graph, under the reference's
  ``<split>_<seed>_<size>_<threshold>_<k>_co_expression_network.csv``, with the training
  conditions it was built from (never cached for a custom split, whose name cannot tell
  split files apart);
- the GO graph of the default vocabulary, ``go_graph_<k>.csv``, with the size and time of
  the data folder's GO edge list and the vocabulary; the GO graph of a dataset's own
  vocabulary, ``go_essential_<dataset>.csv`` (its Jaccard edges, as the reference caches
  them).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import numpy as np

from gears_ddp._logging import get_logger
from gears_ddp.data import cache_settings, download, graphs, io
from gears_ddp.data.cells import CellTable
from gears_ddp.data.conditions import CONTROL, is_single
from gears_ddp.data.go_files import GO_EDGES_NAME

logger = get_logger(__name__)

CACHE_ADVICE = "it is a cache of this dataset folder: delete it and it is built again"
GO_EDGES_ADVICE = (
    "replace it: delete it to download it again, or build it with gears-ddp process --go-annotation or --go-gene-sets"
)


def coexpression_graph(
    cells: CellTable,
    gene_names: np.ndarray,
    node_map: dict,
    train_conditions: list[str],
    dataset_path,
    split: str | None,
    seed: int | None,
    train_gene_set_size: float | None,
    threshold: float,
    k: int,
) -> graphs.GeneGraph:
    """The co-expression graph of the measured genes ``gene_names`` (placed by
    ``node_map``) over the cells of control and the single conditions among
    ``train_conditions`` (those of the split ``split``, ``seed``, ``train_gene_set_size``;
    None for conditions not split by ``prepare_split``),
    read from or written to its cache in ``dataset_path`` when it was built from the same
    conditions; a cache without them is used on its name."""
    cache = Path(dataset_path) / f"{split}_{seed}_{train_gene_set_size}_{threshold}_{k}_co_expression_network.csv"
    use_cache = split != "custom"  # the name cannot tell custom split files apart
    conditions = [c for c in train_conditions if c == CONTROL or is_single(c)]
    settings = {"training_conditions_sha256": hashlib.sha256("\n".join(sorted(conditions)).encode()).hexdigest()}
    cached = use_cache and cache.exists()
    if cached and not cache_settings.differences(cache, settings):
        return graphs.to_gene_graph(graphs.read_edge_list(cache, "co-expression graph", CACHE_ADVICE), node_map)
    if cached:
        logger.info("cached co-expression graph %s was built from other training conditions: building it again", cache)
    rows = cells.cells_of(conditions).numpy()
    edges = graphs.coexpression_edge_list(cells.expression, rows, gene_names, threshold, k)
    if use_cache:
        _cache_edges(cache, edges, settings)
    return graphs.to_gene_graph(edges, node_map)


def default_go_graph(data_path, dataset_path, pert_names: np.ndarray, node_map_pert: dict, k: int) -> graphs.GeneGraph:
    """The GO graph of the published vocabulary's genes ``pert_names`` (placed by
    ``node_map_pert``; top ``k + 1`` sources per gene), from the GO edge list of
    ``data_path`` (``go_essential_all.csv``, every annotated gene's edges; downloaded if
    absent), cached in ``dataset_path`` as ``go_graph_<k>.csv``."""
    source = download.ensure_go_file(GO_EDGES_NAME, data_path)
    cache = Path(dataset_path) / f"go_graph_{k}.csv"
    stat = source.stat()
    settings = {
        "go_edges_size": stat.st_size,
        "go_edges_mtime_ns": stat.st_mtime_ns,
        "vocabulary_sha256": hashlib.sha256("\n".join(pert_names).encode()).hexdigest(),
    }
    if (
        cache.exists()
        and cache_settings.settings_path(cache).is_file()
        and not cache_settings.differences(cache, settings)
    ):
        edges = graphs.read_edge_list(cache, "GO graph", CACHE_ADVICE)
    else:
        edges = graphs.go_edge_list(graphs.read_edge_list(source, "GO graph", GO_EDGES_ADVICE), pert_names, k)
        _cache_edges(cache, edges, settings)
    return graphs.to_gene_graph(edges, node_map_pert)


def dataset_go_graph(
    gene2go: Callable[[], dict], dataset_path, dataset_name: str, pert_names: np.ndarray, node_map_pert: dict, k: int
) -> graphs.GeneGraph:
    """The GO graph of a dataset's own vocabulary ``pert_names`` (placed by
    ``node_map_pert``; top ``k + 1`` sources per gene): the Jaccard similarity of the GO
    terms ``gene2go()`` gives (read only when the graph is not cached), cached in
    ``dataset_path`` as ``go_essential_<dataset_name>.csv``."""
    cache = Path(dataset_path) / f"go_essential_{dataset_name}.csv"
    if cache.exists():
        edges = graphs.read_edge_list(cache, "GO graph", CACHE_ADVICE)
    else:
        edges = graphs.jaccard_edge_list(gene2go(), pert_names)
        _cache_edges(cache, edges)
    return graphs.to_gene_graph(graphs.go_edge_list(edges, pert_names, k), node_map_pert)


def _cache_edges(cache: Path, edges, settings: dict | None = None) -> None:
    """Write the edge list ``edges`` to the CSV file ``cache`` atomically, with the
    ``settings`` it was built with beside it (``cache_settings``), if any."""
    cache_settings.forget(cache)
    with io.atomic_path(cache) as tmp:
        graphs.write_edge_list(edges, tmp)
    if settings is not None:
        cache_settings.write_settings(cache, settings)
