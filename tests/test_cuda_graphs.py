"""The training step replayed from a CUDA graph (``training.cuda_graphs``), and what a CPU
proves about it: the step's shapes and control flow are static over an epoch of real
batches (it traces into one graph, compiled once), its inputs keep their addresses, and the
machinery around the graph (warm-up steps, static batches, the learning rate read from a
tensor, steps of other shapes, a failed capture) trains as the eager step does. On a CPU a
stand-in graph replays by running the captured step again; on a GPU the real graph runs.
"""

import copy
import logging

import pytest
import torch
from gears_testing import needs_a_torch_that_compiles
from stand_in_graphs import FailingGraph, ReplayingGraph

import gears_ddp.model.network as network_module
import gears_ddp.model.weighted_norm as weighted_norm
from gears_ddp import GEARS
from gears_ddp.runtime.dispatch_count import DispatchCount
from gears_ddp.training.cuda_graphs import CapturedStep, StaticBatches, use_cuda_graphs
from gears_ddp.training.engine import FULL_PRECISION, Precision, batch_loss, optimizer_steps, training_step
from gears_ddp.training.optimization import Warmup, make_optimizer

LR = 2.0**-10  # a float32 value: the tensor learning rate of a graph is the eager step's float exactly


def _gears(pert_data, device, uncertainty=False):
    pert_data.get_dataloader(32, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(pert_data, device=str(device))
    gears.model_initialize(hidden_size=32, uncertainty=uncertainty)
    return gears


def _padded_batches(gears, epochs=2):
    loader = gears.dataloader["train_loader"]
    batches = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches += list(loader.batches(0, loader.max_sets_per_batch()))
    return batches


def _learning_rates(steps: int) -> list[float]:
    """The learning rate of each of ``_train``'s ``steps`` optimiser steps: the warmup over 4,
    then halved half-way."""
    return [LR * min(1.0, (step + 1) / 4) * (0.5 if step >= steps // 2 else 1.0) for step in range(steps)]


def _train(network, gears, batches, device, step, precision=FULL_PRECISION, accumulation_steps=1, lr=LR):
    """Losses and final weights of optimiser steps on ``batches`` with warmup and the
    published per-epoch halving (halved once half-way)."""
    optimizer, scheduler = make_optimizer(network, lr, 5e-4)
    warmup = Warmup(4)
    halves = [batches[: len(batches) // 2], batches[len(batches) // 2 :]]
    losses = []
    for part in halves:
        losses += [
            loss.clone()
            for loss in optimizer_steps(
                network,
                part,
                optimizer,
                gears.loss_context(),
                False,
                device,
                precision,
                accumulation_steps,
                warmup=warmup,
                step=step,
            )
        ]
        scheduler.step()
    return torch.stack(losses).cpu(), {k: v.detach().cpu() for k, v in network.state_dict().items()}


def _assert_same_training(got, expected):
    """The same operators in the same order, with the same optimiser arithmetic (a float32
    learning rate): bit for bit, on a CPU."""
    (losses, weights), (expected_losses, expected_weights) = got, expected
    assert torch.equal(losses, expected_losses)
    for name, value in expected_weights.items():
        assert torch.equal(weights[name], value), name


ADAM_STEP_BOUND = 3.2  # |m / sqrt(v)| of Adam (betas 0.9, 0.999) is at most (1 - 0.9) / sqrt(1 - 0.999)
# Two trainings that differ only in the order of their sums, as a replayed and an eager step
# on a GPU do (atomic additions), at most: the largest relative difference of a step's loss,
# and the mean difference of a weight in summed learning rates (Adam moves each weight by
# about a learning rate a step, so this is the share of steps on which the runs disagreed).
# On a CPU, two eager trainings with other piece sizes of the row-wise passes (another
# summation order) stay within a half (float32: 4.5e-5, 0.0009) and a fifth (float16:
# 2.7e-4, 0.0072) of these; a learning rate 2% (float32) or 25% (float16) off exceeds them
# (test_the_gpu_criterion_*, benchmarks/RESULTS.md of 2026-11-28).
SAME_TRAINING = {"off": (1e-4, 0.005), "fp16": (2e-3, 0.015)}


def _assert_trained_alike(got, expected, start, learning_rates, amp):
    """A GPU's atomic additions sum in another order on every run, and Adam turns any
    difference in a gradient near zero into a step of up to ``ADAM_STEP_BOUND`` learning
    rates, so two such trainings agree in their losses and on average over the weights, not
    element by element (``SAME_TRAINING``); no weight differs by more than two runs' largest
    Adam steps, and every parameter that the expected training moved moved (the graph
    updates each)."""
    (losses, weights), (expected_losses, expected_weights) = got, expected
    loss_rtol, mean_steps = SAME_TRAINING[amp]
    torch.testing.assert_close(losses, expected_losses, rtol=loss_rtol, atol=0)
    summed_lr = sum(learning_rates)
    differences = torch.cat(
        [
            (weights[name] - value).abs().flatten()
            for name, value in expected_weights.items()
            if value.is_floating_point()
        ]
    )
    assert float(differences.mean()) <= mean_steps * summed_lr, float(differences.mean()) / summed_lr
    assert float(differences.max()) <= 2 * ADAM_STEP_BOUND * summed_lr
    for name, value in start.items():  # each parameter the expected training moved
        if not torch.equal(expected_weights[name], value):
            assert not torch.equal(weights[name], value), f"{name} never changed"


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_the_gpu_criterion_accepts_another_summation_order_and_refuses_a_wrong_learning_rate(toy, amp, monkeypatch):
    """What the GPU case below asserts, on two eager CPU trainings: one with the row-wise
    passes in pieces of 64 rows instead of one piece (the same arithmetic summed in another
    order) passes; one with a learning rate 25% off fails."""
    device = torch.device("cpu")
    gears = _gears(toy, device)
    batches = _padded_batches(gears)
    start = {k: v.detach().clone() for k, v in gears.model.named_parameters()}

    def trained(lr=LR):  # each training with a gradient scaler of its own (fp16)
        return _train(
            copy.deepcopy(gears.model), gears, batches, device, training_step, Precision.for_mode(amp, device), lr=lr
        )

    eager = trained()
    with monkeypatch.context() as patch:
        patch.setattr(weighted_norm, "ROWS_PER_PASS", 64)
        reordered = trained()
    assert not torch.equal(reordered[0], eager[0])  # another order indeed
    _assert_trained_alike(reordered, eager, start, _learning_rates(len(batches)), amp)
    wrong = trained(lr=1.25 * LR)
    with pytest.raises(AssertionError):
        _assert_trained_alike(wrong, eager, start, _learning_rates(len(batches)), amp)


def _graph_for(device):
    return ReplayingGraph if device.type == "cpu" else CapturedStep(device).graph_factory


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_a_captured_step_trains_as_the_eager_step(toy, device, amp):
    """Two epochs of padded batches, a learning-rate warmup over the first steps (warm-up and
    replayed steps both) and the schedule's halving: the losses and weights of eager steps.
    With fp16, the gradient scaler's step and update are inside the captured step too."""
    gears = _gears(toy, device)
    batches = _padded_batches(gears)
    start = {k: v.detach().cpu().clone() for k, v in gears.model.named_parameters()}
    eager_network, captured_network = gears.model, copy.deepcopy(gears.model)
    captured = CapturedStep(device, warmup_steps=2, graph_factory=_graph_for(device))
    eager = _train(eager_network, gears, batches, device, training_step, Precision.for_mode(amp, device))
    replayed = _train(captured_network, gears, batches, device, captured, Precision.for_mode(amp, device))
    assert captured.replaying and len(captured.graphs) == 1 and len(batches) > 6
    if device.type == "cpu":
        assert captured.graphs[0].replays == len(batches) - 2  # every step after the two warm-up steps
        _assert_same_training(replayed, eager)
    else:
        _assert_trained_alike(replayed, eager, start, _learning_rates(len(batches)), amp)


def test_steps_of_other_shapes_and_unpadded_batches_run_eagerly(toy):
    """Accumulating 5 micro-batches leaves a short last group in each half: it runs eagerly,
    the whole groups replay; unpadded batches never capture."""
    cpu = torch.device("cpu")
    gears = _gears(toy, cpu)
    batches = _padded_batches(gears, epochs=4)
    half = len(batches) // 2
    assert len(batches) % 2 == 0 and half % 5 != 0 and half // 5 >= 2
    eager = _train(copy.deepcopy(gears.model), gears, batches, cpu, training_step, accumulation_steps=5)
    captured = CapturedStep(cpu, warmup_steps=1, micro_batches=5, graph_factory=ReplayingGraph)
    replayed = _train(copy.deepcopy(gears.model), gears, batches, cpu, captured, accumulation_steps=5)
    assert captured.graphs[0].replays == 2 * (half // 5) - 1  # every whole group but the warm-up step
    assert all(len(batch.x) == 32 for batch in captured._static.batches) and len(captured._static.batches) == 5
    _assert_same_training(replayed, eager)

    loader = gears.dataloader["train_loader"]
    unpadded = CapturedStep(cpu, warmup_steps=1, graph_factory=ReplayingGraph)
    _train(copy.deepcopy(gears.model), gears, list(loader.batches()), cpu, unpadded)
    assert not unpadded.replaying


def test_a_capture_that_fails_leaves_eager_steps_and_says_why(toy, caplog):
    cpu = torch.device("cpu")
    gears = _gears(toy, cpu)
    batches = _padded_batches(gears, epochs=1)
    eager = _train(copy.deepcopy(gears.model), gears, batches, cpu, training_step, Precision.for_mode("fp16", cpu))
    captured = CapturedStep(cpu, warmup_steps=1, graph_factory=FailingGraph)
    with caplog.at_level(logging.WARNING, logger="gears_ddp"):
        after_failure = _train(
            copy.deepcopy(gears.model), gears, batches, cpu, captured, Precision.for_mode("fp16", cpu)
        )
    assert captured.failed and not captured.replaying
    assert "could not be captured in a CUDA graph (RuntimeError: operation not permitted" in caplog.text
    assert "cuda_graphs=False" in caplog.text
    _assert_same_training(after_failure, eager)


def test_static_batches_keep_their_addresses_and_take_each_batch(toy, device):
    gears = _gears(toy, device)
    batches = _padded_batches(gears, epochs=1)
    static = StaticBatches(batches[:1], device)
    addresses = [t.data_ptr() for t in _tensors(static.batches[0])]
    assert addresses != [t.data_ptr() for t in _tensors(batches[0])]  # its own memory, even on the same device
    for batch in batches[1:]:
        assert static.fits([batch])
        static.load([batch])
        assert [t.data_ptr() for t in _tensors(static.batches[0])] == addresses
        for mine, theirs in zip(_tensors(static.batches[0]), _tensors(batch)):
            assert torch.equal(mine.cpu(), theirs)
    unpadded = next(iter(gears.dataloader["train_loader"]))
    assert not static.fits([unpadded]) or unpadded.sets.n_sets == static.batches[0].sets.n_sets


def _tensors(batch):
    return [batch.x, batch.y, batch.pert_idx, batch.condition, batch.de_idx, batch.sets.packed]


@needs_a_torch_that_compiles
def test_forward_and_loss_trace_into_one_graph_compiled_once_over_epochs(toy, monkeypatch):
    """``torch.compile(fullgraph=True, dynamic=False)`` over two epochs of real padded batches
    with recompilation an error: one graph, compiled once, the eager losses. The embedding
    renormalisation, which the network runs outside compiled graphs by design
    (``network.renormalise``), runs eagerly before each step here. Unpadded batches, whose
    number of sets changes, would recompile."""
    gears = _gears(toy, "cpu")
    network, context = gears.model.train(), gears.loss_context()
    original = network_module.renormalise
    monkeypatch.setattr(
        network_module, "renormalise", lambda *tables: None if torch.compiler.is_compiling() else original(*tables)
    )
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager_network = copy.deepcopy(network)
    compiled = torch.compile(
        lambda batch: batch_loss(network, batch, context, False), fullgraph=True, dynamic=False, backend="aot_eager"
    )
    batches = _padded_batches(gears)

    def step(batch):
        network.renormalise_embeddings()
        loss = compiled(batch)
        loss.backward()
        eager_loss = batch_loss(eager_network, batch, context, False)
        eager_loss.backward()
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)

    step(batches[0])  # compiled here; from then on a recompilation is an error (torch's own switch)
    with torch.compiler.set_stance("fail_on_recompile"):
        for batch in batches[1:]:
            step(batch)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
        unpadded = list(gears.dataloader["train_loader"].batches())
        assert len({batch.sets.n_sets for batch in unpadded}) > 1
        with pytest.raises(Exception, match="[Rr]ecompil"):
            for batch in unpadded:
                compiled(batch)
    torch._dynamo.reset()


def test_graphs_are_used_on_cuda_unless_turned_off_or_a_collective_is_in_the_forward_pass():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert use_cuda_graphs(True, cuda)
    assert not use_cuda_graphs(False, cuda)
    assert not use_cuda_graphs(True, cuda, collective_in_forward=True)
    assert not use_cuda_graphs(True, cpu)


@pytest.fixture
def cuda_device(device):
    if device.type != "cuda":
        pytest.skip("a CUDA graph replays on a GPU only")
    return device


def test_a_replayed_step_launches_a_few_operators(toy, cuda_device):
    """Counted on the GPU: after capture, a step is the batch's copies, the learning rate,
    one replay and the loss's copy."""
    gears = _gears(toy, cuda_device)
    batches = _padded_batches(gears)
    optimizer, _ = make_optimizer(gears.model, LR, 5e-4)
    captured = CapturedStep(cuda_device)
    steps = optimizer_steps(
        gears.model, iter(batches), optimizer, gears.loss_context(), False, cuda_device, step=captured
    )
    for _ in range(5):
        next(steps)
    assert captured.replaying
    with DispatchCount() as count:
        next(steps)
    assert count.total_operators <= 10 and dict(count.synchronisations) == {}
