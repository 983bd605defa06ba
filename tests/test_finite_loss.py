"""A diverged run stops: at the first non-finite loss every rank stops with an error naming
the epoch and step, no model or report is written from those weights, the checkpoints
written before it stay, and the command exits non-zero with one line."""

import re

import pytest
import torch
from test_cli import _write_config
from test_distributed import SPLIT, _args

from gears_ddp import train_multi_gpu
from gears_ddp.cli import main
from gears_ddp.gears import GEARS
from gears_ddp.training import recipe
from gears_ddp.training.checkpoint import checkpoint_files
from gears_ddp.training.finite_loss import NonFiniteLoss

DIVERGING = {"lr": 1e6}  # weights thrown so far by the first steps that the loss overflows


def _gears(toy):
    toy.get_dataloader(batch_size=16, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    return gears


def test_a_nan_loss_at_a_step_stops_there_and_keeps_the_checkpoints_before_it(toy, tmp_path, monkeypatch):
    steps = recipe.optimizer_steps

    def nan_at_step_three(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            yield torch.full_like(loss, float("nan")) if number == 3 else loss

    monkeypatch.setattr(recipe, "optimizer_steps", nan_at_step_three)
    gears = _gears(toy)
    with pytest.raises(
        NonFiniteLoss,
        match=r"not finite \(NaN or infinite\) at optimiser step 3 of epoch 1 "
        r"\(3 in all\) on rank\(s\) \[0\]",
    ):
        gears.train(epochs=2, save_path=str(tmp_path), checkpoint_every_steps=1)
    assert [int(path.stem.split("-")[1]) for path in checkpoint_files(tmp_path)] == [1, 2]
    assert not (tmp_path / "model.pt").exists() and not (tmp_path / "report.json").exists()
    assert gears.weights_from is None  # the object holds no trained model either
    log = (tmp_path / "train.log").read_text()  # ends with the error and its traceback
    assert " ERROR " in log and "the run ended with NonFiniteLoss: the training loss is not finite" in log
    assert log.strip().splitlines()[-1].startswith("gears_ddp.training.finite_loss.NonFiniteLoss: ")


def test_a_learning_rate_that_diverges_stops_in_the_first_epoch(toy, tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"of epoch 1 .*Lower the learning rate"):
        _gears(toy).train(epochs=3, save_path=str(tmp_path), **DIVERGING)
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.distributed
def test_two_ranks_stop_together_and_the_parent_raises_the_same_error(data_folder, tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"of epoch 1 .* on rank\(s\) \[0, 1\]"):
        train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "run", epochs=3, **DIVERGING))
    assert not (tmp_path / "run" / "model.pt").exists() and not (tmp_path / "run" / "report.json").exists()


@pytest.mark.distributed
def test_the_command_exits_non_zero_with_one_line(data_folder, tmp_path, capsys):
    config = _write_config(tmp_path, data_folder, tmp_path / "run", cpu_processes=2, **DIVERGING)
    assert main(["train", "--config", str(config)]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r"gears-ddp train: the training loss is not finite .* of epoch 1 .*", error[-1])
    assert not any("Traceback" in line for line in error)
    assert not (tmp_path / "run" / "model.pt").exists()


def test_finite_losses_pass_and_a_skipped_float16_step_is_the_scaler_s(toy):
    """The watch itself: finite losses pass; with a float16 scaler a non-finite loss is
    tolerated while the scale is at least 1 (the scaler skips such steps), not below."""
    from gears_ddp.runtime.ranks import SINGLE_PROCESS
    from gears_ddp.training.finite_loss import LossWatch
    from gears_ddp.training.recipe import TrainingPosition

    watch = LossWatch(torch.device("cpu"))
    watch.record(torch.tensor(0.5))
    watch.check(SINGLE_PROCESS, TrainingPosition(0, 1, 1))
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))  # a scaler holds its scale once it has scaled a loss
    scaled = LossWatch(torch.device("cpu"), scaler)
    scaled.record(torch.tensor(float("inf")))
    scaled.check(SINGLE_PROCESS, TrainingPosition(0, 1, 1))
    scaler.update(0.5)
    scaled.record(torch.tensor(float("nan")))
    with pytest.raises(NonFiniteLoss, match="at optimiser step 2 of epoch 1"):
        scaled.check(SINGLE_PROCESS, TrainingPosition(0, 2, 2))
