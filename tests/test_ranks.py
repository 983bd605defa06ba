"""The ranks object: the identity in one process; in a gloo group of 2, the cross-rank
operations the recipe relies on."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from model_fixtures import make_model

from gears_ddp.evaluation.metrics import EvaluationAccumulator
from gears_ddp.evaluation.truth_spread import condition_spreads
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.runtime.gradient_average import NO_AVERAGE, FlatGradientAverage
from gears_ddp.runtime.ranks import SINGLE_PROCESS, ProcessGroupRanks


def _accumulator(rank: int) -> EvaluationAccumulator:
    """Rank r holds cell r of condition 1 and, on rank 1, a cell of condition 0."""
    accumulator = EvaluationAccumulator(["ctrl", "A+ctrl"], 3, torch.full((2, 20), -1), torch.full((2, 20), -1))
    codes = torch.tensor([1] if rank == 0 else [1, 0])
    values = torch.arange(3 * len(codes), dtype=torch.float32).reshape(len(codes), 3) + 10 * rank
    accumulator.add(codes, values, values + 1)
    return accumulator


def _cell_table():
    """Three conditions of 4, 5 and 3 cells (interleaved) over 6 genes, as ``condition_spreads`` reads them."""
    codes = torch.tensor([0, 1, 2, 1, 0, 1, 2, 0, 1, 0, 2, 1])
    expression = torch.arange(12 * 6, dtype=torch.float32).reshape(12, 6) % 7
    return SimpleNamespace(conditions=["ctrl", "A+ctrl", "B+ctrl"], condition_codes=codes, expression=expression)


SPREAD_TABLES = {"de": torch.tensor([[-1, -1], [0, 3], [5, -1]]), "other": torch.tensor([[-1, -1], [2, 1], [4, 0]])}


def test_one_process_is_the_identity():
    ranks = SINGLE_PROCESS
    assert (ranks.world_size, ranks.rank, ranks.is_main) == (1, 0, True)
    network = make_model()
    before = {name: value.clone() for name, value in network.state_dict().items()}
    ranks.share_parameters(network)
    assert all(torch.equal(value, before[name]) for name, value in network.state_dict().items())
    assert ranks.gradient_average(network) is NO_AVERAGE and not NO_AVERAGE.crosses_ranks
    tensor = torch.tensor([1.0, 2.0])
    assert ranks.sum(tensor) is tensor and tensor.tolist() == [1.0, 2.0]
    state = _accumulator(0).state()
    assert ranks.merge_evaluation(state) is state
    assert ranks.gather("x") == ["x"]
    ranks.barrier()
    ranks.broadcast_buffers(network)


def _exercise(local_rank, port, messages):
    setup_ddp(local_rank, 2, "cpu", "127.0.0.1", port, timeout_s=60)
    try:
        ranks = ProcessGroupRanks()
        network = make_model()
        with torch.no_grad():
            network.bn_emb.running_mean.fill_(float(local_rank + 1))  # differs between ranks
        with torch.no_grad():
            network.gene_emb.weight.add_(float(local_rank))  # differs between ranks
        ranks.share_parameters(network)
        gradients = ranks.gradient_average(network)
        ranks.broadcast_buffers(network)
        accumulator = _accumulator(local_rank)
        accumulator.load_state(ranks.merge_evaluation(accumulator.state()))
        result = accumulator.result()
        spreads = condition_spreads(_cell_table(), ["A+ctrl", "B+ctrl", "ctrl"], SPREAD_TABLES, ranks)
        ranks.barrier()
        messages.put(
            (
                local_rank,
                {
                    "place": (ranks.world_size, ranks.rank, ranks.is_main),
                    "gradient_average": type(gradients).__name__,
                    "gene_emb": float(network.gene_emb.weight[0, 0]),
                    "sum": ranks.sum(torch.tensor([float(local_rank + 1), 1.0], dtype=torch.float64)).tolist(),
                    "gather": ranks.gather(f"rank{local_rank}"),
                    "running_mean": float(network.bn_emb.running_mean[0]),
                    "n_cells": result.n_cells.tolist(),
                    "truth_mean": result.truth_mean.tolist(),
                    "spreads": spreads,
                },
            )
        )
    finally:
        cleanup_ddp()


@pytest.mark.distributed
def test_two_gloo_ranks():
    results = dict(spawn_workers(_exercise, (find_free_port(),), 2))
    merged = _accumulator(0)
    merged.add(
        torch.tensor([1, 0]), *(torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 + shift for shift in (0, 1))
    )
    expected = merged.result()  # one process holding both ranks' cells
    alone = condition_spreads(_cell_table(), ["A+ctrl", "B+ctrl", "ctrl"], SPREAD_TABLES)
    table = _cell_table()
    a_cells = table.expression[table.condition_codes == 1]
    np.testing.assert_array_equal(alone["de"]["A+ctrl"]["max"], a_cells[:, [0, 3]].max(0).values.numpy())
    assert np.isnan(alone["de"]["B+ctrl"]["std"][1]) and np.isnan(alone["de"]["ctrl"]["min"]).all()
    for rank, seen in results.items():
        assert seen["place"] == (2, rank, rank == 0)
        assert seen["gradient_average"] == FlatGradientAverage.__name__
        assert seen["gene_emb"] == float(make_model().gene_emb.weight.detach()[0, 0])  # rank 0's weights everywhere
        assert seen["sum"] == [3.0, 2.0]
        assert seen["gather"] == ["rank0", "rank1"]
        assert seen["running_mean"] == 1.0  # rank 0's statistics everywhere
        assert seen["n_cells"] == expected.n_cells.tolist() == [1, 2]
        assert seen["truth_mean"] == expected.truth_mean.tolist()
        # each rank read a share of the conditions; every rank ends with all of them
        assert {name: set(s) for name, s in seen["spreads"].items()} == {
            name: {"ctrl", "A+ctrl", "B+ctrl"} for name in SPREAD_TABLES
        }
        for name, per_condition in alone.items():
            for condition, statistics in per_condition.items():
                for statistic, values in statistics.items():
                    np.testing.assert_array_equal(seen["spreads"][name][condition][statistic], values)
