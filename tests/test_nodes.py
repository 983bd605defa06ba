"""Several machines, simulated on one: two torchrun nodes (``python -m gears_ddp.launch
--config`` and ``gears-ddp train --config``) and a two-host Slurm step, 1 CPU process per node, each node
with its own copy of the dataset folder carrying other file times, as a copy to another
machine has. The run must equal a one-node run of 2 processes bit for bit, only node 0
writes the run folder, and a node whose copy differs in one value is refused by name."""

import re
import subprocess
import sys

import pytest
import torch
import toy_data
import yaml
from test_cli import _write_config
from test_launch import _clean_environment, _launch_arguments, _report

from gears_ddp.launching.environments import find_free_port
from gears_ddp.model.model_folder import read_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
THREADS = {"OMP_NUM_THREADS": 1}  # one thread per rank in every layout, so that sums run in one order


def _node_copies(data_folder, folder, count=2):
    """Node n's copy of the data folder, its files dated (n + 1) x 10^18 ns."""
    return [
        toy_data.copy_data_folder(data_folder, folder / f"node{n}", mtime_ns=(n + 1) * 10**18) for n in range(count)
    ]


def _run_nodes(commands, environments):
    """Start one process per node, wait for all; returns (return code, stdout, stderr) each."""
    processes = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_environment(**THREADS, **environment),
        )
        for command, environment in zip(commands, environments)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    return [(process.returncode, *output) for process, output in zip(processes, outputs)]


def _torchrun_nodes(node_arguments):
    """Two torchrun nodes on this machine, 1 process each, meeting at 127.0.0.1."""
    port = find_free_port()
    return _run_nodes(
        [
            [
                *TORCHRUN,
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                *arguments,
            ]
            for node, arguments in enumerate(node_arguments)
        ],
        [{}, {}],
    )


@pytest.fixture(scope="module")
def one_node_weights(data_folder, tmp_path_factory):
    """The saved weights of the same run as one node of 2 processes."""
    save_path = tmp_path_factory.mktemp("one_node") / "run"
    done = subprocess.run(
        [*TORCHRUN, "--standalone", "--nproc_per_node=2", *_launch_arguments(data_folder, save_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_environment(**THREADS),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return read_weights(save_path)


def _assert_node_zero_wrote_the_run_of_one_node(runs, save_paths, one_node_weights):
    """Both nodes finished; node 0 wrote the run folder it was given, whose weights are
    those of the one-node run, bit for bit; node 1 wrote none."""
    assert [code for code, _, _ in runs] == [0, 0], runs[0][2][-2000:] + runs[1][2][-2000:]
    saved = read_weights(save_paths[0])
    assert saved.keys() == one_node_weights.keys()
    for name, tensor in one_node_weights.items():
        assert torch.equal(saved[name], tensor), name
    assert not save_paths[1].exists()


def test_two_torchrun_nodes_with_their_own_copies_train_as_one_node(data_folder, tmp_path, one_node_weights):
    copies = _node_copies(data_folder, tmp_path)
    save_paths = [tmp_path / f"run{node}" for node in range(2)]  # each node's own disk
    runs = _torchrun_nodes([_launch_arguments(copies[n], save_paths[n]) for n in range(2)])
    _assert_node_zero_wrote_the_run_of_one_node(runs, save_paths, one_node_weights)
    assert _report(save_paths[0])["world_size"] == 2 and runs[1][1].strip() == ""  # node 1 prints no summary
    assert (save_paths[0] / "config.yaml").exists() and (save_paths[0] / "report.html").exists()


def test_gears_ddp_train_on_two_torchrun_nodes_trains_as_one_node(data_folder, tmp_path, one_node_weights):
    copies = _node_copies(data_folder, tmp_path)
    save_paths = [tmp_path / f"run{node}" for node in range(2)]
    configs = [_write_config(copies[n], copies[n], save_paths[n], epochs=1, batch_size=8) for n in range(2)]
    runs = _torchrun_nodes([["-m", "gears_ddp", "train", "--config", str(configs[n])] for n in range(2)])
    _assert_node_zero_wrote_the_run_of_one_node(runs, save_paths, one_node_weights)
    assert runs[0][1].count("best epoch") == 1 and "best epoch" not in runs[1][1]  # the summary comes from node 0
    # two CPU ranks: the run's config.yaml repeats it on one machine without torchrun or a GPU
    assert yaml.safe_load((save_paths[0] / "config.yaml").read_text())["args"]["cpu_processes"] == 2


def test_a_slurm_step_on_two_hosts_trains_as_one_node(data_folder, tmp_path, one_node_weights):
    """The variables srun sets in the one task of each of two hosts, and the rendezvous
    address and port that examples/slurm_train.sbatch exports."""
    copies = _node_copies(data_folder, tmp_path)
    save_paths = [tmp_path / f"run{node}" for node in range(2)]
    port = find_free_port()
    hosts = [
        {
            "SLURM_PROCID": node,
            "SLURM_LOCALID": 0,
            "SLURM_NODEID": node,
            "SLURMD_NODENAME": f"node0{node + 1}",
            "SLURM_NTASKS": 2,
            "SLURM_NNODES": 2,
            "SLURM_STEP_NUM_NODES": 2,
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_NODELIST": "node[01-02]",
            "SLURM_STEP_NODELIST": "node[01-02]",
            "SLURM_JOB_ID": 4242,
            "SLURM_STEPID": 0,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        for node in range(2)
    ]
    runs = _run_nodes([[sys.executable, *_launch_arguments(copies[n], save_paths[n])] for n in range(2)], hosts)
    _assert_node_zero_wrote_the_run_of_one_node(runs, save_paths, one_node_weights)
    assert "one of 1 rank(s) on its machine" in runs[0][2]  # each host counts its own task only


def test_a_node_whose_copy_differs_in_one_value_is_refused_naming_the_ranks(data_folder, tmp_path):
    copies = _node_copies(data_folder, tmp_path)
    toy_data.change_one_value(copies[1] / "toy" / "perturb_processed.h5ad", cell=5, gene=7)
    runs = _torchrun_nodes([_launch_arguments(copies[n], tmp_path / f"run{n}") for n in range(2)])
    assert all(code != 0 for code, _, _ in runs)
    for _, _, stderr in runs:  # every rank says which ranks differ, in what, and where each read its data
        refusal = re.search(
            r"ranks do not hold the same data: expression \(the expression values\): ranks \[0\] "
            r"hold \w{8}, ranks \[1\] hold \w{8} \(rank 0 read [^:]+:(\S+), rank 1 read [^:]+:(\S+)\)",
            stderr,
        )
        assert refusal, stderr[-3000:]
        assert refusal.groups() == (str(copies[0] / "toy"), str(copies[1] / "toy"))
        assert "cells (" not in stderr and "split (" not in stderr
    assert not (tmp_path / "run0" / "model.pt").exists()
