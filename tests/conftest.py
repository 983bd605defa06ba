"""Shared pytest set-up: tests import helper modules that live beside them."""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# deterministic runs on a GPU need cuBLAS's fixed workspace, set before cuBLAS first runs
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# the test processes share the machine's cores (two pytest workers, each starting ranks): OpenMP
# threads that wait by spinning take cores from the others, so they wait passively, as
# docs/distributed.md advises for any shared machine; set before torch loads OpenMP, kept where set
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# numba's on-disk cache (dcor, which the published GEARS imports, compiles with cache=True into its
# installed folder): two pytest workers compiling it at once in a fresh install wrote an index that
# named a function it did not hold, and every later import of dcor aborted in LLVM ("Symbol not
# found"), every worker down. Each worker caches in a folder of its own; set before numba loads
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = str(
        Path(tempfile.gettempdir()) / "gears_ddp_tests_numba" / os.environ["PYTEST_XDIST_WORKER"]
    )

import pytest  # noqa: E402
import torch  # noqa: E402
import toy_data  # noqa: E402
from gears_testing import suite_devices  # noqa: E402

from gears_ddp import PertData  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "distributed: starts processes (spawned ranks, torchrun, launchers)")
    config.addinivalue_line("markers", "slow: takes tens of seconds")


@pytest.fixture(params=suite_devices())
def device(request) -> torch.device:
    """Each device the suite runs on (gears_testing.suite_devices): the CPU, and CUDA when present."""
    return torch.device(request.param)


@pytest.fixture
def data_root(tmp_path):
    """A data folder holding the GO files of the toy dataset."""
    toy_data.write_go_files(tmp_path)
    return tmp_path


@pytest.fixture
def toy(data_root):
    """The toy dataset processed and loaded, with a simulation split."""
    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", toy_data.make_raw())
    pert_data.prepare_split("simulation", seed=1)
    return pert_data


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory):
    """A data folder with the toy dataset processed (``<folder>/toy``), shared by a module."""
    root = tmp_path_factory.mktemp("toy_data")
    toy_data.write_go_files(root)
    PertData(root).new_data_process("toy", toy_data.make_raw())
    return root


@pytest.fixture(scope="module")
def trained_toy(data_folder):
    """A ``GEARS`` on the toy data (simulation split, seed 1; batch 16), hidden size 8, trained
    one epoch from torch seed 0; shared by a module."""
    from gears_ddp import GEARS

    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(16, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1)
    return gears
