"""Gene graphs: vectorised computations equal straightforward ones and the published GEARS."""

import itertools
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import toy_data
from reference_package import import_reference

from gears_ddp import PertData
from gears_ddp.data import graphs
from gears_ddp.data.conditions import CONTROL


def _naive_coexpression(x, gene_names, threshold, k):
    corr = np.abs(np.nan_to_num(np.corrcoef(x.T.astype(np.float64))))
    rows = []
    for target in range(corr.shape[0]):
        best = sorted(range(corr.shape[0]), key=lambda s: corr[target, s])[-(k + 1) :]
        rows += [(gene_names[s], gene_names[target], corr[target, s]) for s in best if corr[target, s] > threshold]
    return pd.DataFrame(rows, columns=graphs.EDGE_COLUMNS)


def _as_set(edges):
    return {(s, t): w for s, t, w in edges[graphs.EDGE_COLUMNS].itertuples(index=False)}


@pytest.mark.parametrize(
    "cells_per_block, panel_elements, merge_rows", [(4096, 2**25, 2048), (7, 64, 3), (11, 300, 2048)]
)
def test_coexpression_equals_straightforward_computation(cells_per_block, panel_elements, merge_rows, monkeypatch):
    """In one block of cells and one panel of genes; in blocks of 7 cells and panels of 2
    genes (15 panels, each correlation merged into both its genes' top lists, 3 rows at a
    time); in blocks of 11 and panels of 10 genes."""
    monkeypatch.setattr(graphs, "PANEL_ELEMENTS", panel_elements)
    monkeypatch.setattr(graphs, "MERGE_ROWS", merge_rows)
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(300, 4))
    x = np.abs(latent @ rng.normal(size=(4, 30)) + rng.normal(scale=0.7, size=(300, 30))).astype(np.float32)
    x[:, 7] = 0.0  # a constant gene: NaN correlations count as 0
    names = [f"g{i}" for i in range(30)]
    rows = np.arange(0, 300, 2)
    ours = _as_set(
        graphs.coexpression_edge_list(
            torch.from_numpy(x), rows, names, threshold=0.3, k=5, cells_per_block=cells_per_block
        )
    )
    naive = _as_set(_naive_coexpression(x[rows], names, threshold=0.3, k=5))
    assert set(ours) == set(naive) and len(ours) > 30
    assert all(abs(ours[e] - naive[e]) < 1e-6 for e in ours)


def test_coexpression_with_fewer_genes_than_k_lists_each_gene_once():
    """4 genes and k = 5: each target lists the 4 genes (the top lists' unused places, -1,
    never become edges), even at a threshold below every correlation (thresholds are
    correlations in [0, 1])."""
    x = np.random.default_rng(3).random((50, 4)).astype(np.float32)
    edges = graphs.coexpression_edge_list(torch.from_numpy(x), np.arange(50), list("abcd"), threshold=-0.5, k=5)
    assert sorted(zip(edges["source"], edges["target"])) == sorted((s, t) for s in "abcd" for t in "abcd")


def test_jaccard_equals_pairwise_loop():
    rng = np.random.default_rng(1)
    gene2go = {f"g{i}": {f"GO:{t}" for t in rng.choice(12, rng.integers(1, 5), replace=False)} for i in range(25)}
    genes = list(gene2go) + ["not_annotated"]
    ours = _as_set(graphs.jaccard_edge_list(gene2go, genes))
    naive = {}
    for a, b in itertools.product(gene2go, repeat=2):
        score = len(gene2go[a] & gene2go[b]) / len(gene2go[a] | gene2go[b])
        if score > 0.1:
            naive[(a, b)] = score
    assert set(ours) == set(naive) and ours[("g0", "g0")] == 1.0
    assert all(abs(ours[e] - naive[e]) < 1e-12 for e in ours)


def test_top_sources_per_target_equals_nlargest():
    rng = np.random.default_rng(2)
    edges = pd.DataFrame(
        {
            "source": rng.choice(list("abcdefgh"), 200),
            "target": rng.choice(list("wxyz"), 200),
            "importance": rng.integers(0, 6, 200) / 5,
        }
    ).drop_duplicates(["source", "target"])
    ours = graphs.top_sources_per_target(edges, k=2)
    expected = edges.groupby("target")[["source", "importance"]].apply(lambda g: g.nlargest(3, "importance"))
    assert len(ours) == len(expected) == 12
    for target, group in ours.groupby("target"):
        reference = expected.loc[target]
        assert sorted(group["importance"]) == sorted(reference["importance"])
        assert set(group["source"]) == set(reference["source"])


@pytest.mark.parametrize("n_targets", [50, 70_000])  # codes of 16 bits (a radix sort) and wider
def test_top_rows_per_target_are_those_of_one_lexicographic_sort(n_targets):
    rng = np.random.default_rng(n_targets)
    targets = rng.integers(0, n_targets, 20_000)
    importance = rng.integers(0, 8, 20_000) / 7  # many ties: the first listed must win
    order = np.lexsort((-importance, targets))
    sorted_targets = targets[order]
    expected = order[np.arange(len(order)) - np.searchsorted(sorted_targets, sorted_targets) <= 3]
    np.testing.assert_array_equal(graphs._top_rows_per_target(targets, importance, 3), expected)


def test_edge_lists_are_written_as_pandas_writes_them_and_read_back_exactly(tmp_path):
    rng = np.random.default_rng(3)
    names = np.array(["A1", "B,2", 'C"3', "D\n4", "E5"], dtype=object)
    edges = pd.DataFrame(
        {"source": rng.choice(names, 300), "target": rng.choice(names, 300), "importance": rng.random(300)}
    )
    graphs.write_edge_list(edges, tmp_path / "ours.csv")
    edges.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_text() == (tmp_path / "pandas.csv").read_text()
    # float32 importances (the co-expression graph's) read back to the same float32 values
    edges["importance"] = edges["importance"].astype(np.float32)
    graphs.write_edge_list(edges, tmp_path / "single.csv")
    back = graphs.read_edge_list(tmp_path / "single.csv", "graph", "")
    assert back["source"].astype(str).tolist() == edges["source"].tolist()
    assert back["target"].astype(str).tolist() == edges["target"].tolist()
    np.testing.assert_array_equal(back["importance"].to_numpy(np.float32), edges["importance"].to_numpy())


def test_coexpression_graph_uses_training_control_and_single_cells(toy):
    train = toy.set2conditions["train"]
    used = [c for c in train if c == CONTROL or "ctrl" in c.split("+")]
    rows = toy.adata.obs["condition"].astype(str).isin(used).to_numpy()
    naive = _as_set(_naive_coexpression(toy.adata.X[rows], list(toy.gene_names), 0.4, 20))
    graph = toy.coexpression_graph()
    index = graph.edge_index.numpy()
    ours = {(toy.gene_names.iloc[s], toy.gene_names.iloc[t]) for s, t in index.T}
    assert ours == set(naive)
    cached = list(Path(toy.dataset_path).glob("*co_expression_network.csv"))
    assert len(cached) == 1 and cached[0].name == "simulation_1_0.75_0.4_20_co_expression_network.csv"


def test_go_graph_keeps_top_k_plus_one_sources_within_vocabulary(toy):
    graph = toy.go_graph(k=3)
    targets = graph.edge_index[1]
    assert int(torch.bincount(targets).max()) <= 4
    assert int(graph.edge_index.max()) < len(toy.pert_names)
    assert bool(((graph.edge_weight > 0.1) & (graph.edge_weight <= 1)).all())


def test_go_graph_is_cached_for_the_vocabulary_and_rebuilt_when_the_go_edges_change(toy, monkeypatch):
    source = Path(toy.data_path) / "go_essential_all" / "go_essential_all.csv"
    first = toy.go_graph(k=3)
    cache = Path(toy.dataset_path) / "go_graph_3.csv"
    assert cache.is_file() and len(pd.read_csv(cache)) == first.num_edges
    read = graphs.read_edge_list

    def only_the_cache(path, *args):
        assert Path(path) != source, "the whole GO edge list was read again"
        return read(path, *args)

    monkeypatch.setattr(graphs, "read_edge_list", only_the_cache)
    again = toy.go_graph(k=3)
    assert torch.equal(again.edge_index, first.edge_index) and torch.equal(again.edge_weight, first.edge_weight)
    monkeypatch.setattr(graphs, "read_edge_list", read)
    edges = pd.read_csv(source)
    edges = edges[edges["source"] != edges["target"]]  # the self edges gone: another GO graph
    edges.to_csv(source, index=False)
    changed = toy.go_graph(k=3)
    assert not torch.equal(changed.edge_index, first.edge_index)
    assert bool((changed.edge_index[0] != changed.edge_index[1]).all())


def test_go_graph_computed_for_custom_vocabulary(data_root):
    pert_data = PertData(data_root, default_pert_graph=False)
    pert_data.new_data_process("toy", toy_data.make_raw())
    graph = pert_data.go_graph(k=20)
    assert (data_root / "toy" / "go_essential_toy.csv").exists()
    expected = graphs.go_edge_list(
        graphs.jaccard_edge_list(pert_data.gene2go, pert_data.pert_names), pert_data.pert_names, 20
    )
    assert graph.num_edges == len(expected)


def test_coexpression_matches_published_gears(toy, tmp_path):
    utils = import_reference("gears.utils")
    adata = toy.adata.copy()
    adata.X = sp.csr_matrix(adata.X)  # the reference calls .toarray() on X
    (tmp_path / "reference" / "toy").mkdir(parents=True)
    reference = _as_set(
        utils.get_coexpression_network_from_train(
            adata, 0.4, 20, str(tmp_path / "reference"), "toy", "simulation", 1, 0.75, toy.set2conditions
        )
    )
    ours = toy.coexpression_graph()
    ours = {
        (toy.gene_names.iloc[s], toy.gene_names.iloc[t]): float(w)
        for (s, t), w in zip(ours.edge_index.numpy().T, ours.edge_weight.numpy())
    }
    assert set(ours) == set(reference) and len(ours) > len(toy.gene_names)
    assert max(abs(ours[e] - reference[e]) for e in ours) < 1e-4


def test_go_graph_matches_published_gears(toy):
    """The published package's GO graph from the same GO files: top k + 1 sources per
    target by Jaccard importance, as node indices of the perturbation vocabulary."""
    utils = import_reference("gears.utils", runs_data_code=True)
    edges = utils.get_similarity_network(
        "go", toy.adata, None, 3, str(toy.data_path), "toy", "simulation", 1, 0.75, toy.set2conditions
    )
    network = utils.GeneSimNetwork(edges, toy.pert_names, toy.node_map_pert)
    reference = {
        (toy.pert_names[s], toy.pert_names[t]): float(w)
        for (s, t), w in zip(network.edge_index.numpy().T, network.edge_weight.numpy())
    }
    ours = toy.go_graph(k=3)
    ours = {
        (toy.pert_names[s], toy.pert_names[t]): float(w)
        for (s, t), w in zip(ours.edge_index.numpy().T, ours.edge_weight.numpy())
    }
    assert set(ours) == set(reference) and len(ours) > len(toy.pert_names)
    assert max(abs(ours[e] - reference[e]) for e in ours) < 1e-6


def test_unknown_gene_in_edges_is_named():
    edges = pd.DataFrame({"source": ["a", "zz"], "target": ["a", "a"], "importance": [1.0, 0.5]})
    with pytest.raises(ValueError, match=r"outside the node set: \['zz'\]"):
        graphs.to_gene_graph(edges, {"a": 0})


def test_custom_split_graphs_are_not_cached_under_an_ambiguous_name(toy, tmp_path):
    split_file = tmp_path / "my_split.pkl"
    split_file.write_bytes(
        pickle.dumps({"train": ["ctrl", "G0+ctrl", "G1+ctrl", "G2+ctrl"], "val": ["G3+ctrl"], "test": ["G4+ctrl"]})
    )
    toy.prepare_split("custom", split_dict_path=split_file)
    before = set(Path(toy.dataset_path).glob("*co_expression_network.csv"))
    assert toy.coexpression_graph().num_edges >= len(toy.gene_names)
    assert set(Path(toy.dataset_path).glob("*co_expression_network.csv")) == before
