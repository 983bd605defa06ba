"""The expression mapped from one file: the same batches, metrics and trained weights as in
memory; rebuilt when its h5ad changes; float16 storage; a screen processed from its h5ad a
block at a time equals one processed in memory; processes share the file, not copies."""

import json
import os
import pickle
import subprocess
import sys

import anndata
import numpy as np
import pytest
import torch
import toy_data
from test_launch import _clean_environment, _launch_arguments

from gears_ddp import PertData
from gears_ddp.data.expression_map import map_file, record_file
from gears_ddp.datasets import make_synthetic_perturb_seq, write_synthetic_screen
from gears_ddp.gears import GEARS

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _loaded(data_folder, **options) -> PertData:
    pert_data = PertData(data_folder, **options)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    return pert_data


def test_mapped_and_in_memory_give_the_same_batches_metrics_and_weights(data_folder):
    runs = {}
    for storage in ("mapped", "memory"):
        pert_data = _loaded(data_folder, expression_storage=storage)
        assert (pert_data.cells.mapped_from is not None) == (storage == "mapped")
        loaders = pert_data.get_dataloader(16, test_batch_size=32)
        batches = {name: [b for b in loader] for name, loader in loaders.items()}
        torch.manual_seed(0)
        gears = GEARS(pert_data)
        gears.model_initialize(hidden_size=8)
        runs[storage] = batches, gears.train(epochs=2), gears.best_model.state_dict()
    (mapped_batches, mapped_report, mapped_weights), (memory_batches, memory_report, memory_weights) = (
        runs["mapped"],
        runs["memory"],
    )
    for name, batches in mapped_batches.items():
        assert len(batches) == len(memory_batches[name]) > 0
        for a, b in zip(batches, memory_batches[name]):
            for field in ("x", "y", "pert_idx", "condition", "de_idx"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (name, field)
    assert mapped_report["model"] == memory_report["model"]
    assert [{k: v for k, v in h.items() if not k.endswith("seconds")} for h in mapped_report["history"]] == [
        {k: v for k, v in h.items() if not k.endswith("seconds")} for h in memory_report["history"]
    ]
    for name, tensor in mapped_weights.items():
        assert torch.equal(tensor, memory_weights[name]), name


def test_the_map_is_rebuilt_when_the_h5ad_changes_and_reused_otherwise(data_root, caplog):
    caplog.set_level("INFO", logger="gears_ddp")
    PertData(data_root).new_data_process("toy", toy_data.make_raw(seed=0))
    folder = data_root / "toy"
    assert map_file(folder).is_file() and json.loads(record_file(folder).read_text())["dtype"] == "float32"
    caplog.clear()
    again = PertData(data_root)
    again.load(data_path=folder)
    assert "writing the expression map" not in caplog.text  # current: reused
    PertData(data_root).new_data_process("toy", toy_data.make_raw(seed=1), overwrite=True)
    caplog.clear()
    changed = PertData(data_root)
    changed.load(data_path=folder)
    assert "writing the expression map" not in caplog.text  # new_data_process rebuilt it already
    fresh = anndata.read_h5ad(folder / "perturb_processed.h5ad")
    np.testing.assert_array_equal(changed.adata.X, fresh.X.toarray())
    os.utime(folder / "perturb_processed.h5ad", ns=(1, 1))  # any change of the h5ad makes the map stale
    caplog.clear()
    PertData(data_root).load(data_path=folder)
    assert "writing the expression map" in caplog.text


def test_copies_of_a_dataset_are_one_dataset_whatever_their_folder_file_times_or_storage(
    data_folder, tmp_path, monkeypatch
):
    """The identity ranks compare: the same for copies with other file times (their maps are
    rebuilt), for the same values written dense, and for expression in memory; a changed
    value changes the expression part only, another split the split part only."""
    import gears_ddp.data.expression_map as expression_map
    from gears_ddp.launching.rank_training import data_identity

    copies = [
        toy_data.copy_data_folder(data_folder, tmp_path / f"node{i}", mtime_ns=(i + 1) * 10**18) for i in range(2)
    ]
    dense = toy_data.copy_data_folder(data_folder, tmp_path / "dense", mtime_ns=10**17)
    adata = anndata.read_h5ad(dense / "toy" / "perturb_processed.h5ad")
    adata.X = adata.X.toarray()
    adata.write_h5ad(dense / "toy" / "perturb_processed.h5ad")
    original = data_identity(_loaded(data_folder))
    assert [data_identity(_loaded(folder)) for folder in (*copies, dense)] == [original] * 3
    assert data_identity(_loaded(data_folder, expression_storage="memory")) == original

    toy_data.change_one_value(copies[1] / "toy" / "perturb_processed.h5ad")
    changed = data_identity(_loaded(copies[1]))
    assert changed["expression"] != original["expression"]
    assert {k: v for k, v in changed.items() if k != "expression"} == {
        k: v for k, v in original.items() if k != "expression"
    }
    other_split = _loaded(data_folder)
    other_split.prepare_split("simulation", seed=2)
    assert {k for k, v in data_identity(other_split).items() if v != original[k]} == {"split"}

    def read_every_value(*_):
        raise AssertionError("the values were read again")

    monkeypatch.setattr(expression_map, "values_digest", read_every_value)
    assert data_identity(_loaded(copies[0])) == original  # a built map's record holds the digest


def test_a_damaged_map_is_built_again(data_root, caplog):
    caplog.set_level("INFO", logger="gears_ddp")
    PertData(data_root).new_data_process("toy", toy_data.make_raw())
    path = map_file(data_root / "toy")
    expected = np.load(path)
    for damage in (b"not a numpy file" * 64, path.read_bytes()[:1000]):  # another file; a truncated map
        path.write_bytes(damage)
        caplog.clear()
        again = PertData(data_root)
        again.load(data_path=data_root / "toy")
        assert "writing the expression map" in caplog.text
        np.testing.assert_array_equal(again.cells.expression.numpy(), expected)


def test_float16_storage_halves_the_file_and_batches_stay_float32(data_folder):
    wide = _loaded(data_folder)
    half = _loaded(data_folder, expression_dtype="float16")
    assert half.cells.expression.dtype == torch.float16 and wide.cells.expression.dtype == torch.float32
    assert half.cells.mapped_from != wide.cells.mapped_from  # one map per dtype
    a = next(iter(wide.get_dataloader(32)["test_loader"]))
    b = next(iter(half.get_dataloader(32)["test_loader"]))
    assert b.x.dtype == torch.float32
    torch.testing.assert_close(b.y, a.y, rtol=1e-3, atol=1e-3)
    size = os.path.getsize(half.cells.mapped_from)
    assert size < 0.55 * a.y.shape[1] * half.cells.n_cells * 4 + 4096


def test_a_mapped_dataset_pickles_as_its_file(data_folder):
    pert_data = _loaded(data_folder)
    payload = pickle.dumps(pert_data.cells)
    assert len(payload) < pert_data.cells.expression.numel() * 4 / 2  # not the values
    copy = pickle.loads(payload)
    assert copy.mapped_from == pert_data.cells.mapped_from
    assert torch.equal(copy.expression, pert_data.cells.expression)
    assert _mapping_holding(copy.expression.data_ptr()) == ("r--s", pert_data.cells.mapped_from)


def _mapping_holding(address: int) -> tuple[str, str]:
    """The permissions and file of this process's mapping that holds ``address``."""
    for line in open("/proc/self/maps"):
        parts = line.split()
        start, end = (int(value, 16) for value in parts[0].split("-"))
        if start <= address < end:
            return parts[1], parts[5] if len(parts) > 5 else ""
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_screen_processed_from_its_file_equals_one_processed_in_memory(tmp_path):
    sizes = {"n_genes": 120, "n_perturbed_genes": 12, "n_combos": 10, "cells_per_condition": 20, "n_control_cells": 200}
    raw = write_synthetic_screen(tmp_path, name="screen", **sizes)
    backed = anndata.read_h5ad(raw, backed="r")
    in_memory = make_synthetic_perturb_seq(**sizes).adata
    np.testing.assert_array_equal(backed.X[:].toarray(), in_memory.X.toarray())
    from_file = PertData(tmp_path)
    from_file.new_data_process("from_file", backed)
    from_memory = PertData(tmp_path, expression_storage="memory")
    from_memory.new_data_process("from_memory", in_memory)
    assert torch.equal(from_file.cells.expression, from_memory.cells.expression)
    written = [anndata.read_h5ad(tmp_path / name / "perturb_processed.h5ad") for name in ("from_file", "from_memory")]
    assert written[0].uns.keys() == written[1].uns.keys()
    for key in ("rank_genes_groups_cov_all", "top_non_dropout_de_20", "non_zeros_gene_idx"):
        for condition, genes in written[1].uns[key].items():
            assert list(written[0].uns[key][condition]) == list(genes), (key, condition)
    assert written[0].obs.astype(str).equals(written[1].obs.astype(str))
    np.testing.assert_array_equal(written[0].X.toarray(), written[1].X.toarray())


def test_a_folder_where_the_map_cannot_be_written_is_named(data_root, monkeypatch):
    """(Simulated: the tests may run as a user who can write anywhere.)"""
    import gears_ddp.data.expression_map as expression_map

    PertData(data_root).new_data_process("toy", toy_data.make_raw())
    folder = data_root / "toy"
    map_file(folder).unlink()

    def refused(path, *args):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(expression_map, "_write_map", refused)
    with pytest.raises(PermissionError, match=f"cannot write the expression map of {folder}.*expression_storage="):
        PertData(data_root).load(data_path=folder)
    PertData(data_root, expression_storage="memory").load(data_path=folder)  # the way out it names


@pytest.mark.distributed
def test_two_torchrun_ranks_map_one_file_without_private_copies(data_folder, tmp_path):
    """Each rank reports, while both are alive, its mapping of the expression file: the same
    file, read-only, its resident pages shared with the other rank, none private."""
    config = _launch_arguments(data_folder, tmp_path / "run")[-2:]  # --config FILE
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(SCRIPTS, "launch_reporting_maps.py"),
        *config,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=_clean_environment(MAPS_REPORT=str(tmp_path / "maps"))
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / "maps" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    expected = str(map_file(data_folder / "toy"))
    for report in reports:
        assert report["path"] == expected
        assert report["permissions"] == "r--s"  # mapped read-only and shared
        assert report["private_kib"] == 0  # no page of it is private to the rank
        assert report["shared_kib"] > 0  # its pages are the other rank's too
