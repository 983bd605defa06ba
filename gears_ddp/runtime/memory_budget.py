"""Refuse an output the machine's memory cannot hold, before it is made.

Some outputs are sized by the user: ``cells_per_perturbation`` predicted cells for each
perturbation, times every gene. Asked for too many, torch's allocator fails deep in the
prediction ("you tried to allocate 16000000000 bytes"), or, on a machine that overcommits, the
operating system kills the process once it touches the pages. ``refuse_beyond_memory`` says
instead, before anything is allocated, how much the output needs, how much there is, and what
to ask for instead.

The memory there is: Linux's ``MemAvailable`` (what can be allocated without swapping), within
the limit of the process's control group (cgroup v2 ``memory.max`` less ``memory.current``,
where a container sets one). Elsewhere nothing is known and nothing is refused.
"""

from __future__ import annotations

from pathlib import Path

FLOAT32_BYTES = 4
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


class BeyondMemory(MemoryError):
    """An output asked for that the machine's memory cannot hold (``refuse_beyond_memory``):
    bad input, which the command line reports in one line."""


def available_memory_bytes(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """The bytes this process can allocate without swapping or meeting its control group's
    limit; None where the system does not say (not Linux)."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    if "MemAvailable" not in fields:
        return None
    available = int(fields["MemAvailable"].split()[0]) * 1024  # in kB
    try:
        limit, used = (cgroup / "memory.max").read_text().strip(), (cgroup / "memory.current").read_text().strip()
    except OSError:
        return available
    return available if limit == "max" else max(0, min(available, int(limit) - int(used)))


def readable_bytes(n_bytes: float) -> str:
    """``n_bytes`` in GiB (at least 1 GiB) or MiB, as the library's logs write sizes."""
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"


def refuse_beyond_memory(n_bytes: float, what: str, advice: str) -> None:
    """Raise ``BeyondMemory`` when ``what`` (its description, needing ``n_bytes``) is more than
    the memory available now, naming both sizes and ``advice``; nothing where the system does
    not say what is available."""
    available = available_memory_bytes()
    if available is not None and n_bytes > available:
        raise BeyondMemory(
            f"{what} needs about {readable_bytes(n_bytes)}, more than the {readable_bytes(available)} of memory "
            f"available: {advice}"
        )
