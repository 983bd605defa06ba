"""The distinct perturbation sets of a batch of cells.

GEARS computes everything before a cell's ``+ x`` from its set of perturbed genes alone, so
the model computes it once per distinct set of a batch (``model.network``). Finding those
sets is a ``unique``: its result's size depends on the data, so on a GPU the host would wait
for the device to find them, every step. The loaders therefore find them on the host while
they gather the batch (``loaders.EpochPlan``), and they reach the device with the batch's
other tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def distinct_perturbation_sets(pert_idx: torch.Tensor, n_perts: int):
    """Distinct perturbation sets of a batch.

    ``pert_idx`` (B x k, indices below ``n_perts``, -1 padded) -> ``sets`` (S x k, each row
    sorted, rows in lexicographic order), ``cell_set`` (B, the set of each cell) and
    ``counts`` (S, cells per set). ``[A, B]`` and ``[B, A]`` are the same set, as the model
    sums the genes' embeddings.
    """
    canonical, _ = torch.sort(pert_idx, dim=1)
    # Each row as one integer whose digits in base n_perts + 1 are its shifted indices, the first
    # most significant: a one-dimensional unique (a few operations, where unique over rows takes
    # one per cell) that orders the keys as the rows.
    base, key = n_perts + 1, torch.zeros_like(canonical[:, 0])
    for column in canonical.unbind(1):
        key = key * base + (column + 1)
    keys, cell_set, counts = torch.unique(key, return_inverse=True, return_counts=True)
    digits = []
    for _ in range(canonical.shape[1]):
        digits.append(keys % base - 1)
        keys = keys // base
    return torch.stack(digits[::-1], dim=1), cell_set, counts


@dataclass
class PerturbationSets:
    """A batch's distinct perturbation sets: ``sets`` (S x k, -1 padded, sorted as
    ``distinct_perturbation_sets`` sorts them), each cell's set ``cell_set`` (B) and the
    cells per set ``counts`` (S). ``n_unperturbed`` (a host integer, 0 or 1) is the number of
    leading sets that perturb no gene (the control cells' set sorts first).

    For the layers whose BatchNorm runs over one row per cell: ``cells_by_set`` (B), the set
    of each cell with the cells grouped by set (a set's row repeated for each of its cells),
    and ``first_cell`` (S), where each set's cells start in it; ``perturbed_cells_by_set``
    and ``first_perturbed_cell``, the same for the cells of the perturbed sets only.
    """

    sets: torch.Tensor
    cell_set: torch.Tensor
    counts: torch.Tensor
    n_unperturbed: int
    cells_by_set: torch.Tensor
    first_cell: torch.Tensor
    perturbed_cells_by_set: torch.Tensor
    first_perturbed_cell: torch.Tensor

    @classmethod
    def of(cls, pert_idx: torch.Tensor, n_perts: int) -> "PerturbationSets":
        """The sets of a batch's ``pert_idx`` (B x k, indices below ``n_perts``), computed
        where ``pert_idx`` is (on a GPU this waits for the device: use it on the host)."""
        sets, cell_set, counts = distinct_perturbation_sets(pert_idx, n_perts)
        n_unperturbed = int(len(sets) > 0 and bool((sets[0] < 0).all()))
        cells_by_set = torch.repeat_interleave(torch.arange(len(sets), device=sets.device), counts)
        first_cell = torch.cumsum(counts, 0) - counts
        unperturbed_cells = int(counts[0]) if n_unperturbed else 0
        return cls(sets, cell_set, counts, n_unperturbed, cells_by_set, first_cell,
                   cells_by_set[unperturbed_cells:], first_cell[n_unperturbed:] - unperturbed_cells)

    @classmethod
    def each_once(cls, sets: torch.Tensor) -> "PerturbationSets":
        """``sets`` (K x k) as they are, one cell each: the sets of an evaluation, where the
        model runs in evaluation mode (not sorted or distinct, as training mode needs)."""
        each = torch.arange(len(sets), device=sets.device)
        return cls(sets, each, torch.ones_like(each), 0, each, each, each, each)

    @property
    def n_cells(self) -> int:
        return self.cell_set.shape[0]

    def map(self, fn) -> "PerturbationSets":
        """The same sets with ``fn`` applied to each tensor (a copy to a device, pinning)."""
        return PerturbationSets(fn(self.sets), fn(self.cell_set), fn(self.counts), self.n_unperturbed,
                                fn(self.cells_by_set), fn(self.first_cell), fn(self.perturbed_cells_by_set),
                                fn(self.first_perturbed_cell))
