"""Batches are gathered correctly; distributed loaders split the data as promised."""

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from gears_ddp import PertData
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.loaders import EpochPlan
from gears_ddp.data.perturbation_sets import PerturbationSets, epoch_perturbation_sets


def _all(loader):
    return list(loader)


def test_batch_contents_follow_the_reference_definition(toy):
    loaders = toy.get_dataloader(16)
    expression = torch.from_numpy(toy.adata.X)
    control = set(toy.cells.control_cells().tolist())
    ranked = toy.adata.uns["rank_genes_groups_cov_all"]
    name_of = dict(zip(toy.adata.obs["condition"].astype(str), toy.adata.obs["condition_name"].astype(str)))
    batch = next(iter(loaders["test_loader"]))
    for row, condition in enumerate(batch.pert):
        # y is an observed cell of that condition; x a control cell (itself for controls)
        y_rows = torch.nonzero((expression == batch.y[row]).all(1)).flatten().tolist()
        assert any(toy.adata.obs["condition"].iloc[r] == condition for r in y_rows)
        x_rows = torch.nonzero((expression == batch.x[row]).all(1)).flatten().tolist()
        assert set(x_rows) & control
        genes = condition_genes(condition)
        expected_pert = [toy.node_map_pert[g] for g in genes] + [-1] * (2 - len(genes))
        assert batch.pert_idx[row].tolist() == expected_pert
        top20 = set(ranked[name_of[condition]][:20])
        expected_de = sorted(toy.node_map[g] for g in top20)
        assert batch.de_idx[row].tolist() == expected_de + [-1] * (20 - len(expected_de))


SET_TENSORS = (
    "sets",
    "counts",
    "cell_set",
    "cells_by_set",
    "first_cell",
    "perturbed_cells_by_set",
    "first_perturbed_cell",
)


def _assert_same_sets(got: PerturbationSets, want: PerturbationSets) -> None:
    """Every tensor the model reads, and the host integers beside them."""
    for name in SET_TENSORS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert (got.n_unperturbed, got.n_cells) == (want.n_unperturbed, want.n_cells)


@pytest.mark.parametrize("columns, batch_size", [(1, 1), (2, 5), (2, 32), (3, 7)])
def test_the_sets_of_an_epoch_are_those_of_each_batch_found_alone(columns, batch_size):
    """One search over the epoch gives each batch (the last one short) what
    ``PerturbationSets.of`` gives it: batches with and without unperturbed cells, sets in
    either gene order, a batch of one set."""
    generator = torch.Generator().manual_seed(columns * 100 + batch_size)
    n_perts = 6
    pert_idx = torch.randint(-1, n_perts, (200, columns), generator=generator)
    pert_idx[torch.rand(200, generator=generator) < 0.3] = -1
    pert_idx[:batch_size] = n_perts - 1  # a first batch of one set, and no unperturbed cell
    sets = epoch_perturbation_sets(pert_idx, n_perts, batch_size)
    batches = pert_idx.split(batch_size)
    assert len(sets) == len(batches)
    for got, cells in zip(sets, batches):
        _assert_same_sets(got, PerturbationSets.of(cells, n_perts))


def _assert_padded(got: PerturbationSets, alone: PerturbationSets, pad_to: int) -> None:
    """``got`` is ``alone`` followed by sets of no cell up to ``pad_to`` sets: no gene (-1),
    count 0, first cell 0; the per-cell tensors and the host integers fixed by the shapes."""
    extra = pad_to - alone.n_sets
    assert (got.padded, got.n_sets, got.n_columns, got.n_cells, got.n_unperturbed, got.unperturbed_cells) == (
        True,
        pad_to,
        alone.n_columns,
        alone.n_cells,
        0,
        0,
    )
    assert len(got.packed) == pad_to * (alone.n_columns + 3) + 2 * alone.n_cells
    assert torch.equal(got.sets, torch.cat((alone.sets, torch.full((extra, alone.n_columns), -1))))
    padding = torch.zeros(extra, dtype=torch.long)
    assert torch.equal(got.counts, torch.cat((alone.counts, padding)))
    assert torch.equal(got.first_cell, torch.cat((alone.first_cell, padding)))
    assert torch.equal(got.cell_set, alone.cell_set) and torch.equal(got.cells_by_set, alone.cells_by_set)


@pytest.mark.parametrize("columns, batch_size", [(1, 4), (2, 32), (3, 7)])
def test_padded_sets_of_an_epoch_are_each_batch_padded(columns, batch_size):
    """``pad_to``: every batch's sets padded to the same number with sets of no cell; from a
    batch's own number of sets up to one per cell, else refused."""
    generator = torch.Generator().manual_seed(columns * 100 + batch_size)
    n_perts = 6
    pert_idx = torch.randint(-1, n_perts, (batch_size * 12, columns), generator=generator)
    pert_idx[torch.rand(len(pert_idx), generator=generator) < 0.3] = -1
    batches = pert_idx.split(batch_size)
    alone = [PerturbationSets.of(cells, n_perts) for cells in batches]
    pad_to = min(batch_size, max(sets.n_sets for sets in alone) + 1)
    for got, sets in zip(epoch_perturbation_sets(pert_idx, n_perts, batch_size, pad_to), alone):
        _assert_padded(got, sets, pad_to)
    fewest = min(sets.n_sets for sets in alone)
    for refused in {batch_size + 1, max(1, fewest - 1)} - set(range(max(s.n_sets for s in alone), batch_size + 1)):
        with pytest.raises(ValueError, match=f"cannot be padded to {refused} sets: from its own number up to one"):
            epoch_perturbation_sets(pert_idx, n_perts, batch_size, refused)


def test_loaders_give_each_batch_the_sets_of_its_cells(toy):
    """Shuffled, sharded, with a short last batch, and resumed in the middle of an epoch."""
    n_perts = len(toy.pert_names)
    loaders = [toy.get_dataloader(8, test_batch_size=5)] + [
        toy.get_dataloader_distributed(8, test_batch_size=5, world_size=2, rank=r) for r in range(2)
    ]
    short_last_batches = 0
    for loader in (loader[name] for loader in loaders for name in ("train_loader", "test_loader", "val_loader")):
        loader.set_epoch(3)
        batches = list(loader)
        short_last_batches += len(batches[-1]) < loader.batch_size
        for batch in batches:
            _assert_same_sets(batch.sets, PerturbationSets.of(batch.pert_idx, n_perts))
        resumed = list(loader.batches(first=2))
        assert len(resumed) == len(batches) - 2
        for batch, again in zip(batches[2:], resumed):
            assert torch.equal(batch.y, again.y)
            _assert_same_sets(again.sets, batch.sets)
    assert short_last_batches > 0
    train = loaders[0]["train_loader"]
    pad_to = train.max_sets_per_batch()
    assert pad_to == min(
        8,
        len(
            {
                tuple(sorted(p))
                for p in toy.cells.condition_pert_idx[
                    torch.unique(toy.cells.condition_codes[train.dataset.cell_indices])
                ].tolist()
            }
        ),
    )
    for batch, padded in zip(train.batches(), train.batches(0, pad_to)):
        _assert_padded(padded.sets, batch.sets, pad_to)


def _assert_same_batch(got, want) -> None:
    for name in ("x", "y", "pert_idx", "condition", "de_idx"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    _assert_same_sets(got.sets, want.sets)
    assert got.sets.padded == want.sets.padded


@pytest.mark.parametrize("window_batches", [1, 3])
def test_a_plan_laid_out_a_window_at_a_time_gives_the_batches_of_one_laid_out_at_once(toy, window_batches):
    """Windows of batches (the last window and batch short, padded sets, batches asked for
    out of order, as the workers of a DataLoader ask) give every batch what one window over
    the whole epoch gives it; the plan keeps one window."""
    loaders = toy.get_dataloader(8, test_batch_size=5)
    for name, pad_to in (("train_loader", None), ("train_loader", 8), ("test_loader", None)):
        loader = loaders[name]
        loader.set_epoch(2)
        positions = loader.sampler.positions()
        whole = EpochPlan(
            loader.dataset,
            positions,
            loader.batch_size,
            loader.drop_last,
            pad_sets_to=pad_to,
            window_batches=len(loader),
        )
        windowed = EpochPlan(
            loader.dataset,
            positions,
            loader.batch_size,
            loader.drop_last,
            pad_sets_to=pad_to,
            window_batches=window_batches,
        )
        assert len(windowed) == len(whole) == len(loader) > 3 * window_batches
        order = [*range(len(whole) - 1, len(whole) // 2, -1), *range(len(whole) // 2 + 1)]
        for i in order:
            _assert_same_batch(windowed[i], whole[i])
            assert len(windowed._window[1]["sets"]) <= window_batches
        with pytest.raises(IndexError, match=f"batch {len(whole)} of an epoch of {len(whole)}"):
            windowed[len(whole)]


def test_control_cells_are_their_own_input(toy):
    loaders = toy.get_dataloader(32)
    for batch in loaders["train_loader"]:
        is_ctrl = batch.condition == toy.cells.conditions.index(CONTROL)
        assert torch.equal(batch.x[is_ctrl], batch.y[is_ctrl])
        assert (batch.pert_idx[is_ctrl] == -1).all() and (batch.de_idx[is_ctrl] == -1).all()


def test_sets_hold_exactly_their_conditions_and_train_drops_last(toy):
    loaders = toy.get_dataloader(16, test_batch_size=7)
    for name in ("val", "test"):
        seen = [c for b in loaders[f"{name}_loader"] for c in b.pert]
        expected = toy.adata.obs["condition"].astype(str).isin(toy.set2conditions[name]).sum()
        assert len(seen) == expected and set(seen) == set(toy.set2conditions[name])
    train_cells = int(toy.adata.obs["condition"].astype(str).isin(toy.set2conditions["train"]).sum())
    sizes = [len(b) for b in loaders["train_loader"]]
    assert sizes == [16] * (train_cells // 16)


def test_pairing_is_seeded_and_resampling_changes_partners(toy):
    a = toy.get_dataloader(16, seed=3)["train_loader"].dataset.partners
    b = toy.get_dataloader(16, seed=3)["train_loader"].dataset.partners
    c = toy.get_dataloader(16, seed=4)["train_loader"].dataset.partners
    assert torch.equal(a, b) and not torch.equal(a, c)
    loader = toy.get_dataloader(16, seed=3, resample_controls=True)["train_loader"]
    loader.set_epoch(1)
    epoch1 = loader.dataset.partners.clone()
    loader.set_epoch(1)
    assert torch.equal(epoch1, loader.dataset.partners)
    assert not torch.equal(epoch1, a)
    controls = set(toy.cells.control_cells().tolist())
    assert set(epoch1.tolist()) - set(range(len(epoch1))) <= controls
    fixed = toy.get_dataloader(16, seed=3)["train_loader"]
    fixed.set_epoch(5)
    assert torch.equal(fixed.dataset.partners, a)


def test_set_epoch_reshuffles_train_deterministically(toy):
    loader = toy.get_dataloader(16)["train_loader"]
    loader.set_epoch(0)
    first = torch.cat([b.y for b in loader])
    loader.set_epoch(0)
    again = torch.cat([b.y for b in loader])
    loader.set_epoch(1)
    other = torch.cat([b.y for b in loader])
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_distributed_shards(toy):
    world = 3
    single = toy.get_dataloader(8, test_batch_size=5)
    ranks = [toy.get_dataloader_distributed(8, test_batch_size=5, world_size=world, rank=r) for r in range(world)]
    for name in ("val_loader", "test_loader"):
        whole = torch.cat([b.y for b in single[name]])
        sharded = torch.cat([b.y for r in ranks for b in r[name]])
        assert torch.equal(whole, sharded)  # every cell exactly once, same order, no padding
    train_positions = [list(r["train_loader"].sampler) for r in ranks]
    assert len({len(p) for p in train_positions}) == 1
    flat = [p for positions in train_positions for p in positions]
    assert len(flat) == len(set(flat))
    steps = {len(r["train_loader"]) for r in ranks}
    assert steps == {len(train_positions[0]) // 8}


def test_rank_outside_world_size(toy):
    import pytest

    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        toy.get_dataloader_distributed(8, world_size=2, rank=2)


@pytest.mark.parametrize("storage", ["mapped", "memory"])
def test_memory_is_one_float32_copy_plus_indices(data_folder, storage):
    pert_data = PertData(data_folder, expression_storage=storage)
    pert_data.load(data_path=data_folder / "toy")
    n_cells, n_genes = pert_data.adata.shape
    assert pert_data.cells.expression.dtype == torch.float32
    assert np.shares_memory(pert_data.adata.X, pert_data.cells.expression.numpy())
    assert (pert_data.cells.mapped_from is not None) == (storage == "mapped")
    index_bytes = pert_data.cells.nbytes() - n_cells * n_genes * 4
    assert 0 < index_bytes <= n_cells * 8 + len(pert_data.cells.conditions) * 22 * 8


def _child_writes_marker(rank, pert_data, queue):
    queue.put(
        (
            pert_data.cells.expression.is_shared(),
            pert_data.adata.shape,
            np.shares_memory(pert_data.adata.X, pert_data.cells.expression.numpy()),
        )
    )
    pert_data.cells.expression[0, 0] = 1234.5


@pytest.mark.distributed
def test_spawned_processes_share_the_expression_in_memory_without_copies(data_folder):
    toy = PertData(data_folder, expression_storage="memory")
    toy.load(data_path=data_folder / "toy")
    toy.share_memory_()
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_child_writes_marker, args=(toy, queue), nprocs=1, join=True)
    is_shared, shape, views = queue.get()
    assert is_shared and views and shape == toy.adata.shape
    assert toy.cells.expression[0, 0].item() == 1234.5  # the child wrote into the parent's memory
    assert toy.adata.X[0, 0] == 1234.5


def test_worker_processes_give_the_same_batches(toy):
    in_process = toy.get_dataloader_distributed(16, world_size=1, rank=0, num_workers=0)["test_loader"]
    workers = toy.get_dataloader_distributed(16, world_size=1, rank=0, num_workers=2)["test_loader"]
    for a, b in zip(in_process, workers, strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.de_idx, b.de_idx)
        assert a.pert == b.pert


@pytest.mark.parametrize("n, world_size", [(101, 1), (101, 2), (100, 3), (7, 4)])
def test_the_shuffled_shards_are_distributed_samplers(n, world_size):
    """The tensor sampler gives exactly DistributedSampler's positions, epoch after epoch."""
    from torch.utils.data import DistributedSampler

    from gears_ddp.data.loaders import ShuffledShardSampler

    for rank in range(world_size):
        ours = ShuffledShardSampler(n, world_size, rank, seed=5)
        theirs = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=5, drop_last=True)
        for epoch in (0, 1, 7):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert ours.positions().tolist() == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"batch_size": "32"}, "batch_size must be a positive integer, got '32'"),
        ({"batch_size": 8, "test_batch_size": 0}, "test_batch_size must be a positive integer, got 0"),
        ({"batch_size": 8, "seed": -1}, "seed must be a non-negative integer, got -1"),
        ({"batch_size": 8, "num_workers": 1.5}, "num_workers must be a non-negative integer, got 1.5"),
        ({"batch_size": 8, "resample_controls": "yes"}, "resample_controls must be True or False, got 'yes'"),
    ],
)
def test_get_dataloader_names_a_bad_loader_option_and_keeps_the_loaders_it_had(toy, given, message):
    """The published entry checks what it is given (``check_loader_options``, the one check the
    training options use too), before it replaces any loader."""
    before = toy.get_dataloader(16)
    with pytest.raises(ValueError, match=message):
        toy.get_dataloader(**given)
    assert toy.dataloader is before and toy.loader_options["batch_size"] == 16
