"""The gradients of several ranks averaged in one flat buffer (``runtime.gradient_average``),
for real with 2 gloo processes: the step equals ``DistributedDataParallel``'s step bit for
bit (weights, optimiser state, running statistics and losses, float32 and float16 with its
scaler, micro-batches accumulated), eagerly and replayed from CUDA graphs; the replayed step
holds no collective (a stand-in graph runs the captured step again on a CPU, and every
collective records whether it ran inside it); one all-reduce per optimiser step whatever the
number of micro-batches; and the main rank's initial weights reach every rank."""

import contextlib

import numpy as np
import pytest
import torch
from model_fixtures import N_GENES, N_PERTS, make_model, random_batch
from stand_in_graphs import COLLECTIVES, ReplayingGraph, restore_collectives, watch_collectives
from torch.nn.parallel import DistributedDataParallel

from gears_ddp.data.cells import PertBatch
from gears_ddp.data.perturbation_sets import epoch_perturbation_sets
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.model.losses import LossContext
from gears_ddp.runtime.gradient_average import FlatGradientAverage
from gears_ddp.runtime.ranks import ProcessGroupRanks
from gears_ddp.training.cuda_graphs import CapturedStep
from gears_ddp.training.engine import Precision, apply_gradients, batch_loss, optimizer_steps, training_step
from gears_ddp.training.optimization import Warmup, make_optimizer

CPU = torch.device("cpu")
LR = 2.0**-10  # a float32 value: the tensor learning rate of a replayed step is the eager float exactly
STEPS, MICRO_BATCHES, CELLS = 6, 2, 12


def test_one_flat_buffer_holds_the_mean_and_a_gradient_no_backward_reached_counts_as_zeros():
    """In one process, with an all-reduce that adds what another rank would hold: every
    gradient ends as the mean, a parameter with no gradient here gets the mean of the other
    rank's and zeros, and the buffer keeps its address from step to step."""
    first, second = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))
    frozen = torch.nn.Parameter(torch.zeros(5), requires_grad=False)
    other_rank = torch.arange(10, dtype=torch.float32)  # the other rank's gradients, times 1/2, packed

    def all_reduce(buffer):
        buffer.add_(other_rank * 0.5)

    average = FlatGradientAverage([first, frozen, second], world_size=2, all_reduce=all_reduce)
    assert average.crosses_ranks and [len(b) for b in average.buffers] == [10]
    address = average.buffers[0].data_ptr()
    first.grad = torch.full((2, 3), 4.0)
    average.average()
    assert torch.equal(first.grad, (4.0 + other_rank[:6].view(2, 3)) / 2)
    assert torch.equal(second.grad, other_rank[6:] / 2)  # none here: zeros
    assert frozen.grad is None and average.buffers[0].data_ptr() == address
    grad_address = first.grad.data_ptr()
    average.average()  # the averaged gradients taken as this rank's again
    assert first.grad.data_ptr() == grad_address and average.buffers[0].data_ptr() == address


def _batches(rank: int) -> list[list[PertBatch]]:
    """This rank's padded micro-batches of every step (each rank its own cells)."""
    steps = []
    for step in range(STEPS):
        micro = []
        for m in range(MICRO_BATCHES):
            x, pert_idx = random_batch(CELLS, seed=100 * rank + 10 * step + m)
            sets = epoch_perturbation_sets(pert_idx, N_PERTS, CELLS, pad_to=6)[0]
            micro.append(
                PertBatch(
                    x=x,
                    y=x + 0.1,
                    pert_idx=pert_idx,
                    condition=(pert_idx[:, 0] + 1) % 6,
                    de_idx=torch.full((CELLS, 20), -1),
                    condition_names=[str(i) for i in range(6)],
                    sets=sets,
                )
            )
        steps.append(micro)
    return steps


def _context() -> LossContext:
    return LossContext(torch.ones(6, N_GENES, dtype=torch.bool), torch.zeros(N_GENES))


def _network(rank: int):
    """The same model on every rank but for a shift on rank 1: the main rank's weights must
    reach every rank before training."""
    network = make_model().train()
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(0.01 * rank)
    return network


def _ddp_training(rank: int, amp: str) -> dict:
    """The steps as ``DistributedDataParallel`` took them: its own all-reduce in the backward
    pass, ``no_sync`` on all micro-batches but the last, then the recipe's optimiser step."""
    network = _network(rank)
    model = DistributedDataParallel(network, broadcast_buffers=False)
    optimizer, _ = make_optimizer(network, LR, 5e-4)
    precision, warmup, context = Precision.for_mode(amp, CPU), Warmup(2), _context()
    losses = []
    for micro in _batches(rank):
        with warmup.scaled(optimizer):
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for i, batch in enumerate(micro):
                with model.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
                    with precision.autocast(CPU):
                        loss = batch_loss(model, batch, context, False)
                    scaled = loss / len(micro)
                    (precision.scaler.scale(scaled) if precision.scaler else scaled).backward()
                total += scaled.detach()
            apply_gradients(network, optimizer, precision)
        losses.append(total)
    return _outcome(network, optimizer, losses)


def _flat_training(rank: int, amp: str, replayed: bool) -> dict:
    """The same steps through the recipe's parts: the main rank's parameters shared, the
    gradients averaged in one flat buffer, eagerly or replayed from (stand-in) graphs."""
    network = _network(rank)
    COLLECTIVES.clear()
    ranks = ProcessGroupRanks()
    ranks.share_parameters(network)
    gradients = ranks.gradient_average(network)
    optimizer, _ = make_optimizer(network, LR, 5e-4)
    step = (
        CapturedStep(CPU, warmup_steps=1, micro_batches=MICRO_BATCHES, graph_factory=ReplayingGraph)
        if replayed
        else training_step
    )
    losses = [
        loss.clone()
        for loss in optimizer_steps(
            network,
            [b for micro in _batches(rank) for b in micro],
            optimizer,
            _context(),
            False,
            CPU,
            Precision.for_mode(amp, CPU),
            MICRO_BATCHES,
            gradients,
            Warmup(2),
            step=step,
        )
    ]
    outcome = _outcome(network, optimizer, losses)
    outcome["collectives"] = list(COLLECTIVES)
    if replayed:
        outcome["graphs"] = [graph.replays for graph in step.graphs]
    return outcome


def _outcome(network, optimizer, losses) -> dict:
    state = {f"model.{k}": v.detach().clone().numpy() for k, v in network.state_dict().items()}
    for index, per_parameter in optimizer.state_dict()["state"].items():
        for key, value in per_parameter.items():
            state[f"adam.{index}.{key}"] = value.detach().clone().numpy()
    return {"state": state, "losses": torch.stack(losses).numpy()}


def _both_ways(local_rank, port, messages):
    setup_ddp(local_rank, 2, "cpu", "127.0.0.1", port, timeout_s=120)
    try:
        results = {}
        for amp in ("off", "fp16"):
            results[amp, "ddp"] = _ddp_training(local_rank, amp)
            originals = watch_collectives()
            try:
                results[amp, "eager"] = _flat_training(local_rank, amp, replayed=False)
                results[amp, "replayed"] = _flat_training(local_rank, amp, replayed=True)
            finally:
                restore_collectives(originals)
        messages.put((local_rank, results))
    finally:
        cleanup_ddp()


@pytest.fixture(scope="module")
def trained_both_ways():
    return dict(spawn_workers(_both_ways, (find_free_port(),), 2))


@pytest.mark.distributed
@pytest.mark.parametrize("amp", ["off", "fp16"])
@pytest.mark.parametrize("way", ["eager", "replayed"])
def test_the_flat_average_trains_as_distributed_data_parallel_bit_for_bit(trained_both_ways, amp, way):
    for rank, results in trained_both_ways.items():
        ddp, flat = results[amp, "ddp"], results[amp, way]
        np.testing.assert_array_equal(flat["losses"], ddp["losses"])
        assert flat["state"].keys() == ddp["state"].keys()
        for name, value in ddp["state"].items():
            np.testing.assert_array_equal(flat["state"][name], value, err_msg=f"rank {rank}: {name}")
    weights = [
        {
            k: v
            for k, v in results[amp, way]["state"].items()
            if k.startswith("model.") and "running" not in k and "num_batches" not in k
        }
        for results in trained_both_ways.values()
    ]
    for name, value in weights[0].items():  # both ranks took the same steps from rank 0's weights
        np.testing.assert_array_equal(weights[1][name], value, err_msg=name)
    start = _network(0).state_dict()
    moved = [
        name
        for name, value in start.items()
        if not np.array_equal(weights[0].get(f"model.{name}", value), value.numpy())
    ]
    assert len(moved) > 10  # the steps trained


@pytest.mark.distributed
@pytest.mark.parametrize("way", ["eager", "replayed"])
def test_a_step_is_one_all_reduce_and_the_replayed_graphs_hold_no_collective(trained_both_ways, way):
    for results in trained_both_ways.values():
        collectives = results["off", way]["collectives"]
        broadcasts = [c for c in collectives if c[0] == "broadcast"]
        assert len(broadcasts) == len(list(make_model().parameters()))  # the initial weights, once
        assert [c for c in collectives if c[0] != "broadcast"] == [("all_reduce", False)] * STEPS
        if way == "replayed":
            # the warm-up step ran eagerly; the others replayed both graphs, the all-reduce between
            assert results["off", way]["graphs"] == [STEPS - 1, STEPS - 1]
            assert not any(inside for _, inside in collectives)
