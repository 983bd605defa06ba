"""The distinct perturbation sets of a batch of cells, and of every batch of an epoch.

GEARS computes everything before a cell's ``+ x`` from its set of perturbed genes alone, so
the model computes it once per distinct set of a batch (``model.network``). Finding those
sets is a ``unique``: its result's size depends on the data, so on a GPU the host would wait
for the device to find them, every step. The loaders therefore find them on the host, for
many batches of an epoch at once (``epoch_perturbation_sets``, used by ``loaders.EpochPlan``
for a window of batches at a time), and they reach the device with each batch's other
tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


def set_keys(pert_idx: torch.Tensor, n_perts: int) -> tuple[torch.Tensor, int]:
    """Each row of ``pert_idx`` (N x k, indices below ``n_perts``, -1 padded) as one integer,
    and the number of possible keys.

    The row is sorted (``[A, B]`` and ``[B, A]`` are the same set, as the model sums the
    genes' embeddings), and its shifted indices are the digits of the key in base
    ``n_perts + 1``, the first most significant: keys order as the sorted rows do, and a
    one-dimensional ``unique`` of them (a few operations, where ``unique`` over rows takes
    one per row) finds the distinct sets in lexicographic order. The set of no gene has key 0.
    """
    canonical, _ = torch.sort(pert_idx, dim=1)
    base, key = n_perts + 1, torch.zeros_like(canonical[:, 0])
    for column in canonical.unbind(1):
        key = key * base + (column + 1)
    return key, base ** canonical.shape[1]


def sets_of_keys(keys: torch.Tensor, n_columns: int, n_perts: int) -> torch.Tensor:
    """The sets (len(keys) x ``n_columns``, -1 padded) that ``set_keys`` gave ``keys``."""
    base, digits = n_perts + 1, []
    for _ in range(n_columns):
        digits.append(keys % base - 1)
        keys = keys // base
    return torch.stack(digits[::-1], dim=1)


def distinct_perturbation_sets(pert_idx: torch.Tensor, n_perts: int):
    """Distinct perturbation sets of a batch.

    ``pert_idx`` (B x k, indices below ``n_perts``, -1 padded) -> ``sets`` (S x k, each row
    sorted, rows in lexicographic order), ``cell_set`` (B, the set of each cell) and
    ``counts`` (S, cells per set) (``set_keys``).
    """
    key, _ = set_keys(pert_idx, n_perts)
    keys, cell_set, counts = torch.unique(key, return_inverse=True, return_counts=True)
    return sets_of_keys(keys, pert_idx.shape[1], n_perts), cell_set, counts


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

    The tensors are views of one integer tensor, ``packed``: ``sets``, ``counts``,
    ``first_cell``, ``first_perturbed_cell``, ``cell_set`` and ``cells_by_set`` one after
    the other (``pack``), so that a batch's sets are one tensor to lay out, pin and copy to
    a device. The host integers say where each one lies.

    ``padded`` sets end with sets of no cell (-1 rows, count 0), and their host
    integers do not depend on the batch: ``n_unperturbed`` and ``unperturbed_cells`` are 0
    there, and the model tells the unperturbed set by its genes (none) instead (the
    ``perturbed_*`` tensors are then those of all sets, and the model does not use them).
    """

    packed: torch.Tensor
    n_sets: int
    n_columns: int
    n_cells: int
    n_unperturbed: int
    unperturbed_cells: int  # the cells of the unperturbed set (0 without one)
    padded: bool = False

    @classmethod
    def pack(
        cls,
        sets,
        counts,
        first_cell,
        first_perturbed_cell,
        cell_set,
        cells_by_set,
        n_unperturbed: int,
        unperturbed_cells: int,
    ) -> "PerturbationSets":
        """The sets of the given tensors (see the class docstring), packed into one."""
        packed = torch.cat((sets.reshape(-1), counts, first_cell, first_perturbed_cell, cell_set, cells_by_set))
        return cls(packed, sets.shape[0], sets.shape[1], cell_set.shape[0], n_unperturbed, unperturbed_cells)

    @classmethod
    def of(cls, pert_idx: torch.Tensor, n_perts: int) -> "PerturbationSets":
        """The sets of a batch's ``pert_idx`` (B x k, indices below ``n_perts``), computed
        where ``pert_idx`` is (on a GPU this waits for the device: use it on the host)."""
        sets, cell_set, counts = distinct_perturbation_sets(pert_idx, n_perts)
        n_unperturbed = int(len(sets) > 0 and bool((sets[0] < 0).all()))
        cells_by_set = torch.repeat_interleave(torch.arange(len(sets), device=sets.device), counts)
        first_cell = torch.cumsum(counts, 0) - counts
        unperturbed_cells = int(counts[0]) if n_unperturbed else 0
        return cls.pack(
            sets,
            counts,
            first_cell,
            first_cell[n_unperturbed:] - unperturbed_cells,
            cell_set,
            cells_by_set,
            n_unperturbed,
            unperturbed_cells,
        )

    @classmethod
    def each_once(cls, sets: torch.Tensor) -> "PerturbationSets":
        """``sets`` (K x k) as they are, one cell each: the sets of an evaluation, where the
        model runs in evaluation mode (not sorted or distinct, as training mode needs)."""
        each = torch.arange(len(sets), device=sets.device)
        return cls.pack(sets, torch.ones_like(each), each, each, each, each, 0, 0)

    def _part(self, start: int, length: int) -> torch.Tensor:
        return self.packed[start : start + length]

    @property
    def sets(self) -> torch.Tensor:
        return self._part(0, self.n_sets * self.n_columns).view(self.n_sets, self.n_columns)

    @property
    def counts(self) -> torch.Tensor:
        return self._part(self.n_sets * self.n_columns, self.n_sets)

    @property
    def first_cell(self) -> torch.Tensor:
        return self._part(self.n_sets * (self.n_columns + 1), self.n_sets)

    @property
    def first_perturbed_cell(self) -> torch.Tensor:
        return self._part(self.n_sets * (self.n_columns + 2), self.n_sets - self.n_unperturbed)

    @property
    def cell_set(self) -> torch.Tensor:
        return self._part(self._per_cell, self.n_cells)

    @property
    def cells_by_set(self) -> torch.Tensor:
        return self._part(self._per_cell + self.n_cells, self.n_cells)

    @property
    def perturbed_cells_by_set(self) -> torch.Tensor:
        return self._part(self._per_cell + self.n_cells + self.unperturbed_cells, self.n_cells - self.unperturbed_cells)

    @property
    def _per_cell(self) -> int:
        """Where the per-cell tensors start in ``packed``."""
        return self.n_sets * (self.n_columns + 3) - self.n_unperturbed

    def map(self, fn) -> "PerturbationSets":
        """The same sets with ``fn`` applied to the packed tensor (a copy to a device, pinning)."""
        return dataclasses.replace(self, packed=fn(self.packed))


def epoch_perturbation_sets(
    pert_idx: torch.Tensor, n_perts: int, batch_size: int, pad_to: int | None = None
) -> list[PerturbationSets]:
    """The ``PerturbationSets`` of every batch of an epoch, found at once: item ``i`` equals
    ``PerturbationSets.of`` of batch ``i``'s ``pert_idx``. With ``pad_to``, every batch's sets
    are ``padded``: followed by sets of no cell (no gene, -1; count 0; first cells 0) up to
    ``pad_to`` sets, from its own number up to one per cell.

    ``pert_idx`` (N x k) holds the epoch's cells in batch order; batch ``i`` is cells
    ``[i * batch_size, (i + 1) * batch_size)`` (the last may be short). Each cell's key
    (``set_keys``) is offset by its batch's number times the number of possible keys, so one
    ``unique`` over the epoch finds every batch's distinct sets, sorted by batch and, within a
    batch, as ``distinct_perturbation_sets`` sorts them. Every tensor of ``PerturbationSets``
    is computed for all batches together and written where each batch's ``packed`` tensor
    lays it out, in a few operations whatever the number of batches; the batches' packed
    tensors are views of the result.
    """
    n_cells, n_columns = pert_idx.shape
    cell_batch = torch.arange(n_cells) // batch_size
    n_batches = -(-n_cells // batch_size)
    key, n_keys = set_keys(pert_idx, n_perts)
    batch_keys, inverse, counts = torch.unique(cell_batch * n_keys + key, return_inverse=True, return_counts=True)
    set_batch = batch_keys // n_keys
    key = batch_keys - set_batch * n_keys
    sets_per_batch = torch.bincount(set_batch, minlength=n_batches)
    cells_per_batch = torch.bincount(cell_batch, minlength=n_batches)
    first_set = torch.cumsum(sets_per_batch, 0) - sets_per_batch
    set_in_batch = torch.arange(len(counts)) - first_set.index_select(0, set_batch)
    n_unperturbed = (key == 0).long().index_select(0, first_set)  # key 0, no gene, is a batch's first set
    unperturbed_cells = counts.index_select(0, first_set) * n_unperturbed
    first_cell = torch.cumsum(counts, 0) - counts - set_batch * batch_size
    if pad_to is None:
        slots, dropped = sets_per_batch, n_unperturbed  # a batch's sets; the unperturbed one has no first_perturbed
    else:
        _check_padding(pad_to, sets_per_batch, cells_per_batch)
        slots, dropped = torch.full_like(sets_per_batch, pad_to), torch.zeros_like(n_unperturbed)

    # every batch's packed tensor (laid out as PerturbationSets.pack lays it out), written for all batches at
    # once; an unperturbed set's first_perturbed_cell goes to one element past them all, dropped. Padding
    # sets (pad_to) have no gene (-1), count 0 and first cells 0
    lengths = slots * (n_columns + 3) - dropped + 2 * cells_per_batch
    end = torch.cumsum(lengths, 0)
    packed = torch.zeros(int(end[-1]) + 1 if n_batches else 1, dtype=torch.long)
    if pad_to is not None:
        packed.index_fill_(0, ((end - lengths).unsqueeze(1) + torch.arange(pad_to * n_columns)).view(-1), -1)
    n_slots = slots.index_select(0, set_batch)  # in each set's batch
    at = (end - lengths).index_select(0, set_batch) + set_in_batch  # each set's place in a part of one item a set
    at_genes = (at + set_in_batch * (n_columns - 1)).unsqueeze(1) + torch.arange(n_columns)
    packed.index_copy_(0, at_genes.view(-1), sets_of_keys(key, n_columns, n_perts).view(-1))
    at += n_slots * n_columns
    packed.index_copy_(0, at, counts)
    at += n_slots
    packed.index_copy_(0, at, first_cell)
    at += n_slots - dropped.index_select(0, set_batch)
    if pad_to is None:
        packed.index_copy_(
            0, torch.where(key == 0, len(packed) - 1, at), first_cell - unperturbed_cells.index_select(0, set_batch)
        )
    else:  # the perturbed-cells tensors of padded sets are those of all sets
        packed.index_copy_(0, at, first_cell)
    at = (end - 2 * cells_per_batch).index_select(0, cell_batch) + torch.arange(n_cells) - cell_batch * batch_size
    packed.index_copy_(0, at, inverse - first_set.index_select(0, cell_batch))
    packed.index_copy_(
        0, at + cells_per_batch.index_select(0, cell_batch), torch.repeat_interleave(set_in_batch, counts)
    )
    # padded sets' host integers do not depend on the batch: no unperturbed set is set apart
    apart = (n_unperturbed, unperturbed_cells) if pad_to is None else (dropped, dropped)
    return [
        PerturbationSets(
            batch_packed, batch_sets, columns, batch_cells, sets_apart, cells_apart, padded=pad_to is not None
        )
        for batch_packed, batch_sets, columns, batch_cells, sets_apart, cells_apart in zip(
            packed[:-1].split(lengths.tolist()),
            slots.tolist(),
            [n_columns] * n_batches,
            cells_per_batch.tolist(),
            apart[0].tolist(),
            apart[1].tolist(),
        )
    ]


def _check_padding(n_sets: int, sets_per_batch: torch.Tensor, cells_per_batch: torch.Tensor) -> None:
    """Refuse a padded number of sets below a batch's own or above its number of cells (the
    model's row buffers hold one set per cell)."""
    too_few = torch.nonzero((sets_per_batch > n_sets) | (cells_per_batch < n_sets)).flatten()
    if len(too_few):
        batch = int(too_few[0])
        raise ValueError(
            f"a batch of {int(cells_per_batch[batch])} cells with {int(sets_per_batch[batch])} distinct "
            f"perturbation sets cannot be padded to {n_sets} sets: from its own number up to one per "
            "cell"
        )
