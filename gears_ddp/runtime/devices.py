"""The compute devices this machine has: CUDA GPUs, Apple silicon's GPU (MPS), the CPU."""
from __future__ import annotations

import torch


def mps_available() -> bool:
    """Whether torch can run on Apple silicon's GPU (Metal Performance Shaders)."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def best_device() -> torch.device:
    """What ``device='auto'`` picks: CUDA when torch sees a GPU, else MPS, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda")
    if mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def checked_device(device) -> torch.device:
    """``device`` as a torch device that this machine has (``'auto'``: ``best_device()``);
    otherwise a ValueError that says what there is."""
    if device == "auto":
        return best_device()
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a device: use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto' "
                         f"({err})") from None
    if checked.type == "cuda":
        count = visible_cuda_devices()
        if count == 0:
            raise ValueError(f"device={device!r}, but torch sees no CUDA GPU (torch.cuda.is_available() is False; "
                             f"torch {torch.__version__}): use device='cpu', or install a CUDA build of torch")
        if (checked.index or 0) >= count:
            raise ValueError(f"device={device!r}, but torch sees {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    if checked.type == "mps" and not mps_available():
        raise ValueError(f"device={device!r}, but torch cannot use Apple silicon's GPU here "
                         f"(torch.backends.mps.is_available() is False; torch {torch.__version__}): use "
                         f"device='cpu' or 'auto'")
    return checked


def visible_cuda_devices() -> int:
    """How many CUDA GPUs torch sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
