"""Stop requests: SIGTERM, SIGUSR1 or Ctrl-C (SIGINT) asks a training run to stop at the next
optimiser step.

Schedulers warn a job before they end it: Slurm sends SIGTERM before it kills a job (and,
with ``sbatch --signal=USR1@90``, SIGUSR1 ahead of the time limit); torchrun forwards
SIGTERM to its workers. While ``StopSignals`` is active, either signal is recorded instead
of ending the process; the recipe reads it at the next step boundary, the ranks agree on it,
the main rank writes a checkpoint and every rank raises ``TrainingInterrupted``. A second
signal of the same kind ends the process as it would have without the handler, so a rank
stuck in a collective is never kept alive by it.

Ctrl-C stops the same way, so that the work since the last checkpoint is not lost; the first
one logs that the run stops at the next step, and a second one raises ``KeyboardInterrupt``
at once, as Ctrl-C always did: a user who presses it twice means it. A process that ignores
SIGINT keeps ignoring it: the workers a parent spawns (``launching.supervisor``) do, since a
terminal's Ctrl-C reaches them as well as the parent, which reads it alone and passes the
first one on as ``CTRL_C_PASSED_ON`` (one press, one stop, wherever it lands).

Outside the steps a command stops at once instead, and cleanly: under
``data.stop_signals.stops_raised`` a stop signal (Ctrl-C too) raises ``Stopped`` where it lands
(``gears-ddp train``, ``demo`` and ``sweep`` while they prepare the data, start ranks, or
score and report after the last step; ``gears-ddp process`` throughout), and the command
exits with ``EXIT_INTERRUPTED`` and one line rather than being killed halfway.

Handlers can only be installed from the main thread; elsewhere ``StopSignals`` does
nothing (Ctrl-C included). The previous handlers are restored on exit.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Callable

from gears_ddp._logging import get_logger

logger = get_logger(__name__)

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))
CTRL_C = signal.SIGINT
# how a parent passes Ctrl-C on to the workers it spawned, which ignore SIGINT itself (None where
# there is no SIGUSR2, as on Windows: SIGINT is passed on as it is)
CTRL_C_PASSED_ON = getattr(signal, "SIGUSR2", None)
EXIT_INTERRUPTED = 75  # exit status of a launched rank that stopped on a signal (EX_TEMPFAIL: try again)
CTRL_C_NOTICE = (
    "Ctrl-C: training stops at the next optimiser step, after a checkpoint (work outside the training "
    "steps stops at once); press Ctrl-C again to stop at once, without one"
)
# what a parent says of workers a passed-on stop ended before they could stop on their own
ENDED_TRAINING = (
    "which it ended before they could stop at a step (while starting, or after the last one): what was saved "
    "(checkpoints, finished files) is kept; run the same command again to continue"
)


# what ``signal.signal`` takes and returns: a function, SIG_DFL / SIG_IGN, or None (set outside Python)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class TrainingInterrupted(RuntimeError):
    """Training stopped on a signal after writing a checkpoint; ``signal_name`` says which,
    ``checkpoint`` where the run can continue from (``resume_from='auto'``)."""

    def __init__(self, message: str, signal_name: str, checkpoint: str | None):
        super().__init__(message)
        self.signal_name, self.checkpoint = signal_name, checkpoint


class StopSignals:
    """Record SIGTERM / SIGUSR1 / Ctrl-C while active (a context manager); ``received`` is the
    signal number (``CTRL_C`` for a Ctrl-C passed on by the parent), or 0 while none came."""

    def __init__(self):
        self.received = 0
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> "StopSignals":
        """Record the stop signals; Ctrl-C itself, or, in a process that ignores it (a worker
        whose parent reads Ctrl-C and passes it on), ``CTRL_C_PASSED_ON``, which a process
        that reads Ctrl-C itself leaves as it was."""
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._record)
            if signal.getsignal(CTRL_C) is not signal.SIG_IGN:
                self._previous[CTRL_C] = signal.signal(CTRL_C, self._record_ctrl_c)
            elif CTRL_C_PASSED_ON is not None:
                self._previous[CTRL_C_PASSED_ON] = signal.signal(CTRL_C_PASSED_ON, self._record_passed_on_ctrl_c)
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

    def _record_ctrl_c(self, number: int, frame) -> None:
        """The first Ctrl-C stops at the next step (and says so), the second at once."""
        if self.received == CTRL_C:
            raise KeyboardInterrupt
        announce_ctrl_c()
        self.received = CTRL_C

    def _record_passed_on_ctrl_c(self, number: int, frame) -> None:
        """A parent's Ctrl-C: the parent announced it, and reads a second one itself."""
        self.received = CTRL_C


def announce_ctrl_c(notice: str = CTRL_C_NOTICE) -> None:
    """Log, where a first Ctrl-C lands, what it does and what a second one does (``notice``:
    training's, unless the work is another)."""
    logger.info(notice)


def passed_on_as(number: int) -> int:
    """The signal a parent sends its spawned workers for the signal ``number`` it received."""
    return CTRL_C_PASSED_ON if number == CTRL_C and CTRL_C_PASSED_ON is not None else number


def signal_name(number: int) -> str:
    return signal.Signals(number).name


def described_signal(number: int) -> str:
    """The signal ``number`` as a stop message names it (Ctrl-C's SIGINT says so)."""
    return "SIGINT (Ctrl-C)" if number == CTRL_C else signal_name(number)
