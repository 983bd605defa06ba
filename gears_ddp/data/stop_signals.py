"""A stop signal while a command prepares, writes files or reports: turned into an exception,
so that the ``finally`` blocks on the way out remove temporary files and release the run
folder, instead of the process dying with them on disk.

Under ``stops_raised`` the signals given (``runtime.stopping.STOP_SIGNALS`` and Ctrl-C's
SIGINT: for the training commands outside their steps, for ``gears-ddp process`` throughout) raise
``Stopped`` where they land, and the ``finally`` blocks of ``io.atomic_path`` and
``io.atomic_files`` remove what they wrote. Steps that must not be cut in two (making a
temporary file and recording it, the renames of files that belong together, the removal)
run under ``stops_held``: a stop that comes meanwhile is raised when they end. Elsewhere (a
Python session; the training steps, which ``runtime.stopping`` stops at a step boundary) the
signals keep their handlers and ``stops_held`` changes nothing. Handlers can only be
installed from the main thread; elsewhere ``stops_raised`` does nothing. A ``Stopped`` that
Python cannot deliver (it landed in a garbage collector's callback) is neither printed nor
lost: it is raised at the next point that can take it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator


class Stopped(BaseException):
    """A stop signal came (``signal_number``) while ``stops_raised`` was active. Like
    ``KeyboardInterrupt`` it is no ``Exception``: the handlers that turn a library's errors
    into messages (``except Exception``) let it through."""

    def __init__(self, signal_number: int):
        self.signal_number = signal_number
        super().__init__(f"stopped by {signal.Signals(signal_number).name}")


class _Held:
    """How deep in ``stops_held`` steps the main thread is, and the stop that came and has not
    yet reached the command (0: none)."""

    depth = 0
    pending = 0


def _raise_stop(number: int, frame) -> None:
    """The handler of ``stops_raised``: raise ``Stopped``, or, in a ``stops_held`` step, keep
    the signal for its end. The stop is kept either way until it reaches ``stops_raised``: a
    handler's exception that lands in a garbage collector's callback (a weak reference's) is
    dropped by Python (``_quiet_dropped_stops`` keeps it from printing a traceback), and the
    stop is then raised at the next held step's end, or when the block ends."""
    _Held.pending = number
    if _Held.depth:
        return
    raise Stopped(number)


@contextlib.contextmanager
def _quiet_dropped_stops() -> Iterator[None]:
    """While the block runs, a ``Stopped`` that Python drops (raised where no one can catch it,
    in a weak reference's callback or a ``__del__``) is not printed as "Exception ignored" and
    a traceback: it is kept in ``_Held.pending`` and raised later, so the user sees the one
    line a stop ends with. Every other dropped exception goes to the hook there was before."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Stopped):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _take_pending() -> int:
    """The stop kept for later (0: none), forgotten."""
    number, _Held.pending = _Held.pending, 0
    return number


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stops_raised(numbers: tuple[int, ...]) -> Iterator[None]:
    """While the block runs, the signals ``numbers`` raise ``Stopped``; the handlers there
    were before are restored after it."""
    if not _in_main_thread():
        yield
        return
    previous = {number: signal.signal(number, _raise_stop) for number in numbers}
    try:
        with _quiet_dropped_stops():
            yield
    except Stopped:
        _take_pending()  # it reached the block: said once
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    number = _take_pending()
    if number:  # a stop whose exception Python dropped, with no held step after it
        raise Stopped(number)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Run the block whole: a stop that comes while it runs (under ``stops_raised``) is raised
    when it ends, even after an exception of its own (the stop is what the user asked for).
    Python runs signal handlers in the main thread only, so elsewhere the block just runs."""
    if not _in_main_thread():
        yield
        return
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
        if not _Held.depth and _Held.pending:
            raise Stopped(_Held.pending)  # kept until it reaches stops_raised
