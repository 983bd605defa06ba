"""A resume continues the run its checkpoint was written by: options that shape the weights,
the optimisation or the data order (``RESUME_OPTIONS['must match']``) cannot change there,
and a resume that changes one is refused before anything is written, naming each option with
both values; more epochs (and the other options that may change) still continue it."""

import shutil
from dataclasses import fields

import pytest
import yaml
from test_folder_owner import SPLIT, _args, _run_file, _snapshot, _toy_gears

from gears_ddp import train_multi_gpu
from gears_ddp.cli import main
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.launching import launchers
from gears_ddp.training.checkpoint import checkpoint_files, load_training_checkpoint
from gears_ddp.training.training_options import RESUME_OPTIONS, TrainingOptions, changed_on_resume

ORIGINAL = {"lr": 0.003, "amp": "bf16", "seed": 0, "cpu_processes": 1, "checkpoint_every": 1}


@pytest.fixture(scope="module")
def one_epoch(data_folder, tmp_path_factory):
    """A run of one epoch (batch 16, seed 0, lr 0.003, bf16) with its checkpoint, trained by
    ``train_multi_gpu`` on one CPU rank; tests continue copies of it."""
    folder = tmp_path_factory.mktemp("one_epoch") / "run"
    train_multi_gpu(data_folder, "toy", SPLIT, _args(folder, **ORIGINAL))
    return folder


@pytest.fixture
def run_copy(one_epoch, tmp_path):
    """A copy of the one-epoch run, the folder its ``config.yaml`` names as ``save_path``."""
    folder = tmp_path / "run"
    shutil.copytree(one_epoch, folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["args"]["save_path"] = str(folder)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def _forbid_ranks(monkeypatch) -> None:
    """Fail the test if a rank starts or the data is prepared for one."""
    for name in ("train_rank", "spawn_workers", "prepared_data", "shared_data"):
        monkeypatch.setattr(launchers, name, lambda *a, **k: pytest.fail("a rank was started"))


def test_gears_ddp_train_resumed_with_another_lr_is_refused_before_any_rank_starts(run_copy, capsys, monkeypatch):
    config, checkpoints = (run_copy / "config.yaml").read_text(), _snapshot(run_copy / "checkpoints")
    continued = ["train", "--config", str(run_copy / "config.yaml"), "--set", "args.resume_from=auto"]
    with monkeypatch.context() as patched:
        _forbid_ranks(patched)
        assert main([*continued, "--set", "args.epochs=2", "--set", "args.lr=0.1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("gears-ddp train: resume_from: ") and "\n" not in error
    assert "written by a run with other training options (lr: 0.003 there, 0.1 here)" in error
    assert str(run_copy / "config.yaml") in error and "gears-ddp train --overwrite" in error
    assert (run_copy / "config.yaml").read_text() == config  # the run's configuration kept
    assert _snapshot(run_copy / "checkpoints") == checkpoints

    assert main([*continued, "--set", "args.epochs=2", "--set", "args.keep_checkpoints=5"]) == 0
    history = load_training_checkpoint(checkpoint_files(run_copy)[-1])["outcome"]["history"]
    assert [record["epoch"] for record in history] == [1, 2]  # more epochs continue it


def test_a_resume_changing_several_options_names_each_and_another_world_size_only_warns(
    run_copy, data_folder, monkeypatch, caplog
):
    changed = {"batch_size": 32, "seed": 5, "amp": "off"}
    config = (run_copy / "config.yaml").read_text()
    with monkeypatch.context() as patched, pytest.raises(ValueError) as refused:
        _forbid_ranks(patched)
        train_multi_gpu(data_folder, "toy", SPLIT, _args(run_copy, **{**ORIGINAL, **changed}, resume_from="auto"))
    for named in ("batch_size: 16 there, 32 here", "seed: 0 there, 5 here", "amp: 'bf16' there, 'off' here"):
        assert named in str(refused.value)
    assert "lr:" not in str(refused.value) and (run_copy / "config.yaml").read_text() == config

    more_ranks = {**ORIGINAL, "cpu_processes": 2}  # the placement may change: a warning of its own
    with caplog.at_level("WARNING", logger="gears_ddp"):
        report = train_multi_gpu(data_folder, "toy", SPLIT, _args(run_copy, **more_ranks, epochs=2, resume_from="auto"))
    assert "resuming a run of 1 rank(s) with 2" in caplog.text and len(report["history"]) == 2


def test_gears_ddp_train_from_a_copied_run_file_with_another_lr_is_refused(run_copy, data_folder, tmp_path, capsys):
    """A run file of its own (not the run folder's config.yaml) resuming the run: refused as well."""
    args = _args(run_copy, **{**ORIGINAL, "lr": 0.001}, epochs=2, resume_from="auto")
    config = (run_copy / "config.yaml").read_text()
    assert main(["train", "--config", str(_run_file(tmp_path, data_folder, args))]) == 2
    assert "lr: 0.003 there, 0.001 here" in capsys.readouterr().err
    assert (run_copy / "config.yaml").read_text() == config


def test_the_published_api_resumed_with_another_batch_size_is_refused_naming_it(data_folder, tmp_path):
    folder = tmp_path / "run"
    _toy_gears(data_folder).train(epochs=1, save_path=str(folder), checkpoint_every=1)  # loaders of batch 16
    checkpoints = _snapshot(folder / "checkpoints")
    with pytest.raises(ValueError, match=r"other training options \(batch_size: 16 there, 32 here\): give the"):
        _toy_gears(data_folder).train(epochs=2, save_path=str(folder), resume_from="auto", batch_size=32)
    rebuilt = _toy_gears(data_folder)
    rebuilt.pert_data.get_dataloader(32, test_batch_size=32)  # loaders built otherwise, no option given
    with pytest.raises(ValueError, match=r"batch_size: 16 there, 32 here"):
        rebuilt.train(epochs=2, save_path=str(folder), resume_from="auto")
    assert _snapshot(folder / "checkpoints") == checkpoints
    report = _toy_gears(data_folder).train(epochs=2, save_path=str(folder), resume_from="auto", test_batch_size=64)
    assert len(report["history"]) == 2  # more epochs, and evaluation batches of another size, continue it


def test_every_option_is_listed_once_as_may_or_must_not_change_on_a_resume():
    listed = [*RESUME_OPTIONS["must match"], *RESUME_OPTIONS["may change"]]
    assert sorted(listed) == sorted(item.name for item in fields(TrainingArgs))


def test_what_a_checkpoint_lacks_or_leaves_to_the_loaders_is_unknown_not_different():
    ours = TrainingArgs.from_dict({"lr": 0.01, "model_config": {"hidden_size": 8}})
    earlier = {"lr": 0.01, "model_config": {"hidden_size": 8}}  # an earlier version's: most options missing
    assert changed_on_resume(earlier, ours) == []
    assert changed_on_resume({**earlier, "batch_size": None, "seed": None}, ours) == []  # GEARS.train's as built
    other_model = {**earlier, "model_config": {"hidden_size": 16, "direction_lambda": 0.5}}
    assert changed_on_resume(other_model, ours) == [
        "model_config.direction_lambda: 0.5 there, 0.1 here",
        "model_config.hidden_size: 16 there, 8 here",
    ]
    single = TrainingOptions.from_dict({"lr": 0.02}, "train")  # GEARS.train's: no model options
    assert changed_on_resume({**earlier, "epochs": 40, "keep_checkpoints": 1}, single) == ["lr: 0.01 there, 0.02 here"]
