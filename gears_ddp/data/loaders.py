"""Loaders over a ``CellTable``: one code path for one process and for many.

``build_loaders`` makes the train / val / test loaders for one rank of ``world_size``;
``PertData.get_dataloader`` is the ``world_size=1`` case, so single-process and
distributed training read data the same way.

- train: ``ShuffledShardSampler`` (``DistributedSampler``'s shuffle with ``drop_last``,
  seeded; ``set_epoch`` reshuffles) and ``drop_last`` batches, as in the reference.
- val / test, and ``train_eval_loader`` (the training cells, for evaluation):
  ``ContiguousShardSampler``: rank r gets one contiguous block of the cells and
  the blocks cover every cell exactly once (no padding duplicates), so metrics gathered
  from all ranks equal the single-process ones. Cells stay grouped by condition.

At the start of an epoch the loader fixes the epoch's order, and lays out what the batches
look up a window of batches at a time, for all batches of the window at once (``EpochPlan``;
its memory does not grow with the cells); a batch is then one ``index_select`` and one
lookup, with no per-cell work and no ``DataLoader`` machinery in the way. The gather reads a
mapped expression file as easily as memory, and for a GPU writes straight into pinned
memory, from which the step copies asynchronously. With ``num_workers > 0`` the same plan
is served through a ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gears_ddp._options import is_int
from gears_ddp.data.cells import CellTable, PertBatch
from gears_ddp.data.perturbation_sets import epoch_perturbation_sets, set_keys

EPOCH_SEED_STRIDE = 1_000_003  # separates the partner streams of successive epochs


class PairedCellDataset:
    """The cells ``cell_indices`` of a table, each paired with a control cell (its input):
    ``partners[cell]``, one index per cell of the table, shared by the datasets of a split."""

    def __init__(
        self,
        table: CellTable,
        cell_indices: torch.Tensor,
        partners: torch.Tensor,
        pairing_seed: int,
        resample_controls: bool = False,
    ):
        self.table = table
        self.cell_indices = cell_indices
        self.partners = partners
        self.pairing_seed = pairing_seed
        self.resample_controls = resample_controls

    def __len__(self) -> int:
        return len(self.cell_indices)

    def set_epoch(self, epoch: int) -> None:
        """Draw new control partners for ``epoch`` if resampling is on (same on every rank)."""
        if self.resample_controls:
            self.partners = self.table.draw_control_partners(self.pairing_seed + EPOCH_SEED_STRIDE * epoch)


PLAN_WINDOW_BATCHES = 128  # batches an epoch plan lays out together: bounds its memory, whatever the cells


class EpochPlan(Dataset):
    """The batches of one epoch: item ``i`` is batch ``i``.

    The plan holds the epoch's order of cells (a view of the dataset's cells for a
    contiguous shard) and the control partners drawn for it, and lays out what the batches
    look up a window of ``window_batches`` batches at a time, for all batches of the window
    at once (a few vectorised operations, then each batch's views of the results): the rows
    to gather (the cells' control partners, then the cells), the cells' condition codes and
    perturbed genes, and the distinct perturbation sets of every batch
    (``epoch_perturbation_sets``: found on the host, so that the step does not wait for
    them). Its memory is then the order, 8 bytes a cell of the rank's share (none for a
    contiguous shard), and one window, whatever the number of cells: the whole epoch laid
    out at once held about 200 bytes a cell. A batch gathers its input and target rows
    with one ``index_select`` (returned as two views of one tensor) and looks up its
    conditions' DE genes. With ``pad_sets_to``, each batch's sets are padded to that many
    (``epoch_perturbation_sets``).
    """

    def __init__(
        self,
        dataset: PairedCellDataset,
        positions: torch.Tensor | slice,
        batch_size: int,
        drop_last: bool,
        pin_memory: bool = False,
        pad_sets_to: int | None = None,
        window_batches: int = PLAN_WINDOW_BATCHES,
    ):
        cells = dataset.cell_indices[positions]  # a view of the dataset's cells for a slice
        if drop_last:
            cells = cells[: len(cells) // batch_size * batch_size]
        self.cells, self.partners, self.table = cells, dataset.partners, dataset.table  # this epoch's partners
        self.batch_size, self.pin_memory, self.pad_sets_to = batch_size, pin_memory, pad_sets_to
        self.window_batches = window_batches
        self._window: tuple[int, dict] | None = None  # the window laid out last: (its number, its layout)

    def __len__(self) -> int:
        return -(-len(self.cells) // self.batch_size)

    def __getitem__(self, i: int) -> PertBatch:
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of an epoch of {len(self)}")
        layout = self._layout(i // self.window_batches)
        first = i % self.window_batches * self.batch_size
        cells = slice(first, first + self.batch_size)
        table, codes = self.table, layout["codes"][cells]
        x, y = self._gather(layout["rows"][i % self.window_batches]).chunk(2)  # the inputs, then the targets
        batch = PertBatch(
            x=x,
            y=y,
            pert_idx=layout["pert_idx"][cells],
            condition=codes,
            de_idx=table.condition_de_idx.index_select(0, codes),
            condition_names=table.conditions,
            sets=layout["sets"][i % self.window_batches],
        )
        return batch.pin_memory() if self.pin_memory else batch  # (the rows are pinned already)

    def _layout(self, window: int) -> dict:
        """What the batches of window ``window`` look up, laid out for all of them at once
        (kept until another window is asked for)."""
        if self._window is None or self._window[0] != window:
            span = self.window_batches * self.batch_size
            cells = self.cells[window * span : (window + 1) * span]
            table = self.table
            codes = table.condition_codes[cells]
            pert_idx = table.condition_pert_idx[codes]
            self._window = (
                window,
                {
                    "codes": codes,
                    "pert_idx": pert_idx,
                    "rows": _rows_of_batches(self.partners[cells], cells, self.batch_size),
                    "sets": epoch_perturbation_sets(pert_idx, table.n_perts, self.batch_size, self.pad_sets_to),
                },
            )
        return self._window[1]

    def _gather(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``index`` in float32: one gather, straight into pinned memory when asked."""
        expression = self.table.expression
        if not self.pin_memory:
            return expression.index_select(0, index).float()
        rows = torch.empty((len(index), expression.shape[1]), dtype=torch.float32, pin_memory=True)
        if expression.dtype == torch.float32:
            return torch.index_select(expression, 0, index, out=rows)
        return rows.copy_(expression.index_select(0, index))


def _rows_of_batches(inputs: torch.Tensor, cells: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """The rows each batch of ``batch_size`` consecutive ``cells`` gathers: its cells' inputs
    (``inputs``, one per cell), then the cells themselves."""
    n_full = len(cells) // batch_size * batch_size
    full = torch.stack((inputs[:n_full].view(-1, batch_size), cells[:n_full].view(-1, batch_size)), 1)
    rows = list(full.view(-1, 2 * batch_size).unbind(0))
    if n_full < len(cells):
        rows.append(torch.cat((inputs[n_full:], cells[n_full:])))
    return rows


def _keep_batch(batch):
    """Collate function: a plan item is already a whole batch (a ``PertBatch``; left
    unannotated since the DataLoader's stub types a collate function's argument as the list it
    is without ``batch_size=None``)."""
    return batch


class ContiguousShardSampler(Sampler):
    """Rank ``rank`` of ``world_size`` gets positions ``[n*rank//W, n*(rank+1)//W)``."""

    def __init__(self, n: int, world_size: int = 1, rank: int = 0):
        self.start = n * rank // world_size
        self.stop = n * (rank + 1) // world_size

    def positions(self) -> slice:
        """This rank's positions, as a slice: an epoch's plan then views the dataset's cells
        instead of holding an index per cell."""
        return slice(self.start, self.stop)

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


class ShuffledShardSampler(Sampler):
    """``torch.utils.data.DistributedSampler(shuffle=True, drop_last=True)``'s positions (the
    same ones, from the same generator), as a tensor instead of a Python list of every
    position: a permutation of ``n`` positions seeded with ``seed + epoch``, cut to a
    multiple of ``world_size``, of which rank ``rank`` takes every ``world_size``-th."""

    def __init__(self, n: int, world_size: int = 1, rank: int = 0, seed: int = 0):
        self.n, self.world_size, self.rank, self.seed, self.epoch = n, world_size, rank, seed, 0
        self.per_rank = n // world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def positions(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=generator)
        return order[: self.per_rank * self.world_size][self.rank :: self.world_size]

    def __iter__(self):
        return iter(self.positions().tolist())

    def __len__(self) -> int:
        return self.per_rank


ShardSampler = ContiguousShardSampler | ShuffledShardSampler  # the samplers a CellLoader takes


LOADER_SMALLEST = {"batch_size": 1, "test_batch_size": 1, "num_workers": 0, "seed": 0}


def check_loader_options(options: dict, name=str) -> None:
    """The one check of the loader options, ``get_dataloader``'s, which ``GEARS.train`` and
    ``train_multi_gpu`` take under the same names: ``batch_size`` and ``test_batch_size``
    positive integers, ``num_workers`` and ``seed`` non-negative ones, ``resample_controls``
    True or False. ``name(key)``: the option as the caller wrote it; keys left out (or None
    for ``test_batch_size``, which is then ``batch_size``) are not checked."""
    for key, smallest in LOADER_SMALLEST.items():
        if key not in options or (key == "test_batch_size" and options[key] is None):
            continue
        if not (is_int(options[key]) and options[key] >= smallest):
            raise ValueError(
                f"{name(key)} must be a {'positive' if smallest else 'non-negative'} integer, got {options[key]!r}"
            )
    if "resample_controls" in options and not isinstance(options["resample_controls"], bool):
        raise ValueError(f"{name('resample_controls')} must be True or False, got {options['resample_controls']!r}")


class CellLoader:
    """Batches of a ``PairedCellDataset`` in its sampler's order (an iterable, like a DataLoader)."""

    def __init__(
        self,
        dataset: PairedCellDataset,
        batch_size: int,
        sampler: ShardSampler,
        drop_last: bool,
        num_workers: int = 0,
        pin_memory: bool = False,
    ):
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle (train) and, if asked, redraw control partners for ``epoch``."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self.dataset.set_epoch(epoch)

    def __iter__(self):
        return self.batches()

    def batches(self, first: int = 0, pad_sets_to: int | None = None):
        """This epoch's batches from batch ``first`` on (a resumed epoch skips those it did),
        their perturbation sets padded to ``pad_sets_to`` when given (``max_sets_per_batch``)."""
        if self.num_workers > 0:  # worker processes gather; the DataLoader pins in this process
            plan = EpochPlan(
                self.dataset, self.sampler.positions(), self.batch_size, self.drop_last, pad_sets_to=pad_sets_to
            )
            yield from DataLoader(
                plan,
                batch_size=None,
                sampler=range(first, len(plan)),
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                collate_fn=_keep_batch,
            )
            return
        plan = EpochPlan(
            self.dataset, self.sampler.positions(), self.batch_size, self.drop_last, self.pin_memory, pad_sets_to
        )
        for i in range(first, len(plan)):
            yield plan[i]

    def max_sets_per_batch(self) -> int:
        """The most distinct perturbation sets a batch can hold: one per cell, and no more than
        the dataset's cells have (the same on every rank: each rank's dataset is the whole set)."""
        table = self.dataset.table
        codes = torch.unique(table.condition_codes[self.dataset.cell_indices])
        keys, _ = set_keys(table.condition_pert_idx[codes], table.n_perts)
        return min(self.batch_size, len(torch.unique(keys)))


def build_loaders(
    table: CellTable,
    set2cells: dict[str, torch.Tensor],
    batch_size: int,
    test_batch_size: int,
    world_size: int = 1,
    rank: int = 0,
    seed: int = 0,
    resample_controls: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> dict[str, CellLoader]:
    """Loaders keyed ``'{set}_loader'`` for every set in ``set2cells`` (train shuffled), plus
    ``'train_eval_loader'``: the training cells in evaluation order (sharded like val / test),
    for the per-epoch evaluation of the training set."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    loaders = {}
    partners = table.draw_control_partners(seed)
    sampler: ShardSampler
    for name, cells in set2cells.items():
        dataset = PairedCellDataset(table, cells, partners, seed, resample_controls and name == "train")
        if name == "train":
            if len(cells) < batch_size * world_size:
                raise ValueError(
                    f"the train set has {len(cells)} cells, fewer than one batch of "
                    f"{batch_size} per rank x {world_size} ranks; lower batch_size"
                )
            sampler = ShuffledShardSampler(len(cells), world_size, rank, seed)
            loaders[f"{name}_loader"] = CellLoader(dataset, batch_size, sampler, True, num_workers, pin_memory)
            loaders["train_eval_loader"] = CellLoader(
                PairedCellDataset(table, cells, partners, seed),
                test_batch_size,
                ContiguousShardSampler(len(cells), world_size, rank),
                False,
                num_workers,
                pin_memory,
            )
        else:
            sampler = ContiguousShardSampler(len(cells), world_size, rank)
            loaders[f"{name}_loader"] = CellLoader(dataset, test_batch_size, sampler, False, num_workers, pin_memory)
    return loaders
