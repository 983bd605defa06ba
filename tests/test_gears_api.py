"""The single-process GEARS API: training, test scoring with baselines, predictions,
checkpoints (both formats and directions), and clear errors."""

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from reference_package import import_reference

from gears_ddp.gears import GEARS
from gears_ddp.training.engine import training_step


@pytest.fixture
def trained(toy, device):
    toy.get_dataloader(16, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(toy, device=str(device))
    gears.model_initialize(hidden_size=8)
    outcome = gears.train(epochs=2)
    return gears, outcome


def test_train_reports_model_and_baselines_per_subgroup(trained):
    gears, outcome = trained
    model, baselines = outcome["model"], outcome["baselines"]
    assert set(baselines) == {"no_change", "mean_effect", "additive", "linear"}
    for summary in (model, *baselines.values()):
        assert np.isfinite(summary["test_mse_de"]) and "test_pearson_delta" in summary
    groups = [g for g, conds in gears.subgroup["test_subgroup"].items() if conds]
    assert all(f"test_{g}_pearson_delta" in model for g in groups)
    assert baselines["no_change"]["test_pearson_delta"] == 0.0  # a constant change has no correlation
    assert len(gears.history) == 2 and gears.history[1]["epoch"] == 2
    assert all(np.isfinite(h["val_mse_de"]) for h in gears.history)


def test_training_steps_fit_a_fixed_batch(toy):
    toy.get_dataloader(16)
    torch.manual_seed(0)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    batch = next(iter(toy.dataloader["train_loader"]))
    context, optimizer = gears.loss_context(), torch.optim.Adam(gears.model.parameters(), lr=1e-3)
    gears.model.train()
    losses = [
        float(training_step(gears.model, [batch], optimizer, context, False, torch.device("cpu"))) for _ in range(80)
    ]
    assert losses[-1] < 0.7 * losses[0]


def test_mixed_precision_follows_full_precision(toy, device):
    """``train(amp='bf16')`` and ``train(amp='fp16')`` (with its gradient scaler, on the CPU
    too) run the steps under autocast: from the same weights and data their losses differ
    from full precision only by rounding."""
    toy.get_dataloader(16, test_batch_size=64)
    losses = {}
    modes = ("off", "bf16", "fp16")
    for amp in modes:
        torch.manual_seed(0)
        gears = GEARS(toy, device=str(device))
        gears.model_initialize(hidden_size=8)
        gears.train(epochs=2, amp=amp)
        losses[amp] = np.array([h["train_loss"] for h in gears.history])
    for amp in modes[1:]:
        assert not np.array_equal(losses["off"], losses[amp])  # mixed precision did run
        np.testing.assert_allclose(losses[amp], losses["off"], rtol=0.05)
    with pytest.raises(ValueError, match=r"train\(amp=...\) must be one of"):
        gears.train(epochs=1, amp="fp8")


def test_predict_return_types_and_unknown_genes(trained):
    gears, _ = trained
    genes = gears.pert_list[:2]
    as_dict = gears.predict([[genes[0]], genes])
    assert set(as_dict) == {genes[0], "_".join(genes)} and as_dict[genes[0]].shape == (gears.num_genes,)
    frame = gears.predict([[genes[0]], genes], return_type="dataframe")
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == gears.gene_list
    np.testing.assert_allclose(frame.loc[genes[0]].to_numpy(), as_dict[genes[0]], rtol=1e-6)
    adata = gears.predict([genes], return_type="anndata")
    assert adata.shape == (1, gears.num_genes) and list(adata.var["gene_name"]) == gears.gene_list
    with pytest.raises(
        ValueError, match=r"2 gene\(s\) not in the perturbation vocabulary \(GEARS.pert_list\): 'NOPE1', 'NOPE2'$"
    ):
        gears.predict([["NOPE2"], [genes[0], "NOPE1"]])


def test_prediction_is_the_mean_over_control_cells_of_the_model_output(trained):
    gears, _ = trained
    gene = gears.pert_list[3]
    prediction = gears.predict([[gene]], seed=5)[gene]
    controls = gears.pert_data.cells.control_cells()
    picked = controls[torch.randint(len(controls), (300,), generator=torch.Generator().manual_seed(5))]
    x = gears.pert_data.cells.expression[picked].to(gears.device)
    pert_idx = torch.tensor([[gears.node_map_pert[gene], -1]]).repeat(300, 1).to(gears.device)
    gears.best_model.eval()
    with torch.no_grad():
        expected = gears.best_model(x, pert_idx).mean(0).cpu().numpy()
    np.testing.assert_allclose(prediction, expected, rtol=1e-5, atol=1e-6)


def test_uncertainty_mode_trains_and_predicts(toy):
    toy.get_dataloader(16)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8, uncertainty=True)
    outcome = gears.train(epochs=1)
    assert np.isfinite(outcome["model"]["test_mse_de"])
    predictions, uncertainty = gears.predict([[gears.pert_list[0]]])
    assert set(uncertainty) == set(predictions) and uncertainty[gears.pert_list[0]] > 0


def test_save_and_load_round_trip(trained, tmp_path):
    gears, _ = trained
    gears.save_model(tmp_path / "model")
    config = pickle.loads((tmp_path / "model" / "config.pkl").read_bytes())
    assert set(config) == {
        "hidden_size",
        "num_go_gnn_layers",
        "num_gene_gnn_layers",
        "decoder_hidden_size",
        "num_similar_genes_go_graph",
        "num_similar_genes_co_express_graph",
        "coexpress_threshold",
        "uncertainty",
        "uncertainty_reg",
        "direction_lambda",
        "G_go",
        "G_go_weight",
        "G_coexpress",
        "G_coexpress_weight",
        "device",
        "num_genes",
        "num_perts",
        "no_perturb",
    }
    fresh = GEARS(gears.pert_data)
    fresh.load_pretrained(tmp_path / "model")
    gene = gears.pert_list[1]
    np.testing.assert_allclose(fresh.predict([[gene]])[gene], gears.predict([[gene]])[gene], rtol=1e-6)


def test_load_strips_module_prefix(trained, tmp_path):
    gears, _ = trained
    gears.save_model(tmp_path / "ddp")
    state = torch.load(tmp_path / "ddp" / "model.pt")
    torch.save({f"module.{k}": v for k, v in state.items()}, tmp_path / "ddp" / "model.pt")
    fresh = GEARS(gears.pert_data)
    fresh.load_pretrained(tmp_path / "ddp")
    assert all(torch.equal(a, b.cpu()) for a, b in zip(fresh.best_model.state_dict().values(), state.values()))


def test_vocabulary_mismatch_is_refused(trained, tmp_path):
    gears, _ = trained
    gears.save_model(tmp_path / "m")
    vocabulary = tmp_path / "m" / "vocabulary.json"
    vocabulary.write_text(vocabulary.read_text().replace('"G1"', '"OTHER"'))
    with pytest.raises(ValueError, match=r"another gene vocabulary.*differing: \['G1', 'OTHER'\]"):
        GEARS(gears.pert_data).load_pretrained(tmp_path / "m")
    vocabulary.unlink()  # a published-format checkpoint: sizes are checked
    config = pickle.loads((tmp_path / "m" / "config.pkl").read_bytes())
    config["num_genes"] += 1
    (tmp_path / "m" / "config.pkl").write_bytes(pickle.dumps(config))
    with pytest.raises(ValueError, match=r"has 41 genes .* the data has 40"):
        GEARS(gears.pert_data).load_pretrained(tmp_path / "m")


def test_published_gears_loads_our_checkpoint(trained, tmp_path):
    module = import_reference("gears.model")
    gears, _ = trained
    gears.save_model(tmp_path / "m")
    config = pickle.loads((tmp_path / "m" / "config.pkl").read_bytes())
    reference = module.GEARS_Model(config)
    reference.load_state_dict(torch.load(tmp_path / "m" / "model.pt"), strict=True)


def test_plot_works_for_every_test_condition(trained, tmp_path):
    """Each test condition's picture, its genes named as var names them: the names of the
    condition's top non-dropout DE genes (``uns`` lists them by var's index), read by label
    here and by position in the plot, without pandas's warning that integer keys of a Series
    become labels (pandas 3)."""
    gears, _ = trained
    pert_data = gears.pert_data
    name_of = dict(zip(pert_data.adata.obs["condition"], pert_data.adata.obs["condition_name"]))
    for condition in pert_data.set2conditions["test"]:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*treating keys as positions", category=FutureWarning)
            figure = gears.plot_perturbation(condition, save_file=tmp_path / f"{condition}.png")
        de_genes = pert_data.adata.uns["top_non_dropout_de_20"][name_of[condition]]
        expected = list(pert_data.var.loc[de_genes, "gene_name"])
        assert [label.get_text() for label in figure.axes[0].get_xticklabels()] == expected
        assert figure.axes[0].get_title() == condition
        assert (tmp_path / f"{condition}.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="not a perturbation condition"):
        gears.plot_perturbation("G99+ctrl")


def test_gi_predict_scores(trained):
    gears, _ = trained
    scores = gears.GI_predict(["G0", "G1"])
    assert list(scores) == [
        "ts",
        "c1",
        "c2",
        "mag",
        "dcor",
        "dcor_singles",
        "dcor_first",
        "dcor_second",
        "corr_fit",
        "dominance",
        "eq_contr",
    ]  # the published keys, in its order
    assert all(isinstance(v, float) for k, v in scores.items() if k != "ts")
    np.testing.assert_array_equal(scores["ts"].coef_, [scores["c1"], scores["c2"]])
    np.testing.assert_allclose(scores["ts"].predict([[1.0, 2.0]]), [scores["c1"] + 2 * scores["c2"]])


def test_errors_before_setup(data_root):
    import toy_data

    from gears_ddp import PertData

    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", toy_data.make_raw())
    with pytest.raises(ValueError, match="prepare_split.*get_dataloader"):
        GEARS(pert_data)
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(8)
    with pytest.raises(RuntimeError, match="call model_initialize"):
        GEARS(pert_data).predict([["G0"]])


def test_train_of_no_epoch_scores_the_model_as_it_is(toy, tmp_path):
    """The published no-perturbation baseline: model_initialize(no_perturb=True), train(epochs=0):
    no optimiser step, then the test scores and the run report of the model as it is. A
    no_perturb model predicts its control input whatever its weights; any other model keeps
    refusing to predict with its random initial weights."""
    toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8, no_perturb=True)
    before = {k: v.clone() for k, v in gears.model.state_dict().items()}
    report = gears.train(epochs=0, save_path=tmp_path / "run")
    assert report["best_epoch"] == 0 and report["history"] == [] and np.isfinite(report["model"]["test_mse_de"])
    assert all(torch.equal(before[k], v) for k, v in gears.best_model.state_dict().items())
    assert "No epoch was trained" in (tmp_path / "run" / "report.html").read_text()
    control = gears.pert_data.cells.control_mean().numpy()
    np.testing.assert_allclose(gears.predict([["G0"]], cells_per_perturbation=20000)["G0"], control, atol=0.05)

    gears.model_initialize(hidden_size=8)
    gears.train(epochs=0, save_path=tmp_path / "random")
    with pytest.raises(RuntimeError, match="random initial weights"):
        gears.predict([["G0"]])
    loaded = GEARS(toy)
    loaded.load_pretrained(tmp_path / "random")  # saved as they were: still refused, loaded again
    with pytest.raises(RuntimeError, match="random initial weights"):
        loaded.predict([["G0"]])
    loaded.load_pretrained(tmp_path / "run")  # the no_perturb model predicts control, loaded again too
    np.testing.assert_allclose(loaded.predict([["G0"]], cells_per_perturbation=20000)["G0"], control, atol=0.05)
    with pytest.raises(ValueError, match=r"train\(epochs=...\) must be a non-negative integer"):
        gears.train(epochs=-1)


def test_a_loader_option_given_to_one_train_call_is_that_calls_alone(toy):
    """train(batch_size=8) trains on loaders of batch 8, built for that call: the next call,
    and another GEARS on the same data, train on the loaders get_dataloader built."""
    built = toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, batch_size=8)
    assert gears.dataloader is not built and toy.dataloader is built and toy.loader_options["batch_size"] == 16
    first_steps = len(gears.dataloader["train_loader"])
    gears.train(epochs=1)
    assert gears.dataloader is built and len(built["train_loader"]) < first_steps  # batches of 16 again
    assert GEARS(toy).dataloader is built
