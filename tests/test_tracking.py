"""Weights & Biases tracking, with a stand-in ``wandb`` module that records its calls: the
published switch (``GEARS(weight_bias_track=True, proj_name=..., exp_name=...)``) and the
``wandb`` option of ``train`` start one run, give it the configuration, log every epoch's
record and the test summary; without the package, the error says how to install it."""

import sys
import types

import pytest

from gears_ddp import GEARS


class StandInWandb(types.ModuleType):
    """Records ``init``, ``config.update`` and ``log`` as the calls of one run."""

    def __init__(self):
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.configs: list[dict] = []
        self.logged: list[dict] = []
        self.config = types.SimpleNamespace(update=self.configs.append)

    def init(self, **settings):
        self.inits.append(settings)

    def log(self, record):
        self.logged.append(dict(record))


@pytest.fixture
def wandb(monkeypatch):
    stand_in = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", stand_in)
    return stand_in


def _epoch_records(wandb) -> list[dict]:
    return [record for record in wandb.logged if "epoch" in record]


def test_the_published_switch_starts_one_run_and_logs_each_epoch_and_the_test_summary(toy, wandb):
    toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy, device="cpu", weight_bias_track=True, proj_name="pertnet", exp_name="toy_run")
    gears.model_initialize(hidden_size=8)
    report = gears.train(epochs=2)
    assert wandb.inits == [{"project": "pertnet", "name": "toy_run"}]
    assert wandb.configs[0]["hidden_size"] == 8  # the model's configuration, then the training's
    assert wandb.configs[1]["training"]["epochs"] == 2 and wandb.configs[1]["world_size"] == 1
    epochs = _epoch_records(wandb)
    assert [record["epoch"] for record in epochs] == [1, 2]
    assert [record["val_mse_de"] for record in epochs] == [row["val_mse_de"] for row in report["history"]]
    assert wandb.logged[-1] == report["model"]  # the test summary, as the report has it
    assert report["model"]["test_mse_de"] > 0
    assert gears.wandb is wandb


def test_the_wandb_option_starts_a_run_with_its_settings(toy, wandb):
    toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy, device="cpu")
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, wandb={"project": "screens", "name": "toy", "mode": "offline"})
    assert wandb.inits == [{"project": "screens", "name": "toy", "mode": "offline"}]
    assert len(_epoch_records(wandb)) == 1 and "test_mse_de" in wandb.logged[-1]


def test_without_the_package_the_error_says_how_to_install_it(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    toy.get_dataloader(16, test_batch_size=64)
    with pytest.raises(ImportError, match="Weights & Biases tracking needs the wandb package: pip install wandb"):
        GEARS(toy, device="cpu", weight_bias_track=True)
