"""Opening data files (gzip, Parquet or plain text, told apart by their magic bytes) and
reading them in chunks of complete lines, whole or a byte range at a time.

A byte range ``[start, stop)`` of a text file holds the lines whose first byte lies in it: its
reader skips to the first line start at or after ``start`` and reads through the line holding
byte ``stop - 1``. Ranges that tile a file therefore read every line exactly once.
"""

from __future__ import annotations

import enum
import functools
import gzip
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from embeddb.errors import InvalidArgumentError, NotFoundError

_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"
_COUNT_BYTES = 16 << 20  # bytes read at a time when counting lines


class FileKind(str, enum.Enum):
    """What a data file holds, from its first bytes (not its name)."""

    TEXT = "text"
    GZIP = "gzip"
    PARQUET = "parquet"


def file_kind(path: Path) -> FileKind:
    """The kind of ``path`` by its magic bytes."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] == _GZIP_MAGIC:
        return FileKind.GZIP
    if magic == _PARQUET_MAGIC:
        return FileKind.PARQUET
    return FileKind.TEXT


def existing_file(path: str | Path) -> Path:
    """``path`` as a Path, or an immediate clear error.

    Raises:
        NotFoundError: no such file.
    """
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"data file {str(p)!r} does not exist")
    return p


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it is gzip (whatever its name)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def line_chunks(path: Path, chunk_bytes: int, prefetch: int = 2) -> Iterator[bytes]:
    """Yield chunks of whole lines, each ending in ``\\n``.

    A last line without a newline gets one. A line longer than ``chunk_bytes`` makes a longer
    chunk. With ``prefetch > 0`` a background thread reads (and decompresses: zlib releases
    the GIL) up to that many chunks ahead while the caller parses.
    """
    for _, chunk in range_chunks(path, chunk_bytes, prefetch=prefetch):
        yield chunk


def range_chunks(
    path: Path, chunk_bytes: int, start: int = 0, stop: int | None = None, prefetch: int = 2
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, chunk)``: chunks of the whole lines of the byte range ``[start, stop)``
    (see the module docstring), each ending in ``\\n``, with the file offset of its first byte.

    Memory stays within about ``2 * chunk_bytes`` (plus the longest line) per chunk in flight.

    Raises:
        InvalidArgumentError: a range other than the whole file of a gzip file.
    """
    if (start, stop) != (0, None) and file_kind(path) is not FileKind.TEXT:
        raise InvalidArgumentError(f"{path}: a byte range of a compressed file cannot be read")
    source = _read_range(path, chunk_bytes, start, stop)
    if prefetch <= 0:
        yield from source
        return
    chunks: queue.Queue[tuple[int, bytes] | BaseException | None] = queue.Queue(maxsize=prefetch)
    done = threading.Event()

    def put(item: tuple[int, bytes] | BaseException | None) -> bool:
        while not done.is_set():
            try:
                chunks.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for chunk in source:
                if not put(chunk):
                    return
            put(None)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=read, name="embeddb-data-read", daemon=True)
    thread.start()
    try:
        while (item := chunks.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        done.set()
        thread.join()


def _read_range(
    path: Path, chunk_bytes: int, start: int, stop: int | None
) -> Iterator[tuple[int, bytes]]:
    with open_binary(path) as fh:
        base, buf = 0, b""  # buf holds the file's bytes from offset base, base a line start
        if start > 0:
            fh.seek(start - 1)
            base = start - 1
            while True:  # skip the rest of the line holding byte start - 1
                data = fh.read(chunk_bytes)
                if not data:
                    return
                cut = data.find(b"\n")
                if cut >= 0:
                    base, buf = base + cut + 1, data[cut + 1 :]
                    break
                base += len(data)
        while stop is None or base < stop:
            want = chunk_bytes if stop is None else max(min(chunk_bytes, stop - base), 1 << 16)
            data = fh.read(want)
            buf = buf + data if buf else data
            if stop is not None and base + len(buf) >= stop:  # buf holds byte stop - 1
                end = buf.find(b"\n", max(stop - 1 - base, 0))
                if end >= 0:
                    yield base, buf[: end + 1]
                    return
            if not data:
                if buf:
                    yield base, buf if buf.endswith(b"\n") else buf + b"\n"
                return
            cut = buf.rfind(b"\n") + 1
            if cut:
                yield base, buf[:cut]
                base, buf = base + cut, buf[cut:]


@functools.lru_cache(maxsize=256)
def _newlines_before(path: Path, offset: int, mtime_ns: int) -> int:
    count = 0
    with open(path, "rb") as fh:
        left = offset
        while left > 0:
            data = fh.read(min(_COUNT_BYTES, left))
            if not data:
                break
            count += data.count(b"\n")
            left -= len(data)
    return count


def newlines_before(path: Path, offset: int) -> int:
    """The number of ``\\n`` bytes in the first ``offset`` bytes of the plain file ``path``.

    Streamed (``bytes.count`` over blocks of 16 MiB, memory bounded) and cached: readers call it
    only to put a true line number into an error message, never on the normal path.
    """
    if offset <= 0:
        return 0
    return _newlines_before(path, offset, os.stat(path).st_mtime_ns)
