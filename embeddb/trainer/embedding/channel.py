"""Messages between the NN worker and its embedding worker: pickled through the pipe, their
large array buffers through shared-memory rings.

A batch's pooled embeddings and its gradients are 0.85 MB each at batch 512 × 26 features ×
dim 16. Pickled into the pipe they cost four copies and, worse, a sender that blocks while the
other process's reader thread waits for a core to drain the socket (2.3 ms per gradient
message on 2 cores, :mod:`benchmarks.profile_step`). Here each message is pickled with
protocol 5: numpy hands its buffers to a callback instead of the pickle stream, the sender
copies every buffer of at least :data:`MIN_RING_BYTES` into its ring, and the pipe carries only
the small pickle and the buffers' places. The receiver copies them out (so the ring space is
free again at once) and unpickles onto the copies.

One ring per direction, each a file in ``/dev/shm`` that both processes map; the NN worker
creates both and unlinks them once the worker has mapped them (or failed to start). Layout::

    [consumed: uint64][capacity bytes of data]

The sender alone advances its private ``produced`` byte count (space it handed out, wasted
tails included); the receiver alone writes ``consumed`` (how far it has copied out), after each
copy. A buffer is contiguous: one that would cross the end skips the tail and starts at 0.
Messages are sent by one thread at a time and received in order by one thread, so a ring
needs no lock. When a buffer does not fit (the ring is full of buffers the other side has not
read yet, or the buffer is larger than the ring) it travels in the pickle stream as before:
slower, never blocked, never lost. Without ``/dev/shm`` (not Linux) both directions pickle
everything into the pipe.

Frame of one message: ``uint32 n`` then ``n`` × ``(uint64 start, uint64 size, uint64 end)``
(``end``: the sender's ``produced`` after the buffer, the receiver's new ``consumed``), then
the pickle.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import struct
import tempfile
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from embeddb.errors import ConfigError

__all__ = [
    "MIN_RING_BYTES",
    "RING_BYTES",
    "RING_BYTES_ENV",
    "Ring",
    "RingChannel",
    "RingFiles",
    "ring_bytes",
]

#: Data bytes of one ring: the pooled embeddings of 8 batches of 0.85 MB fit with room.
#: ``EMBEDDB_RING_BYTES`` overrides it (0: no rings, every message through the pipe).
RING_BYTES = 8 << 20
RING_BYTES_ENV = "EMBEDDB_RING_BYTES"
#: Smaller buffers stay in the pickle stream (a ring slot costs more than it saves).
MIN_RING_BYTES = 16 << 10
_SHM_DIR = Path("/dev/shm")
_COUNTER = struct.Struct("<Q")
_COUNT = struct.Struct("<I")
_PLACE = struct.Struct("<QQQ")


def ring_bytes(environ: Mapping[str, str]) -> int:
    """The ring size: ``EMBEDDB_RING_BYTES`` if set (0 disables the rings), else
    :data:`RING_BYTES`.

    Raises:
        ConfigError: a value that is not a non-negative integer.
    """
    text = environ.get(RING_BYTES_ENV, "").strip()
    if not text:
        return RING_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(RING_BYTES_ENV, f"must be a number of bytes >= 0, got {text!r}")
    return value


class Ring:
    """One direction's shared-memory ring, mapped from ``path`` (both processes)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.capacity = size - _COUNTER.size
        self._data = memoryview(self._map)[_COUNTER.size :]
        self._produced = 0  # the sender's side

    @staticmethod
    def create(capacity: int = RING_BYTES) -> str:
        """A new ring file of ``capacity`` data bytes in ``/dev/shm``; returns its path.

        Raises:
            OSError: no ``/dev/shm`` or no room in it.
        """
        fd, path = tempfile.mkstemp(prefix="embeddb-ring-", dir=_SHM_DIR)
        try:
            os.ftruncate(fd, _COUNTER.size + capacity)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return path

    def put(self, raw: memoryview) -> tuple[int, int, int] | None:
        """Copy ``raw`` (a flat byte view) in; its ``(start, size, end)``, or None when it does
        not fit now."""
        size = raw.nbytes
        position = self._produced % self.capacity
        skip = self.capacity - position if position + size > self.capacity else 0
        consumed = _COUNTER.unpack_from(self._map, 0)[0]
        if self._produced + skip + size - consumed > self.capacity:
            return None
        start = 0 if skip else position
        self._data[start : start + size] = raw
        self._produced += skip + size
        return start, size, self._produced

    def take(self, start: int, size: int, end: int) -> bytearray:
        """Copy a buffer out and free its space (in order of ``put``).

        Raises:
            ValueError: a place outside the ring (a corrupt frame).
        """
        if not (start >= 0 and size >= 0 and start + size <= self.capacity):
            raise ValueError(f"a buffer at {start}+{size} is outside the ring ({self.capacity})")
        out = bytearray(self._data[start : start + size])
        _COUNTER.pack_into(self._map, 0, end)
        return out

    def close(self) -> None:
        """Unmap now if no view of the data is in use (a receiving thread may still hold
        one; then the map goes when the ring is garbage-collected)."""
        with contextlib.suppress(BufferError):
            self._data.release()
            self._map.close()


class RingFiles:
    """The two ring files of one NN worker / embedding worker pair (created by the NN worker)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.to_worker: str | None = None
        self.from_worker: str | None = None
        if capacity is None:
            capacity = ring_bytes(os.environ)
        if capacity <= 0:
            return
        try:
            self.to_worker = Ring.create(capacity)
            self.from_worker = Ring.create(capacity)
        except OSError:  # no /dev/shm: everything through the pipe
            self.unlink()

    @property
    def paths(self) -> tuple[str, str] | None:
        """``(to_worker, from_worker)``, or None when shared memory is not available."""
        if self.to_worker is None or self.from_worker is None:
            return None
        return self.to_worker, self.from_worker

    def unlink(self) -> None:
        """Remove the files (mappings stay valid); idempotent."""
        for path in (self.to_worker, self.from_worker):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self.to_worker = self.from_worker = None


class RingChannel:
    """``send``/``recv`` of a :class:`~multiprocessing.connection.Connection`, with large
    buffers through the rings.

    Args:
        conn: the pipe end.
        tx: the ring this side sends through (None: the pipe only).
        rx: the ring the other side sends through (None: it sends none).
    """

    def __init__(self, conn: Connection, tx: Ring | None, rx: Ring | None) -> None:
        self.conn = conn
        self._tx = tx
        self._rx = rx
        self.ring_bytes = 0  # sent through the ring (the rest went in the pickle stream)

    @classmethod
    def open(
        cls, conn: Connection, paths: tuple[str, str] | None, *, worker_side: bool
    ) -> RingChannel:
        """The channel of one side, given the :attr:`RingFiles.paths`."""
        if paths is None:
            return cls(conn, None, None)
        to_worker, from_worker = Ring(paths[0]), Ring(paths[1])
        return (
            cls(conn, from_worker, to_worker) if worker_side else cls(conn, to_worker, from_worker)
        )

    def send(self, message: Any) -> None:
        """Pickle ``message`` and send it; one sending thread at a time."""
        places: list[tuple[int, int, int]] = []
        tx = self._tx

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            if tx is None:
                return True
            raw = buffer.raw()
            if raw.nbytes < MIN_RING_BYTES:
                return True
            place = tx.put(raw)
            if place is None:
                return True  # no room now: in the pickle stream
            places.append(place)
            self.ring_bytes += raw.nbytes
            return False

        # A failed dumps leaves its buffers' space behind: the next message's ``end`` frees it.
        data = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
        head = _COUNT.pack(len(places)) + b"".join(_PLACE.pack(*p) for p in places)
        self.conn.send_bytes(head + data)

    def recv(self) -> Any:
        """Receive and unpickle the next message; one receiving thread at a time.

        Raises:
            EOFError: the other side closed the pipe.
        """
        frame = memoryview(self.conn.recv_bytes())
        (count,) = _COUNT.unpack_from(frame, 0)
        offset = _COUNT.size
        buffers: list[bytearray] = []
        for _ in range(count):
            start, size, end = _PLACE.unpack_from(frame, offset)
            offset += _PLACE.size
            if self._rx is None:
                raise ValueError("a message names a shared-memory buffer, but there is no ring")
            buffers.append(self._rx.take(start, size, end))
        return pickle.loads(frame[offset:], buffers=buffers)

    def close(self) -> None:
        """Close the pipe end and unmap the rings."""
        self.conn.close()
        for ring in (self._tx, self._rx):
            if ring is not None:
                ring.close()
