"""Seconds as the benchmarks measure them: wall clock (``time.perf_counter``) around work
that the device has finished (a GPU runs asynchronously, so its queue is waited for at both
ends), CPU seconds beside it (``time.process_time``: all threads of this process, and, where
asked, of its ended children), medians of repeated calls (of several functions in turn, for
fair ratios), and the times of each call of a wrapped function."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Callable


def synchronize(device=None) -> None:
    """Wait until ``device`` (a torch device or its name; None: none) has finished its queued work."""
    if device is None:
        return
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def children_cpu_seconds() -> float:
    """User and system CPU seconds of this process's ended, waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CPU_CLOCKS = {  # whose CPU seconds a Stopwatch counts
    "self": time.process_time,  # every thread of this process
    "children": children_cpu_seconds,  # the children of this process that ended inside
    "self and children": lambda: time.process_time() + children_cpu_seconds(),
}


class Stopwatch:
    """``with Stopwatch(device) as watch: ...``, then ``watch.seconds`` (wall) and
    ``watch.cpu_seconds`` (of the processes ``cpu_of`` names, a key of ``CPU_CLOCKS``); the
    device is synchronised on entry and on exit. ``watch.started``: ``time.perf_counter()``
    on entry (after the synchronisation), to place other moments of the block against."""

    def __init__(self, device=None, cpu_of: str = "self"):
        self.device, self._cpu = device, CPU_CLOCKS[cpu_of]
        self.seconds = self.cpu_seconds = float("nan")

    def __enter__(self) -> "Stopwatch":
        synchronize(self.device)
        self.started, self._cpu_start = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *_) -> None:
        synchronize(self.device)
        self.seconds, self.cpu_seconds = time.perf_counter() - self.started, self._cpu() - self._cpu_start


def median_seconds(function: Callable, repeats: int) -> tuple[float, object]:
    """(median wall seconds of ``repeats`` calls of ``function()``, the last call's return value)."""
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def alternating_medians(functions: dict[str, Callable], repeats: int, device=None) -> dict[str, float]:
    """Median wall seconds of ``repeats`` calls of each of ``functions`` (name -> function),
    called in turn (one of each, then again), so that a change in the machine's load falls
    on all of them alike: their ratios are then fair on a shared machine. ``device`` is
    synchronised around each call."""
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            with Stopwatch(device) as watch:
                function()
            seconds[name].append(watch.seconds)
    return {name: statistics.median(values) for name, values in seconds.items()}


def timed_calls(function: Callable, log: list) -> Callable:
    """``function`` with the (start, end) ``perf_counter`` times of each call appended to ``log``."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = function(*args, **kwargs)
        log.append((start, time.perf_counter()))
        return out

    return wrapper
