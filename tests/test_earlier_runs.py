"""Run folders and checkpoints of an earlier version still load.

``tests/data/run_5404fe3/`` was written by gears_ddp at commit 5404fe3, before the options,
the launcher, saved-run loading and the CLI moved (``tests/data/run_5404fe3.make.py`` says
how): a 1-epoch run of the toy data with its config, model folder, metrics and checkpoint,
and beside it the predictions of three queries and the test scores that version gave. This
version must give the same from the same files: through the published API
(``GEARS.load_pretrained``), through the CLI (``gears-ddp evaluate --run``), and by resuming
training from the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import toy_data
import yaml

from gears_ddp import GEARS, PertData
from gears_ddp.cli import main
from gears_ddp.train_distributed import train_multi_gpu

EARLIER = Path(__file__).parent / "data" / "run_5404fe3"
RECORDED = json.loads((EARLIER.parent / "run_5404fe3.predictions.json").read_text())


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """The earlier run folder, with its config pointing at the toy data made here."""
    work = tmp_path_factory.mktemp("earlier")
    data = work / "data"
    data.mkdir()
    toy_data.write_go_files(data)
    PertData(data).new_data_process("toy", toy_data.make_raw())
    run = work / "run"
    shutil.copytree(EARLIER, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["pert_data_path"], config["args"]["save_path"] = str(data), str(run)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run


def test_an_earlier_model_folder_predicts_what_it_predicted(earlier_run):
    config = yaml.safe_load((earlier_run / "config.yaml").read_text())
    pert_data = PertData(config["pert_data_path"])
    pert_data.load(data_path=Path(config["pert_data_path"]) / "toy")
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(16, test_batch_size=64)
    gears = GEARS(pert_data)
    gears.load_pretrained(earlier_run)
    predicted = gears.predict(RECORDED["queries"])
    assert sorted(predicted) == sorted(RECORDED["predictions"])
    for key, row in RECORDED["predictions"].items():
        np.testing.assert_allclose(predicted[key], row, rtol=1e-6, atol=1e-6, err_msg=key)


def test_gears_ddp_evaluate_scores_an_earlier_run_as_it_did(earlier_run, tmp_path):
    out = tmp_path / "scores.json"
    assert main(["evaluate", "--run", str(earlier_run), "--out", str(out)]) == 0
    scores = json.loads(out.read_text())["model"]
    assert set(RECORDED["evaluate"]) <= set(scores)
    for name, value in RECORDED["evaluate"].items():
        assert scores[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name


@pytest.mark.distributed
def test_training_resumes_from_an_earlier_checkpoint(earlier_run, tmp_path):
    """A second epoch from the earlier run's checkpoint: its first epoch is the one the
    earlier version trained, read from the checkpoint, not trained again (its wall seconds,
    which no second run repeats, are the earlier run's)."""
    config = yaml.safe_load((earlier_run / "config.yaml").read_text())
    checkpoint = next((earlier_run / "checkpoints").glob("checkpoint-*.pt"))
    args = {**config["args"], "epochs": 2, "save_path": str(tmp_path / "resumed"), "resume_from": str(checkpoint)}
    report = train_multi_gpu(config["pert_data_path"], config["dataset_name"], config["split_config"], args)
    first = (earlier_run / "metrics.csv").read_text().splitlines()
    earlier_epoch = dict(zip(first[0].split(","), map(float, first[1].split(","))))
    assert [row["epoch"] for row in report["history"]] == [1, 2]
    assert report["history"][0]["train_seconds"] == earlier_epoch["train_seconds"]
    assert report["history"][0]["train_loss"] == pytest.approx(earlier_epoch["train_loss"], rel=1e-12)
    assert report["history"][0]["val_mse_de"] == pytest.approx(earlier_epoch["val_mse_de"], rel=1e-12)
    assert report["history"][1]["train_loss"] != pytest.approx(earlier_epoch["train_loss"], rel=1e-3)
