"""Metrics: parity with the published GEARS, distributed accumulation, the truth spread read
from the data, hand-computed values."""

import dataclasses
import re
import warnings

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from reference_package import import_reference

from gears_ddp.data.grouped import condition_means
from gears_ddp.evaluation.metrics import (
    EvaluationAccumulator,
    EvaluationResult,
    MetricContext,
    compute_metrics,
    deeper_analysis,
    non_dropout_analysis,
    non_dropout_de_table,
    subgroup_metrics,
)
from gears_ddp.evaluation.truth_spread import SPREAD_STATISTICS, spread


def result_from_cells(pert_cat, pred, truth, conditions, de_idx_table, non_dropout_table) -> EvaluationResult:
    """An ``EvaluationResult`` from reference-style per-cell arrays: ``pert_cat`` (N condition
    strings), ``pred`` / ``truth`` (N x G); the tables are indexed by the position of a
    condition in ``conditions`` (as ``CellTable`` tables)."""
    codes = pd.Index(list(conditions)).get_indexer(np.asarray(pert_cat, dtype=object))
    pred = torch.as_tensor(np.asarray(pred))
    accumulator = EvaluationAccumulator(
        conditions, pred.shape[1], torch.as_tensor(de_idx_table), torch.as_tensor(non_dropout_table)
    )
    accumulator.add(torch.from_numpy(codes), pred, torch.as_tensor(np.asarray(truth)))
    return accumulator.result()


def spreads_from_cells(pert_data, test_res) -> dict:
    """``MetricContext.spreads`` of reference-style per-cell results: each condition's cells'
    ``truth`` at its DE genes (gene order) and top non-dropout DE genes, NaN where padded."""
    cells = pert_data.cells
    tables = {
        "de": cells.condition_de_idx.numpy(),
        "non_dropout_de": non_dropout_de_table(pert_data.uns, pert_data.var.index, cells.condition_names).numpy(),
    }
    out = {name: {} for name in tables}
    for condition in np.unique(test_res["pert_cat"]):
        truth = np.asarray(test_res["truth"])[test_res["pert_cat"] == condition]
        for name, table in tables.items():
            genes = table[cells.conditions.index(condition)]
            values = np.where(genes >= 0, truth[:, np.maximum(genes, 0)].astype(np.float32), np.nan)
            out[name][condition] = spread(values)
    return out


def assert_same_metrics(ours: dict, reference: dict) -> None:
    """Same conditions, same keys per condition, values equal within 1e-6 (NaN where NaN)."""
    assert set(ours) == set(reference)
    for condition, expected in reference.items():
        assert set(ours[condition]) == set(expected), condition
        for key, value in expected.items():
            np.testing.assert_allclose(ours[condition][key], value, rtol=1e-6, atol=1e-6, err_msg=f"{condition} {key}")


def reference_style_results(pert_data, conditions, seed=0):
    """The reference's ``evaluate`` output for the cells of ``conditions``: truth is the cells'
    expression, pred adds a per-condition bias and per-cell noise. Some conditions are edited
    to reach the branches of the metrics: DE genes that are always 0 (partly, and all of both
    DE lists), a constant prediction (undefined Pearson), strongly up- and down-regulated genes.

    Arrays are float64 so the reference computes in float64 like this package (with float32
    arrays it rounds its means to float32, a difference of about 1e-7)."""
    cells = pert_data.cells
    rows = cells.cells_of(conditions).numpy()
    codes = cells.condition_codes[rows].numpy()
    de_idx = cells.condition_de_idx[codes].numpy()
    table = non_dropout_de_table(pert_data.uns, pert_data.var.index, cells.condition_names)
    non_dropout_de_idx = table[codes].numpy()
    truth = cells.expression[rows].numpy().astype(np.float64)
    rng = np.random.default_rng(seed)
    pert_cat = np.array(cells.conditions, dtype=object)[codes].astype(str)

    def of(condition):
        return pert_cat == condition

    first, second, third, fourth = [c for c in conditions if c != "ctrl"][:4]
    for idx in (de_idx, non_dropout_de_idx):  # every DE gene always 0
        truth[of(first)] = _zero_at(truth[of(first)], idx[of(first)], 20)
    truth[of(second)] = _zero_at(truth[of(second)], de_idx[of(second)], 5)  # five DE genes always 0
    truth[of(third), :10] *= 12.0  # up-regulated more than 10-fold
    truth[of(third), 10:20] *= 0.25  # down-regulated below 0.33-fold
    bias = rng.normal(scale=0.3, size=len(cells.conditions))[codes, None]
    pred = truth + bias + rng.normal(scale=0.3, size=truth.shape)
    pred[of(fourth)] = 1.0  # constant: Pearson undefined, counted as 0
    return {
        "pert_cat": pert_cat,
        "pred": pred,
        "truth": truth,
        "pred_de": np.take_along_axis(pred, de_idx, 1),
        "truth_de": np.take_along_axis(truth, de_idx, 1),
    }


def _zero_at(values, de_idx, n):
    """``values`` with the first ``n`` DE genes of each row set to 0."""
    values = values.copy()
    np.put_along_axis(values, de_idx[:, :n], 0.0, axis=1)
    return values


def edit_gene_sets(adata, conditions):
    """Give two conditions smaller non-zero / non-dropout gene sets than the toy's (all genes)."""
    names = dict(adata.obs[["condition", "condition_name"]].astype(str).drop_duplicates().to_numpy())
    adata.uns["non_zeros_gene_idx"][names[conditions[1]]] = np.arange(0, 40, 3)
    adata.uns["non_dropout_gene_idx"][names[conditions[1]]] = np.arange(0, 40, 2)
    adata.uns["non_zeros_gene_idx"][names[conditions[2]]] = np.arange(5, 30)


def run_reference(inference, adata, test_res):
    """The published package's three metric functions on ``test_res`` (its warnings silenced)."""
    reference_adata = anndata.AnnData(
        X=sp.csr_matrix(adata.X.astype(np.float64)), obs=adata.obs, var=adata.var, uns=adata.uns
    )  # the reference needs a sparse X
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (
            inference.compute_metrics(test_res),
            inference.deeper_analysis(reference_adata, test_res),
            inference.non_dropout_analysis(reference_adata, test_res),
        )


def our_result(pert_data, test_res):
    """``EvaluationResult`` of reference-style per-cell results of ``pert_data``'s cells."""
    cells = pert_data.cells
    return result_from_cells(
        test_res["pert_cat"],
        test_res["pred"],
        test_res["truth"],
        cells.conditions,
        cells.condition_de_idx,
        non_dropout_de_table(pert_data.uns, pert_data.var.index, cells.condition_names),
    )


def published_case(pert_data):
    """Reference-style per-cell results of the test conditions of ``pert_data`` (two of them
    with smaller gene sets: ``edit_gene_sets``) and the published functions' results of them."""
    inference = import_reference("gears.inference")
    conditions = pert_data.set2conditions["test"]
    edit_gene_sets(pert_data.adata, conditions)
    test_res = reference_style_results(pert_data, conditions)
    return test_res, run_reference(inference, pert_data.adata, test_res)


def test_parity_with_published_gears(toy):
    conditions = toy.set2conditions["test"]
    test_res, ((ref_metrics, ref_pert), ref_deeper, ref_non_dropout) = published_case(toy)

    result = our_result(toy, test_res)
    # the reference sees the edited truth: so must the spreads (read from the unedited data otherwise)
    context = dataclasses.replace(MetricContext.from_pert_data(toy), spreads=spreads_from_cells(toy, test_res))
    metrics, metrics_pert = compute_metrics(result)
    assert metrics.keys() == ref_metrics.keys()
    np.testing.assert_allclose([metrics[k] for k in ref_metrics], list(ref_metrics.values()), rtol=1e-6, atol=1e-6)
    assert_same_metrics(metrics_pert, ref_pert)
    assert_same_metrics(deeper_analysis(context, result), ref_deeper)
    assert_same_metrics(non_dropout_analysis(context, result), ref_non_dropout)

    # the edited conditions reach the branches where keys are absent or values special
    first, second, third, fourth = conditions[:4]
    assert "frac_in_range" not in ref_deeper[first] and "frac_in_range_non_dropout" not in ref_non_dropout[first]
    assert "frac_in_range" in ref_deeper[second]
    assert {"fold_change_gap_upreg_10", "fold_change_gap_downreg_0.33"} <= ref_deeper[third].keys()
    assert ref_pert[fourth]["pearson"] == ref_deeper[fourth]["pearson_top20_de"] == 0


def test_compute_metrics_parity_with_control_cells(toy):
    inference = import_reference("gears.inference")
    conditions = ["ctrl"] + toy.set2conditions["test"]
    test_res = reference_style_results(toy, conditions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_metrics, ref_pert = inference.compute_metrics(test_res)
    result = our_result(toy, test_res)
    metrics, metrics_pert = compute_metrics(result)
    np.testing.assert_allclose([metrics[k] for k in ref_metrics], list(ref_metrics.values()), rtol=1e-6, atol=1e-6)
    assert_same_metrics(metrics_pert, ref_pert)
    assert metrics_pert["ctrl"]["mse_de"] == metrics_pert["ctrl"]["pearson_de"] == 0
    # the reference raises KeyError on control (no DE ranking): here it is left out
    context = MetricContext.from_pert_data(toy)
    assert "ctrl" not in deeper_analysis(context, result) and "ctrl" not in non_dropout_analysis(context, result)


def accumulate(pert_data, loader):
    """An accumulator fed every batch of ``loader``; predictions are exact functions of the batch
    (dyadic arithmetic), so float64 sums are exact whatever the order of the cells."""
    accumulator = EvaluationAccumulator.from_pert_data(pert_data, uncertainty=True)
    for batch in loader:
        pred = batch.y * 0.5 + 0.25 + batch.condition[:, None].float() * 0.125
        accumulator.add(batch.condition, pred, batch.y, logvar=-batch.y)
    return accumulator


def test_two_ranks_merge_to_the_single_process_result(toy):
    single = accumulate(toy, toy.get_dataloader(batch_size=8, test_batch_size=16)["test_loader"]).result()
    states = [
        accumulate(
            toy,
            toy.get_dataloader_distributed(batch_size=8, test_batch_size=batch_size, world_size=2, rank=rank)[
                "test_loader"
            ],
        ).state()
        for rank, batch_size in ((0, 5), (1, 7))
    ]
    merged = EvaluationAccumulator.from_pert_data(toy, uncertainty=True)
    merged.load_state({name: states[0][name] + states[1][name] for name in states[0]})
    result = merged.result()

    assert result.conditions == single.conditions
    assert sorted(result.conditions) == sorted(toy.set2conditions["test"])
    for field in ("n_cells", "pred_mean", "truth_mean", "logvar_mean", "de_idx", "non_dropout_de_idx"):
        np.testing.assert_array_equal(getattr(result, field), getattr(single, field), err_msg=field)
    context = MetricContext.from_pert_data(toy, result.conditions)
    assert compute_metrics(result) == compute_metrics(single)
    assert deeper_analysis(context, result) == deeper_analysis(context, single)


def test_the_truth_spread_read_from_the_data_is_that_of_the_evaluated_cells(toy):
    """The spreads ``MetricContext`` reads from the cell table, a condition at a time, equal
    those of every test cell's truth as the test loader yields it."""
    conditions = toy.set2conditions["test"]
    batches = list(toy.get_dataloader(batch_size=8, test_batch_size=16)["test_loader"])
    names = np.array(toy.cells.conditions, dtype=object)
    test_res = {
        "pert_cat": np.concatenate([names[b.condition.numpy()] for b in batches]).astype(str),
        "truth": torch.cat([b.y for b in batches]).numpy(),
    }
    expected = spreads_from_cells(toy, test_res)
    context = MetricContext.from_pert_data(toy, conditions)
    for name in ("de", "non_dropout_de"):
        assert set(context.spreads[name]) == set(conditions)
        for condition in conditions:
            for statistic in SPREAD_STATISTICS:
                np.testing.assert_array_equal(
                    context.spreads[name][condition][statistic],
                    expected[name][condition][statistic],
                    err_msg=f"{name} {condition} {statistic}",
                )
    assert not np.isnan(context.spreads["de"][conditions[0]]["std"]).all()
    # the analyses refuse a condition the context has no spread for, naming it
    partial = dataclasses.replace(context, spreads={name: {} for name in context.spreads})
    result = our_result(toy, reference_style_results(toy, conditions))
    with pytest.raises(ValueError, match=f"no truth spread for conditions .*{re.escape(conditions[0])}"):
        deeper_analysis(partial, result)


def test_compute_metrics_by_hand():
    conditions = ["ctrl", "A+ctrl", "B+ctrl"]
    de_idx = torch.full((3, 20), -1)
    de_idx[1, :2] = torch.tensor([0, 2])
    de_idx[2, :2] = torch.tensor([0, 1])
    pert_cat = ["ctrl", "ctrl", "A+ctrl", "A+ctrl", "B+ctrl"]
    truth = [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 5], [2, 4, 7]]
    pred = [[3, 2, 1], [3, 2, 1], [0, 0, 0], [2, 2, 2], [1, 2, 3]]
    result = result_from_cells(
        pert_cat, np.array(pred, float), np.array(truth, float), conditions, de_idx, torch.full((3, 20), -1)
    )
    metrics, per = compute_metrics(result)
    # means: ctrl pred [3,2,1] truth [1,2,3]; A pred [1,1,1] truth [1,2,4]; B pred [1,2,3] truth [2,4,7]
    pearson_b = 5 / np.sqrt(2 * 114 / 9)
    expected = {
        "ctrl": {"mse": 8 / 3, "pearson": -1, "mse_de": 0, "pearson_de": 0},
        "A+ctrl": {"mse": 10 / 3, "pearson": 0, "mse_de": 4.5, "pearson_de": 0},  # constant pred: NaN -> 0
        "B+ctrl": {"mse": 7, "pearson": pearson_b, "mse_de": 2.5, "pearson_de": 1},
    }
    assert per.keys() == expected.keys()
    for condition, values in expected.items():
        assert per[condition].keys() == values.keys()
        np.testing.assert_allclose([per[condition][k] for k in values], list(values.values()), atol=1e-12)
    np.testing.assert_allclose(
        [metrics[k] for k in ("mse", "pearson", "mse_de", "pearson_de")],
        [13 / 3, (pearson_b - 1) / 3, 3.5, 0.5],
        atol=1e-12,
    )


def test_subgroup_metrics():
    metrics_pert = {"A+B": {"mse": 1.0, "frac": 2.0}, "C+D": {"mse": 3.0}, "E+ctrl": {"mse": 5.0, "frac": 4.0}}
    subgroups = {
        "combo_seen1": ["A+B", "C+D"],
        "unseen_single": ["E+ctrl", "F+ctrl"],
        "combo_seen0": ["G+H"],
        "combo_seen2": [],
    }
    assert subgroup_metrics(metrics_pert, subgroups) == {
        "test_combo_seen1_mse": 2.0,
        "test_combo_seen1_frac": 2.0,
        "test_unseen_single_mse": 5.0,
        "test_unseen_single_frac": 4.0,
    }
    assert set(subgroup_metrics(metrics_pert, subgroups, prefix="val_")) == {
        "val_combo_seen1_mse",
        "val_combo_seen1_frac",
        "val_unseen_single_mse",
        "val_unseen_single_frac",
    }


def test_bad_input_is_rejected_with_a_clear_error():
    tables = torch.full((1, 20), -1), torch.full((1, 20), -1)
    accumulator = EvaluationAccumulator(["ctrl"], 3, *tables, uncertainty=True)
    with pytest.raises(ValueError, match="logvar must be given"):
        accumulator.add(torch.zeros(1, dtype=torch.long), torch.zeros(1, 3), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="de gene table has shape"):
        EvaluationAccumulator(["ctrl", "A+ctrl"], 3, *tables)


@pytest.mark.parametrize("sparse", [False, True])
def test_condition_means_in_blocks_equal_the_per_condition_means(sparse):
    rng = np.random.default_rng(0)
    dense = np.maximum(rng.normal(size=(23, 5)), 0).astype(np.float32)  # half zeros, as expression has
    codes = rng.integers(-1, 4, size=23)  # -1: left out
    codes[:4] = [0, 1, 2, 3]
    matrix = sp.csr_matrix(dense) if sparse else dense
    # 7 values per block: 1 row per block, so every row is its own block
    means = condition_means(matrix, codes, 5, block_elements=7)
    for code in range(4):
        np.testing.assert_allclose(means[code], dense[codes == code].astype(np.float64).mean(0), rtol=1e-12)
    assert np.isnan(means[4]).all()  # no rows
    np.testing.assert_allclose(condition_means(matrix, codes, 5), means, rtol=1e-12, equal_nan=True)
    nonzero = condition_means(matrix, codes, 5, statistic="nonzero", block_elements=7)
    for code in range(4):
        np.testing.assert_array_equal(nonzero[code], (dense[codes == code] != 0).mean(0))
