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
"""
from __future__ import annotations

import os
import pickle
import struct

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

    def __getstate__(self) -> dict:
        return {"_reader": self._reader, "_writer": self._writer, "_write_lock": self._write_lock,
                "_byte_stream": self._byte_stream}

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
                frame = frame[os.write(self._writer.fileno(), frame):]

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
            messages.append(pickle.loads(self._pending[_LENGTH.size:end]))
            del self._pending[:end]
        return messages

    def close(self) -> None:
        """Close the parent's ends of the pipe; call it after the last ``receive``."""
        self._reader.close()
        self._writer.close()
