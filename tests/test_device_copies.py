"""Batches for a GPU are gathered into pinned (page-locked) memory and copied to the device
without blocking the host; on a CPU nothing is pinned. A CPU plays the GPU here: torch's CUDA
checks are patched, tensors asked for on 'cuda' are made on the CPU, and pinning is recorded
instead of done."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from gears_ddp import GEARS
from gears_ddp.data.cells import PertBatch


def _is_cuda(value) -> bool:
    return (isinstance(value, str) and value.startswith("cuda")) or (
        isinstance(value, torch.device) and value.type == "cuda"
    )


class FakeCuda(TorchFunctionMode):
    """Runs 'cuda' work on the CPU. Records the storages pinned (``Tensor.pin_memory``,
    ``torch.empty(..., pin_memory=True)``) and every copy from the host to 'cuda' as (source
    pinned, ``non_blocking``); what is copied or made on 'cuda' gets storage of its own, known
    as the device's (moving it again is no copy)."""

    def __init__(self):
        super().__init__()
        # the tensors are kept alive, so that no other tensor takes their memory
        self.pinned_storages: dict[int, torch.Tensor] = {}
        self.device_storages: dict[int, torch.Tensor] = {}
        self.copies: list[tuple[bool, bool]] = []

    def pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.pinned_storages

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        self.pinned_storages[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        self.device_storages[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "pin_memory":
            return self.pin(args[0])
        if name == "is_pinned":
            return self.pinned(args[0])
        pin = kwargs.pop("pin_memory", False)
        made_on_device = _is_cuda(kwargs.get("device")) and name != "to"
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if name == "to" and any(_is_cuda(a) for a in (*args[1:], kwargs.get("device"))):
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
            result = func(*args, **kwargs)
            if args[0].untyped_storage().data_ptr() in self.device_storages:
                return self.on_device(result)
            non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args[2:])
            self.copies.append((self.pinned(args[0]), non_blocking))
            return self.on_device(result.clone() if result.data_ptr() == args[0].data_ptr() else result)
        result = func(*args, **kwargs)
        if made_on_device and isinstance(result, torch.Tensor):
            self.on_device(result)
        return self.pin(result) if pin else result


@pytest.fixture
def batch_copies(monkeypatch):
    """Each ``PertBatch.to`` call: (every tensor of the batch pinned, ``non_blocking``)."""
    calls = []
    to = PertBatch.to

    def recorded(batch, device, non_blocking=False):
        tensors = [
            batch.x,
            batch.y,
            batch.pert_idx,
            batch.condition,
            batch.de_idx,
            batch.sets.sets,
            batch.sets.cell_set,
            batch.sets.counts,
            batch.sets.cells_by_set,
            batch.sets.first_cell,
            batch.sets.perturbed_cells_by_set,
            batch.sets.first_perturbed_cell,
        ]
        calls.append((all(t.is_pinned() for t in tensors), non_blocking))
        return to(batch, device, non_blocking)

    monkeypatch.setattr(PertBatch, "to", recorded)
    return calls


def _train(pert_data, device: str) -> None:
    """Three eager steps (a CPU cannot play CUDA's streams and graphs: ``cuda_graphs=False``;
    a replayed step copies each batch into its graph's tensors without blocking,
    ``cuda_graphs.StaticBatches.load``) and the evaluation passes."""
    pert_data.get_dataloader(16, test_batch_size=16)
    torch.manual_seed(0)
    gears = GEARS(pert_data, device=device)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, max_steps=3, cuda_graphs=False)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_batches_are_pinned_and_copied_without_blocking_only_for_cuda(toy, monkeypatch, batch_copies, device):
    fake = FakeCuda()
    if device == "cuda":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        # no capture is underway (Adam's step asks: through torch.cuda before torch 2.13, through
        # torch.accelerator since; a CUDA build of torch with no driver would ask the CUDA runtime
        # and fail)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        if hasattr(torch, "accelerator"):
            monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
    with fake:
        _train(toy, device)
    assert len(batch_copies) >= 3  # the training steps' batches, then the evaluation passes'
    pinned = device == "cuda"
    assert all(batch_pinned == pinned and non_blocking for batch_pinned, non_blocking in batch_copies)
    assert bool(fake.pinned_storages) == pinned
    if pinned:  # everything pinned went to the device without blocking
        pinned_copies = [non_blocking for source_pinned, non_blocking in fake.copies if source_pinned]
        assert pinned_copies and all(pinned_copies)


def test_the_fake_device_sees_a_blocking_copy():
    fake = FakeCuda()
    with fake:
        torch.ones(3).pin_memory().to("cuda", non_blocking=True)
        torch.ones(3).to("cuda")
    assert fake.copies == [(True, True), (False, False)]
