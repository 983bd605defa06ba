"""Processes forked from one that uses gears_ddp: each gets one torch thread and runs torch's
parallel operations (a fork inherits no OpenMP threads, and would otherwise wait for them).
Processes started for ranks: their OpenMP threads wait passively unless the user chose how."""

import json
import multiprocessing
import os
import subprocess
import sys

import torch

import gears_ddp  # noqa: F401 (importing it is what sets forked processes to one thread)
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
