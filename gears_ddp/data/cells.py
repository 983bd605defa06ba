"""All cells of a dataset as a few tensors, and batches gathered from them by index.

There is no Python object per cell. ``CellTable`` holds the expression matrix once
(float32, cells x genes), each cell's condition code, and per-condition lookup tables
(perturbed-gene indices, top-20 DE gene indices). A batch of cells is one ``index_select``
call (see ``loaders.EpochPlan``). ``share_memory_`` moves the tensors to shared memory so processes spawned on the
same node read one copy.

A training example pairs a perturbed cell (target ``y``) with a control cell (input
``x``); control cells are paired with themselves. ``draw_control_partners`` makes that
pairing from a seed, so it is reproducible and identical on every rank.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Sequence

import torch

from gears_ddp.data.conditions import CONTROL
from gears_ddp.data.perturbation_sets import PerturbationSets

N_DE_GENES = 20
VALUES_PER_BLOCK = 2**21  # expression values read at once by a statistic over many cells
MAX_PERTURBED_GENES = 2


@dataclass
class PertBatch:
    """One batch. ``x``: paired control expression (B x G); ``y``: observed expression (B x G);
    ``pert_idx``: perturbed genes in the perturbation vocabulary (B x 2, -1 padded);
    ``condition``: condition code of each cell (B); ``de_idx``: the condition's top-20 DE
    gene indices (B x 20, -1 padded); ``condition_names``: code -> condition string;
    ``sets``: the batch's distinct perturbation sets, found on the host by the loaders (None:
    the model finds them)."""

    x: torch.Tensor
    y: torch.Tensor
    pert_idx: torch.Tensor
    condition: torch.Tensor
    de_idx: torch.Tensor
    condition_names: Sequence[str]
    sets: PerturbationSets | None = None

    _TENSORS = ("x", "y", "pert_idx", "condition", "de_idx")

    def __len__(self) -> int:
        return self.y.shape[0]

    @property
    def pert(self) -> list[str]:
        """Each cell's condition string (the reference's ``batch.pert``)."""
        return [self.condition_names[c] for c in self.condition.tolist()]

    def _map(self, fn) -> "PertBatch":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({name: fn(values[name]) for name in self._TENSORS})
        if self.sets is not None:
            values["sets"] = self.sets.map(fn)
        return PertBatch(**values)

    def to(self, device, non_blocking: bool = False, copy: bool = False) -> "PertBatch":
        """The batch on ``device`` (with ``copy``, in new memory even where it is there already)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking, copy=copy))

    def pin_memory(self) -> "PertBatch":
        """The batch in page-locked memory (called by ``DataLoader(pin_memory=True)``)."""
        return self._map(torch.Tensor.pin_memory)


@dataclass
class CellTable:
    """Expression and per-cell / per-condition indices of one dataset, as tensors.

    ``expression`` is float32 or float16, in memory or a read-only map of the file
    ``mapped_from`` (``expression_map``); batches and statistics come out in float32 or
    float64 either way. A mapped table pickles as the file's path, so a process that
    unpickles it maps the same file instead of receiving a copy.
    """

    expression: torch.Tensor  # (cells, genes) float32 or float16
    condition_codes: torch.Tensor  # (cells,) long, index into ``conditions``
    conditions: list[str]  # condition strings, in order of first appearance
    condition_pert_idx: torch.Tensor  # (conditions, 2) long, -1 padded
    condition_de_idx: torch.Tensor  # (conditions, 20) long, -1 padded
    condition_names: list[str]  # each condition's ``condition_name`` (the key of the uns gene sets)
    mapped_from: str | None = None  # the map file ``expression`` reads, if any
    expression_digest: str | None = None  # ``expression_map.values_digest`` of ``expression``, once known
    _control_mean: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def identity(self) -> dict[str, str]:
        """What the table holds, by content, for comparing copies of a dataset:
        ``expression`` (dtype, shape and the digest of the values: a map's record holds it,
        so nothing is read; values in memory are hashed once), and ``cells`` (each cell's
        condition and the per-condition tables). Where the files lie and when they were
        written play no part."""
        from gears_ddp.data.expression_map import values_digest

        if self.expression_digest is None:
            self.expression_digest = values_digest(self.expression)
        expression = f"{self.expression.dtype} {tuple(self.expression.shape)} {self.expression_digest}"
        cells = hashlib.blake2b(digest_size=16)
        for tensor in (self.condition_codes, self.condition_pert_idx, self.condition_de_idx):
            cells.update(tensor.numpy().tobytes())
        cells.update(repr((self.conditions, self.condition_names)).encode())
        return {
            "expression": hashlib.blake2b(expression.encode(), digest_size=16).hexdigest(),
            "cells": cells.hexdigest(),
        }

    @property
    def n_cells(self) -> int:
        return self.expression.shape[0]

    @property
    def n_perts(self) -> int:
        """A bound on the perturbation indices the conditions use: one more than the largest (0
        without conditions)."""
        return int(self.condition_pert_idx.max()) + 1 if len(self.condition_pert_idx) else 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.mapped_from is not None:
            state["expression"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.mapped_from is not None:
            from gears_ddp.data.expression_map import as_tensor, open_map

            self.expression = as_tensor(open_map(self.mapped_from))

    def share_memory_(self) -> "CellTable":
        """Move every tensor to shared memory (in place) so child processes do not copy it
        (a mapped expression is shared through the page cache already)."""
        tensors = [self.condition_codes, self.condition_pert_idx, self.condition_de_idx]
        for tensor in tensors + ([] if self.mapped_from is not None else [self.expression]):
            tensor.share_memory_()
        return self

    def nbytes(self) -> int:
        """Bytes held by the table's tensors."""
        return sum(
            t.element_size() * t.numel()
            for t in (self.expression, self.condition_codes, self.condition_pert_idx, self.condition_de_idx)
        )

    def control_cells(self) -> torch.Tensor:
        """Indices of the control cells."""
        if CONTROL not in self.conditions:
            return torch.empty(0, dtype=torch.long)
        return torch.nonzero(self.condition_codes == self.conditions.index(CONTROL)).flatten()

    def control_mean(self) -> torch.Tensor:
        """Mean expression of the control cells (G, float32), summed in float64 a block of
        about ``VALUES_PER_BLOCK`` values at a time. Computed once (it reads every control
        cell: a tenth of a million-cell screen) and kept, as the table's data never changes."""
        if self._control_mean is None:
            controls = self.control_cells()
            total = torch.zeros(self.expression.shape[1], dtype=torch.float64)
            for block in controls.split(max(1, VALUES_PER_BLOCK // self.expression.shape[1])):
                total += self.expression[block].sum(0, dtype=torch.float64)
            self._control_mean = (total / max(1, len(controls))).float()
        return self._control_mean

    def rows(self, cells: torch.Tensor) -> torch.Tensor:
        """The expression of ``cells`` in float32."""
        return self.expression[cells].float()

    def cells_of(self, conditions: Sequence[str]) -> torch.Tensor:
        """Indices of the cells of ``conditions``, grouped by condition in the given order."""
        code_of = {c: i for i, c in enumerate(self.conditions)}
        rank = torch.full((len(self.conditions),), len(conditions), dtype=torch.long)
        for position, condition in enumerate(conditions):
            if condition in code_of:
                rank[code_of[condition]] = position
        cell_rank = rank[self.condition_codes]
        order = torch.argsort(cell_rank, stable=True)
        return order[cell_rank[order] < len(conditions)]

    def draw_control_partners(self, seed: int) -> torch.Tensor:
        """For every cell, the index of its input cell: a random control cell for perturbed
        cells (drawn from ``seed``), itself for control cells."""
        controls = self.control_cells()
        partners = torch.arange(self.n_cells)
        if len(controls) == 0:
            return partners
        perturbed = torch.nonzero(self.condition_codes != self.conditions.index(CONTROL)).flatten()
        generator = torch.Generator().manual_seed(seed)
        partners[perturbed] = controls[torch.randint(len(controls), (len(perturbed),), generator=generator)]
        return partners
