"""Launching: the cluster environments read from the launchers' variables (and read nowhere
else), and runs started by torchrun and by (simulated) Slurm, 2 CPU processes: each process
runs ``gears-ddp train --config`` (here through its alias ``python -m gears_ddp.launch``)."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gears_ddp.launching import environments
from gears_ddp.launching.environments import (
    DEFAULT_RENDEZVOUS_PORT,
    LocalEnvironment,
    SlurmEnvironment,
    TorchrunEnvironment,
    find_free_port,
    first_slurm_host,
    is_restart,
    pick_environment,
    publish_rendezvous_address,
    this_job,
)

PACKAGE = Path(__file__).resolve().parent.parent / "gears_ddp"


def _placement_line(threads: int) -> str:
    """Rank 0's log line when it knows it is one of the 2 ranks of its machine."""
    return f"rank 0 on cpu, one of 2 rank(s) on its machine, with {threads} thread(s)"


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "host0",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "123456",
}


# ----------------------------------------------------------------------------- environments


def test_torchrun_variables():
    env = pick_environment(TORCHRUN)
    assert env == TorchrunEnvironment(3, 8, 1, 4, "host0", 29500) and type(env) is TorchrunEnvironment
    assert env.name == "torchrun" and env.started_by_a_launcher


def test_torchrun_takes_precedence_over_slurm():
    assert type(pick_environment({**SLURM, **TORCHRUN})) is TorchrunEnvironment


def test_slurm_variables_derive_address_and_port():
    env = pick_environment(SLURM)
    assert env == SlurmEnvironment(5, 8, 1, 4, "gpu07", 20000 + 123456 % 20000) and type(env) is SlurmEnvironment
    assert env.name == "slurm" and env.started_by_a_launcher


@pytest.mark.parametrize(
    "per_node, node, expected", [("4(x2)", 0, 4), ("2(x3),1", 3, 1), ("2(x3),1", 2, 2), ("3,1,2", 2, 2), ("1", 0, 1)]
)
def test_slurm_tasks_on_this_node(per_node, node, expected):
    environ = {
        **SLURM,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_NODEID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_PROCID": "0",
    }
    assert pick_environment(environ).local_world_size == expected


def test_slurm_master_variables_override():
    env = pick_environment({**SLURM, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "12345"})
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 12345)


def test_slurm_without_address_port_or_tasks_fails():
    for missing, named in (
        ("SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST"),
        ("SLURM_JOB_ID", "SLURM_JOB_ID"),
        ("SLURM_STEP_TASKS_PER_NODE", "srun"),
    ):
        with pytest.raises(ValueError, match=named):
            pick_environment({k: v for k, v in SLURM.items() if k != missing})


def test_no_launcher_gives_none():
    assert pick_environment({"PATH": "/usr/bin", "MASTER_PORT": "1234"}) is None


@pytest.mark.parametrize("missing", ["WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_missing_torchrun_variable(missing):
    environ = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        pick_environment(environ)


@pytest.mark.parametrize(
    "override, variable",
    [
        ({"RANK": "8"}, "RANK"),
        ({"RANK": "-1"}, "RANK"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK"),
        ({"WORLD_SIZE": "eight"}, "WORLD_SIZE"),
    ],
)
def test_invalid_torchrun_values(override, variable):
    with pytest.raises(ValueError, match=variable):
        pick_environment({**TORCHRUN, **override})


def test_invalid_slurm_rank():
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        pick_environment({**SLURM, "SLURM_PROCID": "8"})


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("node01", "node01"),
        ("node[01-03,07]", "node01"),
        ("gpu[1-2],cpu5", "gpu1"),
        ("a[3,1]-ib,b3", "a3-ib"),
        ("r[2-3]n[01-02],x", "r2n01"),
        (" n[098-101] ", "n098"),
    ],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


@pytest.mark.parametrize(
    "environ, detected",
    [
        (TORCHRUN, {TorchrunEnvironment}),
        (SLURM, {SlurmEnvironment}),
        ({**SLURM, **TORCHRUN}, {TorchrunEnvironment, SlurmEnvironment}),
        ({"MASTER_PORT": "1234", "LOCAL_RANK": "0"}, {LocalEnvironment}),
        ({}, {LocalEnvironment}),
    ],
)
def test_each_environment_detects_its_own_variables(environ, detected):
    classes = {LocalEnvironment, TorchrunEnvironment, SlurmEnvironment}
    assert {environment for environment in classes if environment.detect(environ)} == detected


def test_a_local_rendezvous_port_is_the_given_one_else_master_port_else_the_default_or_a_free_one():
    assert LocalEnvironment.rendezvous_port(34567, environ={"MASTER_PORT": "23456"}) == 34567
    assert LocalEnvironment.rendezvous_port(environ={"MASTER_PORT": "23456"}) == 23456
    assert LocalEnvironment.rendezvous_port(default=DEFAULT_RENDEZVOUS_PORT, environ={}) == 12355
    free = LocalEnvironment.rendezvous_port(environ={})
    assert 1 <= free <= 65535 and free != DEFAULT_RENDEZVOUS_PORT
    for port, environ in ((70000, {}), (None, {"MASTER_PORT": "0"})):
        with pytest.raises(ValueError, match="not a TCP port"):
            LocalEnvironment.rendezvous_port(port, environ=environ)
    with pytest.raises(ValueError, match="MASTER_PORT"):
        LocalEnvironment.rendezvous_port(environ={"MASTER_PORT": "eleven"})


def test_spawned_local_ranks_meet_on_this_machine_in_their_place_among_its_ranks():
    ranks = LocalEnvironment.spawned(2, 29999, first_local_rank=2, local_world_size=4)
    assert ranks == [LocalEnvironment(0, 2, 2, 4, "127.0.0.1", 29999), LocalEnvironment(1, 2, 3, 4, "127.0.0.1", 29999)]
    assert LocalEnvironment.spawned(2, 29999)[1] == LocalEnvironment(1, 2, 1, 2, "127.0.0.1", 29999)
    assert LocalEnvironment.name == "local processes" and not LocalEnvironment.started_by_a_launcher


def test_the_rendezvous_address_is_published_for_env_rendezvous():
    environ: dict = {}
    publish_rendezvous_address("10.0.0.2", 23456, environ)
    assert environ == {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "23456"}


def test_torchrun_restart_attempt_and_the_scheduler_job():
    assert TorchrunEnvironment.restart_attempt({}) == "0"
    assert TorchrunEnvironment.restart_attempt({"TORCHELASTIC_RESTART_COUNT": "2"}) == "2"
    assert this_job({}) is None and not is_restart(None)
    torchrun = this_job({"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert torchrun == {"scheduler": "torchrun", "id": "r1", "attempt": [1]} and is_restart(torchrun)
    assert this_job({"TORCHELASTIC_RESTART_COUNT": "0"}) == {"scheduler": "torchrun", "id": "?", "attempt": [0]}
    slurm = this_job({"SLURM_JOB_ID": "42"})
    assert slurm == {"scheduler": "slurm", "id": "42", "attempt": [0]} and not is_restart(slurm)
    both = this_job({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "x"})
    assert both == {"scheduler": "slurm", "id": "42", "attempt": [1, 0]} and is_restart(both)


def test_only_slurm_requeues_and_only_on_sigusr1(monkeypatch):
    calls = []
    monkeypatch.setattr(environments.subprocess, "run", lambda command, **_: calls.append(command) or _Done())
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    slurm = SlurmEnvironment(0, 2, 0, 2, "host", 20042)
    slurm.requeue_on("SIGTERM")
    TorchrunEnvironment(0, 2, 0, 2, "host", 29500).requeue_on("SIGUSR1")
    LocalEnvironment(0, 2, 0, 2, "127.0.0.1", 29500).requeue_on("SIGUSR1")
    assert calls == []
    slurm.requeue_on("SIGUSR1")
    assert calls == [["scontrol", "requeue", "42"]]


class _Done:
    returncode, stderr = 0, ""


# ----------------------------------------------------------------------------- one module reads the variables

LAUNCHERS_VARIABLE = re.compile(r"MASTER_PORT|MASTER_ADDR|SLURM_|TORCHELASTIC|LOCAL_RANK")


def test_only_the_environments_module_names_the_launchers_variables():
    naming = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if LAUNCHERS_VARIABLE.search(path.read_text(encoding="utf-8"))
    )
    assert naming == ["gears_ddp/launching/environments.py"]


def test_a_placement_is_made_in_one_function():
    makers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == (
                        "Placement"
                    ):
                        makers.add(f"{path.relative_to(PACKAGE.parent)}:{function.name}")
    assert makers == {"gears_ddp/launching/rank_training.py:place"}
    assert sum(text.count("Placement(") for text in _package_texts()) == 1


def _package_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")]


# ----------------------------------------------------------------------------- runs under a launcher


LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
)


def _clean_environment(**extra):
    environment = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    environment.update({k: str(v) for k, v in extra.items()})
    return environment


def _run_script(script) -> subprocess.CompletedProcess:
    """Run the Python file ``script`` as a user runs one (``python script.py``), without the
    launchers' variables; its output captured."""
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_clean_environment()
    )


def _launch_arguments(data_folder, save_path, **args):
    """The command-line arguments after ``python`` (or torchrun) that train the toy data into
    ``save_path``, from a configuration file written beside it."""
    config = {
        "pert_data_path": str(data_folder),
        "dataset_name": "toy",
        "split_config": {"split": "simulation", "seed": 1},
        "args": {
            "epochs": 1,
            "batch_size": 8,
            "model_config": {"hidden_size": 8},
            "save_path": str(save_path),
            "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
            **args,
        },
    }
    path = Path(f"{save_path}.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return ["-m", "gears_ddp.launch", "--config", str(path)]


def _report(save_path) -> dict:
    """The run report rank 0 wrote."""
    return json.loads((Path(save_path) / "report.json").read_text(encoding="utf-8"))


@pytest.mark.distributed
def test_torchrun_two_processes(data_folder, tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *_launch_arguments(data_folder, tmp_path / "run"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_clean_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(tmp_path / "run")
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert (tmp_path / "run" / "model.pt").exists()
    assert done.stdout.count("best epoch 1 of 1, 2 process(es)") == 1  # rank 0's summary, once
    assert _placement_line(1) in done.stderr  # torchrun sets OMP_NUM_THREADS=1 for 2 processes per machine


@pytest.mark.distributed
def test_slurm_two_tasks(data_folder, tmp_path):
    port = find_free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, *_launch_arguments(data_folder, tmp_path / "run")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_environment(
                SLURM_PROCID=rank,
                SLURM_NTASKS=2,
                SLURM_LOCALID=rank,
                SLURM_STEP_TASKS_PER_NODE=2,
                SLURM_NODEID=0,
                SLURM_JOB_NODELIST="localhost",
                SLURM_JOB_ID=42,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    report = _report(tmp_path / "run")
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert "best epoch 1 of 1" in outputs[0][0] and outputs[1][0].strip() == ""  # rank 1 prints nothing
    # each of the 2 tasks of the machine takes half the cores this process may use
    assert _placement_line(max(1, len(os.sched_getaffinity(0)) // 2)) in outputs[0][1]


@pytest.mark.distributed
def test_the_launch_module_is_the_train_command():
    """``python -m gears_ddp.launch`` is ``gears-ddp train``: one way to start a rank."""
    launch, train = (
        subprocess.run(
            [sys.executable, "-m", *module, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            env=_clean_environment(),
        )
        for module in (["gears_ddp.launch"], ["gears_ddp", "train"])
    )
    assert launch.returncode == train.returncode == 0
    assert launch.stdout == train.stdout and "--config" in launch.stdout
