"""The split cache of ``PertData.prepare_split``: a cached split is reused only for the
settings it was built with, and a split file of the published GEARS (which writes no
settings) is still read when its name matches."""

import logging
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch
import toy_data

from gears_ddp import PertData
from gears_ddp.data.splits import split_conditions

DEFAULTS = {
    "train_gene_set_size": 0.75,
    "combo_seen2_train_frac": 0.75,
    "combo_single_split_test_set_fraction": 0.1,
    "test_perts": None,
    "only_test_set_perts": False,
    "test_pert_genes": None,
}

# (split, the settings of the first call, the one setting the second call changes); none of
# these settings is part of the split file's name
CHANGES = [
    ("simulation", {}, {"combo_seen2_train_frac": 0.25}),
    ("single", {}, {"combo_single_split_test_set_fraction": 0.3}),
    ("simulation", {"test_perts": "G0_G1"}, {"only_test_set_perts": True}),
    ("single", {}, {"test_pert_genes": "G3"}),
]


@pytest.fixture
def screen(data_root):
    """30 single perturbations and 12 combinations: enough for every split type to fill val
    and test with one seed."""
    combos = toy_data.COMBOS + ["G10+G11", "G12+G20", "G13+G14", "G3+G25"]
    pert_data = PertData(data_root)
    pert_data.new_data_process(
        "screen",
        toy_data.make_raw(n_ctrl=40, cells_per_condition=3, combos=combos, singles=[f"G{i}+ctrl" for i in range(30)]),
        skip_calc_de=True,
    )
    return pert_data


def _fresh_split(pert_data, split, settings):
    """What ``split_conditions`` gives for these settings, without any cache."""
    options = {**DEFAULTS, **settings}
    for name in ("test_perts", "test_pert_genes"):
        if isinstance(options[name], str):
            options[name] = options[name].split("_")
    return split_conditions(pert_data.cells.conditions, split, 1, **options)


@pytest.mark.parametrize("split,first,change", CHANGES, ids=[next(iter(c)) for _, _, c in CHANGES])
def test_a_setting_outside_the_file_name_is_not_answered_from_the_cache(screen, split, first, change, caplog):
    expected = _fresh_split(screen, split, {**first, **change})
    assert expected.set2conditions != _fresh_split(screen, split, first).set2conditions  # the change matters
    screen.prepare_split(split, seed=1, **first)
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        screen.prepare_split(split, seed=1, **first, **change)
    assert screen.set2conditions == expected.set2conditions
    assert screen.subgroup == expected.subgroup
    assert next(iter(change)) in caplog.text  # the log says which setting differed
    screen.prepare_split(split, seed=1, **first)  # and back: the cache now holds the other settings
    assert screen.set2conditions == _fresh_split(screen, split, first).set2conditions


def test_the_same_settings_read_the_cache_without_writing_it(screen):
    screen.prepare_split("single", seed=1, combo_single_split_test_set_fraction=0.3)
    files = {p: p.stat().st_mtime_ns for p in (Path(screen.dataset_path) / "splits").iterdir()}
    assert any(p.suffix == ".json" for p in files)
    screen.prepare_split("single", seed=1, combo_single_split_test_set_fraction=0.3)
    assert {p: p.stat().st_mtime_ns for p in (Path(screen.dataset_path) / "splits").iterdir()} == files


def test_a_split_file_without_settings_is_used_when_its_name_matches(screen):
    """The published GEARS writes the split pickle alone; such a file is read as it is."""
    folder = Path(screen.dataset_path) / "splits"
    conditions = screen.cells.conditions
    singles = [c for c in conditions if c.endswith("+ctrl")]
    written = {"train": ["ctrl"] + singles[:6], "val": singles[6:8], "test": singles[8:]}
    folder.mkdir(exist_ok=True)
    with open(folder / f"{screen.dataset_name}_single_1_0.75.pkl", "wb") as handle:
        pickle.dump(written, handle)
    screen.prepare_split("single", seed=1, combo_single_split_test_set_fraction=0.3)
    assert screen.set2conditions == written
    assert written != _fresh_split(screen, "single", {"combo_single_split_test_set_fraction": 0.3}).set2conditions


def _graph_files(pert_data):
    return sorted(Path(pert_data.dataset_path).glob("*_co_expression_network*"))


def test_the_coexpression_graph_cache_follows_the_split(screen):
    """The published name of the co-expression graph holds the split, seed and
    ``train_gene_set_size`` only; another split under those (here: other test genes) has
    other training cells, and so its own graph."""
    screen.prepare_split("simulation", seed=1)
    first = screen.coexpression_graph()
    screen.prepare_split("simulation", seed=1, test_perts="G0_G1")
    answered = screen.coexpression_graph()
    for path in _graph_files(screen):
        path.unlink()
    fresh = screen.coexpression_graph()
    assert not torch.equal(first.edge_weight, fresh.edge_weight)  # the training cells changed the graph
    assert torch.equal(answered.edge_index, fresh.edge_index) and torch.equal(answered.edge_weight, fresh.edge_weight)
    screen.prepare_split("simulation", seed=1)  # and back, from the split's cache
    again = screen.coexpression_graph()
    assert torch.equal(again.edge_index, first.edge_index) and torch.equal(again.edge_weight, first.edge_weight)


def test_a_coexpression_graph_file_without_settings_is_used_when_its_name_matches(screen):
    screen.prepare_split("simulation", seed=1)
    screen.coexpression_graph()
    (graph_file,) = [p for p in _graph_files(screen) if p.suffix == ".csv"]
    for path in _graph_files(screen):
        if path != graph_file:
            path.unlink()
    edges = pd.read_csv(graph_file)
    edges.iloc[: len(edges) // 2].to_csv(graph_file, index=False)  # as another package might have written it
    assert screen.coexpression_graph().num_edges == len(edges) // 2


def test_a_refused_split_leaves_the_split_before_it_in_place(screen, tmp_path):
    """A split refused (here a custom file naming a condition the data lacks) changes
    nothing: the split, its seed and subgroups stay those of the split before it, so the
    graphs and loaders built next still follow one split."""
    screen.prepare_split("simulation", seed=2)
    before = (screen.split, screen.seed, screen.train_gene_set_size, screen.set2conditions, screen.subgroup)
    custom = tmp_path / "custom.pkl"
    custom.write_bytes(pickle.dumps({"train": ["ctrl", "G0+ctrl"], "val": ["G1+ctrl"], "test": ["NOPE+ctrl"]}))
    with pytest.raises(ValueError, match=r"NOPE\+ctrl"):
        screen.prepare_split("custom", seed=1, train_gene_set_size=0.5, split_dict_path=custom)
    assert (screen.split, screen.seed, screen.train_gene_set_size, screen.set2conditions, screen.subgroup) == before
    assert screen.subgroup is not None
