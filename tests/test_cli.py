"""The gears-ddp command: configuration files, the run folder, evaluate, predict, process."""

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys

import anndata
import numpy as np
import pandas as pd
import pytest
import toy_data
import yaml
from matplotlib.container import BarContainer
from test_bad_input import _refused_in_one_line
from test_launch import _clean_environment
from verdict_reports import report_from_values

from gears_ddp.cli import demo, main
from gears_ddp.cli.demo import DEMO_DATA, DEMO_DATA_PATHS, DEMO_FINDINGS
from gears_ddp.cli.train import _print_summary
from gears_ddp.configuration.run_options import RunConfigError, apply_override, read_run_config
from gears_ddp.data import io
from gears_ddp.data.go_files import read_annotation
from gears_ddp.report.plots import figure_test_metrics
from gears_ddp.report.verdicts import compare, verdict_records
from gears_ddp.runtime.threads import cpu_threads

SMALL_ARGS = {"epochs": 2, "batch_size": 16, "model_config": {"hidden_size": 8}}


def _write_config(tmp_path, data_folder, save_path, **args):
    config = {
        "pert_data_path": str(data_folder),
        "dataset_name": "toy",
        "split_config": {"split": "simulation", "seed": 1},
        "args": {**SMALL_ARGS, "save_path": str(save_path), **args},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ----------------------------------------------------------------------------- configuration


def test_overrides_are_read_as_yaml_values_at_any_depth():
    config = {"args": {"epochs": 3}}
    for assignment in (
        "args.epochs=5",
        "args.amp=bf16",
        "args.sync_batchnorm=true",
        "gpu_ids=[0, 1]",
        "args.model_config.hidden_size=32",
        "args.lr=2e-3",
    ):
        apply_override(config, assignment)
    assert config == {
        "args": {"epochs": 5, "amp": "bf16", "sync_batchnorm": True, "lr": 2e-3, "model_config": {"hidden_size": 32}},
        "gpu_ids": [0, 1],
    }


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("agrs.epochs=3", "unknown key 'agrs'"),
        ("args.epochs", "key=value"),
        ("args.epochs.deeper=3", "args.epochs is not a mapping"),
    ],
)
def test_a_bad_override_is_named(assignment, message):
    with pytest.raises(RunConfigError, match=message):
        apply_override({"args": {"epochs": 3}}, assignment)


def test_overwrite_on_the_command_line_sets_aside_the_run_files_resume(tmp_path, data_folder, monkeypatch, capsys):
    import gears_ddp.cli.train as train_command

    started = []
    monkeypatch.setattr(train_command, "run_training", lambda run: started.append(run) or 0)
    config = _write_config(tmp_path, data_folder, tmp_path / "run", resume_from="auto")  # as a run's config.yaml
    assert main(["train", "--config", str(config), "--overwrite"]) == 0
    assert started[0].args.resume_from is None and started[0].args.overwrite_save_path is True
    both = ["train", "--config", str(config), "--overwrite", "--set", "args.resume_from=auto"]
    assert main(both) == 2  # both asked for on the command line: refused, naming both
    assert "give one of them" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ("pert_data_path: d\ndataset_name: toy\nargs: {epoch: 3}\n", r"run.yaml: unknown args key\(s\) \['epoch'\]"),
        ("pert_data_path: d\ndataset_name: toy\nargs: {epochs: x}\n", r"run.yaml: args\['epochs'\] must be a positive"),
        ("pert_data_path: d\ndataset_name: toy\nargs: {amp: off}\n", r"got False \(YAML reads an unquoted off"),
        ("pert_data_path: d\ndataset_name: toy\nsplit: simulation\n", r"run.yaml: unknown key\(s\) \['split'\]"),
        (
            "pert_data_path: d\ndataset_name: toy\nsplit_config: {splitt: simulation}\n",
            r"run.yaml: unknown split_config",
        ),
        ("pert_data_path: d\nargs: {}\n", "run.yaml: dataset_name must be given"),
        ("pert_data_path: d\ndataset_name: toy\nargs: {model_config: {hiden_size: 8}}\n", "hiden_size"),
        ("pert_data_path: d\ndataset_name: toy\nn_gpus: 0\n", "run.yaml: n_gpus must be an integer >= 1"),
        ("pert_data_path: d\ndataset_name: toy\ngpu_ids: 0\n", r"run.yaml: gpu_ids must be a list of GPU numbers"),
        (
            "pert_data_path: d\ndataset_name: toy\ngpu_ids: [1, 1]\n",
            r"run.yaml: gpu_ids \[1, 1\] lists \[1\] more than once",
        ),
        (
            "pert_data_path: d\ndataset_name: toy\nn_gpus: 3\ngpu_ids: [0, 1]\n",
            "run.yaml: n_gpus=3 disagrees with gpu_ids",
        ),
        ("- a list\n", "must hold a mapping"),
        ("args: {epochs: [}\n", r"run.yaml is not valid YAML: .+ at line 1, column \d+$"),  # one line
    ],
)
def test_a_bad_file_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(RunConfigError, match=message):
        read_run_config(path)


def test_the_resolved_config_fills_every_default_and_reads_back_unchanged(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("pert_data_path: ./data\ndataset_name: toy\nargs: {epochs: 3}\n")
    config = read_run_config(path, ["args.model_config.hidden_size=16"])
    assert config["args"]["epochs"] == 3 and config["args"]["batch_size"] == 32
    assert config["args"]["model_config"]["hidden_size"] == 16
    assert config["args"]["model_config"]["num_go_gnn_layers"] == 1
    assert config["split_config"]["split"] == "simulation" and config["split_config"]["seed"] == 1
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(config))
    assert read_run_config(again) == config


def test_a_bad_command_line_exits_with_status_2_and_a_message(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("pert_data_path: ./data\ndataset_name: toy\nargs: {epochs: 0}\n")
    assert main(["train", "--config", str(path)]) == 2
    assert "run.yaml: args['epochs'] must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the configuration file" in capsys.readouterr().err
    assert (
        main(
            [
                "predict",
                "--run",
                str(tmp_path),
                "--perturbations",
                "G0",
                "--baseline",
                "linear",
                "--out",
                str(tmp_path / "p.h5ad"),
            ]
        )
        == 2
    )
    assert "--baseline writes a baseline's cells of a split: give --split too" in capsys.readouterr().err
    assert (
        main(
            [
                "predict",
                "--run",
                str(tmp_path),
                "--perturbations",
                "G0",
                "--format",
                "anndata",
                "--out",
                str(tmp_path / "p.csv"),
            ]
        )
        == 2
    )
    assert "--format anndata writes an AnnData (HDF5), but --out" in capsys.readouterr().err


def test_the_demo_checks_its_options_before_writing_any_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--epochs", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gears-ddp demo: its options: args['epochs'] must be a positive integer, got 0"
    )
    assert main(["demo", "--set", "args.lr=-1"]) == 2
    assert "args['lr'] must be a positive number" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_train_help_lists_every_option_with_its_default():
    result = subprocess.run(
        [sys.executable, "-m", "gears_ddp", "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    for line in (
        "args.epochs [20]",
        "args.batch_size [32]",
        "args.save_path ['./runs/gears_ddp']",
        "args.model_config.hidden_size [64]",
        "split_config.seed [1]",
    ):
        assert line in result.stdout


# ----------------------------------------------------------------------------- one module per command

COMMAND_LINES = {
    "train": ["--config", "run.yaml"],
    "demo": [],
    "sweep": ["--config", "run.yaml", "--space", "space.yaml", "--trials", "3"],
    "evaluate": ["--run", "r"],
    "predict": ["--run", "r", "--split", "test", "--out", "p.h5ad"],
    "screen": ["--run", "r", "--genes", "A", "B", "--out", "s.csv"],
    "interactions": ["--run", "r", "--out", "i.csv"],
    "process": ["--adata", "a.h5ad", "--data-path", "d", "--name", "n"],
    "check": ["--data-path", "d"],
}


def test_each_command_module_adds_its_own_command_and_main_runs_it(monkeypatch):
    """Each module of gears_ddp/cli adds exactly one subcommand, its NAME; the assembled
    parser lists all nine in the order --help shows; main hands each command's options to
    that module's run."""
    import argparse

    from gears_ddp.cli.dispatch import COMMANDS, build_parser

    for module in COMMANDS:
        subparsers = argparse.ArgumentParser().add_subparsers(dest="command")
        added = module.add_parser(subparsers)
        assert list(subparsers.choices) == [module.NAME] and subparsers.choices[module.NAME] is added
    assembled = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    assert list(assembled.choices) == list(COMMAND_LINES)
    ran = []
    for module in COMMANDS:
        monkeypatch.setattr(module, "run", lambda options, name=module.NAME: ran.append((name, options.command)) or 0)
    for name, arguments in COMMAND_LINES.items():
        assert main([name, *arguments]) == 0
    assert ran == [(name, name) for name in COMMAND_LINES]


# ----------------------------------------------------------------------------- verdicts


def test_the_summary_says_whether_the_model_learned_then_the_note(capsys):
    steady = [0.5, 0.51, 0.49, 0.5, 0.52, 0.48]
    values = {"mse": steady, "mse_de": steady, "pearson_delta": steady}
    report = report_from_values(
        values, {"no_change": {**values, "mse": [v + 0.1 for v in steady]}, "mean_effect": values}
    )
    report.update(
        best_epoch=2,
        world_size=2,
        history=[{"train_loss": 2.0}, {"train_loss": 1.0}],
        verdicts=verdict_records(compare(report)),
    )
    _print_summary(report, note=DEMO_FINDINGS["real"])
    out = capsys.readouterr().out
    assert (
        out.index("Training loss fell")
        < out.index("mse 0.5 against 0.6: beats (+0.1 [")
        < out.index(DEMO_FINDINGS["real"])
    )
    assert "overall: GEARS beats" not in out and not any(line.startswith("metric ") for line in out.splitlines()), (
        out
    )  # the log above shows the test table; the summary does not again


# ----------------------------------------------------------------------------- the demo


@pytest.mark.parametrize("data, dataset", [("real", "papalexi2021"), ("synthetic", "synthetic")])
def test_the_demo_trains_on_the_data_it_names_in_its_own_folder(data, dataset, tmp_path, monkeypatch, capsys):
    """Each choice writes its dataset (processed once) under its default folder and trains on
    it with the demo's split, printing what the data is and closing with its own finding."""
    trained = []
    monkeypatch.setattr(demo, "run_training", lambda run, note: trained.append((run, note)) or 0)
    monkeypatch.chdir(tmp_path)
    arguments = ["demo"] + (["--data", data] if data != "real" else [])
    assert main(arguments + ["--epochs", "3", "--set", "args.seed=5"]) == 0
    run, note = trained[0]
    assert (run.pert_data_path, run.dataset_name) == (DEMO_DATA_PATHS[data], dataset)
    assert run.args.save_path == {"real": "./runs/demo", "synthetic": "./runs/demo-synthetic"}[data]  # one each
    assert (tmp_path / DEMO_DATA_PATHS[data] / dataset / "perturb_processed.h5ad").is_file()
    assert run.split.options["split"] == "simulation" and run.split.options["seed"] == 1
    assert run.args.epochs == 3 and run.args.seed == 5 and note == DEMO_FINDINGS[data]
    assert capsys.readouterr().out.startswith(f"Data: {DEMO_DATA[data]}, in ")


@pytest.mark.distributed
@pytest.mark.slow
def test_the_demo_trains_on_the_packaged_real_screen_with_two_processes(tmp_path, capsys):
    data, save = tmp_path / "data", tmp_path / "run"
    settings = ["--set", "args.model_config.hidden_size=8", "--set", "args.batch_size=128"]
    assert main(["demo", "--data-path", str(data), "--save-path", str(save), "--epochs", "2", *settings]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Data: {DEMO_DATA['real']}, in {data / 'papalexi2021'}.")
    assert "Training loss" in out and "Against predicting no change: mse " in out and DEMO_FINDINGS["real"] in out
    report = json.loads((save / "report.json").read_text())
    assert report["world_size"] == 2 and len(report["history"]) == 2
    assert yaml.safe_load((save / "config.yaml").read_text())["dataset_name"] == "papalexi2021"
    page = (save / "report.html").read_text()
    assert "Did the model learn?" in page
    # single genes only: the one subgroup is every test condition, and additive is the mean effect; each said once
    assert "Single genes not seen in training</th>" not in page
    assert "All test conditions (single genes not seen in training)</th>" in page
    assert "<th>mean_effect = additive<br>difference [95% interval] won</th>" in page
    assert "mean_effect and additive predicted the same" in page
    # every headline verdict has its interval over the 6 test knockouts, drawn in the forest plot
    overall = [record for record in report["verdicts"] if record["subgroup"] is None]
    assert len(overall) == 7 and 'src="plots/differences_all.png"' in page
    for record in overall:
        for name, compared in record["baselines"].items():
            assert compared["n"] == 6 or compared["verdict"] == "n/a", (record["metric"], name)
            if compared["verdict"] != "n/a":
                assert compared["low"] <= compared["difference"] <= compared["high"]
    assert set(report["prediction_spread"]) == {"GEARS", "no_change", "mean_effect", "additive", "linear"}
    assert report["prediction_spread"]["no_change"] < 1e-12 < report["prediction_spread"]["GEARS"]
    pearson = figure_test_metrics(report["model"], report["baselines"]).axes[0]  # the picture of plots/test_metrics.png
    bars = {bars.get_label(): len(bars) for bars in pearson.containers if isinstance(bars, BarContainer)}
    assert bars == {"GEARS": 1, "no_change": 0, "mean_effect = additive": 1, "linear": 1}
    assert [text.get_text() for text in pearson.texts].count("n/a") == 1  # no change's pearson_delta, as the table


# ----------------------------------------------------------------------------- training runs


@pytest.mark.distributed
def test_train_with_two_cpu_processes_writes_the_run_folder(tmp_path, data_folder, capsys):
    save = tmp_path / "run"
    config = _write_config(tmp_path, data_folder, save, cpu_processes=2)
    assert main(["train", "--config", str(config), "--set", "args.epochs=3"]) == 0
    out, log = capsys.readouterr()
    assert log.count("overall: GEARS beats every baseline on") == 1 and "verdict" in log  # the test table, once
    assert "GEARS beats every baseline on" not in out and "report.html" in out
    assert (
        f"The intervals above cover the test perturbations of one seed; for intervals that cover seeds too: "
        f"gears-ddp train --config {save / 'config.yaml'} --seeds 1 2 3 4 5 --set "
        f"args.save_path={save}-replicates"
    ) in out
    assert "Training loss" in out and "Against predicting no change: mse " in out
    assert not any(finding in out for finding in DEMO_FINDINGS.values())
    report = json.loads((save / "report.json").read_text())
    assert report["world_size"] == 2 and len(report["history"]) == 3
    with open(save / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert [float(r["val_mse_de"]) for r in rows] == pytest.approx([h["val_mse_de"] for h in report["history"]])
    log = (save / "train.log").read_text()
    assert "epoch 3/3" in log and "rank 1" not in log
    resolved = yaml.safe_load((save / "config.yaml").read_text())
    assert resolved["args"]["epochs"] == 3 and resolved["args"]["cpu_processes"] == 2
    # and the threads each rank had, which the order of a CPU's sums follows
    assert resolved["args"]["cpu_threads"] == cpu_threads(2)
    page = (save / "report.html").read_text()
    for picture in ("plots/training_curves.png", "plots/test_metrics.png", "plots/predictions.png"):
        assert (save / picture).stat().st_size > 10_000
        assert picture in page
    # the run folder's config.yaml repeats the run, and evaluate scores the saved model as training did
    assert main(["evaluate", "--run", str(save), "--out", str(tmp_path / "scores.json")]) == 0
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["model"]["test_pearson_delta"] == pytest.approx(report["model"]["test_pearson_delta"], abs=1e-6)
    for name in ("additive", "linear"):
        assert scores["baselines"][name] == pytest.approx(report["baselines"][name], nan_ok=True)
    split = {key: resolved["split_config"][key] for key in ("split", "seed", "train_gene_set_size")}
    assert scores["test_split"] == {**split, "differences": []}
    # scored on another split's test set, the scores say so, and so does the command
    seed = split["seed"]
    other = ["--set", f"split_config.seed={seed + 1}", "--out", str(tmp_path / "other.json")]
    capsys.readouterr()
    assert main(["evaluate", "--run", str(save), *other]) == 0
    assert "these scores are of another split than the one" in capsys.readouterr().out
    marked = json.loads((tmp_path / "other.json").read_text())["test_split"]["differences"]
    assert marked == [f"seed: {seed} there, {seed + 1} here"]
    # predictions of the saved model, for a query and in cell-eval's layout, which the real cell-eval reads
    assert (
        main(["predict", "--run", str(save), "--perturbations", "G0+G1", "G3", "--out", str(tmp_path / "queries.h5ad")])
        == 0
    )
    queries = anndata.read_h5ad(tmp_path / "queries.h5ad")
    assert list(queries.obs_names) == ["G0+G1", "G3+ctrl"] and queries.uns["gears_ddp"]["weights_from"] == str(save)
    assert (
        main(["predict", "--run", str(save), "--perturbations", "G0+G1", "G3", "--out", str(tmp_path / "t/q.csv")]) == 0
    )  # the format follows the file's name; the folder is made
    table = pd.read_csv(tmp_path / "t" / "q.csv", index_col=0)
    assert list(table.index) == ["G0+G1", "G3+ctrl"]
    np.testing.assert_allclose(table.to_numpy(), np.asarray(queries.X), rtol=1e-6)
    predicted = tmp_path / "predictions" / "test.h5ad"  # a folder to be made
    assert (
        main(["predict", "--run", str(save), "--split", "test", "--format", "cell-eval", "--out", str(predicted)]) == 0
    )
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"predictions for the \d+ cells of the test set and the dataset's \d+ control cells .+", said)
    # more cells than the machine holds: refused in one line before any is made, nothing written
    too_many = [*("predict", "--run", str(save), "--split", "test", "--format", "cell-eval"), "--out"]
    _refused_in_one_line(
        capsys,
        [*too_many, str(tmp_path / "huge.h5ad"), "--cells-per-perturbation", str(10**9)],
        "1,000,000,000 cells for each of the",
        "of memory available: ask for fewer cells per perturbation",
    )
    assert not (tmp_path / "huge.h5ad").exists()
    (tmp_path / "a_file").touch()  # where --out's folder would go
    _refused_in_one_line(
        capsys,
        ["predict", "--run", str(save), "--perturbations", "G3", "--out", str(tmp_path / "a_file" / "q" / "p.csv")],
        f"its folder {tmp_path / 'a_file' / 'q'} cannot be made: {tmp_path / 'a_file'} is a file, not a folder",
    )
    # the linear baseline's cells in the same layout, beside the same truth
    baseline = tmp_path / "test.linear.h5ad"
    assert (
        main(
            [
                "predict",
                "--run",
                str(save),
                "--split",
                "test",
                "--format",
                "cell-eval",
                "--baseline",
                "linear",
                "--out",
                str(baseline),
            ]
        )
        == 0
    )
    written = anndata.read_h5ad(baseline)
    assert written.uns["gears_ddp"]["baseline"] == "linear" and written.n_obs == anndata.read_h5ad(predicted).n_obs
    assert (tmp_path / "test.linear.truth.h5ad").is_file()
    # the real cell-eval reads the predictions (CI installs it and sets GEARS_DDP_REQUIRE_REFERENCE=1)
    if importlib.util.find_spec("cell_eval") is None and os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") != "1":
        pytest.skip("cell-eval is not installed: everything but its reading of the predictions was checked")
    truth = tmp_path / "predictions" / "test.truth.h5ad"
    outdir = tmp_path / "cell-eval"
    cell_eval = [
        sys.executable,
        "-m",
        "cell_eval",
        "run",
        "-ap",
        str(predicted),
        "-ar",
        str(truth),
        "-o",
        str(outdir),
        "--profile",
        "minimal",
        "--num-threads",
        "1",
    ]
    done = subprocess.run(cell_eval, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(outdir / "results.csv") as handle:
        rows = {row["perturbation"]: row for row in csv.DictReader(handle)}
    tested = {c.replace("+ctrl", "") for c in anndata.read_h5ad(truth).obs["condition"].astype(str) if c != "ctrl"}
    assert set(rows) == tested and len(tested) > 1
    assert all(-1 <= float(row["pearson_delta"]) <= 1 for row in rows.values())


@pytest.mark.distributed
@pytest.mark.slow
def test_train_under_torchrun_runs_one_rank_per_process(tmp_path, data_folder):
    save = tmp_path / "run"
    config = _write_config(tmp_path, data_folder, save)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "gears_ddp",
        "train",
        "--config",
        str(config),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_clean_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("overall: GEARS beats every baseline on") == 1  # rank 0's log has the test table
    assert (
        result.stdout.count("The intervals above cover the test perturbations of one seed") == 1
    )  # the summary comes from rank 0 only
    report = json.loads((save / "report.json").read_text())
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert (save / "report.html").exists() and (save / "model.pt").exists()


# ----------------------------------------------------------------------------- process


def test_process_builds_the_go_files_from_an_annotation_and_the_dataset(tmp_path, capsys):
    reference = tmp_path / "reference"
    gene2go = toy_data.write_go_files(reference)
    annotation = tmp_path / "annotation.tsv"
    annotation.write_text(
        "gene\tgo_id\n" + "".join(f"{g}\t{t}\n" for g, terms in gene2go.items() for t in sorted(terms))
    )
    raw = tmp_path / "raw.h5ad"
    toy_data.make_raw().write_h5ad(raw)
    data = tmp_path / "data"
    assert (
        main(
            [
                "process",
                "--adata",
                str(raw),
                "--data-path",
                str(data),
                "--name",
                "toy",
                "--go-annotation",
                str(annotation),
            ]
        )
        == 0
    )
    assert io.read_pickle(data / "gene2go_all.pkl", "GO") == gene2go
    edges = "go_essential_all/go_essential_all.csv"
    assert sorted((data / edges).read_text().splitlines()) == sorted((reference / edges).read_text().splitlines())
    assert (data / "toy" / "perturb_processed.h5ad").exists()
    assert "written to" in capsys.readouterr().out


def test_a_gaf_file_is_read_without_its_negated_lines(tmp_path):
    gaf = tmp_path / "goa_human.gaf"
    gaf.write_text(
        "!gaf-version: 2.2\n"
        "UniProtKB\tP1\tFEV\tenables\tGO:0000001\tref\tIEA\t\tF\tname\t\tprotein\ttaxon:9606\t20200101\tUniProt\n"
        "UniProtKB\tP1\tFEV\tNOT|enables\tGO:0000002\tref\tIEA\t\tF\tname\t\tprotein\ttaxon:9606\t20200101\tUniProt\n"
        "UniProtKB\tP2\tSAMD1\tinvolved_in\tGO:0000003\tref\tIEA\t\tP\tname\t\tprotein\ttaxon:9606\t20200101\tUniProt\n"
    )
    assert read_annotation(gaf) == {"FEV": {"GO:0000001"}, "SAMD1": {"GO:0000003"}}
    table = tmp_path / "pairs.csv"
    table.write_text("gene,term\nFEV,not-a-term\n")
    with pytest.raises(ValueError, match="no GO id"):
        read_annotation(table)


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--config", "run.yaml", "--seed", "3"],
        ["screen", "--run", "runs/x", "--all-perturbable", "--out", "s.csv", "--over"],
        ["demo", "--epoch", "2"],
    ],
)
def test_options_are_never_abbreviated(command, capsys):
    """`train --seed 3` is not `--seeds 3` (replicates): an option given in part is refused, exit 2."""
    with pytest.raises(SystemExit) as stop:
        main(command)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"gears-ddp {command[0]}: error: unrecognized arguments: " in err
    assert f"usage: gears-ddp {command[0]} [-h]" in err  # the command's usage, not the top level's


def test_a_mistyped_option_is_refused_by_its_command_with_the_nearest_it_takes(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--run", "runs/x", "--split", "test", "--out", "x.h5ad", "--cells-per-perturbaton=9", "more"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "usage: gears-ddp predict" in err
    said = "gears-ddp predict: error: unrecognized arguments: --cells-per-perturbaton=9 more (did you mean "
    assert f"{said}--cells-per-perturbation?)" in err


def test_a_stop_signal_outside_the_training_steps_exits_75_with_one_line(monkeypatch, capsys):
    import signal
    import time

    from gears_ddp.cli import train

    def preparing(options):  # the signal lands while the command prepares its run
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("the signal did not stop the command")

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(train, "run", preparing)
    assert main(["train", "--config", "run.yaml"]) == 75
    err = capsys.readouterr().err
    assert err.startswith("gears-ddp train: stopped by SIGTERM outside the training steps") and err.count("\n") == 1
    assert "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == handler  # this process's handler as it was


def test_reading_a_run_that_has_saved_no_model_yet_says_so_and_how_to_go_on(tmp_path, capsys):
    from gears_ddp.configuration.run_options import run_options_with_overrides

    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    config = {
        "pert_data_path": str(tmp_path / "data"),
        "dataset_name": "toy",
        "split_config": {"split": "simulation", "seed": 1},
        "args": {"epochs": 2, "cpu_processes": 1, "save_path": str(folder)},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(run_options_with_overrides(config, [], "x").config()))
    assert main(["evaluate", "--run", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder} holds no model yet (config.pkl, model.pt): its run has not saved a model" in err
    (folder / "checkpoints" / "checkpoint-000000004.pt").write_bytes(b"x")
    assert main(["predict", "--run", str(folder), "--perturbations", "G1", "--out", str(tmp_path / "p.h5ad")]) == 2
    err = capsys.readouterr().err
    assert "saved checkpoints (the newest checkpoint-000000004.pt) but no model" in err
    assert f"gears-ddp train --config {folder / 'config.yaml'} --set args.resume_from=auto" in err


def test_a_mistake_given_with_set_is_named_with_the_set_not_blamed_on_the_file(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"pert_data_path": str(tmp_path), "dataset_name": "toy", "args": {"epochs": 1}}))
    assert main(["train", "--config", str(config), "--set", "args.amp=fp8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gears-ddp train: {config} with --set args.amp=fp8: args['amp'] must be one of")


def test_a_misspelt_split_is_refused_before_the_data_is_read_or_a_folder_made(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    run = tmp_path / "run"
    config.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(tmp_path / "no-data-here"),
                "dataset_name": "toy",
                "split_config": {"split": "simulaton", "seed": 1},
                "args": {"epochs": 1, "cpu_processes": 1, "save_path": str(run)},
            }
        )
    )
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "split_config: unknown split 'simulaton'; available splits: simulation, simulation_single" in err
    assert not run.exists()
