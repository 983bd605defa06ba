"""The published ``gears.inference`` functions under their names (``gears_ddp.inference``):
the same values as the published package on the same per-cell results, ``evaluate``'s cells
equal to the network run on each cell, and clear errors for bad input."""

import numpy as np
import pytest
import torch
from test_metrics import assert_same_metrics, published_case

from gears_ddp.gears import GEARS
from gears_ddp.inference import compute_metrics, deeper_analysis, evaluate, non_dropout_analysis


def test_same_values_as_the_published_functions(toy):
    test_res, ((ref_metrics, ref_pert), ref_deeper, ref_non_dropout) = published_case(toy)

    metrics, metrics_pert = compute_metrics(test_res)
    assert list(metrics) == list(ref_metrics)
    np.testing.assert_allclose([metrics[k] for k in ref_metrics], list(ref_metrics.values()), rtol=1e-6, atol=1e-6)
    assert list(metrics_pert) == list(ref_pert)  # the published order: sorted conditions
    assert_same_metrics(metrics_pert, ref_pert)
    assert_same_metrics(deeper_analysis(toy.adata, test_res), ref_deeper)
    assert_same_metrics(non_dropout_analysis(toy.adata, test_res), ref_non_dropout)


@pytest.fixture
def model_and_loader(toy):
    toy.get_dataloader(16, test_batch_size=32)
    torch.manual_seed(0)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8, uncertainty=True)
    return gears


def test_evaluate_gives_every_cell_the_network_output(model_and_loader):
    gears = model_and_loader
    loader = gears.dataloader["test_loader"]
    test_res = evaluate(loader, gears.model, gears.config["uncertainty"], gears.device)
    assert set(test_res) == {"pert_cat", "pred", "truth", "pred_de", "truth_de", "logvar"}
    n_cells = sum(len(batch) for batch in loader)
    assert test_res["pred"].shape == test_res["truth"].shape == test_res["logvar"].shape == (n_cells, gears.num_genes)
    assert test_res["pred_de"].shape == test_res["truth_de"].shape == (n_cells, 20)
    assert set(test_res["pert_cat"]) == set(gears.pert_data.set2conditions["test"])

    gears.model.eval()
    start = 0
    with torch.no_grad():
        for batch in loader:
            pred, logvar = gears.model(batch.x, batch.pert_idx)
            stop = start + len(batch)
            assert list(test_res["pert_cat"][start:stop]) == batch.pert
            np.testing.assert_allclose(test_res["pred"][start:stop], pred.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(test_res["logvar"][start:stop], logvar.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(test_res["truth"][start:stop], batch.y.numpy())
            np.testing.assert_array_equal(
                test_res["truth_de"][start:stop], np.take_along_axis(batch.y.numpy(), batch.de_idx.numpy(), 1)
            )
            start = stop
    without = evaluate(loader, gears.model, False, "cpu")
    assert "logvar" not in without
    np.testing.assert_allclose(without["pred"], test_res["pred"], rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_named(model_and_loader):
    gears = model_and_loader
    test_res = evaluate(gears.dataloader["test_loader"], gears.model, False, gears.device)
    with pytest.raises(ValueError, match=r"lacks \['pred_de'\]"):
        compute_metrics({k: v for k, v in test_res.items() if k != "pred_de"})
    with pytest.raises(ValueError, match=r"test_res\['truth'\] has shape \(3, 40\)"):
        compute_metrics({**test_res, "truth": test_res["truth"][:3]})
    with pytest.raises(ValueError, match="names conditions the AnnData does not hold"):
        deeper_analysis(gears.adata, {**test_res, "pert_cat": np.full(len(test_res["pred"]), "G39+ctrl")})
    with pytest.raises(ValueError, match="always reads uns\\['rank_genes_groups_cov_all'\\]"):
        deeper_analysis(gears.adata, test_res, de_column_prefix="other")
    with pytest.raises(TypeError, match="gears_ddp network"):
        evaluate(gears.dataloader["test_loader"], object(), False, "cpu")
    gears.model_initialize(hidden_size=8)
    with pytest.raises(ValueError, match="uncertainty mode"):
        evaluate(gears.dataloader["test_loader"], gears.model, True, "cpu")
