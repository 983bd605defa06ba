"""Padded perturbation sets (``epoch_perturbation_sets(pad_to=...)``): the fixed shapes a step replayed
from a CUDA graph needs, with the step of the unpadded sets: loss, gradients and BatchNorm
running statistics (float64, so that equality is tested well below float32 rounding; the tolerances of
``test_model.py``'s float64 comparisons, as a lone perturbed cell's zero variance amplifies
rounding by 1/sqrt(eps))."""

import copy

import pytest
import torch
from model_fixtures import N_GENES, make_model, random_batch

from gears_ddp.data.perturbation_sets import PerturbationSets, epoch_perturbation_sets
from gears_ddp.model.losses import LossContext, gears_loss

BATCHES = {
    "mixed": torch.cat((torch.tensor([[-1, -1]]), random_batch(batch_size=15, seed=7)[1])),
    "no control cell": torch.tensor([[3, -1], [5, -1], [3, 5], [5, 3], [7, 11], [3, -1]]),
    "controls only": torch.tensor([[-1, -1]] * 5),
    "one perturbed cell": torch.tensor([[-1, -1], [4, -1], [-1, -1]]),
}


def _moved_model(uncertainty: bool):
    """A model moved away from its initialisation: there BatchNorm's biases are 0, and a lone
    perturbed cell makes rows equal whose normalised values then sit at ReLU's kink (0), on
    either side of it by rounding."""
    model = make_model(uncertainty=uncertainty).train().double()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    return model


def _step(model, x, y, pert_idx, sets, context):
    """Loss, then every parameter's gradient and every buffer, of one training-mode step."""
    model.zero_grad(set_to_none=True)
    out = model(x, pert_idx, sets)
    pred, logvar = out if model.uncertainty else (out, None)
    condition = (pert_idx + 1).sum(1) % len(context.retained_genes)  # some conditions, cells grouped by set
    loss = gears_loss(pred, y, condition, context, logvar)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, dict(model.named_buffers())


@pytest.mark.parametrize("fused_decoder", [True, False])
@pytest.mark.parametrize("uncertainty", [False, True])
@pytest.mark.parametrize("batch", list(BATCHES), ids=str)
def test_a_padded_step_equals_the_unpadded_one(batch, uncertainty, fused_decoder):
    pert_idx = BATCHES[batch]
    n_cells = len(pert_idx)
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(n_cells, N_GENES, generator=generator, dtype=torch.float64)
    y = x + torch.randn(n_cells, N_GENES, generator=generator, dtype=torch.float64)
    retained = torch.rand(4, N_GENES, generator=generator) < 0.6
    context = LossContext(retained, torch.rand(N_GENES, generator=generator, dtype=torch.float64))
    unpadded_model = _moved_model(uncertainty)
    unpadded_model.fused_decoder = fused_decoder
    padded_model = copy.deepcopy(unpadded_model)
    unpadded = PerturbationSets.of(pert_idx, 25)
    padded = epoch_perturbation_sets(pert_idx, 25, n_cells, pad_to=n_cells)[0]  # as many as it can have: one a cell
    assert padded.padded and padded.n_sets == n_cells > unpadded.n_sets
    results = [
        _step(model, x, y, pert_idx, sets, context)
        for model, sets in ((unpadded_model, unpadded), (padded_model, padded))
    ]
    (loss, grads, buffers), (padded_loss, padded_grads, padded_buffers) = results
    torch.testing.assert_close(padded_loss, loss, rtol=1e-10, atol=0)
    scale = max(float(g.abs().max()) for g in grads.values() if g is not None)
    for name, grad in grads.items():
        if grad is None:
            assert padded_grads[name] is None or not padded_grads[name].any(), name
        else:
            torch.testing.assert_close(padded_grads[name], grad, rtol=1e-7, atol=1e-9 * scale, msg=name)
    for name, buffer in buffers.items():
        torch.testing.assert_close(padded_buffers[name], buffer, rtol=1e-10, atol=1e-10, msg=name)
    if batch == "controls only":  # pert_fuse saw no cell: its running statistics did not move
        assert int(padded_buffers["pert_fuse.network.1.num_batches_tracked"]) == 0
