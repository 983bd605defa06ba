"""Tests for gears_ddp.datasets.synthetic: format, determinism, ground truth and validation."""

import itertools
import json
import re

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from gears_ddp.data.conditions import condition_genes, is_combo, is_single, validate_conditions
from gears_ddp.data.graphs import coexpression_edge_list
from gears_ddp.data.processing import check_expression, validate_annotations
from gears_ddp.datasets import SyntheticPerturbSeq, make_synthetic_perturb_seq

SMALL = dict(
    n_genes=300, n_modules=10, n_perturbed_genes=20, n_combos=20, cells_per_condition=30, n_control_cells=300, seed=3
)


@pytest.fixture(scope="module")
def data() -> SyntheticPerturbSeq:
    """One small dataset shared by the read-only tests."""
    return make_synthetic_perturb_seq(**SMALL)


def _effect(true_means: pd.DataFrame, condition: str) -> np.ndarray:
    """True effect of a condition relative to control (log-normalised space)."""
    return (true_means.loc[condition] - true_means.loc["ctrl"]).to_numpy()


def _single_and_sum(true_means: pd.DataFrame, combo: str) -> tuple[np.ndarray, np.ndarray]:
    """A combo's true effect and the sum of its two single-gene true effects."""
    first, second = condition_genes(combo)
    return _effect(true_means, combo), _effect(true_means, f"{first}+ctrl") + _effect(true_means, f"{second}+ctrl")


def test_same_seed_is_identical_and_other_seed_differs(data):
    again = make_synthetic_perturb_seq(**SMALL)
    assert (again.adata.X != data.adata.X).nnz == 0
    pd.testing.assert_frame_equal(again.adata.obs, data.adata.obs)
    pd.testing.assert_frame_equal(again.adata.var, data.adata.var)
    pd.testing.assert_frame_equal(again.true_means, data.true_means)
    assert again.gene2go == data.gene2go and again.interaction_types == data.interaction_types
    other = make_synthetic_perturb_seq(**{**SMALL, "seed": 4})
    assert other.adata.shape == data.adata.shape
    assert (other.adata.X != data.adata.X).nnz > 0
    assert not other.adata.obs["condition"].equals(data.adata.obs["condition"])


def test_shapes_columns_and_params(data):
    adata = data.adata
    n_conditions = 1 + SMALL["n_perturbed_genes"] + SMALL["n_combos"]
    expected_cells = SMALL["n_control_cells"] + SMALL["cells_per_condition"] * (n_conditions - 1)
    assert adata.shape == (expected_cells, SMALL["n_genes"])
    assert sp.isspmatrix_csr(adata.X) and adata.X.dtype == np.float32
    assert {"condition", "cell_type"} <= set(adata.obs.columns)
    assert list(adata.var["gene_name"]) == list(adata.var_names)
    assert adata.obs_names.is_unique and adata.var_names.is_unique
    assert set(adata.obs["cell_type"]) == {"synthetic"}
    assert data.true_means.shape == (n_conditions, SMALL["n_genes"])
    assert list(data.true_means.columns) == list(adata.var_names)
    assert set(data.true_means.index) == set(adata.obs["condition"])
    counts = adata.obs["condition"].value_counts()
    assert counts["ctrl"] == SMALL["n_control_cells"]
    assert (counts.drop("ctrl") == SMALL["cells_per_condition"]).all()
    params = json.loads(json.dumps(data.params))
    assert {k: params[k] for k in SMALL} == SMALL
    validate_annotations(adata, "synthetic data")
    check_expression(adata.X, "synthetic data")


@pytest.fixture(scope="module")
def default_data() -> SyntheticPerturbSeq:
    """The dataset with every default setting."""
    return make_synthetic_perturb_seq()


def test_default_size_fits_a_cpu_demo(default_data):
    adata = default_data.adata
    assert adata.n_vars == 1000 and 5000 <= adata.n_obs <= 8000


def test_default_combos_leave_unseen_pairs_for_the_simulation_split(default_data):
    # GEARS's simulation split keeps 75% of the perturbed genes seen: the expected number of
    # combos with both genes unseen (the combo_seen0 test subgroup) should be at least 4
    n_genes, n_combos = default_data.params["n_perturbed_genes"], default_data.params["n_combos"]
    n_unseen = n_genes - int(0.75 * n_genes)
    assert n_combos * (n_unseen * (n_unseen - 1)) / (n_genes * (n_genes - 1)) >= 4


def _non_self_coexpression_edges(data: SyntheticPerturbSeq) -> pd.DataFrame:
    """GEARS's co-expression graph (|r| > 0.4, top 21 per gene) over control and single cells, minus self pairs."""
    conditions = data.adata.obs["condition"].astype(str).to_numpy()
    rows = np.flatnonzero([c == "ctrl" or is_single(c) for c in conditions])
    edges = coexpression_edge_list(
        data.adata.X.toarray(), rows, data.adata.var["gene_name"].to_numpy(), threshold=0.4, k=20
    )
    return edges[edges["source"] != edges["target"]]


def test_programs_give_within_module_coexpression(default_data):
    edges = _non_self_coexpression_edges(default_data)
    modules = default_data.adata.var["module"]
    within = (modules[edges["source"]].to_numpy() == modules[edges["target"]].to_numpy()).mean()
    assert len(edges) >= 1000 and within >= 0.7


def test_without_program_variation_the_coexpression_graph_is_nearly_empty(default_data):
    flat = make_synthetic_perturb_seq(program_sd=0.0)
    pd.testing.assert_frame_equal(flat.true_means, default_data.true_means)  # programs leave the truth alone
    assert len(_non_self_coexpression_edges(flat)) < 100


def test_expression_is_log_normalised(data):
    X = data.adata.X
    assert np.isfinite(X.data).all() and (X.data >= 0).all()
    totals = np.asarray(X.expm1().sum(axis=1)).ravel()
    np.testing.assert_allclose(totals, 1e4, rtol=1e-3)
    detection = np.asarray((X > 0).mean(axis=0)).ravel()
    assert detection.min() < 0.2 and detection.max() > 0.9  # lowly and highly expressed genes


def test_cells_are_shuffled(data):
    conditions = data.adata.obs["condition"].astype(str).to_numpy()
    changes = np.count_nonzero(conditions[1:] != conditions[:-1])
    assert changes > 0.5 * len(conditions)


def test_conditions_are_well_formed_and_combos_use_singles(data):
    conditions = data.true_means.index
    validate_conditions(conditions)
    singles = [c for c in conditions if is_single(c)]
    combos = [c for c in conditions if is_combo(c)]
    assert len(singles) == SMALL["n_perturbed_genes"] and len(combos) == SMALL["n_combos"]
    assert all(c.endswith("+ctrl") for c in singles)
    single_genes = {condition_genes(c)[0] for c in singles}
    for combo in combos:
        first, second = condition_genes(combo)
        assert first < second and {first, second} <= single_genes
    assert single_genes <= set(data.adata.var_names)
    assert all(data.gene2go.get(gene) for gene in single_genes)
    assert set(data.interaction_types) == set(combos)


def test_go_vocabulary_includes_unmeasured_genes(data):
    measured = set(data.adata.var_names)
    assert data.pert_genes == sorted(data.gene2go)
    unmeasured = [g for g in data.pert_genes if g not in measured]
    assert 0.10 * SMALL["n_genes"] <= len(unmeasured) <= 0.20 * SMALL["n_genes"]
    assert all(term.startswith("GO:") and len(term) == 10 for terms in data.gene2go.values() for term in terms)


def test_knockdown_lowers_and_activation_raises_target(data):
    adata = data.adata
    conditions = adata.obs["condition"].astype(str).to_numpy()
    control_mean = np.asarray(adata.X[conditions == "ctrl"].mean(axis=0)).ravel()
    modes = adata.var["perturbation"]
    assert (modes == "knockdown").sum() > 0 and (modes == "activation").sum() > 0
    for gene in adata.var_names[modes != "none"]:
        column = adata.var_names.get_loc(gene)
        perturbed_mean = adata.X[conditions == f"{gene}+ctrl"][:, column].mean()
        if modes[gene] == "knockdown":
            assert perturbed_mean < control_mean[column], gene
        else:
            assert perturbed_mean > control_mean[column], gene


def test_perturbations_propagate_downstream(data):
    singles = [c for c in data.true_means.index if is_single(c)]
    affected = []
    for condition in singles:
        effect = pd.Series(_effect(data.true_means, condition), index=data.true_means.columns)
        affected.append(int((effect.drop(condition_genes(condition)[0]).abs() > 0.1).sum()))
    assert np.median(affected) >= 2


def test_interaction_types_and_their_effects(data):
    types = pd.Series(data.interaction_types)
    counts = types.value_counts()
    assert counts.sum() == SMALL["n_combos"]
    assert set(counts.index) == {"additive", "synergy", "buffering", "epistasis"}
    assert all(counts[kind] == round(0.15 * SMALL["n_combos"]) for kind in ("synergy", "buffering", "epistasis"))
    additive_errors = []
    for combo, kind in data.interaction_types.items():
        combined, summed = _single_and_sum(data.true_means, combo)
        if kind == "additive":  # exact in log-rate space; log1p and normalisation bend it slightly
            additive_errors.append(np.linalg.norm(combined - summed) / np.linalg.norm(summed))
        elif kind == "synergy":
            assert np.linalg.norm(combined) > 1.05 * np.linalg.norm(summed), combo
        elif kind == "buffering":
            assert np.linalg.norm(combined) < np.linalg.norm(summed), combo
    assert max(additive_errors) < 0.1 and np.median(additive_errors) < 0.02


def test_interaction_fractions_are_honoured():
    types = make_synthetic_perturb_seq(**{**SMALL, "interaction_fractions": {"synergy": 0.5}}).interaction_types
    assert pd.Series(types).value_counts().to_dict() == {"synergy": 10, "additive": 10}


def _mean_jaccard(sets: list[set], pairs) -> float:
    """Mean Jaccard index of the given index pairs of ``sets``."""
    return float(np.mean([len(sets[i] & sets[j]) / len(sets[i] | sets[j]) for i, j in pairs]))


def test_go_annotations_follow_modules(data):
    var = data.adata.var[data.adata.var_names.isin(list(data.gene2go))]
    sets = [data.gene2go[g] for g in var.index]
    modules = var["module"].to_numpy()
    pairs = list(itertools.combinations(range(len(sets)), 2))
    within = [(i, j) for i, j in pairs if modules[i] == modules[j]]
    across = [(i, j) for i, j in pairs if modules[i] != modules[j]]
    assert _mean_jaccard(sets, within) > 3 * _mean_jaccard(sets, across)


def test_h5ad_round_trip(data, tmp_path):
    import anndata

    data.adata.write_h5ad(tmp_path / "synthetic.h5ad")
    back = anndata.read_h5ad(tmp_path / "synthetic.h5ad")
    assert list(back.obs["condition"].astype(str)) == list(data.adata.obs["condition"].astype(str))
    assert (back.X != data.adata.X).nnz == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_combos": 191}, "exceeds the 190 possible pairs"),
        ({"n_perturbed_genes": 301}, "must not exceed n_genes"),
        ({"n_genes": 0}, "n_genes must be an integer >= 1"),
        ({"cells_per_condition": -5}, "cells_per_condition must be an integer >= 1"),
        ({"n_control_cells": 2.5}, "n_control_cells must be an integer"),
        ({"n_modules": 400}, "n_modules .* must not exceed n_genes"),
        ({"n_go_terms": 5}, "n_go_terms .* must be at least n_modules"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"frac_activation": 1.5}, "frac_activation must be a number in"),
        ({"interaction_fractions": {"synergy": 0.7, "buffering": 0.5}}, "sum to 1.2 > 1"),
        ({"interaction_fractions": {"antagonism": 0.1}}, "unknown types"),
        ({"cell_type": ""}, "cell_type must be a non-empty string"),
        ({"program_sd": -0.1}, "program_sd must be a finite number >= 0"),
        ({"program_sd": float("nan")}, "program_sd must be a finite number >= 0"),
        ({"activation_range": (2.0, 1.0)}, "activation_range must be"),
        ({"activation_range": (0.0, 1.0)}, "activation_range must be"),
        ({"activation_range": 2.0}, "activation_range must be"),
        ({"shared_response": -1.0}, "shared_response must be a finite number >= 0"),
        ({"library_size": 0}, "library_size must be > 0"),
        ({"library_size": 1e4, "measured_share": 0.0}, "measured_share must be in"),
        ({"measured_share": 0.5}, "and 1 unless library_size is given"),
    ],
)
def test_invalid_parameters_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_synthetic_perturb_seq(**{**SMALL, **overrides})


def _mean_effect_share(true_means: pd.DataFrame) -> float:
    """Mean over perturbed conditions of the Pearson correlation of the condition's true
    effect with the mean true effect: how much of a perturbation the average one explains."""
    effects = true_means.drop(index="ctrl") - true_means.loc["ctrl"]
    mean = effects.mean()
    return float(np.mean([np.corrcoef(row, mean)[0, 1] for _, row in effects.iterrows()]))


def test_a_shared_response_makes_perturbations_alike(data):
    shared = make_synthetic_perturb_seq(**{**SMALL, "shared_response": 1.0})
    assert _mean_effect_share(data.true_means) < 0.3 < 0.6 < _mean_effect_share(shared.true_means)
    assert shared.params["shared_response"] == 1.0 and data.params["shared_response"] == 0.0


def test_unmeasured_counts_enter_each_cells_total_and_the_truth(data):
    shallow = make_synthetic_perturb_seq(**{**SMALL, "library_size": 2e4, "measured_share": 0.01})
    measured_total = np.asarray(shallow.adata.X.expm1().sum(axis=1)).ravel()  # 1e4 x the measured share of each cell
    assert 0.007e4 < np.median(measured_total) < 0.014e4
    control_truth = np.expm1(shallow.true_means.loc["ctrl"]).sum()
    assert control_truth == pytest.approx(0.01e4, rel=1e-6)  # a control cell's expected measured share
    assert shallow.adata.X.nnz < 0.8 * data.adata.X.nnz  # 200 measured counts per cell instead of about 340


def test_presets_are_named_option_sets():
    from gears_ddp.datasets import PRESETS, preset

    assert preset("benchmark") == {} and {"benchmark", "norman"} <= set(PRESETS)
    norman = preset("norman")
    norman["interaction_fractions"]["synergy"] = 1.0  # a copy: the preset itself is unchanged
    assert PRESETS["norman"]["interaction_fractions"]["synergy"] != 1.0
    with pytest.raises(ValueError, match=re.escape(f"unknown synthetic preset 'nope'; known: {sorted(PRESETS)}")):
        preset("nope")
