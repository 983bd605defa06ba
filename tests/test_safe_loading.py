"""No file the library reads runs code: every pickle loader refuses a planted pickle whose
``__reduce__`` would create a file (the file must not appear), names the file and what it
asked for, and still reads what the published GEARS writes."""

import pickle
import re

import numpy as np
import pytest
import torch
import toy_data

from gears_ddp import PertData
from gears_ddp.data import io
from gears_ddp.gears import GEARS


class Planted:
    """Unpickling this calls ``open(target, 'w')``, which creates ``target``."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


def plant(path, tmp_path, inside=None):
    """Write a pickle at ``path`` whose loading would create a file; return that file."""
    target = tmp_path / f"created_by_{path.name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Planted(target) if inside is None else inside(Planted(target))))
    return target


def assert_refused(call, path, target):
    # the planted call is io.open, which pickle names _io.open from Python 3.12
    with pytest.raises(
        ValueError, match=rf"refused to read .* from {re.escape(str(path))}: it asks to call _?io\.open"
    ):
        call()
    assert not target.exists()


def test_the_planted_pickle_runs_code_with_plain_pickle(tmp_path):
    """The check is real: unrestricted unpickling of the planted file creates the file."""
    target = plant(tmp_path / "x.pkl", tmp_path)
    pickle.loads((tmp_path / "x.pkl").read_bytes()).close()
    assert target.exists()


def test_model_config(toy, tmp_path):
    toy.get_dataloader(16)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.save_model(tmp_path / "model")
    config = tmp_path / "model" / "config.pkl"
    target = plant(config, tmp_path, inside=lambda planted: {"hidden_size": 8, "device": planted})
    assert_refused(lambda: GEARS(toy).load_pretrained(tmp_path / "model"), config, target)


def test_cached_split_and_subgroups(data_root, tmp_path):
    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", toy_data.make_raw())
    pert_data.prepare_split("simulation", seed=1)
    splits = sorted((data_root / "toy" / "splits").glob("*.pkl"))
    assert len(splits) == 2  # the split and its subgroups
    for path in splits:
        original = path.read_bytes()
        target = plant(path, tmp_path)
        assert_refused(lambda: pert_data.prepare_split("simulation", seed=1), path, target)
        path.write_bytes(original)


def test_custom_split_file(toy, tmp_path):
    path = tmp_path / "custom.pkl"
    target = plant(path, tmp_path, inside=lambda planted: {"train": [planted], "val": [], "test": []})
    assert_refused(lambda: toy.prepare_split("custom", split_dict_path=str(path)), path, target)


@pytest.mark.parametrize("name", ["gene2go_all.pkl", "essential_all_data_pert_genes.pkl"])
def test_go_pickles(data_root, tmp_path, name):
    path = data_root / name
    target = plant(path, tmp_path)
    assert_refused(lambda: PertData(data_root).new_data_process("toy", toy_data.make_raw()), path, target)


def test_perturbation_gene_set_file(data_root, tmp_path):
    path = tmp_path / "genes.pkl"
    target = plant(path, tmp_path, inside=lambda planted: [planted])
    pert_data = PertData(data_root, gene_set_path=str(path))
    assert_refused(lambda: pert_data.new_data_process("toy", toy_data.make_raw()), path, target)


def test_training_checkpoint(toy, tmp_path):
    toy.get_dataloader(16)
    path = tmp_path / "run" / "checkpoints" / "checkpoint-000000001.pt"
    target = tmp_path / "created_by_checkpoint"
    path.parent.mkdir(parents=True)
    torch.save({"format": 2, "position": Planted(target)}, path)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    with pytest.raises(ValueError, match=rf"cannot read training checkpoint {path}: .*io\.open"):
        gears.train(epochs=1, save_path=str(tmp_path / "run"), resume_from=str(path))
    assert not target.exists()


def test_what_the_published_gears_writes_still_loads(tmp_path):
    """The published package pickles its config (torch tensors among plain values), split
    files (lists of condition strings, numpy strings among them) and GO files with the
    standard pickler."""
    config = {
        "hidden_size": 64,
        "uncertainty": False,
        "direction_lambda": 0.1,
        "device": "cuda:0",
        "G_go": torch.tensor([[0, 1], [1, 0]]),
        "G_go_weight": torch.tensor([0.5, 0.25]),
        "G_coexpress": torch.tensor(np.array([[0], [1]])),
        "G_coexpress_weight": torch.tensor([0.9]),
        "num_genes": 2,
        "num_perts": 2,
    }
    split = {"train": ["ctrl", np.str_("A+ctrl")], "val": np.array(["B+ctrl"]), "test": []}
    gene2go = {"A": {"GO:1", "GO:2"}, "B": frozenset({"GO:1"})}
    for name, value in (("config.pkl", config), ("split.pkl", split), ("gene2go.pkl", gene2go)):
        for protocol in (2, pickle.DEFAULT_PROTOCOL):
            (tmp_path / name).write_bytes(pickle.dumps(value, protocol=protocol))
            loaded = io.read_pickle(tmp_path / name, name)
            assert loaded.keys() == value.keys()
    loaded = io.read_pickle(tmp_path / "config.pkl", "config")
    assert torch.equal(loaded["G_go"], config["G_go"]) and loaded["G_go_weight"].dtype == torch.float32
    assert list(io.read_pickle(tmp_path / "split.pkl", "split")["val"]) == ["B+ctrl"]
