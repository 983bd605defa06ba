"""The process-group plumbing: devices and gloo groups (the launchers' variables: test_launch.py)."""

import gc
import logging
import os
import socket
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gears_ddp.launching import process_group
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.process_group import backend_for, cleanup_ddp, setup_ddp
from gears_ddp.runtime.devices import resolve_devices

# ----------------------------------------------------------------------------- ports and devices


def test_find_free_port_can_be_bound():
    port = find_free_port()
    assert 1 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_cpu_processes():
    assert resolve_devices(cpu_processes=3) == [torch.device("cpu")] * 3


@pytest.mark.parametrize("kwargs", [{"n_gpus": 1}, {"gpu_ids": [0]}])
def test_cpu_processes_with_gpu_arguments_fails(kwargs):
    with pytest.raises(ValueError, match="cpu_processes"):
        resolve_devices(cpu_processes=2, **kwargs)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_cpu_processes_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="cpu_processes"):
        resolve_devices(cpu_processes=bad)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.parametrize("kwargs", [{}, {"n_gpus": 1}, {"gpu_ids": [0]}])
def test_no_cuda_points_to_cpu_processes(no_cuda, kwargs):
    with pytest.raises(ValueError, match="no CUDA device is visible.*cpu_processes"):
        resolve_devices(**kwargs)


def test_gpu_ids_order_is_rank_order(two_gpus):
    assert resolve_devices(gpu_ids=[1, 0]) == [torch.device("cuda:1"), torch.device("cuda:0")]


def test_gpu_ids_with_matching_n_gpus(two_gpus):
    assert resolve_devices(n_gpus=1, gpu_ids=[1]) == [torch.device("cuda:1")]


def test_gpu_id_out_of_range(two_gpus):
    with pytest.raises(ValueError, match=r"\[2\].*2 device\(s\) are visible"):
        resolve_devices(gpu_ids=[2])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_gpus": True}, "n_gpus must be an integer"),
        ({"gpu_ids": "01"}, "gpu_ids must be a list"),
        ({"gpu_ids": [0, 1.0]}, "gpu_ids must be a list"),
        ({"gpu_ids": []}, "gpu_ids is empty"),
        ({"n_gpus": 1, "gpu_ids": [0, 1]}, "disagrees"),
    ],
)
def test_a_malformed_gpu_request_fails_before_any_gpu_is_looked_at(no_cuda, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_devices(**kwargs)


def test_duplicate_gpu_ids(two_gpus):
    with pytest.raises(ValueError, match="more than once"):
        resolve_devices(gpu_ids=[1, 1])


def test_too_many_gpus(two_gpus):
    with pytest.raises(ValueError, match="n_gpus=3.*2 visible"):
        resolve_devices(n_gpus=3)


def test_all_visible_gpus_by_default(two_gpus):
    assert resolve_devices() == [torch.device("cuda:0"), torch.device("cuda:1")]
    assert resolve_devices(n_gpus=1) == [torch.device("cuda:0")]


def test_n_gpus_disagrees_with_gpu_ids(two_gpus):
    with pytest.raises(ValueError, match="n_gpus=1 disagrees"):
        resolve_devices(n_gpus=1, gpu_ids=[0, 1])


def test_n_gpus_below_one(two_gpus):
    with pytest.raises(ValueError, match="n_gpus"):
        resolve_devices(n_gpus=0)


def test_backend_for():
    assert backend_for(torch.device("cuda:1")) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"


# ----------------------------------------------------------------------------- process groups


@pytest.mark.distributed
def test_rank_that_never_joins(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # setup_ddp writes them; restore afterwards
        monkeypatch.setenv(name, os.environ.get(name, "unset"))
    port = find_free_port()
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as info:
            setup_ddp(0, 2, "cpu", "127.0.0.1", port, timeout_s=2)
    finally:
        cleanup_ddp()
    assert time.monotonic() - start < 12
    message = str(info.value)
    assert "rank 0" in message and "1 of the 2 ranks joined, the others did not" in message
    assert "world size 2" in message and f"127.0.0.1:{port}" in message and "2 s" in message
    assert info.value.__cause__ is not None
    assert not dist.is_initialized()


def test_ranks_wait_for_each_other_at_the_meeting_store():
    store = dist.HashStore()
    waited = []

    def rank(number):
        process_group._wait_for_ranks(store, number, 3, "here", timeout_s=10)
        waited.append(number)

    threads = [threading.Thread(target=rank, args=(number,)) for number in (0, 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert waited == []  # two of three: both wait
    rank(2)  # the last to join wakes the others
    for thread in threads:
        thread.join(timeout=5)
    assert sorted(waited) == [0, 1, 2]


def test_rank_0_says_how_many_ranks_joined_while_it_waits_and_at_the_timeout(monkeypatch, caplog):
    """A script that starts fewer processes than its world size hears of it while it waits,
    not only at the timeout (which is 10 minutes unless set)."""
    monkeypatch.setattr(process_group, "JOIN_NOTICE_EVERY_S", 0.2)
    store = dist.HashStore()
    store.add("joined", 1)  # rank 1 has joined; rank 2 never comes
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="gears_ddp"), pytest.raises(TimeoutError) as info:
        process_group._wait_for_ranks(store, 0, 3, "127.0.0.1:12355", timeout_s=0.9)
    assert 0.9 <= time.monotonic() - start < 5
    notices = [record.getMessage() for record in caplog.records if "waiting for the ranks" in record.getMessage()]
    assert len(notices) >= 3
    assert notices[0].startswith("waiting for the ranks to join at 127.0.0.1:12355: 2 of 3 have after 0 s")
    assert "2 of the 3 ranks joined, the others did not" in str(info.value)
    assert "nprocs" in str(info.value) and "world_size" in str(info.value)


def test_setup_ddp_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank 2"):
        setup_ddp(2, 2, master_port=1234)


@pytest.mark.distributed
def test_cleanup_collects_a_dropped_ddp_model_while_python_still_runs(monkeypatch):
    """A DDP model can live in reference cycles; left to the collection at interpreter shutdown,
    releasing it can abort a finished worker (a gloo thread then waits for the interpreter
    lock). ``cleanup_ddp`` collects it first."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # setup_ddp writes them; restore afterwards
        monkeypatch.setenv(name, os.environ.get(name, "unset"))
    gc.disable()  # only cleanup_ddp may collect here
    try:
        setup_ddp(0, 1, "cpu", "127.0.0.1", find_free_port())
        model = DistributedDataParallel(torch.nn.Linear(4, 4))
        model(torch.ones(8, 4)).sum().backward()
        model.__dict__["in_a_cycle"] = model  # as DDP's own hooks can leave it
        dropped = weakref.ref(model)
        del model
        assert dropped() is not None
        cleanup_ddp()
        assert dropped() is None and not dist.is_initialized()
    finally:
        gc.enable()
        cleanup_ddp()
