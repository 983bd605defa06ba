"""``device='auto'`` and Apple silicon's GPU (MPS): what is picked, and what distributed
training refuses, with torch's availability checks patched to play each machine."""

import pytest
import torch

from gears_ddp import GEARS, train_multi_gpu
from gears_ddp.runtime.devices import best_device, checked_device, resolve_devices


def _machine(monkeypatch, cuda: bool, mps: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize(
    "cuda, mps, expected", [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")]
)
def test_auto_picks_cuda_then_mps_then_the_cpu(monkeypatch, cuda, mps, expected):
    _machine(monkeypatch, cuda, mps)
    assert checked_device("auto") == torch.device(expected)


def test_mps_is_a_device_where_torch_has_it(monkeypatch):
    _machine(monkeypatch, cuda=False, mps=True)
    assert checked_device("mps") == torch.device("mps")
    _machine(monkeypatch, cuda=False, mps=False)
    with pytest.raises(ValueError, match=r"device='mps'.*Apple silicon.*mps.is_available\(\) is False"):
        checked_device("mps")
    with pytest.raises(ValueError, match=r"device='gpu' is not a device: use .*'mps' or 'auto'"):
        checked_device("gpu")


def test_gears_on_auto_runs_on_the_machines_best_device(toy):
    toy.get_dataloader(16)
    assert GEARS(toy, device="auto").device == best_device()


def test_distributed_training_refuses_mps_and_says_to_train_in_one_process(monkeypatch, data_folder):
    _machine(monkeypatch, cuda=False, mps=True)
    one_process = r"(?s)Apple silicon.*MPS.*one process with GEARS\(pert_data, device='mps'\).*cpu_processes"
    with pytest.raises(ValueError, match=one_process):
        resolve_devices()
    with pytest.raises(ValueError, match=one_process):
        train_multi_gpu(data_folder, "toy", {"split": "simulation", "seed": 1}, {"epochs": 1, "save_path": None})
    assert resolve_devices(cpu_processes=2) == [torch.device("cpu")] * 2  # CPU processes stay possible
    _machine(monkeypatch, cuda=False, mps=False)
    with pytest.raises(ValueError, match="no CUDA device is visible") as raised:
        resolve_devices()
    assert "MPS" not in str(raised.value)


def test_work_spread_over_processes_runs_on_cuda_when_torch_sees_a_gpu_else_on_the_cpu(monkeypatch):
    from gears_ddp.runtime import devices

    monkeypatch.setattr(devices, "visible_cuda_devices", lambda: 0)
    monkeypatch.setattr(devices, "mps_available", lambda: True)  # MPS runs no spawned workers
    assert devices.cuda_or_cpu() == torch.device("cpu")
    monkeypatch.setattr(devices, "visible_cuda_devices", lambda: 2)
    assert devices.cuda_or_cpu() == torch.device("cuda")
