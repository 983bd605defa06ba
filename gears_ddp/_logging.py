"""Library logging: every module logs through ``get_logger`` under the ``gears_ddp`` name.

The library never prints; applications decide what to show by configuring ``logging``.
``enable_console_logging`` is the one-liner examples and scripts use for readable output.
"""

import logging
import sys

LIBRARY_LOGGER_NAME = "gears_ddp"


class CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as ``logging.lastResort``
    does), so that stderr redirected after the handler was made (a notebook, a test's
    capture) never leaves it writing to a closed stream."""

    # set on the one handler ``enable_console_logging`` adds, so that a second call adds none
    _gears_ddp_console: bool = False

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        """The stream is always the current stderr."""


def get_logger(name: str) -> logging.Logger:
    """Return the logger for a module of this library (``name`` is usually ``__name__``)."""
    if not name.startswith(LIBRARY_LOGGER_NAME):
        name = f"{LIBRARY_LOGGER_NAME}.{name}"
    return logging.getLogger(name)


# (logger name, level, message) of every record ``log_once`` has let through in this process
_SAID: set[tuple[str, int, str]] = set()


def log_once(logger: logging.Logger, level: int, message: str, *args) -> None:
    """Log ``message % args`` at ``level`` the first time this process says it, and at DEBUG
    after that. For what every load of the same data says again (a local copy found, the
    conditions dropped for want of GO terms): a command that processes a screen and then
    trains on it loads it twice, and should say each of these once."""
    said = (logger.name, level, message % args if args else message)
    if said in _SAID:
        level = logging.DEBUG
    elif logger.isEnabledFor(level):
        _SAID.add(said)
    logger.log(level, message, *args, stacklevel=2)  # the record names the caller's line


def enable_console_logging(level: int = logging.INFO) -> None:
    """Send the library's log records to stderr with a timestamped format (idempotent)."""
    logger = logging.getLogger(LIBRARY_LOGGER_NAME)
    logger.setLevel(level)
    if not any(getattr(h, "_gears_ddp_console", False) for h in logger.handlers):
        handler = CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._gears_ddp_console = True
        logger.addHandler(handler)
