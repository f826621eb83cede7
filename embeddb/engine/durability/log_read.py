"""Reading an update log back while it is appended to: the read side of
:class:`~embeddb.engine.durability.log.UpdateLog`.

:class:`LogReader` holds what readers share with the writer, under one lock: the segments
(:class:`~embeddb.engine.durability.log_format.Segment`, each with its size in complete records and
a
sparse index of record offsets), the first and last seq, and the times of recent appends.
:class:`~embeddb.engine.durability.log.UpdateLog` derives from it and appends; a reader never sees a
partial record, since a segment's ``size`` grows only once a record is written whole. Restore
replays :meth:`LogReader.read` after a snapshot's seq; a follower reads the same stream and
tails it with :meth:`LogReader.wait_appended` between reads.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from embeddb.engine.durability.log_format import (
    RECORD_HEADER,
    SEGMENT_HEADER,
    Segment,
    decode,
    os_error,
    read_record,
)
from embeddb.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OutOfRangeError,
    StorageError,
    UnavailableError,
)

__all__ = ["LogReader", "LogRecord", "LogTruncatedError"]

_TIMES = 1 << 14  # append times remembered (a ring indexed by seq), for followers' lag


class LogRecord(NamedTuple):
    """One record read back: its seq and the payload as appended (decompressed)."""

    seq: int
    payload: bytes


class LogTruncatedError(OutOfRangeError, StorageError):
    """A reader asked for records that
    :meth:`~embeddb.engine.durability.log.UpdateLog.truncate_before`
    already deleted.

    Also an :class:`~embeddb.errors.OutOfRangeError` (gRPC ``OUT_OF_RANGE``): a follower that
    gets it must bootstrap again from a snapshot.

    Attributes:
        after_seq: the reader wanted the records after this seq.
        first_seq: the lowest seq the log still holds.
    """

    def __init__(self, directory: Path, after_seq: int, first_seq: int) -> None:
        self.after_seq = after_seq
        self.first_seq = first_seq
        super().__init__(
            f"update log {directory}: the records after seq {after_seq} were truncated away; "
            f"the log starts at seq {first_seq} (a follower must bootstrap again from a snapshot)"
        )


class LogReader:
    """The segments of an open update log, and the records read back from them.

    The base of :class:`~embeddb.engine.durability.log.UpdateLog` (``UpdateLog`` below), which fills
    in
    the segments when it opens and calls :meth:`_published` (under ``_lock``) after each append.

    Args:
        directory: the log's directory.

    All methods are thread-safe.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()  # appends, segment list, counters
        self._closed = False
        self._appended = threading.Condition(self._lock)  # notified by append when _waiting
        self._waiting = 0
        self._times: list[float] = [0.0] * _TIMES  # wall-clock append time of seq, at seq % _TIMES
        self._segments: list[Segment] = []
        self._first_seq = 0
        self._last_seq = 0
        self._timed_from = 1  # append times are known from this seq on

    @property
    def last_seq(self) -> int:
        """The highest seq appended (``start_seq``, 0 by default, for an empty log)."""
        return self._last_seq

    @property
    def first_seq(self) -> int:
        """The lowest seq still held (``last_seq + 1`` when the log holds no record)."""
        return self._first_seq

    # ----------------------------------------------------------------------------------- tails

    def wait_appended(self, after_seq: int, timeout: float | None = None) -> bool:
        """Block until a record with a seq above ``after_seq`` is appended (or already is).

        For readers that tail the log (followers): :meth:`UpdateLog.append` wakes the waiters at
        once, and costs nothing extra while nobody waits.

        Args:
            after_seq: wait for ``last_seq > after_seq``.
            timeout: seconds to wait at most; None waits until an append or
                :meth:`UpdateLog.close`.

        Returns:
            Whether ``last_seq > after_seq`` (False after a timeout or once the log is closed).
        """
        with self._lock:
            if self._last_seq <= after_seq and not self._closed:
                self._waiting += 1
                try:
                    self._appended.wait_for(
                        lambda: self._last_seq > after_seq or self._closed, timeout
                    )
                finally:
                    self._waiting -= 1
            return self._last_seq > after_seq

    def append_time(self, seq: int) -> float | None:
        """The wall-clock time (``time.time()``) at which record ``seq`` was appended, if known:
        for records appended by this :class:`UpdateLog` among its last 16,384; else None."""
        with self._lock:
            if self._timed_from <= seq <= self._last_seq and self._last_seq - seq < _TIMES:
                return self._times[seq % _TIMES]
        return None

    def _published(self, seq: int) -> None:
        """Record ``seq`` is written whole (under ``_lock``): it is the last seq now; note the
        time and wake the readers that wait for it."""
        self._last_seq = seq
        self._times[seq % _TIMES] = time.time()
        if self._waiting:
            self._appended.notify_all()

    # ----------------------------------------------------------------------------------- reads

    def read(self, after_seq: int = 0) -> Iterator[LogRecord]:
        """The records with seq > ``after_seq``, in seq order, across segments.

        The iterator reads what was appended before the call and also what is appended while
        it runs, never a partial record; it ends once it has caught up with the writer.

        Raises:
            LogTruncatedError: the records after ``after_seq`` were truncated away (raised by
                this call, or while iterating if a truncation overtakes the reader).
            CorruptDataError: a record fails its checksum (while iterating; names the file and
                offset).
            UnavailableError: the log is closed.
        """
        if after_seq < 0:
            raise InvalidArgumentError(f"after_seq must be >= 0, got {after_seq}")
        with self._lock:
            if self._closed:
                raise UnavailableError(f"update log {self.directory} is closed")
            if after_seq + 1 < self._first_seq:
                raise LogTruncatedError(self.directory, after_seq, self._first_seq)
        return self._records(after_seq + 1)

    def _records(self, next_seq: int) -> Iterator[LogRecord]:
        while True:
            with self._lock:
                if next_seq > self._last_seq:
                    return
                if next_seq < self._first_seq:
                    raise LogTruncatedError(self.directory, next_seq - 1, self._first_seq)
                firsts = [s.first_seq for s in self._segments]
                segment = self._segments[bisect.bisect_right(firsts, next_seq) - 1]
                k = bisect.bisect_right(segment.mark_seqs, next_seq) - 1
                seq, offset = (
                    (segment.mark_seqs[k], segment.mark_offsets[k])
                    if k >= 0
                    else (segment.first_seq, SEGMENT_HEADER.size)
                )
            try:
                f = open(segment.path, "rb", buffering=1 << 16)  # noqa: SIM115 (closed by the with below)
            except FileNotFoundError:
                with self._lock:
                    gone = next_seq < self._first_seq
                if gone:
                    raise LogTruncatedError(self.directory, next_seq - 1, self._first_seq) from None
                raise
            except OSError as exc:
                raise os_error(f"cannot read update log segment {segment.path}", exc) from exc
            with f:
                f.seek(offset)
                crc = segment.crc
                while True:
                    with self._lock:
                        end, sealed = segment.size, segment.sealed
                    if offset >= end:
                        if sealed:
                            break  # on to the next segment
                        return  # caught up with the writer
                    while offset < end:
                        record = read_record(f, offset, end, crc)
                        if isinstance(record, str):
                            raise CorruptDataError(
                                f"update log segment {segment.path}: {record} at offset {offset}"
                            )
                        got, flags, length, stored = record
                        if got != seq:
                            raise CorruptDataError(
                                f"update log segment {segment.path}: the record at offset "
                                f"{offset} has seq {got}, expected {seq}"
                            )
                        if seq >= next_seq:
                            payload = decode(segment.path, offset, flags, length, stored)
                            next_seq = seq + 1
                            yield LogRecord(seq, payload)
                        offset += RECORD_HEADER.size + len(stored)
                        seq += 1
