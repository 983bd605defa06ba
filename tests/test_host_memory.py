"""Freed host memory is kept for reuse during CPU training, and given back after."""

import os
import subprocess
import sys
import textwrap

import pytest

from gears_ddp.runtime import host_memory

FAULT_COUNT = textwrap.dedent("""
    import os, resource, sys
    import torch
    from gears_ddp.runtime.host_memory import retained_host_memory

    def faults_of_steps():
        # a training step's pattern: several buffers of a few MiB, all freed at its end
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            buffers = [torch.ones(3 * 2**20) for _ in range(4)]  # 12 MiB each, written
            del buffers
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_of_steps()
    default = faults_of_steps()
    del os.environ["MALLOC_MMAP_THRESHOLD_"]  # the process started with it; now let the library set its own
    with retained_host_memory():
        faults_of_steps()  # the heap grows once
        retained = faults_of_steps()
    print(default, retained)
""")


@pytest.mark.skipif(host_memory._c_library() is None, reason="the C library is not glibc")
def test_steps_stop_faulting_pages_in_while_memory_is_retained():
    """The process starts with glibc's static default mmap threshold (128 KiB): every buffer
    of a step is mapped and faulted in afresh, the worst case of glibc's defaults (whose
    dynamic thresholds settle differently from run to run). Retained, they are reused."""
    environment = {k: v for k, v in os.environ.items() if k not in host_memory.USER_SETTINGS}
    environment["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    out = subprocess.run(
        [sys.executable, "-c", FAULT_COUNT], capture_output=True, text=True, check=True, env=environment
    )
    default, retained = map(int, out.stdout.split())
    assert default > 20 * 3000  # every step faults its 48 MiB in again (4 KiB pages)
    assert retained < default / 20


class _Recorder:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append(("mallopt", parameter, value))

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))


def test_settings_are_raised_in_the_block_and_memory_given_back_after(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(host_memory, "_c_library", lambda: recorder)
    for name in host_memory.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    with host_memory.retained_host_memory():
        assert recorder.calls == [
            ("mallopt", host_memory.M_MMAP_THRESHOLD, 32 * 2**20),
            ("mallopt", host_memory.M_TRIM_THRESHOLD, 256 * 2**20),
        ]
    assert recorder.calls[2:] == [
        ("mallopt", host_memory.M_MMAP_THRESHOLD, 128 * 2**10),
        ("mallopt", host_memory.M_TRIM_THRESHOLD, 128 * 2**10),
        ("malloc_trim", 0),
    ]


def test_the_users_own_allocator_settings_are_left_alone(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(host_memory, "_c_library", lambda: recorder)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    with host_memory.retained_host_memory():
        pass
    assert recorder.calls == []


def test_training_retains_memory_for_the_optimiser_steps_and_evaluates_without(toy, monkeypatch):
    """An evaluation's batch blocks would grow a retaining heap with the number of cells, so
    the recipe retains memory around each epoch's optimiser steps and leaves it before the
    epoch's evaluation of train and val."""
    import contextlib

    from gears_ddp.gears import GEARS
    from gears_ddp.training import engine, recipe

    retaining, seen = [False], []

    @contextlib.contextmanager
    def recording_retention():
        retaining[0] = True
        try:
            yield
        finally:
            retaining[0] = False

    def steps(*args, **kwargs):
        for loss in engine.optimizer_steps(*args, **kwargs):
            seen.append(("step", retaining[0]))
            yield loss

    def evaluation(*args, **kwargs):
        seen.append(("evaluate", retaining[0]))
        return engine.evaluate(*args, **kwargs)

    monkeypatch.setattr(recipe, "retained_host_memory", recording_retention)
    monkeypatch.setattr(recipe, "optimizer_steps", steps)
    monkeypatch.setattr(recipe, "evaluate", evaluation)
    toy.get_dataloader(16, test_batch_size=64)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=2)
    assert ("step", True) in seen and ("evaluate", False) in seen
    assert ("step", False) not in seen and ("evaluate", True) not in seen
    assert sum(kind == "evaluate" for kind, _ in seen) >= 4  # train and val, each epoch
