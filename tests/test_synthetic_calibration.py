"""The "norman" synthetic preset reproduces the Norman screen's statistics it is calibrated on
(``gears_ddp.evaluation.calibration``; targets in ``NORMAN_TARGETS``), measured on the data as a
user loads it: written by ``write_synthetic_dataset``, processed, split as the demo splits it."""

import pytest

from gears_ddp import PertData
from gears_ddp.datasets import preset, write_synthetic_dataset
from gears_ddp.evaluation.calibration import NORMAN_TARGETS, calibration_statistics


@pytest.fixture(scope="module")
def norman(tmp_path_factory):
    folder = tmp_path_factory.mktemp("norman")
    write_synthetic_dataset(folder, name="synthetic", **preset("norman"))
    pert_data = PertData(str(folder))
    pert_data.load(data_path=str(folder / "synthetic"))
    return pert_data


@pytest.mark.parametrize("split_seed", [1, 2, 3])
def test_norman_preset_meets_its_calibration_targets(norman, split_seed):
    norman.prepare_split("simulation", seed=split_seed)
    statistics = calibration_statistics(norman)
    for name, (what, _, (low, high)) in NORMAN_TARGETS.items():
        assert low <= statistics[name] <= high, f"{what}: {statistics[name]:.4g} outside [{low}, {high}]"
    # on two-gene combinations of seen genes, adding the single effects beats the average effect
    assert statistics["additive_combo_seen2_pearson_delta"] > statistics["mean_effect_combo_seen2_pearson_delta"] + 0.1
    assert statistics["combos"] / statistics["singles"] == pytest.approx(131 / 105, rel=0.1)
