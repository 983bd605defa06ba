"""What a training step and an evaluation pass ask of the device: no host synchronisation
(on a GPU each one stalls the queue of kernels), and a fixed, bounded number of operators
per optimiser step (each one a launch on a GPU). Counted on the CPU by
``runtime.dispatch_count.DispatchCount``, which sees the same operators a GPU run dispatches.
"""

import pytest
import torch

from gears_ddp import GEARS, PertData
from gears_ddp.data.loaders import CellLoader
from gears_ddp.model import graph_conv, weighted_norm
from gears_ddp.runtime.dispatch_count import DispatchCount
from gears_ddp.training import recipe
from gears_ddp.training.engine import Precision, evaluate, optimizer_steps
from gears_ddp.training.optimization import make_optimizer

# Operators that launch work (not views) per optimiser step at hidden 64: 300 under torch 2.13
# on a CPU (with 173 views; benchmarks/bench_dispatch.py records both at batch 32 and 256), 304
# on an H200 under torch 2.11; the limit keeps them from growing. 8 of them came with the sums
# over rows as matrix-vector products (a vector of ones each) and the graph convolution's
# backward gather, which took 0.55 ms off an H200's replayed step (benchmarks/RESULTS.md,
# 2026-12-04). Views launch nothing, and how many torch's autograd makes is its own: under
# torch 2.4 5 more slices' backward passes launch work too.
MAX_OPERATORS_PER_STEP = 310


@pytest.fixture(scope="module")
def loaded(data_folder):
    pert_data = PertData(data_folder)
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split("simulation", seed=1)
    return pert_data


def _gears(pert_data, device, batch_size=32, **model_options):
    pert_data.get_dataloader(batch_size, test_batch_size=16)
    torch.manual_seed(0)
    gears = GEARS(pert_data, device=str(device))
    gears.model_initialize(hidden_size=64, **model_options)
    return gears


def _counted_steps(gears, device, n_steps, accumulation_steps=1, amp="off", fused_decoder=True):
    """The counts of ``n_steps`` optimiser steps, after one uncounted step (first-call work);
    batches are gathered beforehand, as a loader does on the host."""
    gears.model.fused_decoder = fused_decoder
    optimizer, _ = make_optimizer(gears.model, 1e-3, 5e-4)
    loader = gears.dataloader["train_loader"]
    batches = [batch for _, batch in zip(range((n_steps + 1) * accumulation_steps), loader)]
    assert len(batches) == (n_steps + 1) * accumulation_steps
    steps = optimizer_steps(
        gears.model,
        iter(batches),
        optimizer,
        gears.loss_context(),
        gears.config["uncertainty"],
        device,
        Precision.for_mode(amp, device),
        accumulation_steps,
    )
    next(steps)
    with DispatchCount() as count:
        for _ in steps:
            pass
    return count


@pytest.mark.parametrize(
    "options",
    [{}, {"uncertainty": True}, {"fused_decoder": False}, {"amp": "bf16"}, {"accumulation_steps": 2}],
    ids=str,
)
def test_optimiser_steps_never_wait_for_the_device(loaded, device, options):
    model_options = {"uncertainty": options.get("uncertainty", False)}
    step_options = {k: v for k, v in options.items() if k != "uncertainty"}
    count = _counted_steps(_gears(loaded, device, **model_options), device, 2, **step_options)
    assert count.total_operators > 0
    assert dict(count.synchronisations) == {}


def test_operators_per_step_are_few_and_the_same_every_step(loaded, device, monkeypatch):
    """Counted with a GPU's row pieces (one piece per pass), and so with its graph convolutions
    (gathers, not a CPU's sparse products), as a GPU launches them."""
    monkeypatch.setattr(weighted_norm, "ROWS_PER_PASS", weighted_norm.ROWS_PER_PASS_ACCELERATOR)
    assert not graph_conv.uses_sparse_product(torch.zeros(1))
    gears = _gears(loaded, device)
    per_step = []
    for n_steps in (1, 3):
        count = _counted_steps(gears, device, n_steps)
        per_step.append((count.total_operators - count.total_views) / n_steps)
    assert per_step[0] == per_step[1]  # nothing depends on how many sets a batch holds
    assert per_step[0] <= MAX_OPERATORS_PER_STEP


@pytest.fixture
def counting_without_loading(monkeypatch):
    """``DispatchCount`` that leaves out the loaders' work: on a GPU run they gather on the
    host, so their CPU operators are not the device's."""
    active = []
    batches = CellLoader.batches

    def uncounted(loader, first=0, pad_sets_to=None):
        source = batches(loader, first, pad_sets_to)
        while True:
            with active[-1].paused():
                batch = next(source, None)
            if batch is None:
                return
            yield batch

    monkeypatch.setattr(CellLoader, "batches", uncounted)

    def start():
        active.append(DispatchCount())
        return active[-1]

    return start


def test_evaluation_waits_only_once_its_batches_are_summed(loaded, device, counting_without_loading):
    """The batches of an evaluation pass are summed without a wait; at the end there are two,
    for one batch as for eight: the conditions seen (a ``nonzero``) and the sums read back
    (one copy). Making the accumulator waits for nothing (its DE tables stay on the host)."""
    gears = _gears(loaded, device)
    counts = []
    for batch_size in (1000, 2):
        loaded.get_dataloader(32, test_batch_size=batch_size)
        loader = loaded.dataloader["val_loader"]
        with counting_without_loading() as count:
            evaluate(gears.model, loader, gears.new_accumulator(), False, device)
        counts.append((len(loader), count.synchronisations))
    (one, at_end), (many, with_many) = counts
    assert one == 1 and many >= 8
    assert with_many == at_end == {"aten.nonzero": 1, "Tensor.cpu": 1}


def test_the_training_loop_reads_the_loss_only_to_log_it(loaded, monkeypatch, counting_without_loading):
    """Whole epochs through ``GEARS.train``, counted over the training recipe (its steps, the
    epoch's evaluation passes, the best model's test pass; the report's scoring after it reads
    its numbers on the host by design): with the loaders' host work left out, 2 and 5
    optimiser steps wait for the device as often (their evaluation passes are the same), and
    every ``LOG_EVERY_STEPS`` steps the log line and the finite-loss check are one wait each."""
    waits = {}
    run = recipe.TrainingRecipe.run
    for log_every, max_steps in ((50, 2), (50, 5), (2, 5)):
        monkeypatch.setattr(recipe, "LOG_EVERY_STEPS", log_every)
        gears = _gears(loaded, "cpu", batch_size=8)
        counting = counting_without_loading()

        def counted_run(training, counting=counting):
            with counting:
                return run(training)

        monkeypatch.setattr(recipe.TrainingRecipe, "run", counted_run)
        gears.train(epochs=1, max_steps=max_steps)
        waits[log_every, max_steps] = counting.synchronisations
        assert counting.total_operators > 0
    assert waits[50, 2] == waits[50, 5]
    logged = waits[2, 5] - waits[50, 5]  # steps 1, 3 and 5 log; step 1 logs either way
    assert dict(logged) == {"Tensor.item": 2 * 2}


def test_the_counter_sees_what_makes_the_host_wait():
    x = torch.arange(6.0)
    with DispatchCount() as count:
        x.sum().item()
        bool(x[0] > 1)
        x[x > 2]
        torch.unique(x)
        torch.nonzero(x)
        torch.repeat_interleave(x.long())
        torch.repeat_interleave(x.long(), output_size=15)
        x.tolist()
        x.to("cpu", non_blocking=True)
        x.cpu().numpy()  # one wait: the copy; numpy takes values on the host already
    assert dict(count.synchronisations) == {
        "Tensor.item": 1,
        "Tensor.__bool__": 1,
        "aten.index with a boolean mask": 1,
        "aten._unique2": 1,
        "aten.nonzero": 1,
        "aten.repeat_interleave without output_size": 1,
        "Tensor.tolist": 1,
        "Tensor.cpu": 1,
    }
    assert count.operators["aten.sum.default"] == 1 and count.total_operators >= 9
