"""Loaders over a ``CellTable``: one code path for one process and for many.

``build_loaders`` makes the train / val / test loaders for one rank of ``world_size``;
``PertData.get_dataloader`` is the ``world_size=1`` case, so single-process and
distributed training read data the same way.

- train: ``DistributedSampler`` (shuffle, ``drop_last``, seeded; ``set_epoch`` reshuffles)
  and ``drop_last`` batches, as in the reference.
- val / test: ``ContiguousShardSampler``: rank r gets one contiguous block of the cells and
  the blocks cover every cell exactly once (no padding duplicates), so metrics gathered
  from all ranks equal the single-process ones. Cells stay grouped by condition.

Each loader is a ``torch.utils.data.DataLoader`` whose dataset gathers a whole batch in one
call (``__getitems__``); ``CellLoader.set_epoch`` also redraws control partners when asked.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from gears_ddp.data.cells import CellTable, PertBatch

EPOCH_SEED_STRIDE = 1_000_003  # separates the partner streams of successive epochs


class PairedCellDataset(Dataset):
    """The cells ``cell_indices`` of a table, each paired with a control cell."""

    def __init__(self, table: CellTable, cell_indices: torch.Tensor, pairing_seed: int,
                 resample_controls: bool = False):
        self.table = table
        self.cell_indices = cell_indices
        self.pairing_seed = pairing_seed
        self.resample_controls = resample_controls
        self.partners = table.draw_control_partners(pairing_seed)

    def __len__(self) -> int:
        return len(self.cell_indices)

    def __getitems__(self, positions) -> PertBatch:
        return self.table.gather(self.cell_indices[torch.as_tensor(positions, dtype=torch.long)], self.partners)

    def __getitem__(self, position: int) -> PertBatch:
        return self.__getitems__([position])

    def set_epoch(self, epoch: int) -> None:
        """Draw new control partners for ``epoch`` if resampling is on (same on every rank)."""
        if self.resample_controls:
            self.partners = self.table.draw_control_partners(self.pairing_seed + EPOCH_SEED_STRIDE * epoch)


def _keep_batch(batch: PertBatch) -> PertBatch:
    """Collate function: the dataset already returns a whole batch."""
    return batch


class ContiguousShardSampler(Sampler):
    """Rank ``rank`` of ``world_size`` gets positions ``[n*rank//W, n*(rank+1)//W)``."""

    def __init__(self, n: int, world_size: int = 1, rank: int = 0):
        self.start = n * rank // world_size
        self.stop = n * (rank + 1) // world_size

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


class CellLoader(DataLoader):
    """A ``DataLoader`` over a ``PairedCellDataset`` with one ``set_epoch`` for sampler and pairing."""

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self.dataset.set_epoch(epoch)


def _loader(dataset, batch_size, sampler, drop_last, num_workers, pin_memory) -> CellLoader:
    return CellLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      collate_fn=_keep_batch, num_workers=num_workers, pin_memory=pin_memory,
                      persistent_workers=False)


def build_loaders(table: CellTable, set2cells: dict[str, torch.Tensor], batch_size: int,
                  test_batch_size: int, world_size: int = 1, rank: int = 0, seed: int = 0,
                  resample_controls: bool = False, num_workers: int = 0,
                  pin_memory: bool = False) -> dict[str, CellLoader]:
    """Loaders keyed ``'{set}_loader'`` for every set in ``set2cells`` (train shuffled)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    loaders = {}
    for name, cells in set2cells.items():
        dataset = PairedCellDataset(table, cells, seed, resample_controls and name == "train")
        if name == "train":
            if len(cells) < batch_size * world_size:
                raise ValueError(f"the train set has {len(cells)} cells, fewer than one batch of "
                                 f"{batch_size} per rank x {world_size} ranks; lower batch_size")
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                         seed=seed, drop_last=True)
            loaders[f"{name}_loader"] = _loader(dataset, batch_size, sampler, True, num_workers, pin_memory)
        else:
            sampler = ContiguousShardSampler(len(cells), world_size, rank)
            loaders[f"{name}_loader"] = _loader(dataset, test_batch_size, sampler, False, num_workers,
                                                pin_memory)
    return loaders

