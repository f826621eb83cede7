"""Opening data files (gzip or plain, told apart by their magic bytes) and reading them in
chunks of complete lines."""

from __future__ import annotations

import gzip
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from embeddb.errors import NotFoundError

_GZIP_MAGIC = b"\x1f\x8b"


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
    if prefetch <= 0:
        yield from _read_chunks(path, chunk_bytes)
        return
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=prefetch)
    stop = threading.Event()

    def put(item: bytes | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for chunk in _read_chunks(path, chunk_bytes):
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
        stop.set()
        thread.join()


def _read_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    rest = b""
    with open_binary(path) as fh:
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                break
            data = rest + data if rest else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            chunk, rest = data[:cut], data[cut:]
            yield chunk
    if rest:
        yield rest + b"\n"
