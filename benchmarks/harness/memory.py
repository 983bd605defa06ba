"""Resident memory of a process, as the benchmarks report it: the peak the kernel keeps for
this process, the memory lines of ``/proc/<pid>/status`` (current resident, private, shared
and peak), a thread that samples peaks the kernel does not keep (of private memory, or of
other processes), and the peaks of every process of a tree that a command starts (its
private memory, and the pages of a mapped file it holds)."""

from __future__ import annotations

import resource
import threading
from pathlib import Path
from typing import Callable

SAMPLING_S = 0.1


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


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children, their children, ...)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        queue += [int(c) for c in children]
    return found


def mapped_file_mib(pid: int, suffix: str) -> tuple[float, float]:
    """Resident and shared MiB of the process's mappings of files whose name ends with ``suffix``."""
    resident = shared = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5:
                inside = len(parts) > 5 and parts[5].endswith(suffix)
            elif inside and parts[0] == "Rss:":
                resident += int(parts[1])
            elif inside and parts[0] == "Shared_Clean:":
                shared += int(parts[1])
    return resident / 1024, shared / 1024


def sample_tree(
    root: int, is_counted: Callable[[bytes], bool] = lambda cmdline: True, map_suffix: str = ".npy"
) -> PeakSampler:
    """Peaks, per process of the tree under ``root`` that ``is_counted(cmdline)`` picks, of
    its private memory (``RssAnon``), its resident memory (``VmRSS``) and its resident and
    shared pages of mapped files named ``*map_suffix`` (``per_process`` reads them)."""

    def sample() -> dict:
        figures = {}
        for pid in [root] + descendants(root):
            try:
                if not is_counted(Path(f"/proc/{pid}/cmdline").read_bytes()):
                    continue
                memory = status_mib(pid)
                resident, shared = mapped_file_mib(pid, map_suffix)
            except OSError:  # the process ended meanwhile
                continue
            figures.update(
                {
                    (pid, "private"): memory.get("RssAnon", 0.0),
                    (pid, "rss"): memory.get("VmRSS", 0.0),
                    (pid, "resident"): resident,
                    (pid, "shared"): shared,
                }
            )
        return figures

    return PeakSampler(sample, SAMPLING_S)


def per_process(peaks: dict) -> dict:
    """``sample_tree``'s peaks as a list per figure, in process id order."""
    pids = sorted({pid for pid, _ in peaks})
    return {kind: [peaks[(pid, kind)] for pid in pids] for kind in ("private", "rss", "resident", "shared")}
