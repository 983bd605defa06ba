"""Replicates: the summary's numbers, the checks made before any process starts, and real
replicates on 2 CPU processes (a failing one, a re-run that skips and resumes, the weights
of each against the same run alone)."""

import csv
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from matplotlib.collections import PathCollection
from scipy import stats
from test_paired_verdicts import plain_bootstrap, plain_two_level_bootstrap
from verdict_reports import report_from_values

from gears_ddp import train_multi_gpu, train_replicates
from gears_ddp.cli import main
from gears_ddp.configuration.sections import ReplicateOptions
from gears_ddp.distributed import group_runs
from gears_ddp.distributed.replicates import device_groups
from gears_ddp.evaluation.paired_bootstrap import BEATS, LOSES, NO_CLEAR, interval_verdict
from gears_ddp.launching import launchers
from gears_ddp.report.plots import figure_replicate_values
from gears_ddp.report.replicate_report import TABLE_COLUMNS, TABLE_FILE, write_replicate_report
from gears_ddp.report.replicate_summary import replicate_table, summarise_replicates, t_interval
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED

SPLIT = {"split": "simulation", "seed": 1}


# ----------------------------------------------------------------------------- the summary's numbers

GEARS_VALUES = [0.31, 0.27, 0.35, 0.30, 0.29]  # pearson_delta, higher is better
ADDITIVE_VALUES = [0.20, 0.22, 0.21, 0.19, 0.24]  # GEARS clearly above
MEAN_EFFECT_VALUES = [0.33, 0.25, 0.36, 0.28, 0.31]  # differences straddle zero
GEARS_MSE = [0.10, 0.12, 0.11, 0.13, 0.10]  # mse_de, lower is better
ADDITIVE_MSE = [0.08, 0.09, 0.085, 0.10, 0.07]  # GEARS clearly worse
MEAN_EFFECT_MSE = [0.20, 0.21, 0.19, 0.22, 0.20]  # GEARS clearly better


OFFSETS = np.array([0.02, -0.01, 0.0, 0.015, -0.02, -0.005])  # around 0: the summaries are the values above
OTHER_OFFSETS = np.array([-0.04, 0.03, 0.01, -0.02, 0.05, -0.03])


def _reports():
    """Five replicates of 6 test perturbations each, whose means are the values above."""
    reports = {}
    for i in range(5):
        model = {"pearson_delta": GEARS_VALUES[i] + OFFSETS, "mse_de": GEARS_MSE[i] + OFFSETS}
        baselines = {
            "additive": {"pearson_delta": ADDITIVE_VALUES[i] + OFFSETS, "mse_de": ADDITIVE_MSE[i] + OFFSETS},
            "mean_effect": {
                "pearson_delta": MEAN_EFFECT_VALUES[i] + OTHER_OFFSETS,
                "mse_de": MEAN_EFFECT_MSE[i] + OTHER_OFFSETS,
            },
        }
        reports[f"seed-{i}"] = report_from_values(model, baselines)
    return reports


def _grid(reports, metric, baseline, higher):
    values = [report["per_perturbation"]["values"] for report in reports.values()]
    sign = 1 if higher else -1
    return sign * np.array([np.subtract(v["GEARS"][metric], v[baseline][metric]) for v in values])


def test_mean_sd_interval_and_verdict_on_known_numbers():
    reports = _reports()
    pearson, mse = summarise_replicates(reports)
    assert (pearson.metric, mse.metric) == ("pearson_delta", "mse_de")
    assert pearson.gears.mean == pytest.approx(np.mean(GEARS_VALUES))
    assert pearson.gears.sd == pytest.approx(np.std(GEARS_VALUES, ddof=1))
    assert pearson.baselines["additive"].sd == pytest.approx(np.std(ADDITIVE_VALUES, ddof=1))
    for verdict, higher in ((pearson, True), (mse, False)):
        for name in ("additive", "mean_effect"):
            grid = _grid(reports, verdict.metric, name, higher)
            comparison = verdict.differences[name]
            assert (comparison.low, comparison.high) == pytest.approx(plain_two_level_bootstrap(grid), abs=1e-12)
            assert comparison.difference == pytest.approx(grid.mean())
            assert (comparison.n, comparison.replicates) == (6, 5)
    assert pearson.differences["additive"].verdict == BEATS  # interval above zero, higher is better
    assert pearson.differences["mean_effect"].verdict == NO_CLEAR  # interval holds zero
    assert mse.differences["additive"].verdict == LOSES  # GEARS's mse_de higher: worse
    assert mse.differences["mean_effect"].verdict == BEATS  # GEARS's mse_de lower: better
    assert pearson.summary == "beats additive; no clear difference from mean_effect"
    assert mse.summary == "beats mean_effect; loses to additive"


@pytest.mark.parametrize(
    "low, high, verdict",
    [(0.1, 0.3, BEATS), (-0.3, -0.1, LOSES), (-0.1, 0.2, NO_CLEAR), (0.0, 0.2, NO_CLEAR), (-0.2, 0.0, NO_CLEAR)],
)
def test_the_verdict_reads_the_signed_interval(low, high, verdict):
    assert interval_verdict(low, high) == verdict


def test_a_missing_value_leaves_its_pair_out_and_one_replicate_bootstraps_its_perturbations():
    reports = _reports()
    values = reports["seed-0"]["per_perturbation"]["values"]["additive"]["pearson_delta"]
    values[2] = math.nan  # null in a report.json
    pearson = summarise_replicates(reports)[0]
    assert pearson.differences["additive"].n == 6 and pearson.differences["additive"].dropped == 0  # tested elsewhere
    grid = _grid(reports, "pearson_delta", "additive", True)
    assert pearson.differences["additive"].difference == pytest.approx(np.nanmean(grid))
    single = summarise_replicates({"seed-1": _reports()["seed-1"]})[0]
    assert single.differences["additive"].replicates == 1 and math.isnan(single.gears.sd)
    assert (single.differences["additive"].low, single.differences["additive"].high) == pytest.approx(
        plain_bootstrap(_grid({"s": _reports()["seed-1"]}, "pearson_delta", "additive", True)[0]), abs=1e-12
    )
    assert t_interval([0.2])[0] == 0.2 and math.isnan(t_interval([0.2])[2])


def test_the_interval_of_rows_of_values_is_that_of_each_row():
    rows = np.array([[0.2, 0.5, 0.3, 0.9], [1.0, 1.0, 1.0, 1.0], [0.1, np.inf, 0.2, 0.3]])
    mean, sd, low, high = t_interval(rows)
    for row, values in enumerate(rows[:2]):
        assert (mean[row], sd[row], low[row], high[row]) == pytest.approx(t_interval(values), rel=1e-12)
    expected = stats.t.interval(0.95, 3, loc=np.mean(rows[0]), scale=stats.sem(rows[0]))
    assert (low[0], high[0]) == pytest.approx(expected, rel=1e-10)
    assert sd[1] == 0 and low[1] == high[1] == 1.0  # equal values: no spread
    assert mean[2] == np.inf and np.isnan([sd[2], low[2], high[2]]).all()  # no interval with an infinite value


def test_the_summary_files_hold_every_replicate_metric_subgroup_and_method(tmp_path):
    replicates = [
        {
            "name": f"seed-{i}",
            "seed": i,
            "split_seed": 1,
            "folder": str(tmp_path / f"seed-{i}"),
            "status": "finished",
            "error": None,
        }
        for i in range(5)
    ]
    replicates.append(
        {
            "name": "seed-9",
            "seed": 9,
            "split_seed": 1,
            "folder": str(tmp_path / "seed-9"),
            "status": "failed",
            "error": "rank 0 of 1 failed first; its traceback: MemoryError",
        }
    )
    page = write_replicate_report(tmp_path, {"dataset_name": "toy"}, replicates, _reports())
    with open(tmp_path / TABLE_FILE, newline="") as table:
        rows = list(csv.DictReader(table))
    assert tuple(rows[0]) == TABLE_COLUMNS
    assert len(rows) == 5 * 2 * 3  # replicates x metrics x (GEARS and two baselines), one subgroup
    additive = [float(r["value"]) for r in rows if r["metric"] == "mse_de" and r["method"] == "additive"]
    assert additive == pytest.approx(ADDITIVE_MSE, abs=1e-12) and {r["replicate"] for r in rows} == {
        f"seed-{i}" for i in range(5)
    }
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["finished"] == 5 and summary["replicates"][-1]["status"] == "failed"
    assert summary["metrics"][0]["differences"]["additive"]["verdict"] == BEATS
    text = page.read_text()
    assert "seed-9" in text and "MemoryError" in text and "expanded percentile bootstrap" in text
    assert "loses to additive" in text and "GEARS beats every baseline on 0 of 2 metrics" in text
    assert (tmp_path / "plots" / "replicates_pearson_delta.png").stat().st_size > 0
    assert (tmp_path / "plots" / "differences_all.png").stat().st_size > 0 and "differences_all.png" in text
    table = replicate_table(summary["metrics"]).splitlines()
    assert table[1].startswith("pearson_delta") and "beats" in table[1] and "no clear difference" in table[1]


def test_on_a_screen_of_single_genes_the_page_shows_the_test_conditions_once_and_the_files_keep_all(tmp_path):
    def single_genes(report):  # every test condition an unseen single: the subgroup's values are the whole's
        record = report["per_perturbation"]
        return {
            **report,
            "model": {
                **report["model"],
                **{key.replace("test_", "test_unseen_single_"): value for key, value in report["model"].items()},
            },
            "baselines": {
                name: {
                    **values,
                    **{key.replace("test_", "test_unseen_single_"): value for key, value in values.items()},
                }
                for name, values in report["baselines"].items()
            },
            "per_perturbation": {**record, "subgroups": {"unseen_single": list(record["conditions"])}},
        }

    reports = {name: single_genes(report) for name, report in _reports().items()}
    replicates = [
        {"name": name, "seed": i, "split_seed": 1, "folder": str(tmp_path / name), "status": "finished", "error": None}
        for i, name in enumerate(reports)
    ]
    page = write_replicate_report(tmp_path, {"dataset_name": "toy"}, replicates, reports).read_text()
    assert "Single genes not seen in training</th>" not in page
    assert "All test conditions (single genes not seen in training)</th>" in page
    assert page.count("<tr><td><b>") == 2  # pearson_delta and mse_de, once each
    summary = json.loads((tmp_path / "report.json").read_text())
    assert [record["subgroup"] for record in summary["metrics"]] == [None, None, "unseen_single", "unseen_single"]
    verdicts = summarise_replicates(reports, metrics=("mse_de",), subgroups=(None,))
    axes = figure_replicate_values(verdicts, "all test conditions (single genes not seen in training)").axes[0]
    assert [label.get_text().replace("\n", " ") for label in axes.get_xticklabels()] == [
        "all test conditions (single genes not seen in training)"
    ]


def test_the_plot_shows_every_replicates_value_gears_beside_each_baseline():
    verdicts = summarise_replicates(_reports(), metrics=("mse_de",))
    figure = figure_replicate_values(verdicts)
    axes = figure.axes[0]
    points = [collection.get_offsets() for collection in axes.collections if isinstance(collection, PathCollection)]
    drawn = sorted(sorted(np.round(np.asarray(offsets)[:, 1], 6)) for offsets in points)
    assert drawn == sorted(sorted(np.round(values, 6)) for values in (GEARS_MSE, ADDITIVE_MSE, MEAN_EFFECT_MSE))
    words = [text.get_text() for text in axes.texts]
    assert words == ["loses", "beats"]  # under additive and mean_effect, in that order
    assert "lower is better" in axes.get_title()
    # the legend, laid out, lies well within the figure: three columns filled its whole width
    # (647 of 650 points), the first marker cut at the edge
    figure.canvas.draw()
    legend, page = figure.legends[0].get_window_extent(), figure.bbox
    assert legend.width <= 0.9 * page.width and page.x0 < legend.x0 and legend.x1 < page.x1


# ----------------------------------------------------------------------------- refused before any process


def _args(save_path, **overrides):
    return {
        "cpu_processes": 2,
        "epochs": 1,
        "max_steps": 6,
        "batch_size": 8,
        "test_batch_size": 32,
        "model_config": {"hidden_size": 8},
        "save_path": str(save_path),
        "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
        **overrides,
    }


@pytest.fixture
def no_processes(monkeypatch):
    """Any attempt to prepare data or start workers fails the test."""

    def refuse(*_, **__):
        raise AssertionError("a process or the data was started before the input was checked")

    monkeypatch.setattr(launchers, "SpawnedWorkers", refuse)
    monkeypatch.setattr(group_runs, "shared_data", refuse)


@pytest.mark.parametrize(
    "replicates, args, message",
    [
        ({"seeds": []}, {}, r"replicates.seeds must be a non-empty list"),
        ({"seeds": [1, 2, 1]}, {}, r"replicates.seeds \[1, 2, 1\] lists \[1\] more than once"),
        ({"split_seeds": [3, 3]}, {}, r"replicates.split_seeds \[3, 3\] lists \[3\] more than once"),
        ({}, {}, "replicates needs seeds and/or split_seeds"),
        ({"seeds": [1, 2], "split_seeds": [1]}, {}, "give lists of equal length"),
        (
            {"seeds": [1, 2], "parallel": 3},
            {},
            r"replicates.parallel=3 group\(s\) of replicates.ranks_per_replicate=1 "
            r"device\(s\) need 3 devices, but 2 are given \(cpu, cpu\)",
        ),
        (
            {"seeds": [1, 2], "ranks_per_replicate": 3},
            {},
            r"one group of replicates.ranks_per_replicate=3 device\(s\) "
            r"need 3 devices, but 2 are given",
        ),
        (
            {"seeds": [1, 2]},
            {"resume_from": "RUN/seed-1"},
            r"args\['resume_from'\]=.*seed-1.* names one run's checkpoint",
        ),
        ({"seeds": [1, 2]}, {"save_path": None}, r"replicates need args\['save_path'\]"),
        ({"seeds": [1, -2]}, {}, r"replicates.seeds must hold non-negative integers; \[-2\] are not"),
        ({"seeds": [1, 2], "ranks_per_replicate": 0}, {}, "replicates.ranks_per_replicate must be a positive integer"),
        ({"seeds": [1, 2]}, {"overwrite_save_path": True}, r"args\['overwrite_save_path'\] with replicates"),
        ("1 2 3", {}, "replicates must be a mapping such as"),
    ],
)
def test_bad_input_is_refused_naming_it(tmp_path, data_folder, no_processes, replicates, args, message):
    (tmp_path / "seed-1" / "checkpoints").mkdir(parents=True)
    args = {
        key: str(value).replace("RUN", str(tmp_path)) if key == "resume_from" else value for key, value in args.items()
    }
    with pytest.raises(ValueError, match=message):
        train_replicates(data_folder, "toy", SPLIT, {**_args(tmp_path), **args}, replicates)
    assert not (tmp_path / "config.yaml").exists()


def test_a_save_path_holding_another_configuration_is_refused(tmp_path, data_folder, no_processes):
    run = tmp_path / "run"
    (run / "seed-2").mkdir(parents=True)
    single = {"pert_data_path": str(data_folder), "dataset_name": "toy", "args": {"epochs": 1}}
    (run / "config.yaml").write_text(yaml.safe_dump(single))
    with pytest.raises(ValueError, match=r"save_path .*run holds a single run \(its config.yaml\)"):
        train_replicates(data_folder, "toy", SPLIT, _args(run), {"seeds": [1, 2]})
    (run / "config.yaml").unlink()
    replicate = yaml.safe_dump(
        {
            "pert_data_path": str(data_folder),
            "dataset_name": "toy",
            "split_config": SPLIT,
            "args": {"epochs": 3, "seed": 2},
        }
    )
    (run / "seed-2" / "config.yaml").write_text(replicate)
    with pytest.raises(
        ValueError,
        match=r"replicate seed-2: .*seed-2 holds a run of another configuration "
        r"\(.*args.epochs: 3 there, 1 here",
    ):
        train_replicates(data_folder, "toy", SPLIT, _args(run), {"seeds": [1, 2]})
    assert not (run / "config.yaml").exists()


def test_the_command_line_refuses_a_duplicated_seed_with_status_2(tmp_path, data_folder, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(data_folder),
                "dataset_name": "toy",
                "split_config": SPLIT,
                "args": _args(tmp_path / "run"),
            }
        )
    )
    assert main(["train", "--config", str(config), "--seeds", "4", "4"]) == 2
    assert "replicates.seeds [4, 4] lists [4] more than once" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "save_path, message",
    [
        ("a_file", "save_path {root}/a_file is a file, not a folder; choose another save_path"),
        (
            "a_file/replicates",
            "save_path {root}/a_file/replicates cannot be made: {root}/a_file is a file, not a folder",
        ),
    ],
)
def test_the_command_line_refuses_a_save_path_a_file_stands_in_with_status_2(
    tmp_path, data_folder, capsys, save_path, message
):
    (tmp_path / "a_file").write_text("mine")
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(data_folder),
                "dataset_name": "toy",
                "split_config": SPLIT,
                "args": _args(tmp_path / save_path),
            }
        )
    )
    assert main(["train", "--config", str(config), "--seeds", "1", "2"]) == 2
    error = capsys.readouterr().err
    assert message.format(root=tmp_path) in error and "Traceback" not in error and len(error.splitlines()) == 1
    assert (tmp_path / "a_file").read_text() == "mine"


def test_replicates_are_refused_in_a_sweep_s_folder_which_keeps_its_report(tmp_path, data_folder, capsys):
    """Their report would replace the sweep's (and their summary remove its trials.csv)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("trials: 3\n")
    (sweep / "report.html").write_text("the sweep's")
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"pert_data_path": str(data_folder), "dataset_name": "toy", "split_config": SPLIT, "args": _args(sweep)}
        )
    )
    assert main(["train", "--config", str(config), "--seeds", "1", "2"]) == 2
    error = capsys.readouterr().err
    assert f"save_path {sweep} holds a sweep (its sweep.yaml), not replicates: replicates cannot be trained" in error
    assert (sweep / "report.html").read_text() == "the sweep's" and not (sweep / "seed-1").exists()


def test_a_run_whose_workers_the_passed_on_stop_ended_as_they_started_was_interrupted(tmp_path):
    """Ctrl-C as a sweep's trials start: the parent passes it on (SIGUSR2), which ends workers
    that have no handler yet. Their run was interrupted (a sweep retries it), not failed ("killed
    by SIGUSR2 (out of memory, or stopped from outside?)", never retried)."""
    from types import SimpleNamespace

    from gears_ddp.launching.supervisor import DistributedTrainingError

    class EndedByTheStop:
        received: list = []  # no message came

        def result(self):
            raise DistributedTrainingError("rank 0 of 1 was killed by SIGUSR2")

        def ended_by(self, received):
            return signal.SIGINT if signal.SIGINT in received else None

        def close(self):
            pass

    trial = SimpleNamespace(name="trial-0001", folder=tmp_path)
    entry = SimpleNamespace(run=trial, workers=EndedByTheStop(), started=0)
    scheduler = group_runs.GroupScheduler([[torch.device("cpu")]])
    interrupted = scheduler._settle(entry, [signal.SIGINT])
    assert interrupted["status"] == "interrupted"
    assert interrupted["error"] == "stopped by SIGINT (Ctrl-C) before its workers could stop at a step"
    assert scheduler._settle(entry, [])["status"] == "failed"  # no stop: it failed


def test_devices_are_cut_into_groups_of_the_ranks_a_replicate_asks_for(caplog):
    devices = [torch.device("cpu")] * 5
    groups = device_groups(devices, ReplicateOptions.from_dict({"seeds": [1], "ranks_per_replicate": 2}))
    assert [len(group) for group in groups] == [2, 2]
    assert "stay idle" in caplog.text  # the fifth device
    assert len(device_groups(devices, ReplicateOptions.from_dict({"seeds": [1], "parallel": 3}))) == 3


# ----------------------------------------------------------------------------- real replicates


def _state(folder):
    return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_failing_replicate_leaves_the_others_finished_and_a_rerun_skips_them_and_resumes_it(
    data_folder, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a replicate and the run alone sum in the same order
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(data_folder),
                "dataset_name": "toy",
                "split_config": SPLIT,
                "args": _args(run, checkpoint_every_steps=2, keep_checkpoints=10),
            }
        )
    )
    # seed-2 fails right after its first checkpoint: clearing what killed writers leave there meets a folder
    blocker = run / "seed-2" / "checkpoints" / ".checkpoint-blocker.tmp"
    blocker.mkdir(parents=True)
    assert main(["train", "--config", str(config), "--seeds", "1", "2"]) == 1
    err = capsys.readouterr().err
    assert "1 of 2 replicates did not finish" in err and "seed-2 failed" in err and ".checkpoint-blocker.tmp" in err, (
        err[-3000:]
    )
    assert (run / "seed-1" / "report.html").exists() and not (run / "seed-2" / "report.html").exists()
    summary = json.loads((run / "report.json").read_text())
    assert [(r["name"], r["status"]) for r in summary["replicates"]] == [("seed-1", "finished"), ("seed-2", "failed")]
    assert "IsADirectoryError" in summary["replicates"][1]["error"]
    with open(run / TABLE_FILE, newline="") as table:
        assert {row["replicate"] for row in csv.DictReader(table)} == {"seed-1"}

    blocker.rmdir()
    finished_before = (run / "seed-1" / "report.json").stat().st_mtime_ns
    assert main(["train", "--config", str(config), "--seeds", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 replicates finished" in out and "vs additive: difference [95% interval] won" in out
    assert (run / "seed-1" / "report.json").stat().st_mtime_ns == finished_before  # skipped
    log = (run / "train.log").read_text()
    assert "seed-1: finished before (its report is complete" in log
    assert "seed-2: resuming from" in log and "checkpoint-000000002.pt" in log
    summary = json.loads((run / "report.json").read_text())
    assert [r["status"] for r in summary["replicates"]] == ["finished", "finished"]
    assert summary["metrics"][0]["methods"]["GEARS"]["n"] == 2
    # the resumed replicate ends as the same run trained alone without a stop (bit for bit on CPU)
    alone = train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "alone", cpu_processes=1, seed=2))
    resumed = _state(run / "seed-2")
    for name, tensor in _state(tmp_path / "alone").items():
        assert torch.equal(tensor, resumed[name]), name
    assert json.loads((run / "seed-2" / "report.json").read_text())["model"]["test_mse_de"] == pytest.approx(
        alone["model"]["test_mse_de"], rel=1e-12
    )


@pytest.mark.distributed
@pytest.mark.slow
def test_two_replicates_on_two_processes_give_the_weights_of_each_run_alone(data_folder, tmp_path, caplog, monkeypatch):
    # one thread per process in both: two processes sharing two cores would otherwise get one thread each and a
    # process alone two, and float sums split over other threads round differently
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    caplog.set_level("INFO", logger="gears_ddp")
    summary = train_replicates(data_folder, "toy", SPLIT, _args(tmp_path / "run"), {"seeds": [3, 4]})
    assert summary["finished"] == 2
    assert "2 replicate(s) (seed-3, seed-4) on 2 device group(s) of 1 rank(s), 2 training at once" in caplog.text
    alone = tmp_path / "alone-4"  # the second replicate (the second device group): its seed, not the first's
    train_multi_gpu(data_folder, "toy", SPLIT, _args(alone, cpu_processes=1, seed=4))
    replicate, other = _state(tmp_path / "run" / "seed-4"), _state(tmp_path / "run" / "seed-3")
    for name, tensor in _state(alone).items():
        assert torch.equal(tensor, replicate[name]), name
    assert any(not torch.equal(tensor, other[name]) for name, tensor in replicate.items())
    seeds = yaml.safe_load((tmp_path / "run" / "seed-4" / "config.yaml").read_text())
    assert seeds["args"]["seed"] == 4 and seeds["args"]["cpu_processes"] == 1  # repeats the replicate alone


@pytest.mark.distributed
@pytest.mark.slow
def test_a_replicate_of_two_ranks_trains_on_a_group_of_two_processes(data_folder, tmp_path, caplog):
    caplog.set_level("INFO", logger="gears_ddp")
    summary = train_replicates(
        data_folder,
        "toy",
        {"split": "simulation"},
        _args(tmp_path / "run", max_steps=2),
        {"split_seeds": [2], "ranks_per_replicate": 2},
    )
    assert [r["name"] for r in summary["replicates"]] == ["split-2"]
    report = json.loads((tmp_path / "run" / "split-2" / "report.json").read_text())
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert "group 1: cpu, cpu" in caplog.text
    assert yaml.safe_load((tmp_path / "run" / "split-2" / "config.yaml").read_text())["split_config"]["seed"] == 2


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stop_signal_stops_the_running_replicate_with_a_checkpoint_and_starts_no_other(data_folder, tmp_path):
    from test_launch import _clean_environment
    from test_restarts import _wait_for_step

    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(data_folder),
                "dataset_name": "toy",
                "split_config": SPLIT,
                "args": _args(run, cpu_processes=1, epochs=500, max_steps=None, checkpoint_every_steps=5),
            }
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gears_ddp", "train", "--config", str(config), "--seeds", "1", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
    )
    _wait_for_step(run / "seed-1", 5, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "replicates stopped on SIGTERM: 0 of 2 finished; run the same command again" in err
    summary = json.loads((run / "report.json").read_text())
    assert [(r["name"], r["status"]) for r in summary["replicates"]] == [
        ("seed-1", "interrupted"),
        ("seed-2", "not started"),
    ]
    assert "checkpoint" in summary["replicates"][0]["error"] and not (run / "seed-2").exists()


def _worker_failing_as_it_ends(local_rank, *args, **handed):
    """A rank that does all its work, report included, and then exits with an error."""
    launchers.spawned_rank(local_rank, *args, **handed)
    os._exit(3)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_replicate_whose_worker_fails_after_its_complete_report_counts_as_finished(
    data_folder, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(launchers, "spawned_rank", _worker_failing_as_it_ends)
    summary = train_replicates(
        data_folder, "toy", SPLIT, _args(tmp_path / "run", cpu_processes=1, max_steps=2), {"seeds": [7]}
    )
    assert [r["status"] for r in summary["replicates"]] == ["finished"]
    assert (
        "seed-7: finished in" in caplog.text
        and "a worker failed as it ended: rank 0 of 1 exited with code 3" in caplog.text
    )
