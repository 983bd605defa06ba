"""A process the library runs from start to end (the ``gears-ddp`` command, a spawned rank)
ends with its heap frozen, so that CPython's finalisation does not walk it; a process that
goes on (a script calling ``main``, the parent of spawned ranks) keeps collecting."""

import atexit
import gc
import subprocess
import sys
from pathlib import Path

import pytest

from gears_ddp.launching.supervisor import spawn_workers

pytestmark = pytest.mark.distributed


def _freeze_count_at_exit(local_rank, folder, messages):
    messages.put(("running", gc.get_freeze_count()))
    atexit.register(lambda: (Path(folder) / f"rank{local_rank}").write_text(str(gc.get_freeze_count())))


def test_a_spawned_rank_ends_with_its_heap_frozen_and_its_parent_goes_on_collecting(tmp_path):
    before = gc.get_freeze_count()
    received = spawn_workers(_freeze_count_at_exit, (str(tmp_path),), 2)
    assert received == [("running", 0), ("running", 0)]  # not frozen while the worker runs
    assert all(int((tmp_path / f"rank{rank}").read_text()) > 0 for rank in range(2))
    assert gc.get_freeze_count() == before


def test_the_command_ends_with_its_heap_frozen_and_main_leaves_it_alone(tmp_path):
    script = (
        "import atexit, gc, sys\n"
        "from gears_ddp.cli import command, main\n"
        "print('main', main(['check', '--config', 'missing.yaml']), gc.get_freeze_count(), flush=True)\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count() > 0, flush=True))\n"
        "sys.argv = ['gears-ddp', 'check', '--config', 'missing.yaml']\n"
        "sys.exit(command())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == ["main 2 0", "at exit True"]
    assert done.stderr.count("missing.yaml") == 2  # each call named the missing file


@pytest.mark.parametrize("module", ["gears_ddp", "gears_ddp.launch"])
def test_the_modules_torchrun_and_srun_start_end_with_their_heap_frozen(tmp_path, module):
    """``python -m gears_ddp`` and ``python -m gears_ddp.launch`` (each rank of a torchrun or
    srun job) run the command: their heap is frozen as they end."""
    argv = [module, *([] if module == "gears_ddp.launch" else ["train"]), "--config", "missing.yaml"]
    script = (
        "import atexit, gc, runpy, sys\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count() > 0, flush=True))\n"
        f"sys.argv = {argv!r}\n"
        f"runpy.run_module({module!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "missing.yaml" in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["at exit True"]
