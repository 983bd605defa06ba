"""The GEARS loss, computed with tensor operations instead of a Python loop over conditions.

Per batch, cells are grouped by condition. For each group, over its cells and its retained
genes (for a perturbed condition its ``non_zeros_gene_idx``, for control all genes)::

    sum((pred - y)^4) / (cells * genes)
  + direction_lambda * sum((sign(y - ctrl_mean) - sign(pred - ctrl_mean))^2) / (cells * genes)

and the loss is the mean of the group terms. In uncertainty mode the first term becomes
``sum((pred - y)^4 + reg * exp(-logvar) * (pred - y)^4) / (cells * genes)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gears_ddp.data.conditions import CONTROL
from gears_ddp.model.model_options import ModelOptions

GAMMA = 2  # the error is raised to 2 + GAMMA
DEFAULTS = ModelOptions.defaults()  # the loss's weights default to the model options' one definition


@dataclass
class LossContext:
    """What the loss needs beyond a batch: each condition's retained genes (C x G bool, by
    condition code) and the control mean expression (G)."""

    retained_genes: torch.Tensor
    ctrl_mean: torch.Tensor
    direction_lambda: float = DEFAULTS["direction_lambda"]
    uncertainty_reg: float = DEFAULTS["uncertainty_reg"]
    genes_per_condition: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        self.genes_per_condition = self.retained_genes.sum(1)

    @classmethod
    def from_pert_data(
        cls,
        pert_data,
        direction_lambda: float = DEFAULTS["direction_lambda"],
        uncertainty_reg: float = DEFAULTS["uncertainty_reg"],
    ):
        """Build it from a loaded ``PertData`` (needs the DE gene sets of ``new_data_process``)."""
        uns, cells = pert_data.uns, pert_data.cells
        if "non_zeros_gene_idx" not in uns:
            raise ValueError(
                f"dataset {pert_data.dataset_name!r} has no uns['non_zeros_gene_idx']: the loss "
                "needs the gene sets that new_data_process computes unless skip_calc_de=True"
            )
        retained = torch.zeros(len(cells.conditions), len(pert_data.var), dtype=torch.bool)
        for code, (condition, name) in enumerate(zip(cells.conditions, cells.condition_names)):
            if condition == CONTROL:
                retained[code] = True
            else:
                retained[code, torch.as_tensor(np.asarray(uns["non_zeros_gene_idx"][name], dtype=np.int64))] = True
        return cls(retained, pert_data.cells.control_mean(), direction_lambda, uncertainty_reg)

    def to(self, device) -> "LossContext":
        return LossContext(
            self.retained_genes.to(device), self.ctrl_mean.to(device), self.direction_lambda, self.uncertainty_reg
        )


def gears_loss(
    pred: torch.Tensor,
    y: torch.Tensor,
    condition: torch.Tensor,
    context: LossContext,
    logvar: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GEARS loss of a batch (``condition``: each cell's condition code).

    The group terms are summed into one slot per condition of the dataset, and their mean
    is over the slots that received cells: no operation's size depends on which conditions
    the batch holds, so a GPU never waits to learn it."""
    retained = context.retained_genes.index_select(0, condition)
    error = (pred - y) ** (2 + GAMMA)
    if logvar is not None:
        error = error + context.uncertainty_reg * torch.exp(-logvar) * error
    direction = (torch.sign(y - context.ctrl_mean) - torch.sign(pred - context.ctrl_mean)) ** 2
    per_cell = torch.where(retained, error + context.direction_lambda * direction, 0).sum(1)
    slots = per_cell.new_zeros(2, len(context.retained_genes))
    per_condition = slots[0].index_add(0, condition, per_cell)
    cells = slots[1].index_add(0, condition, torch.ones_like(per_cell))
    present = cells > 0
    terms = per_condition / torch.where(present, cells * context.genes_per_condition, 1)
    return terms.sum() / present.sum()
