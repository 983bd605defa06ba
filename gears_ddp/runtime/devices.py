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
