"""What is asked of an object before it holds what the answer needs is refused by name,
not failed on a None deep inside."""

import pytest
import torch

from gears_ddp import PertData
from gears_ddp.datasets import write_synthetic_dataset
from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE, ChangePredictor
from gears_ddp.report.page_builder import not_applicable_cell


def test_pert_data_without_a_dataset_says_to_load_one(tmp_path):
    pert_data = PertData(tmp_path)
    for asked in (pert_data.require_data, lambda: pert_data.ctrl_adata, pert_data.share_memory_):
        with pytest.raises(RuntimeError, match="no dataset loaded"):
            asked()


class NoChange(torch.nn.Module):
    """A network of 3 genes that predicts no change."""

    num_genes = 3

    def set_effects(self, sets):
        return torch.zeros(len(sets.sets), self.num_genes), None


def test_drawn_cells_predictor_without_control_cells_is_refused():
    predictor = ChangePredictor(NoChange(), torch.device("cpu"), DRAWN_CELLS_CHANGE)  # not for_data's: no cells
    with pytest.raises(ValueError, match="needs the control cells"):
        predictor.changes(torch.tensor([[0, -1]]))


def test_synthetic_dataset_writes_its_expression_itself(tmp_path):
    with pytest.raises(ValueError, match="takes no expression_to"):
        write_synthetic_dataset(
            tmp_path,
            n_genes=50,
            n_modules=4,
            n_perturbed_genes=6,
            n_combos=3,
            cells_per_condition=5,
            n_control_cells=20,
            expression_to=lambda obs, var, blocks: [list(b) for b in blocks] and None,
        )


def test_not_applicable_cell_without_a_reason():
    assert not_applicable_cell(None) == '<td class="na">n/a<br><span class="meaning"></span></td>'
    assert "fixed" in not_applicable_cell("fixed")
