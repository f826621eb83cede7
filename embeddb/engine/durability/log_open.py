"""Opening an update log's directory: everything :class:`~embeddb.engine.durability.log.UpdateLog`
does before its first append.

:func:`open_log` creates the directory if missing and takes its exclusive ``flock`` (one log
at a time per directory), finishes a cut that a failed fsync left undone (:mod:`.log_fence`),
scans and validates every segment, cutting what the config allows (:mod:`.log_scan`), creates
the first segment of a new log, moves appends to a segment of the format written when the
active one is older (:func:`upgrade_active`), and opens the active segment for appending,
fsynced (what an earlier process wrote may still be only in the page cache).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_fence import apply_fence
from embeddb.engine.durability.log_format import (
    FILE_MODE,
    SEGMENT_HEADER,
    VERSION,
    Segment,
    create_segment,
    os_error,
    segment_header,
    write_all,
)
from embeddb.engine.durability.log_scan import LogCut, TailPolicy, scan_log
from embeddb.errors import StorageError

__all__ = ["OpenedLog", "fdatasync", "open_log", "upgrade_active"]

logger = logging.getLogger(
    "embeddb.engine.durability.log"
)  # the log's own logger: one place to tune

fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class OpenedLog(NamedTuple):
    """An update log's directory, opened: what the log appends with from now on."""

    dir_fd: int  # holds the directory's flock until closed
    fd: int  # the active segment, open for appending
    segments: list[Segment]
    last_seq: int
    cuts: tuple[LogCut, ...]  # the tails cut off the last segment


def open_log(
    directory: Path, config: LogConfig, start_seq: int, fail: Callable[[StorageError], None]
) -> OpenedLog:
    """Open (or create) the log in ``directory``; see the module docstring.

    Args:
        start_seq: when the directory holds no log, the first record gets ``start_seq + 1``;
            an existing log must reach at least ``start_seq``.
        fail: called with the error when a segment could not be written and cannot be
            removed either (see :func:`~.log_format.create_segment`).

    Raises:
        StorageError: the directory cannot be created, opened or locked, or an existing log ends
            before ``start_seq``.
        CorruptDataError: a segment fails validation (:mod:`.log_scan`).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise os_error(f"cannot open update log directory {directory}", exc) from exc
    fd = -1
    try:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise os_error(
                f"update log directory {directory} is in use by another UpdateLog", exc
            ) from exc
        apply_fence(directory, dir_fd)  # a cut a failed fsync left undone
        segments, last_seq, cuts = _recover(directory, dir_fd, config, start_seq, fail)
        upgrade_active(directory, dir_fd, segments, last_seq, fail)
        active = segments[-1]
        try:
            fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            # What an earlier process wrote may still be only in the page cache.
            fdatasync(fd)
            os.fsync(dir_fd)
        except OSError as exc:
            raise os_error(f"cannot open update log segment {active.path}", exc) from exc
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.close(dir_fd)  # also releases the flock
        raise
    return OpenedLog(dir_fd, fd, segments, last_seq, cuts)


def _recover(
    directory: Path,
    dir_fd: int,
    config: LogConfig,
    start_seq: int,
    fail: Callable[[StorageError], None],
) -> tuple[list[Segment], int, tuple[LogCut, ...]]:
    """Scan and validate the segments, cutting what the config allows (:mod:`.log_scan`);
    create the first segment of a new log. Returns the segments, the last seq and the cuts."""
    policy = TailPolicy(config.tail_recovery, config.cut_corrupt_tail, config.cuts_dir or directory)
    segments, next_seq, cuts = scan_log(directory, policy)
    if not segments:
        segment, fd = create_segment(directory, dir_fd, start_seq + 1, fail)
        os.close(fd)
        return [segment], start_seq, tuple(cuts)
    last_seq = next_seq - 1
    if start_seq > last_seq:
        raise StorageError(
            f"update log {directory} ends at seq {last_seq}, before start_seq "
            f"{start_seq}: it is older than the state it should continue"
        )
    return segments, last_seq, tuple(cuts)


def upgrade_active(
    directory: Path,
    dir_fd: int,
    segments: list[Segment],
    last_seq: int,
    fail: Callable[[StorageError], None],
) -> None:
    """Make the active segment one of the format written (:data:`~.log_format.VERSION`):
    an older one that holds records is sealed (fsynced first) and a new segment starts at
    the next seq (appended to ``segments``); one that holds none is replaced, atomically, by a
    new empty one."""
    active = segments[-1]
    if active.version == VERSION:
        return
    old = active.version
    try:
        if active.size > SEGMENT_HEADER.size:
            fd = os.open(active.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fdatasync(fd)
            finally:
                os.close(fd)
            segment, fd = create_segment(directory, dir_fd, last_seq + 1, fail)
            os.close(fd)
            active.sealed = True
            segments.append(segment)
        else:
            staged = active.path.with_name(f".{active.path.name}.new")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            fd = os.open(staged, flags, FILE_MODE)
            try:
                header = segment_header(active.first_seq)
                write_all(fd, [header], len(header))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(staged, active.path)
            os.fsync(dir_fd)
            active.version = VERSION
    except OSError as exc:
        raise os_error(
            f"cannot start a format-{VERSION} segment in update log {directory}", exc
        ) from exc
    logger.info(
        "update log %s: segment %s has format version %d; appends go to format version %d "
        "from seq %d on",
        directory, active.path.name, old, VERSION, last_seq + 1,
    )  # fmt: skip
