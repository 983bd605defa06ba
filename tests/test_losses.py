"""The vectorised GEARS loss equals a per-condition loop and the published loss functions."""

import numpy as np
import pytest
import torch
import toy_data
from reference_package import import_reference

from gears_ddp import PertData
from gears_ddp.model.losses import LossContext, gears_loss

N_GENES = 30
CONDITIONS = ["ctrl", "A+ctrl", "B+ctrl", "A+B"]


def _context(direction_lambda=0.1, reg=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    retained = torch.rand(len(CONDITIONS), N_GENES, generator=generator) < 0.6
    retained[0] = True
    return LossContext(retained, torch.rand(N_GENES, generator=generator), direction_lambda, reg)


def _batch(seed, n_cells=20):
    generator = torch.Generator().manual_seed(seed)
    condition = torch.randint(0, len(CONDITIONS), (n_cells,), generator=generator)
    y = torch.rand(n_cells, N_GENES, generator=generator)
    pred = y + 0.3 * torch.randn(n_cells, N_GENES, generator=generator)
    logvar = torch.randn(n_cells, N_GENES, generator=generator)
    return pred, y, condition, logvar


def _loop_loss(pred, y, condition, context, logvar=None):
    """Straightforward: one term per condition present, averaged."""
    terms = []
    for code in condition.unique().tolist():
        cells = condition == code
        genes = context.retained_genes[code]
        p, t = pred[cells][:, genes], y[cells][:, genes]
        error = (p - t) ** 4
        if logvar is not None:
            error = error + context.uncertainty_reg * torch.exp(-logvar[cells][:, genes]) * error
        ctrl = context.ctrl_mean[genes]
        direction = context.direction_lambda * (torch.sign(t - ctrl) - torch.sign(p - ctrl)) ** 2
        terms.append((error.sum() + direction.sum()) / (p.shape[0] * p.shape[1]))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("uncertainty", [False, True])
def test_loss_equals_per_condition_loop(seed, uncertainty):
    context = _context(reg=0.7)
    pred, y, condition, logvar = _batch(seed)
    logvar = logvar if uncertainty else None
    torch.testing.assert_close(
        gears_loss(pred, y, condition, context, logvar),
        _loop_loss(pred, y, condition, context, logvar),
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize("uncertainty", [False, True])
def test_loss_equals_the_published_loss(uncertainty):
    """Values against the published functions; gradients against the published loss, or, in
    uncertainty mode (whose published function adds in place to a leaf tensor that requires
    grad, which autograd refuses on CPU), against the loop."""
    utils = import_reference("gears.utils")
    context = _context(direction_lambda=0.1, reg=0.5)
    pred, y, condition, logvar = _batch(seed=5)
    perts = [CONDITIONS[c] for c in condition.tolist()]
    dict_filter = {
        c: np.flatnonzero(context.retained_genes[i].numpy()) for i, c in enumerate(CONDITIONS) if c != "ctrl"
    }
    ours_pred, other_pred = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    if uncertainty:
        ours = gears_loss(ours_pred, y, condition, context, logvar)
        with torch.no_grad():
            theirs = utils.uncertainty_loss_fct(
                pred, logvar, y, perts, reg=0.5, ctrl=context.ctrl_mean, direction_lambda=0.1, dict_filter=dict_filter
            )
        other = _loop_loss(other_pred, y, condition, context, logvar)
    else:
        ours = gears_loss(ours_pred, y, condition, context)
        theirs = other = utils.loss_fct(
            other_pred, y, perts, ctrl=context.ctrl_mean, direction_lambda=0.1, dict_filter=dict_filter
        )
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    ours.backward()
    other.backward()
    torch.testing.assert_close(ours_pred.grad, other_pred.grad, rtol=1e-5, atol=1e-8)


def test_context_from_data_uses_non_zero_genes_and_control_mean(toy):
    context = LossContext.from_pert_data(toy)
    conditions = toy.cells.conditions
    assert bool(context.retained_genes[conditions.index("ctrl")].all())
    name_of = dict(zip(toy.adata.obs["condition"].astype(str), toy.adata.obs["condition_name"].astype(str)))
    for code, condition in enumerate(conditions):
        if condition != "ctrl":
            expected = np.asarray(toy.adata.uns["non_zeros_gene_idx"][name_of[condition]])
            assert np.flatnonzero(context.retained_genes[code].numpy()).tolist() == expected.tolist()
    ctrl_rows = (toy.adata.obs["condition"] == "ctrl").to_numpy()
    np.testing.assert_allclose(context.ctrl_mean.numpy(), toy.adata.X[ctrl_rows].mean(0), rtol=1e-6)


def test_context_needs_gene_sets(data_root):
    pert_data = PertData(data_root)
    pert_data.new_data_process("no_de", toy_data.make_raw(), skip_calc_de=True)
    with pytest.raises(ValueError, match="no uns\\['non_zeros_gene_idx'\\].*skip_calc_de"):
        LossContext.from_pert_data(pert_data)
