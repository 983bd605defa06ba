"""The training step replayed from a CUDA graph (``training.cuda_graphs``), and what a CPU
proves about it: the step's shapes and control flow are static over an epoch of real
batches (it traces into one graph, compiled once), its inputs keep their addresses, and the
machinery around the graph (warm-up steps, static batches, the learning rate read from a
tensor, steps of other shapes, a failed capture) trains as the eager step does. On a CPU a
stand-in graph replays by running the captured step again; on a GPU the real graph runs.
"""
import copy
import dataclasses
import logging

import pytest
import torch

import gears_ddp.model.network as network_module
from gears_ddp import GEARS
from gears_ddp.runtime.dispatch_count import DispatchCount
from gears_ddp.training.cuda_graphs import CapturedStep, StaticBatches, use_cuda_graphs
from gears_ddp.training.engine import Precision, batch_loss, optimizer_steps, training_step
from gears_ddp.training.optimization import Warmup, make_optimizer
from stand_in_graphs import FailingGraph, ReplayingGraph

LR = 2.0 ** -10  # a float32 value: the tensor learning rate of a graph is the eager step's float exactly


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


def _train(network, gears, batches, device, step, precision=Precision(), accumulation_steps=1):
    """Losses and final weights of optimiser steps on ``batches`` with warmup and the
    published per-epoch halving (halved once half-way)."""
    optimizer, scheduler = make_optimizer(network, LR, 5e-4)
    warmup = Warmup(4)
    halves = [batches[:len(batches) // 2], batches[len(batches) // 2:]]
    losses = []
    for part in halves:
        losses += [loss.clone() for loss in optimizer_steps(network, part, optimizer, gears.loss_context(), False,
                                                            device, precision, accumulation_steps, warmup=warmup,
                                                            step=step)]
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
PRODUCT_ROUNDING = {"off": 2.0 ** -24, "fp16": 2.0 ** -11}  # float32's and float16's unit roundoff


def _rounding_noise(gears, batches, amp) -> dict[str, torch.Tensor]:
    """Each parameter's elements whose gradient is rounding noise at ``amp``'s precision in
    some batch: the float64 gradient (on the CPU, at the initial weights) at most 10 unit
    roundoffs of the largest gradient. Such an element's float32 or float16 gradient is
    whatever the summation order makes it (a Linear's bias before a BatchNorm, which removes
    it: ``emb_trans_v2.network.0.bias`` has a gradient of 3.6e-15 in float64 and 1.9e-6 in
    float32), and Adam turns any of it into a step of up to ``ADAM_STEP_BOUND`` learning rates."""
    network = copy.deepcopy(gears.model).cpu().double().train()
    context = gears.loss_context()  # on the model's device: moved to the CPU, as the network and batches
    context = type(context)(context.retained_genes.cpu(), context.ctrl_mean.cpu().double(),
                            context.direction_lambda, context.uncertainty_reg)
    smallest, largest = {}, 0.0
    for batch in batches:
        network.zero_grad(set_to_none=True)
        batch = dataclasses.replace(batch.to("cpu"), x=batch.x.cpu().double(), y=batch.y.cpu().double())
        batch_loss(network, batch, context, False).backward()
        for name, parameter in network.named_parameters():
            if parameter.grad is not None:
                gradient = parameter.grad.abs()
                smallest[name] = torch.minimum(smallest[name], gradient) if name in smallest else gradient
                largest = max(largest, float(gradient.max()))
    return {name: values <= 10 * PRODUCT_ROUNDING[amp] * largest for name, values in smallest.items()}


def _assert_trained_alike_on_a_gpu(got, expected, start, noise, learning_rates, amp):
    """A GPU's atomic additions sum in another order on every run, so a replayed and an eager
    run agree to a bound, not bit for bit: the losses and every element whose gradient is above
    rounding (``_rounding_noise``) to the tolerance of one float32 (float16) rounding per
    step; the elements of rounding-noise gradients only within two runs' largest Adam steps.
    Every parameter moved (the graph updates each)."""
    (losses, weights), (expected_losses, expected_weights) = got, expected
    rtol = {"off": 1e-4, "fp16": 2e-3}[amp]
    torch.testing.assert_close(losses, expected_losses, rtol=rtol, atol=0)
    reach = 2 * ADAM_STEP_BOUND * sum(learning_rates)
    for name, noisy in noise.items():
        value, expected_value = weights[name], expected_weights[name]
        assert not torch.equal(value, start[name]), f"{name} never changed"
        torch.testing.assert_close(value[~noisy], expected_value[~noisy], rtol=10 * rtol, atol=1e-5,
                                   msg=lambda mismatch: f"{name}: {mismatch}")  # torch's figures kept
        if noisy.any():
            assert float((value[noisy] - expected_value[noisy]).abs().max()) <= reach, name


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
        _assert_trained_alike_on_a_gpu(replayed, eager, start, _rounding_noise(gears, batches, amp),
                                       _learning_rates(len(batches)), amp)


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
        after_failure = _train(copy.deepcopy(gears.model), gears, batches, cpu, captured,
                               Precision.for_mode("fp16", cpu))
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


def test_forward_and_loss_trace_into_one_graph_compiled_once_over_epochs(toy, monkeypatch):
    """``torch.compile(fullgraph=True, dynamic=False)`` over two epochs of real padded batches
    with recompilation an error: one graph, compiled once, the eager losses. The embedding
    renormalisation, which the network runs outside compiled graphs by design
    (``network.renormalise``), runs eagerly before each step here. Unpadded batches, whose
    number of sets changes, would recompile."""
    gears = _gears(toy, "cpu")
    network, context = gears.model.train(), gears.loss_context()
    original = network_module.renormalise
    monkeypatch.setattr(network_module, "renormalise",
                        lambda *tables: None if torch.compiler.is_compiling() else original(*tables))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager_network = copy.deepcopy(network)
    compiled = torch.compile(lambda batch: batch_loss(network, batch, context, False), fullgraph=True,
                             dynamic=False, backend="aot_eager")
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
    steps = optimizer_steps(gears.model, iter(batches), optimizer, gears.loss_context(), False, cuda_device,
                            step=captured)
    for _ in range(5):
        next(steps)
    assert captured.replaying
    with DispatchCount() as count:
        next(steps)
    assert count.total_operators <= 10 and dict(count.synchronisations) == {}
