"""write_synthetic_dataset writes a folder PertData loads, and never clobbers other GO files."""

import json
import pickle

import numpy as np
import pytest

from gears_ddp import PertData
from gears_ddp.datasets import read_ground_truth, read_true_means, write_synthetic_dataset

SMALL = dict(n_genes=200, n_modules=8, n_perturbed_genes=16, n_combos=12, cells_per_condition=15, n_control_cells=200)


def test_folder_loads_with_ground_truth(tmp_path):
    folder = write_synthetic_dataset(tmp_path, **SMALL)
    pert_data = PertData(tmp_path)
    pert_data.load(data_path=folder)
    pert_data.prepare_split("simulation", seed=1)
    truth = read_true_means(folder)
    assert set(truth.index) == set(pert_data.cells.conditions)
    assert list(truth.columns) == list(pert_data.gene_names)
    ground_truth = read_ground_truth(folder)
    assert ground_truth == json.loads((folder / "ground_truth.json").read_text())
    combos = [c for c in pert_data.cells.conditions if "ctrl" not in c]
    assert set(ground_truth["interaction_types"]) == set(combos)
    assert set(ground_truth["interaction_types"].values()) <= {"additive", "synergy", "buffering", "epistasis"}
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is not a synthetic dataset folder"):
        read_ground_truth(tmp_path)
    # the observed control mean tracks the noise-free control profile
    control = pert_data.adata.X[pert_data.adata.obs["condition"] == "ctrl"].mean(0)
    assert np.corrcoef(control, truth.loc["ctrl"].to_numpy())[0, 1] > 0.9


def test_existing_dataset_is_kept_and_other_go_files_are_refused(tmp_path):
    folder = write_synthetic_dataset(tmp_path, **SMALL)
    stamp = (folder / "perturb_processed.h5ad").stat().st_mtime_ns
    assert write_synthetic_dataset(tmp_path, **SMALL) == folder
    assert (folder / "perturb_processed.h5ad").stat().st_mtime_ns == stamp
    other = tmp_path / "other"
    other.mkdir()
    real_go = {"TP53": {"GO:0000001"}}
    (other / "gene2go_all.pkl").write_bytes(pickle.dumps(real_go))
    with pytest.raises(FileExistsError, match="holds other GO annotations"):
        write_synthetic_dataset(other, **SMALL)
    assert pickle.loads((other / "gene2go_all.pkl").read_bytes()) == real_go
