"""Where a run's time went: the wall seconds of its phases (set-up, epochs, test,
baselines, interactions, report; a rank's start-up), in the order they first ran.

``GEARS.train`` and each rank of a distributed run keep one ``PhaseClock``; the run ends
with its ``line()`` in the log and its ``seconds`` in the report (``report.json``'s
``timing``), so that a phase that grows shows itself in the next run's log.
"""

from __future__ import annotations

import contextlib
import time


class PhaseClock:
    """Wall seconds (``time.perf_counter``) per named phase; a phase entered twice adds up."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the block as phase ``name``."""
        outer, self._open = self._open, (name, time.perf_counter())
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - self._open[1])
            self._open = outer

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` measured elsewhere (the recipe's epochs, say) to phase ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def so_far(self) -> dict[str, float]:
        """The phases' seconds, the one in progress counted up to now (what a report written
        inside a phase can hold)."""
        seconds = dict(self.seconds)
        if self._open is not None:
            name, start = self._open
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return seconds

    def line(self) -> str:
        """``where the time went: set-up 0.21 s, epochs 3.10 s, ... (3.52 s in all)``."""
        seconds = self.so_far()
        parts = ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items())
        return f"where the time went: {parts} ({sum(seconds.values()):.2f} s in all)"
