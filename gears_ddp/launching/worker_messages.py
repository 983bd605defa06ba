"""A one-way message channel from spawned workers to the parent that cannot hang the parent.

``multiprocessing`` queues read a whole message in one blocking call: when a worker dies
part-way through writing one (killed, out of memory, stopped by ``mp.spawn`` after a peer
failed), the parent waits forever for the rest, because the parent itself still holds a
writing end of the pipe. Here the parent only ever reads the bytes the pipe already holds
and keeps incomplete frames in a buffer, so a half-written message is dropped, never waited
for. Messages are pickled by value with the standard pickler (tensors included), so reading
them never needs the sender to be alive, unlike torch's shared-memory tensor pickling.

That is for POSIX pipes, which are byte streams. Windows pipes carry whole messages, so
there the channel uses the ``Connection`` API (``send_bytes`` / ``recv_bytes``) instead.

Log records travel the same way: spawned processes do not inherit the parent's logging
set-up, so a worker's records are sent to the parent (``forward_logs``), which hands them
to its own loggers (``replay_log``), where its handlers and levels decide what to show.

What travels is typed: each kind of message is a small dataclass below, read by its fields.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import time
import traceback
from dataclasses import dataclass

from gears_ddp._logging import LIBRARY_LOGGER_NAME


@dataclass(frozen=True)
class LogRecord:
    """A worker's log record, as the fields of a ``logging.LogRecord`` (made picklable)."""

    fields: dict


@dataclass(frozen=True, order=True)
class WorkerFailed:
    """A worker failed at ``time`` (seconds since the epoch) with ``traceback``. The time
    tells the first failure from those of workers that failed because a peer went away."""

    time: float
    worker: int
    traceback: str


@dataclass(frozen=True)
class RunReport:
    """Rank 0's report of a finished training run."""

    report: dict


@dataclass(frozen=True)
class RunInterrupted:
    """Training stopped on a signal (``signal_name``) after writing ``checkpoint``."""

    message: str
    signal_name: str
    checkpoint: str | None


@dataclass(frozen=True)
class RunDiverged:
    """Training stopped at a non-finite loss; ``message`` names the epoch and step."""

    message: str


@dataclass(frozen=True)
class PairScreenChunk:
    """The scores of one finished chunk of a pair screen's pairs."""

    chunk: int
    scores: dict


_LENGTH = struct.Struct("!Q")
_READ_BYTES = 1 << 20


class WorkerMessages:
    """Workers ``put`` picklable objects; the parent collects them with ``receive``.

    Create it in the parent and pass it to the workers in ``mp.spawn``'s arguments (a pipe
    end crosses to a child only while it is being spawned). Writes by several workers are
    serialised by a lock, so frames never interleave. ``byte_stream`` says how the pipe is
    read: as a byte stream without ever blocking (POSIX, the default there), or whole
    message by message with the ``Connection`` API (Windows, whose pipes carry messages).
    """

    def __init__(self, context, byte_stream: bool = os.name != "nt"):
        self._reader, self._writer = context.Pipe(duplex=False)
        self._write_lock = context.Lock()
        self._byte_stream = byte_stream
        self._pending = bytearray()
        self.log_level = logging.getLogger(LIBRARY_LOGGER_NAME).getEffectiveLevel()  # the parent's, at creation

    def __getstate__(self) -> dict:
        return {
            "_reader": self._reader,
            "_writer": self._writer,
            "_write_lock": self._write_lock,
            "_byte_stream": self._byte_stream,
            "log_level": self.log_level,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _pending=bytearray())

    def put(self, message) -> None:
        """Send ``message`` to the parent (blocks while the pipe is full and the parent reads)."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            if not self._byte_stream:
                self._writer.send_bytes(payload)
                return
            frame = memoryview(_LENGTH.pack(len(payload)) + payload)
            while frame:
                frame = frame[os.write(self._writer.fileno(), frame) :]

    def put_failure(self, worker: int) -> None:
        """Tell the parent that ``worker`` failed with the exception being handled."""
        self.put(WorkerFailed(time.time(), worker, traceback.format_exc()))

    def receive(self) -> list:
        """The messages completed since the last call, without ever waiting for more bytes."""
        if not self._byte_stream:
            messages = []
            while self._reader.poll(0):
                messages.append(pickle.loads(self._reader.recv_bytes()))
            return messages
        while self._reader.poll(0):
            chunk = os.read(self._reader.fileno(), _READ_BYTES)
            if not chunk:  # every writing end is closed
                break
            self._pending += chunk
        messages = []
        while len(self._pending) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._pending)
            end = _LENGTH.size + length
            if len(self._pending) < end:
                break
            messages.append(pickle.loads(self._pending[_LENGTH.size : end]))
            del self._pending[:end]
        return messages

    def forward_logs(self, rank: int) -> None:
        """In a worker: send the library's log records to the parent as ``LogRecord``
        messages, rank 0's from the parent's level, other ranks' warnings and errors (their
        messages prefixed with the rank)."""
        library_logger = logging.getLogger(LIBRARY_LOGGER_NAME)
        library_logger.setLevel(self.log_level if rank == 0 else max(self.log_level, logging.WARNING))
        library_logger.addHandler(_ForwardingHandler(self, "" if rank == 0 else f"rank {rank}: "))
        library_logger.propagate = False

    def close(self) -> None:
        """Close the parent's ends of the pipe; call it after the last ``receive``."""
        self._reader.close()
        self._writer.close()


class _ForwardingHandler(logging.Handler):
    """Puts each record, made picklable (message formatted, traceback as text), on the channel."""

    def __init__(self, messages: WorkerMessages, prefix: str):
        super().__init__()
        self.messages, self.prefix = messages, prefix

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            fields.update(msg=self.prefix + message, args=None, exc_info=None, exc_text=None)
            self.messages.put(LogRecord(fields))
        except Exception:  # a log record must never break training
            self.handleError(record)


def replay_log(fields: dict, prefix: str = "") -> None:
    """In the parent: hand a forwarded record to the parent's logger of the same name, its
    message prefixed with ``prefix`` (which says whose it is when several runs log at once)."""
    record = logging.makeLogRecord({**fields, "msg": prefix + fields["msg"]} if prefix else fields)
    target = logging.getLogger(record.name)
    if target.isEnabledFor(record.levelno):
        target.handle(record)
