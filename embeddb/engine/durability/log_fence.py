"""After a failed fsync under ``fsync: always``: cut the log back to its last durable record.

Under ``always`` a call is acknowledged only once an fsync covering its record has completed,
so when an fsync fails, every record after the last durable one belongs to a call that is
refused (``UNAVAILABLE``) — yet its bytes may already be in the file, and a restart would replay
them. So at the failure the log (fail-stop: it writes nothing more to any segment):

1. writes a **fence** — ``durable-end.json`` in the log's directory: the last durable seq, the
   segment holding it and the offset where that segment's durable records end — to a staged
   file, fsyncs it, renames it into place and fsyncs the directory;
2. cuts the log back to that position: deletes the segments after it, ``ftruncate`` s the one
   holding it to the offset and fsyncs it and the directory.

Both are best effort, and either one suffices: the next open applies a fence it finds
(:func:`apply_fence`, before the segments are scanned) and then removes it. If neither can be
written — the device refuses every write, fsync and rename — the records of the refused calls
may survive in the file and a restart replays them, whole (never part of one): the guarantee
then falls back to "entirely or not at all", as with PostgreSQL, which PANICs on a failed fsync
and replays its WAL at the next start. The server log says which case happened.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from embeddb.engine.durability.fileio import FileIO
from embeddb.engine.durability.log_format import FILE_MODE, Segment, os_error, write_all
from embeddb.errors import StorageError

__all__ = ["FENCE", "apply_fence", "fence"]

FENCE = "durable-end.json"

logger = logging.getLogger(
    "embeddb.engine.durability.log"
)  # the log's own logger: one place to tune


def fence(
    directory: Path,
    dir_fd: int,
    segments: list[Segment],
    end: tuple[Segment, int],
    seq: int,
    io: FileIO,
) -> bool:
    """Record the durable end ``end`` (segment, offset; records up to ``seq``) and cut the log
    back to it (the log's lock held, the log failed). Returns whether the cut was made durable;
    never raises an :class:`OSError` (both steps are best effort, failures are logged). Once
    cut, ``segments`` (the log's list, in memory) ends there too."""
    segment, offset = end
    marked = _write_fence(directory, dir_fd, segment, offset, seq, io)
    if segment not in segments:  # deleted meanwhile (truncate_before): the fence alone cuts
        return False
    later = segments[segments.index(segment) + 1 :]
    try:
        for doomed in later:
            doomed.path.unlink(missing_ok=True)
        _cut(segment.path, offset, io)
        io.fsync_dir(dir_fd)
    except OSError as exc:
        logger.error(
            "update log %s: cannot cut the records after seq %d (never acknowledged) off %s at "
            "offset %d: %s; %s",
            directory, seq, segment.path.name, offset, exc,
            "the next start drops them (durable-end.json)" if marked else
            "the fence could not be written either: a restart may replay them",
        )  # fmt: skip
        return False
    del segments[len(segments) - len(later) :]
    segment.size = offset
    while segment.mark_offsets and segment.mark_offsets[-1] >= offset:
        segment.mark_offsets.pop()
        segment.mark_seqs.pop()
    logger.warning(
        "update log %s: cut back to seq %d, its last durable record, after a failed fsync",
        directory, seq,
    )  # fmt: skip
    return True


def apply_fence(directory: Path, dir_fd: int) -> None:
    """At open, before the segments are scanned: drop what a fence (left by :func:`fence`)
    marks as never acknowledged, then remove the fence.

    Raises:
        StorageError: the fence is unreadable, or the cut cannot be made.
    """
    path = directory / FENCE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise os_error(f"cannot read the update log fence {path}", exc) from exc
    try:
        mark = json.loads(text)
        name, offset, seq = str(mark["segment"]), int(mark["offset"]), int(mark["seq"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"update log fence {path} is not valid: {exc}") from exc
    dropped = 0
    try:
        for later in sorted(directory.glob("*.log")):
            if later.name > name:  # zero-padded first seqs: later segments sort after
                dropped += later.stat().st_size
                later.unlink()
        segment = directory / name
        if segment.exists() and segment.stat().st_size > offset:
            dropped += segment.stat().st_size - offset
            _cut(segment, offset, FileIO())
        os.fsync(dir_fd)
        path.unlink()
        os.fsync(dir_fd)
    except OSError as exc:
        raise os_error(f"update log {directory}: cannot apply the fence {path}", exc) from exc
    if dropped:
        logger.warning(
            "update log %s: dropped %d bytes after seq %d, records of calls refused after a "
            "failed fsync (never acknowledged)",
            directory, dropped, seq,
        )  # fmt: skip


def _cut(path: Path, offset: int, io: FileIO) -> None:
    """Truncate the segment ``path`` to ``offset`` and fsync it (raises :class:`OSError`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        io.truncate(fd, offset)
        io.fsync(fd)
    finally:
        os.close(fd)


def _write_fence(
    directory: Path, dir_fd: int, segment: Segment, offset: int, seq: int, io: FileIO
) -> bool:
    staged = directory / f".{FENCE}.new"
    data = json.dumps({"seq": seq, "segment": segment.path.name, "offset": offset}).encode()
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            write_all(fd, [data], len(data), io)
            io.fsync(fd)
        finally:
            os.close(fd)
        io.replace(staged, directory / FENCE)
        io.fsync_dir(dir_fd)
    except OSError as exc:
        logger.error("update log %s: cannot write the fence %s: %s", directory, FENCE, exc)
        return False
    return True
