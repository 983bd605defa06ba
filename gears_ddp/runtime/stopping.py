"""Stop requests: SIGTERM or SIGUSR1 asks a training run to stop at the next optimiser step.

Schedulers warn a job before they end it: Slurm sends SIGTERM before it kills a job (and,
with ``sbatch --signal=USR1@90``, SIGUSR1 ahead of the time limit); torchrun forwards
SIGTERM to its workers. While ``StopSignals`` is active, either signal is recorded instead
of ending the process; the recipe reads it at the next step boundary, the ranks agree on it,
the main rank writes a checkpoint and every rank raises ``TrainingInterrupted``. A second
signal of the same kind ends the process as it would have without the handler, so a rank
stuck in a collective is never kept alive by it.

Outside the steps a command stops at once instead, and cleanly: under
``data.stop_signals.stops_raised`` a stop signal raises ``Stopped`` where it lands
(``gears-ddp train``, ``demo`` and ``sweep`` while they prepare the data, start ranks, or
score and report after the last step; ``gears-ddp process`` throughout), and the command
exits with ``EXIT_INTERRUPTED`` and one line rather than being killed halfway.

Handlers can only be installed from the main thread; elsewhere ``StopSignals`` does
nothing. The previous handlers are restored on exit.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Callable

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))
EXIT_INTERRUPTED = 75  # exit status of a launched rank that stopped on a signal (EX_TEMPFAIL: try again)


# what ``signal.signal`` takes and returns: a function, SIG_DFL / SIG_IGN, or None (set outside Python)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class TrainingInterrupted(RuntimeError):
    """Training stopped on a signal after writing a checkpoint; ``signal_name`` says which,
    ``checkpoint`` where the run can continue from (``resume_from='auto'``)."""

    def __init__(self, message: str, signal_name: str, checkpoint: str | None):
        super().__init__(message)
        self.signal_name, self.checkpoint = signal_name, checkpoint


class StopSignals:
    """Record SIGTERM / SIGUSR1 while active (a context manager); ``received`` is the signal
    number, or 0 while none came."""

    def __init__(self):
        self.received = 0
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _record(self, number: int, frame) -> None:
        if self.received == number:  # the second time: what the signal would have done
            signal.signal(number, self._previous.get(number, signal.SIG_DFL))
            os.kill(os.getpid(), number)
            return
        self.received = number


def signal_name(number: int) -> str:
    return signal.Signals(number).name
