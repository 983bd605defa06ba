"""Runs started by torchrun and by (simulated) Slurm, 2 CPU processes: each process runs
``gears-ddp train --config`` (here through its alias ``python -m gears_ddp.launch``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gears_ddp.distributed.process_group import find_free_port

pytestmark = pytest.mark.distributed


def _placement_line(threads: int) -> str:
    """Rank 0's log line when it knows it is one of the 2 ranks of its machine."""
    return f"rank 0 on cpu, one of 2 rank(s) on its machine, with {threads} thread(s)"


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


def _launch_arguments(data_folder, save_path, **args):
    """The command-line arguments after ``python`` (or torchrun) that train the toy data into
    ``save_path``, from a configuration file written beside it."""
    config = {
        "pert_data_path": str(data_folder),
        "dataset_name": "toy",
        "split_config": {"split": "simulation", "seed": 1},
        "args": {"epochs": 1, "batch_size": 8, "model_config": {"hidden_size": 8}, "save_path": str(save_path), **args},
    }
    path = Path(f"{save_path}.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return ["-m", "gears_ddp.launch", "--config", str(path)]


def _report(save_path) -> dict:
    """The run report rank 0 wrote."""
    return json.loads((Path(save_path) / "report.json").read_text(encoding="utf-8"))


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
