"""How many CPU threads a training process uses, and how its OpenMP threads wait.

torch's default is one thread per core of the machine. On a shared node that goes wrong in
three ways: the process may be allowed fewer cores (CPU affinity, set by Slurm or taskset)
or less CPU time (a cgroup quota, set by container runtimes and Slurm), other ranks of the
same job share the node's cores, and other jobs may keep cores busy. An extra thread then
waits for a core another process holds, and OpenMP threads spin while they wait, so the
loss is far larger than the missing cores; ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep while
they wait) recovers most of it, at the cost of waking the threads for each parallel
operation, which an idle machine pays (``benchmarks/bench_threads.py`` measures both;
``benchmarks/RESULTS.md`` has the figures).

A forked process gets one thread (``single_threaded_forks``). So: ranks share the usable
cores evenly (``cpu_threads``), unless the run gives their count (``args.cpu_threads``, which a
CPU run's config.yaml records, as the order of a CPU's sums follows it); training in one
process uses at most the usable cores (``at_most_usable_threads``); and spawned workers that
share the machine's cores with other ranks wait passively (``passive_openmp_environment``),
while a worker alone on the machine keeps OpenMP's default, as the calling process does.
OpenMP reads its settings when torch is imported, so a process that is already running keeps
its own: set ``OMP_WAIT_POLICY=PASSIVE`` before starting Python on a shared node. Settings
the user made (``OMP_NUM_THREADS``, where the run gives no ``args.cpu_threads``;
``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) are always kept.
"""

from __future__ import annotations

import contextlib
import os

import torch
from joblib import cpu_count

OPENMP_WAITING = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota."""
    return max(1, cpu_count())


def cpu_threads(local_processes: int = 1, requested: int | None = None) -> int:
    """Threads for one of ``local_processes`` training processes on this machine:
    ``requested`` (a run's ``args.cpu_threads``) when given, else ``OMP_NUM_THREADS`` when
    the user set it, else the usable cores shared evenly. The order in which a CPU's sums add
    up follows the count, so a run's figures do too (bit for bit the same with the same count)."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, usable_cores() // local_processes)


@contextlib.contextmanager
def torch_threads(count: int):
    """While active, torch computes with ``count`` threads; the previous count is restored
    on exit."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def at_most_usable_threads():
    """While active, torch uses no more threads than the usable cores (fewer if set so
    already); the previous count is restored on exit."""
    return torch_threads(min(torch.get_num_threads(), cpu_threads()))


@contextlib.contextmanager
def passive_openmp_environment():
    """While active, processes started from this one get ``OMP_WAIT_POLICY=PASSIVE``, unless
    the user chose how OpenMP waits; the environment is restored on exit."""
    if any(name in os.environ for name in OPENMP_WAITING):
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)


def single_threaded_forks() -> None:
    """Give every process forked from this one a single torch thread. torch's OpenMP threads
    do not survive a fork: a forked child that runs a parallel operation waits for threads
    that are not there, for ever. Forking is multiprocessing's default on Linux, and the
    published GEARS's users fork: its paper scores GI_predict over a ``Pool`` of processes
    (``paper/predicting_GIs.py``), where gears_ddp's scores run on torch. torch's own
    DataLoader workers take one thread likewise; spawned processes (``train_multi_gpu``,
    screens) are not forks and set their own."""
    os.register_at_fork(after_in_child=lambda: torch.set_num_threads(1))
