"""Processes forked from one that uses gears_ddp: each gets one torch thread and runs torch's
parallel operations (a fork inherits no OpenMP threads, and would otherwise wait for them).
Processes started for ranks that share the machine's cores: their OpenMP threads wait passively
unless the user chose how; a process alone on the machine keeps OpenMP's default."""

import json
import multiprocessing
import os
import subprocess
import sys
import time

import torch

import gears_ddp  # noqa: F401 (importing it is what sets forked processes to one thread)
from gears_ddp.launching.supervisor import SpawnedWorkers
from gears_ddp.runtime import threads
from gears_ddp.runtime.threads import OPENMP_WAITING, passive_openmp_environment


def _threads_and_work(_):
    values = torch.randn(300, 300, dtype=torch.float64)
    return torch.get_num_threads(), float(torch.cdist(values, values).sum())


def test_a_forked_process_gets_one_torch_thread_and_finishes():
    torch.set_num_threads(2)
    values = torch.randn(1000, 1000)
    (values @ values).sum()  # the parent's thread pool is running
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(_threads_and_work, range(2)).get(timeout=120)
    assert [threads for threads, _ in results] == [1, 1]
    assert all(work > 0 for _, work in results)


def test_a_rank_s_threads_are_the_run_s_count_else_omp_num_threads_else_the_cores_shared(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [threads.cpu_threads(ranks) for ranks in (1, 2, 3, 16)] == [8, 4, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.cpu_threads(2) == 3
    assert threads.cpu_threads(2, requested=5) == 5  # args.cpu_threads, as config.yaml records it


def _started_process_sees() -> dict:
    """The OpenMP waiting settings a process started now finds."""
    program = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {OPENMP_WAITING}}}))"
    shown = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout)


def test_processes_started_for_ranks_wait_passively_unless_the_user_chose(monkeypatch):
    for name in OPENMP_WAITING:
        monkeypatch.delenv(name, raising=False)
    with passive_openmp_environment():
        assert _started_process_sees() == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    assert not any(name in os.environ for name in OPENMP_WAITING)  # this process's environment as it was
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    with passive_openmp_environment():
        assert _started_process_sees() == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "1000"}


def _report_openmp_waiting(local_rank, messages):
    messages.put((local_rank, os.environ.get("OMP_WAIT_POLICY")))


def _spawned_see(nprocs: int, ranks_on_machine: int | None) -> list:
    """The ``OMP_WAIT_POLICY`` each of ``nprocs`` spawned workers finds."""
    workers = SpawnedWorkers(_report_openmp_waiting, (), nprocs, ranks_on_machine=ranks_on_machine)
    try:
        deadline = time.monotonic() + 120
        while not workers.finished():
            assert time.monotonic() < deadline, "the spawned workers did not finish in 120 s"
            time.sleep(0.05)
        return [policy for _, policy in sorted(workers.result())]
    finally:
        workers.close()


def test_spawned_workers_wait_passively_only_where_processes_share_the_cores(monkeypatch):
    for name in OPENMP_WAITING:
        monkeypatch.delenv(name, raising=False)
    assert _spawned_see(2, None) == ["PASSIVE", "PASSIVE"]  # train_multi_gpu's ranks on one machine
    assert _spawned_see(1, 2) == ["PASSIVE"]  # one run's rank beside another run's (replicates, sweeps)
    # alone on the machine (one run at a time of a sweep or replicates, one pair-screen worker):
    # OpenMP's default, as in the calling process; passive waits made such an epoch 3x slower
    assert _spawned_see(1, 1) == [None]
    assert _spawned_see(1, None) == [None]
    assert "OMP_WAIT_POLICY" not in os.environ
