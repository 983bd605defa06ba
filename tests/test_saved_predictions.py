"""``saved_pred`` with the published semantics: predictions handed in are what ``predict``
and ``GI_predict`` answer from, weights or none (the published scores of them, too); the
entries a ``GEARS``'s own ``predict`` wrote are never read back, and a new network forgets
them; refusing to predict with untrained weights stays for everything else."""

import numpy as np
import pytest
from reference_package import published_gears
from test_pair_screen import _assert_close_scores

from gears_ddp import GEARS, PertData
from gears_ddp.interactions.calls import genetic_interaction_scores
from gears_ddp.interactions.scores import GI_SCORE_NAMES

COMBO = ["G0", "G1"]
KEYS = ["G0", "G1", "G0_G1"]


def test_a_gears_without_weights_scores_the_predictions_it_is_handed(trained_toy):
    """paper/predicting_GIs.py: predict on one GEARS, hand saved_pred to a new one that never
    loads weights, GI_predict there: the published GI_predict's scores of the same dict."""
    trained_toy.predict([["G0"], ["G1"], COMBO])
    cpu = GEARS(trained_toy.pert_data, device="cpu")
    cpu.saved_pred = trained_toy.saved_pred
    ours = cpu.GI_predict(COMBO)
    published = published_gears(trained_toy)
    published.saved_pred = dict(trained_toy.saved_pred)
    theirs = published.GI_predict(COMBO, GI_genes_file=None)
    assert list(ours) == list(theirs)
    _assert_close_scores(ours, theirs, "published GI_predict of saved_pred")
    np.testing.assert_array_equal(cpu.predict([["G0"]])["G0"], trained_toy.saved_pred["G0"])
    with pytest.raises(RuntimeError, match=r"no model yet.*saved_pred needs \['G2_G3'\] beside \['G2', 'G3'\]"):
        cpu.saved_pred = {"G2": trained_toy.saved_pred["G0"], "G3": trained_toy.saved_pred["G1"]}
        cpu.GI_predict(["G2", "G3"])
    with pytest.raises(RuntimeError, match="no model yet"):
        cpu.predict([["G4"]])


def test_observed_means_are_scored_with_random_weights(trained_toy):
    """paper/Ext_Fig_7.ipynb: model_initialize(), the true mean expression of every observed
    condition written into saved_pred, GI_predict(combo.split('_')): the scores of the
    observed changes over control; any other prediction still needs trained weights."""
    gears = GEARS(trained_toy.pert_data)
    gears.model_initialize()
    frame = gears.adata.to_df()
    frame["condition"] = gears.adata.obs["condition"]
    means = frame.groupby("condition", observed=True).mean()
    for condition, expression in means.iterrows():
        key = condition.strip("+ctrl") if "ctrl" in condition else "_".join(condition.split("+"))
        gears.saved_pred[key] = expression.values
    scores = gears.GI_predict("G0_G1".split("_"))
    control = means.loc["ctrl"].to_numpy(np.float64)
    observed = [means.loc[c].to_numpy(np.float64) - control for c in ("G0+ctrl", "G1+ctrl", "G0+G1")]
    _assert_close_scores(scores, genetic_interaction_scores(*observed), "observed changes")
    with pytest.raises(RuntimeError, match="random initial weights"):
        gears.GI_predict(["G2", "G7"])  # G2_G7 is no observed condition


def test_own_predictions_are_not_read_back_and_a_new_network_forgets_them(trained_toy, tmp_path):
    exact = trained_toy.GI_predict(COMBO)
    trained_toy.predict([["G0"], ["G1"], COMBO])
    assert set(KEYS) <= set(trained_toy.saved_pred)
    after = trained_toy.GI_predict(COMBO)  # the model's exact changes, not predict's drawn cells
    assert [after[name] for name in GI_SCORE_NAMES] == pytest.approx(
        [exact[name] for name in GI_SCORE_NAMES], nan_ok=True
    )
    again = trained_toy.predict([["G0"]], seed=5)["G0"]
    assert not np.array_equal(again, trained_toy.predict([["G0"]])["G0"])  # another draw is predicted, not cached

    handed = np.full(trained_toy.num_genes, 2.5, dtype=np.float32)
    trained_toy.saved_pred["G3"] = handed
    np.testing.assert_array_equal(trained_toy.predict([["G3"], ["G4"]])["G3"], handed)
    assert trained_toy.predict([["G3"]], return_type="dataframe").loc["G3"].eq(2.5).all()
    assert not np.allclose(trained_toy.predict([["G3"]], return_type="anndata").X[0], 2.5)  # from the weights

    trained_toy.save_model(tmp_path / "model")
    trained_toy.load_pretrained(tmp_path / "model")
    assert set(trained_toy.saved_pred) == {"G3"}  # the old weights' predictions are forgotten; G3 was handed in
    with pytest.raises(ValueError, match=r"saved_pred\['G3'\] holds 3 values; it needs one per gene"):
        trained_toy.saved_pred["G3"] = np.ones(3)
        trained_toy.predict([["G3"]])
    del trained_toy.saved_pred["G3"]


def test_uncertainty_mode_needs_the_handed_in_uncertainty_too(trained_toy):
    gears = GEARS(trained_toy.pert_data)
    gears.model_initialize(hidden_size=8, uncertainty=True)
    gears.train(epochs=1)
    handed = np.zeros(gears.num_genes)
    gears.saved_pred["G5"] = handed
    predictions, uncertainty = gears.predict([["G5"]])
    assert not np.array_equal(predictions["G5"], handed)  # no saved_logvar_sum['G5']: predicted
    gears.saved_pred["G5"] = handed
    gears.saved_logvar_sum["G5"] = 0.25
    predictions, uncertainty = gears.predict([["G5"]])
    np.testing.assert_array_equal(predictions["G5"], handed)
    assert uncertainty == {"G5": 0.25}


def test_a_run_loaded_onto_another_split_of_its_data_is_said_to_be_so(trained_toy, data_folder, tmp_path, caplog):
    """A run folder's model loaded into a GEARS whose data was split with another seed: its
    test set may hold perturbations the model trained on; loading and predict_split say so,
    naming the setting; on the run's own split nothing is said."""
    from gears_ddp.data.io import write_yaml

    run = tmp_path / "run"
    trained_toy.save_model(run)
    write_yaml({"split_config": {"split": "simulation", "seed": 1, "train_gene_set_size": 0.75}}, run / "config.yaml")
    for seed, warned in ((2, True), (1, False)):
        pert_data = PertData(data_folder)
        pert_data.load(data_path=data_folder / "toy")
        pert_data.prepare_split("simulation", seed=seed)
        pert_data.get_dataloader(16, test_batch_size=64)
        caplog.clear()
        with caplog.at_level("WARNING", logger="gears_ddp"):
            gears = GEARS(pert_data)
            gears.load_pretrained(run)
            gears.predict_split("test", cells_per_perturbation=2)
        said = [r.getMessage() for r in caplog.records if "trained on another split" in r.getMessage()]
        assert len(said) == (2 if warned else 0), said
        if warned:
            assert "(seed: 1 there, 2 here): its test set may hold perturbations it trained on" in said[0]
            assert "the test set may hold" in said[1] and "open_run(folder).gears" in said[1]
