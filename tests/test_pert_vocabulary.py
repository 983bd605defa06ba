"""``args.default_pert_graph``: the perturbations a model trained by ``train_multi_gpu``
knows, as the published ``PertData(default_pert_graph=...)`` chooses them, kept by the run's
configuration for everything that reloads the run."""

import pytest
import toy_data

from gears_ddp import PertData, train_multi_gpu
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.model.model_folder import read_weights
from gears_ddp.runs.saved_runs import load_run

SPLIT = {"split": "simulation", "seed": 1}


def test_default_pert_graph_must_be_a_boolean():
    with pytest.raises(ValueError, match=r"args\['default_pert_graph'\] must be True or False"):
        TrainingArgs.from_dict({"default_pert_graph": "no"})


def test_a_run_without_the_default_graph_knows_the_datasets_genes_and_its_reload_the_same(tmp_path):
    data_folder = tmp_path / "data"  # GO files that annotate genes the dataset does not measure
    toy_data.write_go_files(data_folder, list(toy_data.GENES) + [f"UNMEASURED{i}" for i in range(5)])
    PertData(data_folder).new_data_process("toy", toy_data.make_raw())
    save_path = tmp_path / "run"
    train_multi_gpu(
        data_folder,
        "toy",
        SPLIT,
        {
            "cpu_processes": 1,
            "epochs": 1,
            "max_steps": 2,
            "batch_size": 8,
            "model_config": {"hidden_size": 8},
            "save_path": str(save_path),
            "default_pert_graph": False,
        },
    )
    expected = {}
    for default in (True, False):
        pert_data = PertData(data_folder, default_pert_graph=default)
        pert_data.load(data_path=data_folder / "toy")
        expected[default] = list(pert_data.pert_names)
    assert expected[True] == sorted(expected[False] + [f"UNMEASURED{i}" for i in range(5)])
    assert read_weights(save_path)["pert_emb.weight"].shape[0] == len(expected[False])
    assert load_run(save_path).pert_list == expected[False]
