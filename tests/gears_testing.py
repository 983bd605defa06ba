"""Test helpers in the spirit of ``torch_geometric.testing``: the devices a test runs on.

A test that takes the ``device`` fixture runs once per device of ``suite_devices()``: the
CPU, and CUDA when a GPU is present, so one command runs the suite on a GPU machine too.
``GEARS_DDP_TEST_DEVICES=cuda`` (a comma-separated list) picks the devices explicitly.

Markers (registered in ``conftest.py``): ``distributed`` for tests that start processes
(``-m "not distributed"`` skips them), ``slow`` for tests that take tens of seconds.
"""

import os

import pytest
import torch

from gears_ddp.training.training_options import torch_compiles_the_network


def suite_devices() -> list[str]:
    """The device types the suite runs on."""
    chosen = os.environ.get("GEARS_DDP_TEST_DEVICES")
    if chosen:
        devices = [d.strip() for d in chosen.split(",") if d.strip()]
        if "cuda" in devices and not torch.cuda.is_available():
            raise RuntimeError("GEARS_DDP_TEST_DEVICES asks for cuda, but torch sees no GPU")
        return devices
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def exact_on(device: torch.device) -> bool:
    """Whether repeated runs are bit-identical on ``device`` as they are: on CUDA, atomic
    additions (``index_add_``, scatter) sum in a varying order, so only closeness can be
    asserted, unless the runs use torch's deterministic algorithms (``deterministic``)."""
    return torch.device(device).type == "cpu"


# the tests that measure torch.compile: releases older than the oldest that compiles the
# network cannot, and there compile=True is refused (training_options.compile_refusal)
needs_a_torch_that_compiles = pytest.mark.skipif(
    not torch_compiles_the_network(),
    reason=f"torch {torch.__version__} is older than the oldest release that compiles the network",
)
