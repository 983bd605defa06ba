"""Deterministic algorithms for a run (``deterministic: True``).

On a GPU, sums that run through atomic additions (``index_add_``, the backward of
``index_select``) add in an order that changes from run to run, so two runs of the same
configuration differ in their last bits, and training carries the difference on. torch's
deterministic mode uses algorithms that add in a fixed order instead (somewhat slower), and
cuBLAS needs a fixed workspace for it (``CUBLAS_WORKSPACE_CONFIG``, set here unless the user
set it; it must be set before cuBLAS first runs in the process to take effect).
"""

from __future__ import annotations

import contextlib
import os

import torch

CUBLAS_WORKSPACE_CONFIG = ":4096:8"


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """A block that runs with torch's deterministic algorithms when ``enabled``; the previous
    setting comes back after it. Does nothing when not ``enabled``."""
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
