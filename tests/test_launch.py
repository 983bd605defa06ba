"""python -m gears_ddp.launch under torchrun and under (simulated) Slurm, 2 CPU processes."""
import json
import os
import subprocess
import sys

import pytest

from gears_ddp.distributed.runtime import find_free_port

pytestmark = pytest.mark.distributed

def _placement_line(threads: int) -> str:
    """Rank 0's log line when it knows it is one of the 2 ranks of its machine."""
    return f"rank 0 on cpu, one of 2 rank(s) on its machine, with {threads} thread(s)"

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "OMP_NUM_THREADS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                      "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
                      "SLURM_JOB_ID")


def _clean_environment(**extra):
    environment = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    environment.update({k: str(v) for k, v in extra.items()})
    return environment


def _launch_arguments(data_folder, save_path):
    args = {"epochs": 1, "batch_size": 8, "model_config": {"hidden_size": 8}, "save_path": str(save_path)}
    return ["-m", "gears_ddp.launch", "--data-path", str(data_folder), "--dataset", "toy",
            "--args-json", json.dumps(args)]


def _report(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_torchrun_two_processes(data_folder, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               *_launch_arguments(data_folder, tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_clean_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(done.stdout)
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert (tmp_path / "run" / "model.pt").exists()
    assert _placement_line(1) in done.stderr  # torchrun sets OMP_NUM_THREADS=1 for 2 processes per machine


def test_slurm_two_tasks(data_folder, tmp_path):
    port = find_free_port()
    processes = [subprocess.Popen([sys.executable, *_launch_arguments(data_folder, tmp_path / "run")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_clean_environment(SLURM_PROCID=rank, SLURM_NTASKS=2, SLURM_LOCALID=rank,
                                                         SLURM_STEP_TASKS_PER_NODE=2, SLURM_NODEID=0,
                                                         SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID=42,
                                                         MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                 for rank in (0, 1)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    report = _report(outputs[0][0])
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert outputs[1][0].strip() == ""  # rank 1 prints nothing
    # each of the 2 tasks of the machine takes half the cores this process may use
    assert _placement_line(max(1, len(os.sched_getaffinity(0)) // 2)) in outputs[0][1]


def test_outside_torchrun_and_slurm_it_says_what_to_do(data_folder, tmp_path):
    done = subprocess.run([sys.executable, *_launch_arguments(data_folder, tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env=_clean_environment())
    assert done.returncode != 0 and "must be started by torchrun or srun" in done.stderr
