"""Processes forked from one that uses gears_ddp: each gets one torch thread and runs torch's
parallel operations (a fork inherits no OpenMP threads, and would otherwise wait for them)."""

import multiprocessing

import torch

import gears_ddp  # noqa: F401 (importing it is what sets forked processes to one thread)


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
