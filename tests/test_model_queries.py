"""``inference.model_queries`` and ``interactions`` take explicit inputs: a model's answers
with the published ``saved_pred`` semantics from parts built by hand (no ``GEARS``), and
the observed pairs scored from any changes handed in."""

import numpy as np
import pandas as pd
import pytest
import torch

from gears_ddp.data import PertData
from gears_ddp.inference.model_queries import NO_MODEL, RANDOM_WEIGHTS, ModelQueries, SavedPredictions
from gears_ddp.interactions.agreement import compare_calls
from gears_ddp.interactions.observed import observed_changes, observed_interactions, predicted_interactions
from gears_ddp.interactions.pair_tables import trained_conditions
from gears_ddp.interactions.scores import GI_SCORE_NAMES


def _combination_data(data_folder) -> PertData:
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    return pert_data


def test_queries_without_a_model_answer_from_the_entries_handed_in_and_name_what_is_missing(trained_toy):
    genes = len(trained_toy.pert_data.gene_names)
    handed = {"G0": np.arange(genes, dtype=np.float32), "G1": np.ones(genes, dtype=np.float32)}
    saved = SavedPredictions(dict(handed))
    queries = ModelQueries(None, torch.device("cpu"), trained_toy.pert_data, saved)
    answers = queries.predict([["G0"], ["G1"]])
    np.testing.assert_array_equal(answers["G0"], handed["G0"])
    np.testing.assert_array_equal(answers["G1"], handed["G1"])
    assert queries.weights_problem == NO_MODEL
    with pytest.raises(RuntimeError, match="no model yet"):
        queries.predict([["G2"]])
    with pytest.raises(RuntimeError, match=r"saved_pred needs \['G0_G1'\] beside \['G0', 'G1'\]"):
        queries.pair_changes(["G0", "G1"])
    random_weights = ModelQueries(
        trained_toy.best_model,
        torch.device("cpu"),
        trained_toy.pert_data,
        SavedPredictions(),
        dict(trained_toy.config),
        None,
    )
    assert random_weights.weights_problem == RANDOM_WEIGHTS


def test_a_models_own_predictions_are_kept_but_an_entry_handed_in_is_not_overwritten(trained_toy):
    saved = SavedPredictions({"G1": np.zeros(len(trained_toy.pert_data.gene_names), dtype=np.float32)})
    handed = saved.saved["G1"]
    queries = ModelQueries(
        trained_toy.best_model, trained_toy.device, trained_toy.pert_data, saved, dict(trained_toy.config), "training"
    )
    ours = queries.predict([["G0"], ["G1"]], return_type="dataframe")
    expected = trained_toy.predict([["G0"]])["G0"]
    np.testing.assert_allclose(ours.loc["G0"].to_numpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(ours.loc["G1"].to_numpy(), handed)  # answered from it
    computed = queries.predict([["G1"]], return_type="anndata")  # computed by the model, never from saved_pred
    assert not np.allclose(np.asarray(computed.X)[0], handed)
    assert saved.saved["G1"] is handed  # not replaced by the model's own
    assert saved.own["G0"] is saved.saved["G0"] and "G1" not in saved.own
    again = queries.predict([["G0"]])["G0"]  # an own entry is never read back: the weights give it again
    np.testing.assert_allclose(again, expected, rtol=1e-6)


def test_pairs_scored_from_their_observed_changes_agree_with_the_observed_calls(data_folder):
    pert_data = _combination_data(data_folder)
    observed = observed_interactions(pert_data)
    assert len(observed) > 0

    def the_observed_changes(queries):  # single queries as their observed single conditions, pairs as theirs
        names = [f"{q[0]}+ctrl" if len(q) == 1 else f"{q[0]}+{q[1]}" for q in queries]
        names = [name if name in pert_data.cells.conditions else f"ctrl+{name.split('+')[0]}" for name in names]
        return torch.from_numpy(observed_changes(pert_data.cells, names))

    predicted = predicted_interactions(
        observed,
        the_observed_changes,
        list(pert_data.gene_names),
        train_conditions=trained_conditions(pert_data.set2conditions),
    )
    pd.testing.assert_frame_equal(predicted[list(GI_SCORE_NAMES)], observed[list(GI_SCORE_NAMES)])
    agreement = compare_calls(observed, predicted)
    assert all(values["agree"] == len(observed) for values in agreement["types"].values())


def test_the_train_conditions_leave_out_control_and_need_a_split():
    assert trained_conditions({"train": ["ctrl", "A+ctrl", "A+B"], "test": ["C+ctrl"]}) == ["A+ctrl", "A+B"]
    assert trained_conditions(None) == []
