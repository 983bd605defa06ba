"""The published GEARS's own user code, run against gears_ddp as written: the README's block
and the tutorials of snap-stanford/GEARS (``demo/``), and the paper's scripts of
yhr91/GEARS_misc (``paper/``) that use the package. Each block is copied as the published
code writes it, with ``from gears ...`` renamed ``from gears_ddp ...``, the toy dataset (a
local folder) instead of a download, the CPU instead of ``cuda:N``, Weights & Biases off and
one epoch; the toy's genes stand for the paper's (``G0``, ``G1`` for ``CBL``, ``CNN1``...).
Lines that only draw or print are left out; each block's results are checked."""

import tarfile
from multiprocessing import Pool
from zipfile import ZipFile

import numpy as np
import pandas as pd
import pytest
import scanpy as sc
import scipy.sparse as sp
import torch
import toy_data
from scipy.stats import pearsonr

PUBLISHED_GI_KEYS = [
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
]
N_GENES = len(toy_data.GENES)


@pytest.fixture
def here(data_folder, tmp_path, monkeypatch):
    """A working folder whose ./data holds the GO files, as after the published download."""
    toy_data.write_go_files(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    return tmp_path


def saved_model(pert_data, folder):
    """A model of ``pert_data`` trained one epoch and saved in ``folder``: what a script that
    loads one found there."""
    from gears_ddp import GEARS

    trained = GEARS(pert_data, device="cpu")
    trained.model_initialize(hidden_size=64)
    trained.train(epochs=1)
    trained.save_model(folder)


def test_readme_block(data_folder, here):
    from gears_ddp import GEARS, PertData

    # get data
    pert_data = PertData("./data")
    # load dataset in paper: norman, adamson, dixit.
    pert_data.load(data_path=str(data_folder / "toy"))
    # specify data split
    pert_data.prepare_split(split="simulation", seed=1)
    # get dataloader with batch size
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)

    # set up and train a model
    gears_model = GEARS(pert_data, device="cpu")
    gears_model.model_initialize(hidden_size=64)
    report = gears_model.train(epochs=1)

    # save/load model
    gears_model.save_model("gears")
    gears_model.load_pretrained("gears")

    # predict
    predictions = gears_model.predict([["G0", "G1"], ["G2"]])
    scores = gears_model.GI_predict(["G0", "G1"], GI_genes_file=None)

    assert np.isfinite(report["model"]["test_mse_de"]) and (here / "gears" / "model.pt").exists()
    assert list(predictions) == ["G0_G1", "G2"] and predictions["G2"].shape == (N_GENES,)
    assert list(scores) == PUBLISHED_GI_KEYS


def test_model_tutorial(data_folder, here):
    from gears_ddp import GEARS, PertData

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="simulation", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)

    gears_model = GEARS(pert_data, device="cpu", weight_bias_track=False, proj_name="pertnet", exp_name="pertnet")
    gears_model.model_initialize(hidden_size=64)
    tunable = gears_model.tunable_parameters()
    gears_model.train(epochs=1, lr=1e-3)
    gears_model.save_model("test_model")
    gears_model.load_pretrained("test_model")
    predictions = gears_model.predict([["G3"], ["G3", "G4"]])
    genes = gears_model.gene_list[:5]

    assert {"hidden_size", "uncertainty", "direction_lambda"} <= set(tunable)
    assert list(predictions) == ["G3", "G3_G4"] and genes == toy_data.GENES[:5]


def test_plot_top20_de_tutorial(data_folder, here):
    from gears_ddp import GEARS, PertData

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="simulation", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)
    saved_model(pert_data, "gears_seed1_norman")  # the model tutorial's, which this one reads

    gears_model = GEARS(pert_data, device="cpu")
    gears_model.load_pretrained("gears_seed1_norman")
    figure = gears_model.plot_perturbation("G0+G1")
    gears_model.plot_perturbation("G0+G1", save_file="a.pdf")  # as paper/Fig2g.ipynb saves it

    assert figure.axes[0].get_title() == "G0+G1"
    assert (here / "a.pdf").read_bytes()[:4] == b"%PDF"


def test_uncertainty_tutorial(data_folder, here):
    from gears_ddp import PertData
    from gears_ddp.inference import compute_metrics, deeper_analysis, evaluate

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="simulation", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)

    from gears_ddp import GEARS

    gears_model = GEARS(pert_data, device="cpu")

    ## train a uncertainty-aware model, specify uncertainty to True
    gears_model.model_initialize(uncertainty=True)
    gears_model.train(epochs=1)
    gears_model.save_model("gears_unc")

    ## load a pretrained uncertainty model
    gears_model.load_pretrained("gears_unc")

    test_res = evaluate(
        gears_model.dataloader["test_loader"], gears_model.model, gears_model.config["uncertainty"], gears_model.device
    )
    test_metrics, test_pert_res = compute_metrics(test_res)
    out = deeper_analysis(gears_model.adata, test_res)

    pert2unc = (
        pd.DataFrame(tuple(zip(test_res["pert_cat"], np.mean(test_res["logvar"], axis=1)))).groupby(0).agg("mean")
    )
    pert2unc = dict(zip(pert2unc.index.values, pert2unc.values))

    metric = "pearson_delta"
    stats_summary = [np.exp(-pert2unc[i][0]) for i in test_pert_res.keys() if metric in out[i]]
    metric_summary = [out[i][metric] for i in test_pert_res.keys() if metric in out[i]]
    correlation = pearsonr(stats_summary, metric_summary)

    test_conditions = pert_data.set2conditions["test"]
    n_cells = sum(len(batch) for batch in gears_model.dataloader["test_loader"])
    assert {"pert_cat", "pred", "truth", "pred_de", "truth_de", "logvar"} == set(test_res)
    assert test_res["logvar"].shape == test_res["pred"].shape == (n_cells, N_GENES)
    assert test_res["pred_de"].shape == (n_cells, 20)
    assert set(test_metrics) == {"mse", "pearson", "mse_de", "pearson_de"} and set(test_pert_res) == set(
        test_conditions
    )
    assert len(stats_summary) == len(metric_summary) == len(test_conditions) and -1 <= correlation[0] <= 1
    predictions, uncertainty = gears_model.predict([["G0"]])  # the tuple of uncertainty mode
    assert set(predictions) == set(uncertainty) == {"G0"} and uncertainty["G0"] > 0


def test_data_tutorial_with_ones_own_raw_counts(here):
    raw = toy_data.make_raw()
    raw.X = sp.csr_matrix(np.rint(np.expm1(raw.X.toarray()) / 20).astype(np.float32))  # counts, as a screen has them
    raw.write_h5ad("sample_adata.h5ad")

    adata = sc.read_h5ad("sample_adata.h5ad")
    sc.pp.normalize_total(adata)
    sc.pp.log1p(adata)
    sc.pp.highly_variable_genes(adata, n_top_genes=5000, subset=True)

    from gears_ddp import PertData

    pert_data = PertData("./data")  # specific saved folder
    pert_data.new_data_process(dataset_name="dixit", adata=adata)  # specific dataset name and adata object
    pert_data.load(data_path="./data/dixit")  # load the processed data, the path is saved folder + dataset_name
    pert_data.prepare_split(split="simulation", seed=1)  # get data split with seed
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)  # prepare data loader

    assert (here / "data" / "dixit" / "perturb_processed.h5ad").exists()
    assert set(pert_data.set2conditions) == {"train", "val", "test"} and len(pert_data.dataloader["train_loader"]) > 0


def test_no_perturbation_baseline_of_fig2_train(data_folder, here):
    """paper/fig2_train.py --model no_perturb: the test scores of a model that predicts the
    control cell, untrained."""
    from gears_ddp import GEARS, PertData

    seed, no_perturb, epoch = 1, True, 0

    pert_data = PertData("./data", default_pert_graph=False)
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="simulation", seed=seed)  # get data split with seed
    pert_data.get_dataloader(batch_size=32, test_batch_size=32)

    gears_model = GEARS(
        pert_data, device="cpu", weight_bias_track=False, proj_name="toy", exp_name="no_perturb" + "_seed" + str(seed)
    )

    gears_model.model_initialize(hidden_size=64, no_perturb=no_perturb)
    report = gears_model.train(epochs=epoch)

    assert report["history"] == [] and np.isfinite(report["model"]["test_mse_de"])
    assert {"no_change", "mean_effect", "additive", "linear"} == set(report["baselines"])


gears_model_cpu = None  # paper/predicting_GIs.py's module-level model, read by its mapper in the pool's workers


def mapper(c):
    return gears_model_cpu.GI_predict(c)


def Map(F, x, workers):
    """
    wrapper for map()
    Spawn workers for parallel processing

    """
    with Pool(workers) as pool:
        ret = list(pool.imap(F, x))
    return ret


def test_predicting_gis_on_a_cpu_model_from_saved_predictions(data_folder, here):
    """paper/predicting_GIs.py: predict every single and pair once, hand saved_pred to a CPU
    GEARS that never loads weights, score the pairs in a pool of processes."""
    global gears_model_cpu
    from gears_ddp import GEARS, PertData

    model_name = "gears_misc_umi_only_no_test"

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="no_test", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)
    saved_model(pert_data, "./model_ckpt/" + model_name)

    gears_model = GEARS(pert_data, device="cpu", weight_bias_track=False, proj_name="gears", exp_name=model_name)
    gears_model.load_pretrained("./model_ckpt/" + model_name)

    def remove_duplicates_list(list_):
        import itertools

        list_.sort()
        return list(k for k, _ in itertools.groupby(list_))

    norman_adata = sc.read_h5ad(str(data_folder / "toy" / "perturb_processed.h5ad"))
    genes_of_interest = set(
        [c.strip("+ctrl") for c in norman_adata.obs["condition"] if ("ctrl+" in c) or ("+ctrl" in c)]
    )
    genes_of_interest = [g for g in genes_of_interest if g in list(pert_data.pert_names)]

    all_possible_combos = []
    for g1 in genes_of_interest:
        for g2 in genes_of_interest:
            if g1 == g2:
                continue
            all_possible_combos.append(sorted([g1, g2]))
    all_possible_combos = remove_duplicates_list(all_possible_combos)[:6]  # the first 6 of the 45 pairs

    # Predict all singles
    for c in genes_of_interest:
        gears_model.predict([[c]])
    # Predict all combos
    for c in all_possible_combos:
        gears_model.predict([c])

    # Then use a CPU-based model for computing GI scores parallely
    np.save(model_name + "_all_preds", gears_model.saved_pred)
    gears_model_cpu = GEARS(pert_data, device="cpu")
    gears_model_cpu.saved_pred = gears_model.saved_pred

    all_GIs = Map(mapper, all_possible_combos, workers=2)
    all_GIs = {str(key): val for key, val in zip(all_possible_combos, all_GIs)}
    np.save(model_name + "_allGI", all_GIs)

    assert len(genes_of_interest) == 10 and len(all_GIs) == 6
    assert all(list(scores) == PUBLISHED_GI_KEYS for scores in all_GIs.values())
    first = all_possible_combos[0]
    assert all_GIs[str(first)]["mag"] == pytest.approx(gears_model_cpu.GI_predict(first)["mag"])
    assert (here / (model_name + "_allGI.npy")).exists()


def test_observed_interactions_of_ext_fig_7(data_folder, here):
    """paper/Ext_Fig_7.ipynb: a model with random weights, the true mean expression of every
    observed condition written into saved_pred, GI_predict of each observed combination."""
    from gears_ddp import GEARS, PertData

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="no_test", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)

    gears_model = GEARS(
        pert_data, device="cpu", weight_bias_track=False, proj_name="experiment_GI", exp_name="experiment_GI"
    )
    gears_model.model_initialize()

    exp_df = gears_model.adata.to_df()
    exp_df["condition"] = gears_model.adata.obs["condition"]
    mean_exp_df = exp_df.groupby("condition", observed=True).mean()

    for pert_id, expression in mean_exp_df.iterrows():
        if "ctrl" in pert_id:
            pert_name = pert_id.strip("+ctrl")
        else:
            pert_name = "_".join(pert_id.split("+"))
        gears_model.saved_pred[pert_name] = expression.values

    combo_names = [n for n in list(gears_model.saved_pred.keys()) if "_" in n]

    true_mags = {}
    true_corr_fit = {}
    for combo in combo_names:
        res = gears_model.GI_predict(combo.split("_"))
        true_mags[combo] = res["mag"]
        true_corr_fit[combo] = res["corr_fit"]

    observed = gears_model.observed_interactions()  # the same, in one call
    assert sorted(true_mags) == sorted(p.replace("+", "_") for p in observed["pair"])
    for row in observed.itertuples():
        assert true_mags[f"{row.first_gene}_{row.second_gene}"] == pytest.approx(row.mag, abs=1e-3)


def test_inference_tutorial_norman(data_folder, here):
    """demo/tutorial_inference_Norman.ipynb: the dataset and model archives, the genes file
    found locally (dataverse_download keeps a local copy), GI_predict on the listed genes."""
    from gears_ddp import GEARS, PertData

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="no_test", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)
    saved_model(pert_data, "model_ckpt")
    with tarfile.open("norman_umi_go.tar.gz", "w:gz") as tar:  # the archives the tutorial downloads
        tar.add(str(data_folder / "toy" / "perturb_processed.h5ad"), arcname="norman_umi_go/perturb_processed.h5ad")
    with ZipFile("model.zip", "w") as archive:
        for name in ("config.pkl", "model.pt"):
            archive.write(f"model_ckpt/{name}")
    np.save("genes_with_hi_mean.npy", np.array(toy_data.GENES[:30], dtype=object), allow_pickle=True)
    toy_data.write_go_files("./")

    from gears_ddp.utils import dataverse_download

    ## Download dataloader from dataverse
    dataverse_download("https://dataverse.harvard.edu/api/access/datafile/6979957", "norman_umi_go.tar.gz")
    ## Extract and set up dataloader directory
    with tarfile.open("norman_umi_go.tar.gz", "r:gz") as tar:
        tar.extractall()
    ## Download model from dataverse
    dataverse_download("https://dataverse.harvard.edu/api/access/datafile/10457098", "model.zip")
    ## Extract and set up model directory
    with ZipFile(("model.zip"), "r") as zip:
        zip.extractall(path="./")

    data_path = "./"
    data_name = "norman_umi_go"
    model_name = "gears_misc_umi_no_test"
    pert_data = PertData(data_path)
    pert_data.load(data_path=data_path + data_name)
    pert_data.prepare_split(split="no_test", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=128)
    gears_model = GEARS(pert_data, device="cpu", weight_bias_track=False, proj_name="gears", exp_name=model_name)
    gears_model.load_pretrained("./model_ckpt")

    predictions = gears_model.predict([["G1", "G0"]])
    dataverse_download("https://dataverse.harvard.edu/api/access/datafile/6979958", "genes_with_hi_mean.npy")
    scores = gears_model.GI_predict(["G1", "G0"], GI_genes_file="./genes_with_hi_mean.npy")

    assert list(predictions) == ["G1_G0"] and list(scores) == PUBLISHED_GI_KEYS
    assert scores["mag"] != pytest.approx(gears_model.GI_predict(["G1", "G0"])["mag"])  # 30 of the 40 genes


def test_paper_scripts_other_calls(data_folder, here):
    """paper/CellOracle_evaluation_wandb.ipynb (a loaded model switched to no_perturb, its
    predictions read from saved_pred) and paper/Ext_Fig_2.ipynb (each query's predicted cells,
    all_samples=True)."""
    from gears_ddp import GEARS, PertData

    pert_data = PertData("./data")
    pert_data.load(data_path=str(data_folder / "toy"))
    pert_data.prepare_split(split="simulation", seed=1)
    pert_data.get_dataloader(batch_size=128, test_batch_size=128)
    saved_model(pert_data, "norman_gears_run1")

    gears_model = GEARS(pert_data, device="cpu", weight_bias_track=False, proj_name="gears", exp_name="gears")
    gears_model.load_pretrained("norman_gears_run1")
    gears_model.no_perturb = True
    gears_model.model.no_perturb = True
    for k in ["G0+ctrl", "G0+G1"]:
        pert = [p for p in k.split("+") if p != "ctrl"]
        gears_model.predict([pert])
    gears_pred = pd.DataFrame(gears_model.saved_pred).T
    assert list(gears_pred.index) == ["G0", "G0_G1"]
    np.testing.assert_allclose(gears_pred.loc["G0"], gears_pred.loc["G0_G1"])  # no perturbation: control

    gears_model.model.no_perturb = False
    genes = ["G0", "G1"]
    preds = gears_model.predict([genes], all_samples=True)["_".join(genes)]
    assert preds.shape == (300, N_GENES)
    np.testing.assert_allclose(preds.mean(0), gears_model.predict([genes])["G0_G1"], rtol=1e-5)
    with pytest.raises(ImportError, match="GEARS.observed_interactions"):
        from gears_ddp.inference import GIs  # noqa: F401
