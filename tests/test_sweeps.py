"""Sweeps for real: trials of the toy run drawn by Optuna, a planted bad learning rate pruned
before its last epoch, the best trial chosen on validation alone, the report; a sweep killed
halfway finishes with its number of trials and no trial trained twice; two processes on one
journal draw disjoint trials; every bad input named before any trial starts."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_launch import _clean_environment

from gears_ddp.cli import main
from gears_ddp.data.io import write_yaml
from gears_ddp.runtime.threads import cpu_threads
from gears_ddp.sweeps import train_sweep as sweep_module

pytestmark = pytest.mark.distributed
SPLIT = {"split": "simulation", "seed": 1}
SPACE = {
    "args": {
        "lr": {"type": "categorical", "choices": [0.003, 10.0]},
        "model_config": {"hidden_size": {"type": "int", "low": 8, "high": 16}},
    }
}


def _args(folder, **more):
    return {
        "epochs": 12,
        "batch_size": 16,
        "test_batch_size": 64,
        "cpu_processes": 1,
        "model_config": {"hidden_size": 8},
        "save_path": str(folder),
        "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
        **more,
    }


def _files(tmp_path, data_folder, folder, **more):
    run, space = tmp_path / "run.yaml", tmp_path / "space.yaml"
    run.write_text(
        yaml.safe_dump(
            {
                "pert_data_path": str(data_folder),
                "dataset_name": "toy",
                "split_config": SPLIT,
                "args": _args(folder, **more),
            }
        )
    )
    space.write_text(yaml.safe_dump(SPACE))
    return run, space


def _rows(folder) -> list[dict]:
    with open(Path(folder) / "trials.csv", newline="") as table:
        return list(csv.DictReader(table))


def _best_validation(trial_folder) -> float:
    return min(float(row["val_mse_de"]) for row in _metric_rows(trial_folder))


@pytest.mark.slow
def test_a_sweep_prunes_a_planted_bad_trial_and_chooses_on_validation(data_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_module, "PRUNER", {**sweep_module.PRUNER, "startup_trials": 2})
    folder = tmp_path / "sweep"
    summary = sweep_module.train_sweep(data_folder, "toy", SPLIT, _args(folder, epochs=8), SPACE, 4)
    rows = _rows(folder)
    assert [int(row["number"]) for row in rows] == [0, 1, 2, 3] and summary["counts"] == {
        state: sum(row["state"] == state for row in rows) for state in dict.fromkeys(row["state"] for row in rows)
    }
    pruned = [row for row in rows if row["state"] == "PRUNED"]
    assert pruned and all(float(row["args.lr"]) == 10.0 and int(row["epochs"]) < 8 for row in pruned)
    assert all(row["note"].startswith("pruned after epoch ") for row in pruned)
    complete = [row for row in rows if row["state"] == "COMPLETE"]
    for row in complete:  # a trial's value is its best epoch's validation mse_de: the test set never chooses
        assert float(row["value"]) == pytest.approx(_best_validation(row["folder"]))
        assert json.loads((Path(row["folder"]) / "trial.json").read_text())["state"] == "complete"
    best = min(complete, key=lambda row: float(row["value"]))
    assert summary["best"]["number"] == int(best["number"])
    again = yaml.safe_load((folder / "run.yaml").read_text())
    assert again["args"]["lr"] == float(best["args.lr"]) and again["args"]["save_path"] == f"{folder}-best"
    assert again["args"]["model_config"]["hidden_size"] == int(best["args.model_config.hidden_size"])
    page = (folder / "report.html").read_text()
    assert f"Best of 4 trials: trial {best['number']}" in page and "chosen on validation alone" in page
    assert "this is the sweep's run file" in page and "<code>config.yaml</code>" not in page  # a sweep has none
    assert all((folder / "plots" / name).stat().st_size > 0 for name in ("sweep_history.png", "sweep_settings.png"))
    assert summary["best_verdicts"] and summary["best_verdicts"][0]["metric"] == "pearson_delta"
    # the same call again holds its trials already: nothing is trained
    modified = {row["folder"]: (Path(row["folder"]) / "metrics.csv").stat().st_mtime_ns for row in rows}
    assert (
        sweep_module.train_sweep(data_folder, "toy", SPLIT, _args(folder, epochs=8), SPACE, 4)["best"]
        == summary["best"]
    )
    assert {row["folder"]: (Path(row["folder"]) / "metrics.csv").stat().st_mtime_ns for row in rows} == modified


@pytest.mark.slow
def test_the_best_trial_s_run_yaml_trained_alone_repeats_it_bit_for_bit(data_folder, tmp_path):
    """Two trials at once share the cores, a thread count of their own; trained alone, run.yaml
    gets the threads the trial had (args.cpu_threads, which its config.yaml records), and a
    CPU's sums, whose order follows the count, add up as the trial's did: the same weights."""
    folder = tmp_path / "sweep"
    space = {"args": {"model_config": {"hidden_size": {"type": "int", "low": 8, "high": 16}}}}
    summary = sweep_module.train_sweep(data_folder, "toy", SPLIT, _args(folder, epochs=1, cpu_processes=2), space, 2)
    best = Path(summary["best"]["folder"])
    shared = cpu_threads(2)  # each of the two trials' ranks
    assert yaml.safe_load((best / "config.yaml").read_text())["args"]["cpu_threads"] == shared
    again = yaml.safe_load((folder / "run.yaml").read_text())
    assert again["args"]["cpu_processes"] == 1 and again["args"]["cpu_threads"] == shared
    assert main(["train", "--config", str(folder / "run.yaml")]) == 0
    trial, retrained = (json.loads((path / "report.json").read_text()) for path in (best, Path(f"{folder}-best")))
    assert retrained["parameter_digests"] == trial["parameter_digests"] and retrained["model"] == trial["model"]


def _sweep(*arguments, **environment):
    return subprocess.Popen(
        [sys.executable, "-m", "gears_ddp", "sweep", *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(**environment),
    )


def _wait_for(path: Path, process, timeout_s: float = 240) -> None:
    """Wait until ``path`` exists, while ``process`` runs."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.1)


@pytest.mark.slow
def test_a_sweep_killed_halfway_finishes_its_trials_and_trains_none_twice(data_folder, tmp_path):
    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder, epochs=6)
    killed = _sweep("--config", run, "--space", space, "--trials", 3)
    _wait_for(folder / "trial-0001", killed)  # trial 0 finished, trial 1 under way
    time.sleep(2)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    first = (folder / "trial-0000" / "report.json").stat().st_mtime_ns
    resumed = _sweep("--config", run, "--space", space, "--trials", 3)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    rows = _rows(folder)
    assert "trial 1: interrupted: the sweep that ran it stopped; retried once" in err
    retried = next(row for row in rows if row["number"] == "1")
    assert retried["state"] == "FAIL"
    retry = next(row for row in rows if row["folder"] == retried["folder"] and row["number"] != "1")
    assert retry["state"] in ("COMPLETE", "PRUNED")  # in the interrupted trial's folder
    finished = [row for row in rows if row["state"] in ("COMPLETE", "PRUNED")]
    assert len(finished) == 3
    assert len({row["folder"] for row in finished}) == 3  # no trial trained twice
    assert (folder / "trial-0000" / "report.json").stat().st_mtime_ns == first


@pytest.mark.slow
def test_a_stopped_sweep_exits_75_and_its_trial_continues_from_its_checkpoint(data_folder, tmp_path):
    """SIGTERM to a sweep halfway through its last trial, which writes checkpoints: the trial
    stops with a checkpoint, the sweep exits with status 75 and marks it failed, to be
    retried; the same command then retries it in its folder from that checkpoint (its
    metrics keep the epochs trained before the stop), though the retry already counts as
    the sweep's one trial, and the sweep ends with that trial."""
    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder, epochs=30, checkpoint_every=1)
    stopped = _sweep("--config", run, "--space", space, "--trials", 1)
    _wait_for(folder / "trial-0000" / "checkpoints", stopped)
    time.sleep(1)
    stopped.send_signal(signal.SIGTERM)
    _, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 75, err[-3000:]
    assert "the sweep stopped on SIGTERM; run the same command again to continue it" in err
    interrupted, queued = _rows(folder)  # the stopped trial, and its retry queued with its settings
    assert interrupted["state"] == "FAIL" and interrupted["note"].startswith("interrupted when its sweep stopped")
    assert queued["state"] == "WAITING" and queued["note"] == "retry of trial 0, continued in its folder"
    assert queued["args.lr"] == interrupted["args.lr"] != ""
    epochs_before = len(_metric_rows(folder / "trial-0000"))
    assert 1 <= epochs_before < 30
    resumed = _sweep("--config", run, "--space", space, "--trials", 1)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    rows = _rows(folder)
    retry = next(row for row in rows if row["folder"] == interrupted["folder"] and row["number"] != "0")
    assert retry["state"] in ("COMPLETE", "PRUNED")
    assert f"trial-{int(retry['number']):04d}: resuming from {folder / 'trial-0000' / 'checkpoints'}" in err
    epochs = [int(row["epoch"]) for row in _metric_rows(folder / "trial-0000")]
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) > epochs_before  # continued, not restarted
    assert len(rows) == 2 and f"1 trial: 1 {retry['state'].lower()}; 1 more interrupted and retried" in out


@pytest.mark.slow
def test_a_sweep_whose_trials_all_fail_records_each_error_and_exits_1(data_folder, tmp_path):
    """A trial that fails as it trains (a learning rate whose loss is no longer finite) is
    marked failed with its error and the sweep goes on to the next; with no trial complete
    there is no best run, and the command says so with exit status 1. Its report is drawn with
    no finished trial (a log-scaled range failed there: "Data cannot be log-scaled")."""
    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder, epochs=3)
    space.write_text(yaml.safe_dump({"args": {"lr": {"type": "float", "low": 1e29, "high": 1e30, "log": True}}}))
    failing = _sweep("--config", run, "--space", space, "--trials", 2)
    out, err = failing.communicate(timeout=600)
    assert failing.returncode == 1, err[-3000:]
    assert "2 trials: 2 fail" in out and "Traceback" not in err
    assert f"no trial completed, so there is no best run (no run.yaml); trials.csv in {folder}" in err
    rows = _rows(folder)
    assert [row["state"] for row in rows] == ["FAIL", "FAIL"]
    assert all(row["note"].startswith("the training loss is not finite") for row in rows)
    assert (folder / "report.html").is_file() and not (folder / "run.yaml").exists()


def _metric_rows(trial_folder) -> list[dict]:
    with open(Path(trial_folder) / "metrics.csv", newline="") as table:
        return list(csv.DictReader(table))


@pytest.mark.slow
def test_two_processes_on_one_journal_draw_disjoint_trials(data_folder, tmp_path):
    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder, epochs=2)
    first = _sweep("--config", run, "--space", space, "--trials", 4)
    _wait_for(folder / "sweep.yaml", first)
    second = _sweep("--join", folder, "--set", "args.cpu_processes=1")
    logs = [process.communicate(timeout=600) for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], logs[1][1][-3000:]
    drawn = [{int(name) for name in _trial_names(err)} for _, err in logs]
    assert drawn[0] and drawn[1] and not drawn[0] & drawn[1]  # each trial drawn by one process
    rows = _rows(folder)
    assert len(rows) == len(drawn[0] | drawn[1]) >= 4 and all(row["state"] != "FAIL" for row in rows)


def _trial_names(log: str) -> list[str]:
    return [
        line.split("trial-")[1][:4]
        for line in log.splitlines()
        if "gears_ddp.distributed.group_runs: trial-" in line and "training on group" in line
    ]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ["--storage", "postgresql://nobody@127.0.0.1:9/none"],
            "--storage postgresql://nobody@127.0.0.1:9/none: the database does not answer",
        ),
        (
            ["--storage", "sqlite:///nonexistent/dir/x.db"],
            "--storage sqlite:///nonexistent/dir/x.db: the database does not answer",
        ),
        (["--trials", "0"], "--trials must be a positive integer, got 0"),
        ("space: {args: {learning_rate: {type: float, low: 0.1, high: 1}}}", "args.learning_rate is not an option"),
        (
            "space: {args: {lr: {type: float, low: 0.0, high: 1, log: true}}}",
            "args.lr is on a log scale but its range reaches 0.0",
        ),
        (
            "space: {args: {batch_size: {type: categorical, choices: []}}}",
            "args.batch_size is categorical with no choices",
        ),
        ("space: {args: {lr: {type: float, low: 1, high: 1}}}", "args.lr has low 1 >= high 1"),
        (
            "space: {args: {model_config: {hidden_size: {type: float, low: 32, high: 128}}}}",
            "args.model_config.hidden_size=68.66873708001009 of the search space: ",
        ),
        (
            "space: {args: {model_config: {hidden_size: {type: float, low: 32, high: 128}}}}",
            "(a value drawn inside the float range: for whole numbers give it type: int)",
        ),
        ("space: {args: {lr: [type: float", "is not valid YAML: expected ',' or ']'"),
    ],
)
def test_bad_input_is_named_before_any_trial_starts(data_folder, tmp_path, capsys, change, message):
    from gears_ddp.cli import main

    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder)
    arguments = ["sweep", "--config", str(run), "--space", str(space), "--trials", "3"]
    if isinstance(change, str):
        space.write_text(change.split(": ", 1)[1])
    else:
        arguments = arguments[:-2] + change if change[0] == "--trials" else arguments + change
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error, error
    assert not folder.exists()  # a refused sweep leaves nothing


@pytest.mark.parametrize(
    "change, message",
    [
        ({"replicates": {"seeds": [1, 2]}}, "a sweep's trials are single runs; leave replicates out"),
        ({"args": {"save_path": None}}, "a sweep needs args.save_path"),
        ({"args": {"resume_from": "auto"}}, "leave args.resume_from and args.overwrite_save_path out"),
        ({"args": {"overwrite_save_path": True}}, "leave args.resume_from and args.overwrite_save_path out"),
    ],
)
def test_a_run_file_a_sweep_cannot_take_is_named_before_any_trial_starts(
    data_folder, tmp_path, capsys, change, message
):
    from gears_ddp.cli import main

    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder)
    config = yaml.safe_load(run.read_text())
    config["args"].update(change.pop("args", {}))
    run.write_text(yaml.safe_dump({**config, **change}))
    assert main(["sweep", "--config", str(run), "--space", str(space), "--trials", "3"]) == 2
    error = capsys.readouterr().err.strip()
    assert f"{run}: {message}" in error and "\n" not in error, error
    assert not folder.exists()


def test_joining_a_folder_that_holds_no_sweep_is_named(tmp_path, capsys):
    from gears_ddp.cli import main

    assert main(["sweep", "--join", str(tmp_path)]) == 2
    assert f"--join {tmp_path}: no sweep there ({tmp_path / 'sweep.yaml'}" in capsys.readouterr().err
    (tmp_path / "sweep.yaml").write_text("run: {}\n")
    assert main(["sweep", "--join", str(tmp_path)]) == 2
    assert f"{tmp_path / 'sweep.yaml'} is not a sweep's file" in capsys.readouterr().err


def test_a_sweep_folder_of_another_space_is_refused(data_folder, tmp_path, capsys):
    from gears_ddp.cli import main

    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder)
    folder.mkdir()
    plan = sweep_module.plan_sweep(
        yaml.safe_load(run.read_text()), {"args": {"lr": {"type": "float", "low": 0.001, "high": 0.01}}}, 3
    )
    write_yaml(plan.record(), folder / "sweep.yaml")
    assert main(["sweep", "--config", str(run), "--space", str(space), "--trials", "3"]) == 2
    assert f"{folder} holds a sweep of another search space" in capsys.readouterr().err
    assert main(["sweep", "--join", str(folder), "--config", str(run)]) == 2
    assert "--join takes the run file and the search space of the sweep it joins" in capsys.readouterr().err


# ---------------------------------------------------------------- a PostgreSQL server serves the study


def _postgres_binaries() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), if installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own in a temporary folder (as the postgres user when this
    runs as root, which PostgreSQL refuses to run as); yields its URL."""
    binaries = _postgres_binaries()
    if binaries is None:
        if os.environ.get("GEARS_DDP_REQUIRE_POSTGRES"):
            raise RuntimeError("GEARS_DDP_REQUIRE_POSTGRES is set but PostgreSQL's server is not installed")
        pytest.skip("PostgreSQL's server is not installed (.ci/run installs it: apt-get install postgresql)")
    import shutil
    import tempfile

    from gears_ddp.launching.environments import find_free_port

    data = Path(tempfile.mkdtemp(prefix="gears-ddp-postgres-"))  # not under pytest's folder, which only root reads
    run_as = []
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    port = find_free_port()
    subprocess.run(
        [*run_as, str(binaries / "initdb"), "-D", str(data / "db"), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *run_as,
            str(binaries / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "log"),
            "-w",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(binaries / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "stop"], capture_output=True
        )
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_a_postgresql_server_serves_one_study_to_two_processes(data_folder, tmp_path, postgres):
    import optuna

    from gears_ddp.sweeps.study import with_installed_driver

    folder = tmp_path / "sweep"
    run, space = _files(tmp_path, data_folder, folder, epochs=2)
    command = ("--config", run, "--space", space, "--trials", 3, "--storage", postgres)
    first = _sweep(*command)
    _wait_for(folder / "sweep.yaml", first)
    second = _sweep(*command)  # the same command on another "machine": the study is the database's
    logs = [process.communicate(timeout=600) for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], logs[1][1][-3000:]
    drawn = [{int(name) for name in _trial_names(err)} for _, err in logs]
    assert drawn[0] and drawn[1] and not drawn[0] & drawn[1]
    name = yaml.safe_load((folder / "sweep.yaml").read_text())["study"]
    assert name == folder.as_posix()  # the folder as given: another folder named sweep is another study
    study = optuna.load_study(study_name=name, storage=with_installed_driver(postgres))  # as the sweep reads it
    assert {trial.number for trial in study.trials} == drawn[0] | drawn[1] and len(study.trials) >= 3
    assert not (folder / "study.journal").exists()  # nothing of the study in the folder
    assert yaml.safe_load((folder / "sweep.yaml").read_text())["storage"] == postgres


# ---------------------------------------------------------------- resuming, refusing, joining (no training)


def _config(data_folder, folder, **more) -> dict:
    return {
        "pert_data_path": str(data_folder),
        "dataset_name": "toy",
        "split_config": SPLIT,
        "args": _args(folder, **more),
    }


def _journal_study(plan):
    """The study of ``plan`` in its folder's journal, as ``run_sweep`` opens it."""
    from gears_ddp.sweeps.study import load_or_create_study, open_storage

    plan.folder.mkdir(parents=True, exist_ok=True)
    return load_or_create_study(open_storage(plan.folder, None), plan.study, plan.made_by(), 0, sweep_module.PRUNER)


def _complete_report(folder: Path, values=(0.5, 0.25)) -> None:
    """A run's complete report in ``folder`` (``report.json`` with its history, the page)."""
    folder.mkdir(parents=True, exist_ok=True)
    history = [{"epoch": epoch, "val_mse_de": value} for epoch, value in enumerate(values, 1)]
    (folder / "report.json").write_text(json.dumps({"history": history, "best_epoch": len(values)}))
    (folder / "report.html").write_text("<html></html>")


def test_an_interrupted_last_trial_is_retried_when_the_sweep_runs_again(data_folder, tmp_path):
    """A sweep killed with its last trial running: the trial is marked failed and its retry
    queued, which counts in its place; the sweep run again draws the retry (in the trial's
    folder, from its checkpoint) though the study holds the sweep's one trial, then no more."""
    from optuna.trial import TrialState

    plan = sweep_module.plan_sweep(_config(data_folder, tmp_path / "sweep"), SPACE, 1)
    study = _journal_study(plan)
    left = study.ask(plan.space.distributions())  # running when its sweep was killed
    left.set_user_attr("folder", str(plan.folder / "trial-0000"))
    sweep_module._retry_abandoned(study, plan.folder)
    trials = sweep_module._Trials(plan, study)
    retry = trials.next_run()
    assert retry is not None and retry.name == "trial-0001"
    assert retry.folder == plan.folder / "trial-0000" and retry.run.args.resume_from == "auto"
    assert study.trials[0].state == TrialState.FAIL and study.trials[1].params == left.params
    assert trials.next_run() is None  # the retry counts as the sweep's one trial


def test_processes_that_draw_the_last_trial_at_once_draw_it_once(data_folder, tmp_path, monkeypatch):
    """Two processes of one sweep (--join) that count its trials at the same moment: one
    draws the last trial, the other finds the sweep full, however slow a draw is."""
    import threading
    import time

    import optuna

    plan = sweep_module.plan_sweep(_config(data_folder, tmp_path / "sweep"), SPACE, 1)
    studies = [_journal_study(plan), _journal_study(plan)]  # each process opens the study itself
    ask = optuna.Study.ask

    def slow_ask(study, *args, **kwargs):
        time.sleep(0.5)  # counted, not yet drawn: where the other process counts too
        return ask(study, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "ask", slow_ask)
    drawn = []
    processes = [
        threading.Thread(target=lambda s=s: drawn.append(sweep_module._Trials(plan, s).next_run())) for s in studies
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=30)
    assert sorted(run is None for run in drawn) == [False, True]
    assert len(studies[0].trials) == 1


def test_a_trial_whose_report_is_complete_when_its_workers_end_is_complete(data_folder, tmp_path):
    """A stop signal that reaches a trial after it wrote its report ends its workers as they
    exit (a rank killed by SIGTERM): the trial is complete, with its best epoch's value, not
    failed; so is a trial left running by a sweep killed just after its report was written."""
    from optuna.trial import TrialState

    from gears_ddp.sweeps.report import trial_rows

    plan = sweep_module.plan_sweep(_config(data_folder, tmp_path / "sweep"), SPACE, 3)
    study = _journal_study(plan)
    trials = sweep_module._Trials(plan, study)
    run = trials.next_run()
    assert run is not None
    _complete_report(run.folder)
    killed = {"status": "failed", "error": "rank 0 of 1 was killed by SIGTERM", "seconds": 9.0}
    trials.settled(run, killed, True)
    assert study.trials[0].state == TrialState.COMPLETE and study.trials[0].value == 0.25
    assert json.loads((run.folder / "trial.json").read_text())["state"] == "complete"
    left = study.ask(plan.space.distributions())  # its sweep killed (SIGKILL) after its report was written
    left.set_user_attr("folder", str(plan.folder / "trial-0001"))
    _complete_report(plan.folder / "trial-0001", (0.75, 0.5))
    sweep_module._retry_abandoned(study, plan.folder)
    assert study.trials[1].state == TrialState.COMPLETE and study.trials[1].value == 0.5
    assert len(study.trials) == 2 and [row["state"] for row in trial_rows(study)] == ["COMPLETE", "COMPLETE"]


def test_a_pruned_trial_says_when_in_trials_csv(data_folder, tmp_path):
    from gears_ddp.sweeps.report import trial_rows

    plan = sweep_module.plan_sweep(_config(data_folder, tmp_path / "sweep"), SPACE, 3)
    study = _journal_study(plan)
    trials = sweep_module._Trials(plan, study)
    run = trials.next_run()
    assert run is not None
    run.folder.mkdir(parents=True)
    trials.active[run.name]["pruned"] = (2, 8.15e7)
    trials.settled(run, {"status": "failed", "error": "rank 0 of 1 was killed by SIGTERM"}, False)
    assert trial_rows(study)[0]["note"] == "pruned after epoch 2"
    assert json.loads((run.folder / "trial.json").read_text())["note"] == "pruned after epoch 2"


def test_a_folder_that_holds_a_run_is_refused_before_anything_is_written(data_folder, tmp_path, capsys):
    from gears_ddp.cli import main

    folder = tmp_path / "demo"
    run, space = _files(tmp_path, data_folder, folder)
    _complete_report(folder)
    write_yaml(_config(data_folder, folder), folder / "config.yaml")
    before = sorted(path.name for path in folder.iterdir())
    assert main(["sweep", "--config", str(run), "--space", str(space), "--trials", "2"]) == 2
    error = capsys.readouterr().err.strip()
    assert f"save_path {folder} holds a single run (its config.yaml), not a sweep" in error, error
    assert "choose another save_path" in error and "\n" not in error
    assert sorted(path.name for path in folder.iterdir()) == before


def test_sweeps_of_one_database_in_folders_of_one_name_are_two_studies(data_folder, tmp_path):
    """runs/x/dbsweep and runs/y/dbsweep given one database: each its own study (the second
    would otherwise report the first's trials as its own and train none)."""
    from gears_ddp.sweeps.study import load_or_create_study, open_storage

    storage = f"sqlite:///{tmp_path / 'sweeps.db'}"
    plans = [
        sweep_module.plan_sweep(_config(data_folder, tmp_path / name / "dbsweep"), SPACE, 2, storage)
        for name in ("x", "y")
    ]
    assert plans[0].study != plans[1].study
    first, second = (
        load_or_create_study(open_storage(plan.folder, storage), plan.study, plan.made_by(), 0, sweep_module.PRUNER)
        for plan in plans
    )
    first.ask(plans[0].space.distributions())
    assert len(first.trials) == 1 and second.trials == []


def _no_training(monkeypatch):
    """Sweeps that draw no trial: what they check and write before training, and the report."""
    monkeypatch.setattr(sweep_module._Trials, "next_run", lambda self: None)


def test_resuming_with_another_run_is_refused_and_a_raised_trial_count_is_recorded(data_folder, tmp_path, monkeypatch):
    """Only the devices and the number of trials may change when a sweep continues: another
    run option (more epochs) is refused naming it; a raised count is written to sweep.yaml,
    which --join reads; another --seed continues the study (a continuing process seeds its
    draws afresh), the sweep's seed kept."""
    _no_training(monkeypatch)
    folder = tmp_path / "sweep"
    sweep_module.run_sweep(sweep_module.plan_sweep(_config(data_folder, folder), SPACE, 3))
    with pytest.raises(sweep_module.SweepError) as refused:
        sweep_module.run_sweep(sweep_module.plan_sweep(_config(data_folder, folder, epochs=2), SPACE, 3))
    assert f"{folder} holds a sweep of another run (args.epochs: 12 there, 2 here;" in str(refused.value)
    again = _config(data_folder, folder, cpu_processes=2)  # other devices
    sweep_module.run_sweep(sweep_module.plan_sweep(again, SPACE, 5, seed=7))
    held = yaml.safe_load((folder / "sweep.yaml").read_text())
    assert held["trials"] == 5 and held["seed"] == 0
    assert sweep_module.joining_plan(folder, ["args.cpu_processes=1"]).trials == 5
    with pytest.raises(sweep_module.SweepError, match="holds a sweep of another run .args.lr: 0.001 there, 0.01 here"):
        sweep_module.run_sweep(sweep_module.joining_plan(folder, ["args.lr=0.01"]), joining=True)


def test_gpus_join_a_sweep_started_on_cpu_processes(data_folder, tmp_path, monkeypatch):
    """docs/sweeps.md's --join ... --set gpu_ids=[0,1] on a sweep whose run file says
    cpu_processes: 2 (the demo's): the devices given replace the sweep's."""
    _no_training(monkeypatch)
    folder = tmp_path / "sweep"
    config = _config(data_folder, folder, cpu_processes=2, cpu_threads=1)
    sweep_module.run_sweep(sweep_module.plan_sweep(config, SPACE, 3))
    joined = sweep_module.joining_plan(folder, ["gpu_ids=[0,1]"])
    assert joined.config["gpu_ids"] == [0, 1] and joined.config["args"]["cpu_processes"] is None
    assert joined.config["args"]["cpu_threads"] is None  # the threads of the CPU processes it replaces
    assert joined.config["args"]["epochs"] == 12


def test_a_continued_sweep_says_what_another_trial_count_does(caplog):
    """--trials of a continued sweep: more draws more; fewer than are drawn draws none and
    keeps them all, which it says rather than ending without a word."""
    with caplog.at_level("INFO", logger="gears_ddp"):
        sweep_module._say_the_new_count(12, 6, 6)
        sweep_module._say_the_new_count(6, 12, 12)
        sweep_module._say_the_new_count(6, 12, 4)
    said = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert said == [
        ("INFO", "the sweep held 6 trials; --trials 12 draws 6 more"),
        (
            "WARNING",
            "the sweep held 12 trials, and 12 are drawn already: --trials 6 draws none more and removes none "
            "(its report ranks all 12); give --trials above 12 to train more",
        ),
        ("INFO", "the sweep held 12 trials; --trials 6 draws 2 more, not 8"),
    ]


def test_the_importances_picture_says_which_trials_it_ranks_by(data_folder, tmp_path, monkeypatch):
    """Optuna ranks the settings by the complete trials alone: the picture says how many, and
    how many pruned ones it left out."""
    from gears_ddp.report import plots
    from gears_ddp.sweeps import report

    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: drawn.setdefault(Path(path).name, figure))
    plan = sweep_module.plan_sweep(_config(data_folder, tmp_path / "sweep"), SPACE, 4)
    keys = ["args.lr", "args.model_config.hidden_size"]
    rows = [
        {"number": number, "state": state, "value": value, "args.lr": 0.003, "args.model_config.hidden_size": 8}
        for number, (state, value) in enumerate([("COMPLETE", 0.3), ("PRUNED", 0.9), ("COMPLETE", 0.2), ("FAIL", None)])
    ]
    report._pictures(tmp_path, rows, keys, plan, {"args.lr": 0.7, "args.model_config.hidden_size": 0.3})
    label = drawn["sweep_importances.png"].axes[0].get_xlabel()
    assert label == "importance (Optuna's PED-ANOVA) over the 2 complete trials; the 1 pruned left out"
