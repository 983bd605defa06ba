"""``enable_console_logging``'s handler writes to the stderr of the moment: one made before
stderr was redirected (a notebook, a test's capture) writes to the new stream, and one whose
old stream was closed raises no logging error."""

import io
import logging
import sys

from gears_ddp import enable_console_logging
from gears_ddp._logging import LIBRARY_LOGGER_NAME, get_logger


def test_the_console_handler_follows_stderr(monkeypatch):
    library_logger = logging.getLogger(LIBRARY_LOGGER_NAME)
    monkeypatch.setattr(library_logger, "handlers", [])
    monkeypatch.setattr(library_logger, "level", library_logger.level)
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    enable_console_logging()
    enable_console_logging()  # idempotent: one handler
    assert len(library_logger.handlers) == 1
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    get_logger("somewhere").info("after the redirect")
    assert second.getvalue().rstrip().endswith("INFO gears_ddp.somewhere: after the redirect")
    assert "Logging error" not in second.getvalue()
