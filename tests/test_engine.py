"""The shared engine: per-condition evaluation equals per-cell prediction; an accumulated
step equals the step on the mean of the micro-batch gradients."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from gears_ddp.evaluation.metrics import EvaluationAccumulator
from gears_ddp.gears import GEARS
from gears_ddp.training.engine import batch_loss, evaluate, training_step


def _gears(toy, device, uncertainty=False):
    toy.get_dataloader(16, test_batch_size=7)
    torch.manual_seed(0)
    gears = GEARS(toy, device=str(device))
    gears.model_initialize(hidden_size=8, uncertainty=uncertainty)
    gears.model.train()
    for batch in toy.dataloader["train_loader"]:  # move BatchNorm running statistics off their start
        gears.model(batch.x.to(device), batch.pert_idx.to(device))
    return gears


class _Wrapper(nn.Module):
    """Stands for what ``torch.compile`` returns: the network is ``._orig_mod``."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module


@pytest.mark.parametrize("uncertainty", [False, True])
def test_per_condition_evaluation_equals_per_cell_prediction(toy, uncertainty, device):
    gears = _gears(toy, device, uncertainty)
    loader = toy.dataloader["test_loader"]
    fast = evaluate(_Wrapper(gears.model), loader, gears.new_accumulator(), uncertainty, device)
    slow_acc = gears.new_accumulator()
    gears.model.eval()
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            out = gears.model(batch.x, batch.pert_idx)
            pred, logvar = out if uncertainty else (out, None)
            slow_acc.add(batch.condition, pred, batch.y, logvar)
    slow = slow_acc.result()
    assert fast.conditions == slow.conditions and np.array_equal(fast.n_cells, slow.n_cells)
    np.testing.assert_allclose(fast.pred_mean, slow.pred_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fast.truth_mean, slow.truth_mean)
    if uncertainty:
        np.testing.assert_allclose(fast.logvar_mean, slow.logvar_mean, rtol=1e-5, atol=1e-5)


def test_accumulated_step_uses_the_mean_of_micro_batch_gradients(toy, device):
    gears = _gears(toy, device)
    context = gears.loss_context()
    batches = [b.to(device) for _, b in zip(range(2), toy.dataloader["train_loader"])]
    accumulated = copy.deepcopy(gears.model)
    reference = copy.deepcopy(gears.model)
    optimizer = torch.optim.SGD(accumulated.parameters(), lr=0.1)
    loss = training_step(accumulated, batches, optimizer, context, False, device, clip_value=None)
    # the same update by hand: mean of the two gradients, one SGD step
    grads = []
    for batch in batches:
        model = copy.deepcopy(reference)
        model.train()
        batch_loss(model, batch, context, False).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    expected_loss = np.mean(
        [float(batch_loss(copy.deepcopy(reference).train(), b, context, False).detach()) for b in batches]
    )
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name in grads[0]:
                param -= 0.1 * (grads[0][name] + grads[1][name]) / 2
    for (name, a), b in zip(accumulated.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_gradient_values_are_clipped(toy, device):
    gears = _gears(toy, device)
    batch = next(iter(toy.dataloader["train_loader"]))
    optimizer = torch.optim.SGD(gears.model.parameters(), lr=0.0)
    training_step(gears.model, [batch], optimizer, gears.loss_context(), False, device)
    largest = max(float(p.grad.abs().max()) for p in gears.model.parameters() if p.grad is not None)
    assert largest <= 1.0


def test_accumulator_refuses_missing_logvar(toy):
    accumulator = EvaluationAccumulator.from_pert_data(toy, uncertainty=True)
    with pytest.raises(ValueError, match="uncertainty=True; logvar must be given"):
        accumulator.empty_effects().add(torch.tensor([0]), torch.zeros(1, toy.adata.n_vars))


def test_warmup_ramps_the_learning_rate_then_leaves_the_schedule_alone():
    from gears_ddp.training.optimization import Warmup

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    warmup, moves = Warmup(3), []
    for _ in range(5):
        before = float(param.detach())
        param.grad = torch.ones(1)
        with warmup.scaled(optimizer):
            optimizer.step()
        moves.append(before - float(param.detach()))
        assert optimizer.param_groups[0]["lr"] == 1.0
    assert moves == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 1.0])
    resumed = Warmup(3, steps_done=1)  # a run resumed after its first step
    with resumed.scaled(optimizer):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(2 / 3)


def test_learning_rate_scaling_with_the_effective_batch():
    from gears_ddp.configuration.sections import TrainingArgs

    args = {"lr": 1e-3, "grad_accum_steps": 2}
    assert TrainingArgs.from_dict({**args, "lr_scaling": "linear"}).scaled_lr(4) == pytest.approx(8e-3)
    assert TrainingArgs.from_dict({**args, "lr_scaling": "sqrt"}).scaled_lr(4) == pytest.approx(1e-3 * 8**0.5)
    assert TrainingArgs.from_dict(args).scaled_lr(4) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match=r"args\['lr_scaling'\] must be one of"):
        TrainingArgs.from_dict({"lr_scaling": "cubic"})


def test_deterministic_algorithms_hold_for_the_block_and_the_setting_comes_back(monkeypatch):
    from gears_ddp.runtime.determinism import CUBLAS_WORKSPACE_CONFIG, deterministic_algorithms
    from gears_ddp.training.training_options import TrainingOptions

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(False):
        assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG
    assert not torch.are_deterministic_algorithms_enabled()
    assert TrainingOptions.from_dict({"deterministic": True}).deterministic is True
    with pytest.raises(ValueError, match=r"args\['deterministic'\] must be True or False"):
        TrainingOptions.from_dict({"deterministic": "yes"})
    with pytest.raises(ValueError, match=r"args\['cuda_graphs'\] must be True or False"):
        TrainingOptions.from_dict({"cuda_graphs": 1})
