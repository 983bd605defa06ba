"""``data.stop_signals``: a stop signal under ``stops_raised`` ends the block with ``Stopped``
and nothing else on stderr, even when Python drops the exception its handler raised (a stop
that lands in a weak reference's callback, as a garbage collection can make it)."""

from __future__ import annotations

import signal
import sys
import weakref

import pytest

from gears_ddp.data.stop_signals import Stopped, stops_held, stops_raised


class _Collectable:
    pass


def _collect_with_callback(callback) -> None:
    """Make an object whose weak reference runs ``callback`` when it is collected, and let it go:
    the callback runs where no caller can catch what it raises."""
    thing = _Collectable()
    reference = weakref.ref(thing, lambda _: callback())
    del thing
    assert reference() is None


@pytest.fixture
def dropped(monkeypatch):
    """The exceptions Python drops from here on, as their types (instead of printing each as
    "Exception ignored" and a traceback on stderr)."""
    seen: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    return seen


def test_a_stop_dropped_in_a_weakref_callback_is_raised_at_the_blocks_end_and_not_printed(dropped):
    reached_the_end = False
    with pytest.raises(Stopped) as stopped:
        with stops_raised((signal.SIGINT,)):
            _collect_with_callback(lambda: signal.raise_signal(signal.SIGINT))
            reached_the_end = True
    assert stopped.value.signal_number == signal.SIGINT
    assert reached_the_end  # Python dropped the handler's exception; the block went on to its end
    assert dropped == []  # not printed: the stop's one line is all the user sees


def test_a_stop_dropped_in_a_weakref_callback_is_raised_when_the_next_held_step_ends(dropped):
    with pytest.raises(Stopped):
        with stops_raised((signal.SIGTERM,)):
            _collect_with_callback(lambda: signal.raise_signal(signal.SIGTERM))
            with stops_held():
                pass
            pytest.fail("the stop was not raised when the held step ended")
    assert dropped == []


def test_other_exceptions_dropped_under_stops_raised_still_reach_the_hook_there_was(dropped):
    hook = sys.unraisablehook
    with stops_raised((signal.SIGINT,)):
        _collect_with_callback(lambda: 1 / 0)
    assert dropped == [ZeroDivisionError]
    assert sys.unraisablehook is hook  # restored when the block ended
