"""Resident memory of a process, as the benchmarks report it: the peak the kernel keeps for
this process, the memory lines of ``/proc/<pid>/status`` (current resident, private, shared
and peak), and a thread that samples peaks the kernel does not keep (of private memory, or
of other processes)."""
from __future__ import annotations

import resource
import threading
from pathlib import Path
from typing import Callable


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (``getrusage``'s max RSS), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def status_mib(pid: int | str = "self") -> dict[str, float]:
    """The memory lines of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``,
    ``RssShmem``, ...), in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[name] = int(rest.split()[0]) / 1024
    return values


class PeakSampler:
    """The peaks of figures that ``sample()`` reads (a dict of name -> value), read every
    ``interval_s`` by a thread from the moment it is made until ``stop()``, which reads them
    once more and returns the peaks."""

    def __init__(self, sample: Callable[[], dict], interval_s: float):
        self.peaks: dict = {}
        self._read, self._interval_s = sample, interval_s
        self._take()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        for name, value in self._read().items():
            self.peaks[name] = max(self.peaks.get(name, value), value)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._take()

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._take()
        return self.peaks
