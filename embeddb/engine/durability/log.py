"""The update log: one shard's acknowledged mutations, appended in ``seq`` order.

The shard appends one record per mutation while it holds its own lock (:meth:`UpdateLog.append`
only frames the payload and hands it to the kernel with ``write(2)``), releases the lock, and
waits for the record to be as durable as the policy promises (:meth:`UpdateLog.wait_durable`)
before it acknowledges. Restore replays :meth:`UpdateLog.read` after a snapshot's seq; a follower
reads the same stream while appends continue, and tails it with :meth:`UpdateLog.wait_appended`
(a condition that ``append`` notifies only while somebody waits) between reads.

This module owns appending, rolling to a new segment and deleting old ones; the parts of the
log are drawn elsewhere:

- :mod:`.log_config`: :class:`LogConfig`, the fsync policies and their loss windows, and what
  opening does with a torn or corrupt tail;
- :mod:`.log_open`: opening a directory (its lock, the scan that validates it, the format
  upgrade of the active segment);
- :mod:`.log_sync`: carrying out the fsync policy (group commit, the interval thread) and a
  failed fsync;
- :mod:`.log_read`: reading back (:class:`~.log_read.LogReader`, the base of the log's classes);
- :mod:`.log_format`, :mod:`.log_scan`, :mod:`.log_fence`: the bytes on disk, the validation
  rules, the cut after a failed fsync.

Files
-----
A log is a directory of segments, each named after the seq of its first record; appends go to
the last (the *active*) segment, and a new one starts when the active one would exceed
``segment_bytes``. The segment header and the framing of a record (a CRC-32C-checksummed
header, then the payload, LZ4-compressed when that shrinks it) are drawn in :mod:`.log_format`,
with the format versions: segments of version 1 (zlib CRC-32) are still read, and a log that
ends in one continues in a new version-2 segment when it opens. :meth:`~UpdateLog.sync` and
:meth:`~UpdateLog.close` always fsync everything appended (``never`` included).

Failures while appending
------------------------
A failed ``write(2)`` (full disk, file size limit, I/O error) raises
:class:`~embeddb.errors.StorageError` with the errno message and the file, and the log cuts the
file back to the end of its last complete record, so the seq is not used and a later append
never follows a partial record. If that cut fails too, or an fsync fails (:mod:`.log_sync`),
the log is marked failed: every later append and every wait for an undurable seq raises. Reads
keep working.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from embeddb.config import FsyncPolicy
from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_format import (
    RECORD_HEADER,
    SEGMENT_HEADER,
    PayloadPart,
    Segment,
    create_segment,
    frame,
    os_error,
    record_header,
    write_all,
)
from embeddb.engine.durability.log_open import open_log
from embeddb.engine.durability.log_read import LogRecord, LogTruncatedError
from embeddb.engine.durability.log_scan import LogCut
from embeddb.engine.durability.log_sync import LogSync, close_quietly
from embeddb.errors import InvalidArgumentError, StorageError, UnavailableError

__all__ = ["LogConfig", "LogCut", "LogRecord", "LogTruncatedError", "UpdateLog"]

logger = logging.getLogger(__name__)


class UpdateLog(LogSync):
    """The append-only, segmented, checksummed update log of one shard.

    Args:
        directory: the log's directory (created if missing). One :class:`UpdateLog` at a time
            may open it (an exclusive ``flock``).
        config: fsync policy, segment size, compression.
        start_seq: when the directory holds no log, the first record gets ``start_seq + 1``
            (after restoring a snapshot taken at ``start_seq``). An existing log must reach at
            least ``start_seq``.
        io: the file layer its writes, fsyncs and renames go through (:mod:`.fileio`: tests
            inject faults there).

    Raises:
        StorageError: the directory cannot be created, opened or locked, or an existing log ends
            before ``start_seq``.
        CorruptDataError: a segment fails validation (see :mod:`.log_config`); torn tails,
            and corrupt ones where ``config`` allows it, are cut instead (:attr:`cuts`).

    All methods are thread-safe.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        start_seq: int = 0,
        io: FileIO = REAL,
    ) -> None:
        if start_seq < 0:
            raise InvalidArgumentError(f"start_seq must be >= 0, got {start_seq}")
        super().__init__(Path(directory))  # the lock, the segments, the readers' state
        self._init_sync(config if config is not None else LogConfig(), io)
        opened = open_log(self.directory, self.config, start_seq, self._fail)
        self._dir_fd, self._fd = opened.dir_fd, opened.fd
        self._segments, self._last_seq, self._cuts = opened.segments, opened.last_seq, opened.cuts
        self._durable_seq = self._last_seq
        self._durable_end = (self._segments[-1], self._segments[-1].size)  # where it ends
        self._first_seq = self._segments[0].first_seq
        self._timed_from = self._last_seq + 1  # append times are known from this seq on
        self._start_syncer()

    @property
    def cuts(self) -> tuple[LogCut, ...]:
        """The tails cut off the last segment when this log opened (also in ``log-cuts.jsonl``)."""
        return self._cuts

    # --------------------------------------------------------------------------------- appends

    def append(self, payload_parts: Sequence[PayloadPart]) -> int:
        """Append one record whose payload is the concatenation of ``payload_parts``.

        The parts (bytes, or C-contiguous buffers such as ``memoryview(array)``) are written
        with one ``writev(2)``, without an fsync; compression and checksumming happen before
        the log's lock is taken.

        Returns:
            The record's seq: ``last_seq + 1``.

        Raises:
            InvalidArgumentError: a part is not C-contiguous, or the payload exceeds 4 GiB - 1.
            StorageError: the write failed (the record is not in the log), or the log has failed
                earlier (see the module docstring).
            UnavailableError: the log is closed.
        """
        record = frame(payload_parts, self.config.lz4_min_bytes)
        size = RECORD_HEADER.size + record.stored
        with self._lock:
            self._check_writable()
            seq = self._last_seq + 1
            active = self._segments[-1]
            if active.size > SEGMENT_HEADER.size and active.size + size > self.config.segment_bytes:
                active = self._roll(seq)
            header = record_header(record, seq)
            try:
                write_all(self._fd, [header, *record.parts], size, self._io)
            except OSError as exc:
                self._cut_back(active, exc)
                raise os_error(
                    f"update log segment {active.path}: cannot append seq {seq}", exc
                ) from exc
            active.mark(seq, active.size)
            active.size += size
            self._published(seq)
        return seq

    # --------------------------------------------------------------------------- housekeeping

    def truncate_before(self, seq: int) -> int:
        """Delete the segments whose records all have a seq below ``seq``.

        Whole segments only, oldest first, never the active one; a reader that has opened a
        deleted segment reads it to its end.

        Returns:
            The bytes freed.

        Raises:
            StorageError: a segment could not be deleted.
            UnavailableError: the log is closed.
        """
        with self._sync_lock:
            if self._failed is None and not self._closed:
                self._sync_locked()  # fsyncs and closes sealed segments: no fd holds them
            with self._lock:
                if self._closed:
                    raise UnavailableError(f"update log {self.directory} is closed")
                doomed: list[Segment] = []
                while len(self._segments) > 1 and self._segments[1].first_seq <= seq:
                    doomed.append(self._segments.pop(0))
                self._first_seq = self._segments[0].first_seq
        freed = 0
        errors: list[str] = []
        for segment in doomed:
            try:
                segment.path.unlink()
                freed += segment.size
            except OSError as exc:
                errors.append(f"{segment.path}: {exc}")
        if doomed:
            try:
                os.fsync(self._dir_fd)
            except OSError as exc:  # not fatal: a deletion lost to a crash leaves a valid prefix
                logger.warning("update log %s: fsync of the directory failed: %s", self, exc)
        if errors:
            raise StorageError(f"cannot delete update log segments: {'; '.join(errors)}")
        return freed

    def close(self) -> None:
        """Stop the background thread, fsync everything appended (under every policy, unless
        the log has failed) and close the files. Idempotent.

        Raises:
            StorageError: the final fsync failed (the files are closed all the same).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True  # no more appends; every written record is covered below
            self._appended.notify_all()
        self._stop_syncer()
        with self._sync_lock:
            try:
                if self._failed is None:
                    self._sync_locked()
            finally:
                with self._lock:
                    self._close_retired()
                    close_quietly(self._fd)
                    self._fd = -1
                    close_quietly(self._dir_fd)  # releases the flock

    def __enter__(self) -> UpdateLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"UpdateLog({str(self.directory)!r}, seqs {self._first_seq}..{self._last_seq})"

    # -------------------------------------------------------------------------------- internals

    def _check_writable(self) -> None:
        if self._closed:
            raise UnavailableError(f"update log {self.directory} is closed")
        if self._failed is not None:
            raise self._failure()

    def _cut_back(self, segment: Segment, exc: OSError) -> None:
        """After a failed write (under ``_lock``): cut the partial record off, or fail the log."""
        try:
            os.ftruncate(self._fd, segment.size)
        except OSError as cut_exc:
            self._fail(
                os_error(
                    f"update log segment {segment.path}: cannot cut a partial record back to "
                    f"offset {segment.size} after '{exc}'",
                    cut_exc,
                )
            )

    def _roll(self, seq: int) -> Segment:
        """Seal the active segment and start one at ``seq`` (under ``_lock``; on failure the
        old one stays active). Not fsynced here, which would stall every writer: the next sync
        fsyncs it before the active one (:mod:`.log_sync`); under ``never`` it is closed
        unsynced, that policy leaves flushing to the OS."""
        old = self._segments[-1]
        segment, fd = create_segment(self.directory, self._dir_fd, seq, self._fail, self._io)
        old.sealed = True
        self._retired.append(self._fd)
        self._fd = fd
        self._segments.append(segment)
        if self.config.fsync is FsyncPolicy.NEVER and self._sync_lock.acquire(blocking=False):
            try:
                self._close_retired()
            finally:
                self._sync_lock.release()
        return segment
