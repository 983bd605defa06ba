"""One training path: ``GEARS.train`` is the distributed recipe with one rank.

The same seed, loaders and model options give the same weights and report in one process
as on one rank of ``train_multi_gpu``; both entry points take the same options; a
single-process run is reproducible, checkpoints and resumes exactly."""

import inspect
import logging
from dataclasses import fields

import numpy as np
import pytest
import torch
from gears_testing import exact_on

from gears_ddp import PertData, train_multi_gpu
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.gears import GEARS
from gears_ddp.model.model_folder import read_weights
from gears_ddp.training.checkpoint import checkpoint_files, load_training_checkpoint
from gears_ddp.training.training_options import TrainingOptions

SPLIT = {"split": "simulation", "seed": 1}


def _loaded(data_folder) -> PertData:
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split(**SPLIT)
    return pert_data


def _without_seconds(history):
    return [{k: v for k, v in record.items() if not k.endswith("seconds")} for record in history]


def _assert_same(a, b, what: str):
    np.testing.assert_equal(a, b, err_msg=what)  # NaN equals NaN here


@pytest.mark.distributed
def test_gears_train_equals_one_rank_of_train_multi_gpu(data_folder, tmp_path, device):
    s = 3
    pert_data = _loaded(data_folder)
    torch.manual_seed(s)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128, seed=s)
    gears = GEARS(pert_data, device=str(device))
    gears.model_initialize(hidden_size=32)
    # on a GPU, atomic additions sum in varying orders unless torch's deterministic algorithms run
    deterministic = not exact_on(device)
    single = gears.train(epochs=3, seed=s, deterministic=deterministic)

    placement = {"cpu_processes": 1} if device.type == "cpu" else {}
    distributed = train_multi_gpu(
        data_folder,
        "toy",
        SPLIT,
        {
            "epochs": 3,
            "batch_size": 32,
            "test_batch_size": 128,
            "seed": s,
            "model_config": {"hidden_size": 32},
            "save_path": str(tmp_path / "out"),
            "deterministic": deterministic,
            **placement,
        },
        gpu_ids=None if device.type == "cpu" else [device.index or 0],
    )

    # the same operators in the same order, on the CPU or deterministic on a GPU: bit for bit
    saved = read_weights(distributed["model_path"])
    for name, tensor in gears.best_model.state_dict().items():
        _assert_same(tensor.cpu().numpy(), saved[name].numpy(), name)
    assert single["parameter_digests"] == distributed["parameter_digests"]  # the last epoch's weights too
    for part in ("model", "baselines"):
        assert single[part].keys() == distributed[part].keys()
    for key, value in single["model"].items():
        _assert_same(value, distributed["model"][key], key)
    for name, summary in single["baselines"].items():
        for key, value in summary.items():
            _assert_same(value, distributed["baselines"][name][key], f"{name} {key}")
    assert single["best_epoch"] == distributed["best_epoch"]
    single_history, distributed_history = _without_seconds(single["history"]), _without_seconds(distributed["history"])
    assert [h.keys() for h in single_history] == [h.keys() for h in distributed_history]
    for mine, theirs in zip(single_history, distributed_history):
        for key, value in mine.items():
            _assert_same(value, theirs[key], key)
    assert "model_path" not in single and distributed["world_size"] == single["world_size"] == 1


def test_train_and_args_take_the_same_options():
    """Every option of ``GEARS.train`` is a key of ``args`` with the same meaning, and
    ``args`` adds only the model and launch options."""
    parameters = dict(inspect.signature(GEARS.train).parameters)
    parameters.pop("self")
    options = {f.name: f.default for f in fields(TrainingOptions)}
    assert list(parameters) == list(options)
    assert {name: p.default for name, p in parameters.items()} == options
    extra = {f.name for f in fields(TrainingArgs)} - set(options)
    assert extra == {
        "model_config",
        "cpu_processes",
        "cpu_threads",
        "timeout_s",
        "find_unused_parameters",
        "expression_storage",
        "expression_dtype",
        "default_pert_graph",
    }


def _first_losses(pert_data, train_seed, torch_seed=0):
    torch.manual_seed(torch_seed)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, seed=train_seed)
    return gears.history[0]["train_loss"], gears


def test_a_seeded_single_process_run_repeats_and_the_seed_matters(toy):
    toy.get_dataloader(16, test_batch_size=64)
    first, _ = _first_losses(toy, train_seed=5)
    again, _ = _first_losses(toy, train_seed=5)
    other, gears = _first_losses(toy, train_seed=6)
    assert first == again
    assert other != first  # another shuffle and control pairing
    assert toy.loader_options["seed"] == 0 and gears.dataloader is not toy.dataloader  # the call's loaders alone


def test_a_loader_option_rebuilds_the_loaders(toy):
    toy.get_dataloader(16, test_batch_size=64)
    batches_of_16 = len(toy.dataloader["train_loader"])
    torch.manual_seed(0)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, batch_size=8)
    assert len(gears.dataloader["train_loader"]) in (2 * batches_of_16, 2 * batches_of_16 + 1)
    assert len(gears.dataloader["test_loader"]) == len(toy.dataloader["test_loader"])  # test batches of 64 kept
    assert toy.loader_options["batch_size"] == 16  # the data's own loaders as get_dataloader built them


def test_bad_options_are_named(toy):
    toy.get_dataloader(16)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    with pytest.raises(ValueError, match=r"train\(lr=...\) must be a positive number, got -1"):
        gears.train(lr=-1)
    with pytest.raises(ValueError, match=r"train\(checkpoint_every=...\)=1 needs train\(save_path=...\)"):
        gears.train(checkpoint_every=1)
    with pytest.raises(TypeError, match="epoch"):
        gears.train(epoch=3)


def test_resuming_from_what_is_no_checkpoint_is_named(toy, tmp_path):
    """resume_from a run's model file (the published format, not a training checkpoint) or a
    folder without checkpoints: an error naming the path, before any step."""
    toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, save_path=str(tmp_path / "run"))
    model_file = tmp_path / "run" / "model.pt"
    with pytest.raises(ValueError, match=f"{model_file} is not a gears_ddp training checkpoint"):
        gears.train(epochs=2, save_path=str(tmp_path / "again"), resume_from=str(model_file))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"resume_from='{tmp_path / 'empty'}': no readable checkpoint in"):
        gears.train(epochs=2, save_path=str(tmp_path / "again"), resume_from=str(tmp_path / "empty"))
    assert not (tmp_path / "again" / "model.pt").exists()


def test_single_process_checkpoints_and_resumes_exactly(toy, tmp_path, caplog):
    toy.get_dataloader(16, test_batch_size=64)

    def run(epochs, save_path, **options):
        torch.manual_seed(0)
        gears = GEARS(toy)
        gears.model_initialize(hidden_size=8)
        return gears.train(epochs=epochs, save_path=str(save_path), checkpoint_every=1, **options)

    whole = run(3, tmp_path / "whole")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        run(2, tmp_path / "part")
    steps = len(toy.dataloader["train_loader"])
    written = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint ")]
    assert [line.split(" written to ")[0] for line in written] == [
        f"checkpoint after epoch {epoch} (optimiser step {epoch * steps} in all)" for epoch in (1, 2)
    ]
    resumed = run(3, tmp_path / "resumed", resume_from=str(tmp_path / "part"))
    assert resumed["model_path"] == str(tmp_path / "resumed")
    assert _without_seconds(resumed["history"]) == _without_seconds(whole["history"])
    assert resumed["model"] == whole["model"]
    final = [load_training_checkpoint(checkpoint_files(tmp_path / name)[-1])["model"] for name in ("whole", "resumed")]
    for name, tensor in final[0].items():
        assert torch.equal(tensor, final[1][name]), name
