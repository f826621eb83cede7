"""The update log: one shard's acknowledged mutations, appended in ``seq`` order.

The shard appends one record per mutation while it holds its own lock (:meth:`UpdateLog.append`
only frames the payload and hands it to the kernel with ``write(2)``), releases the lock, and
waits for the record to be as durable as the policy promises (:meth:`UpdateLog.wait_durable`)
before it acknowledges. Restore replays :meth:`UpdateLog.read` after a snapshot's seq; a follower
reads the same stream while appends continue, and tails it with :meth:`UpdateLog.wait_appended`
(a condition that ``append`` notifies only while somebody waits) between reads.

Files
-----
A log is a directory of **segments**, each named after the seq of its first record; appends go
to the last (the *active*) segment, a new one starts when the active one would exceed
``segment_bytes``, and a record never spans two segments::

    <directory>/
        00000000000000000001.log        seqs 1 .. 41236          (sealed: complete and fsynced)
        00000000000000041237.log        seqs 41237 .. last_seq   (active)

A segment is a 24-byte header followed by records (all integers little-endian)::

    segment header
    0          8          12                    20         24
    ┌──────────┬──────────┬─────────────────────┬──────────┐
    │ magic    │ version  │ first_seq  u64      │ crc32 of │
    │"EMBDBLOG"│ u32 = 1  │ (= the file's name) │ 0:20     │
    └──────────┴──────────┴─────────────────────┴──────────┘

    record: a 21-byte header, then the stored payload
    0          4          8                     16         20     21
    ┌──────────┬──────────┬─────────────────────┬──────────┬──────┬─────────────────────┐
    │ crc32    │ stored   │ seq  u64            │ length   │ flags│ stored payload      │
    │          │ u32      │                     │ u32      │ u8   │ (`stored` bytes)    │
    └──────────┴──────────┴─────────────────────┴──────────┴──────┴─────────────────────┘
    crc32  = zlib.crc32(stored payload ‖ header bytes 4:21)
    flags  bit 0 (LZ4): the stored payload is one LZ4 frame of the `length` payload bytes;
           without it, stored == length and the payload is stored as is. Other bits: reserved, 0.

For example the record of seq 7 with the 5-byte payload ``hello`` is 26 bytes: a header with
``stored = 5, seq = 7, length = 5, flags = 0`` and its crc, then ``hello``. A payload of at least
``lz4_min_bytes`` is stored LZ4-compressed when that makes it smaller; reading decompresses into
at most ``length`` bytes and checks that the frame ends there.

Fsync policies and their loss windows
-------------------------------------
:meth:`~UpdateLog.append` returns only after ``write(2)`` has, so a crash of the **process**
(``kill -9``, an exception) loses nothing appended under any policy: the kernel still holds it.
The policies differ on **power loss or a kernel crash**:

- ``always``: :meth:`~UpdateLog.wait_durable` returns once an fsync covering the record has
  completed. Group commit: one fsync covers every record appended before it started, and
  concurrent waiters share it. Loses nothing acknowledged; costs an fsync (~0.1–10 ms by
  device) per group of concurrent requests.
- ``interval`` (the default, every 5 ms): :meth:`~UpdateLog.wait_durable` returns at once; a
  background thread fsyncs every ``interval_ms``. Loses at most the acknowledged updates of the
  last ``interval_ms`` plus the duration of one fsync.
- ``never``: fsync is left to the kernel's writeback (typically up to 30 s of updates lost).

The default is ``interval`` because ``always`` puts an fsync in the path of every acknowledged
request group — its cost is measured by the durability benchmark — while training tolerates a
few milliseconds of lost gradient updates after a power cut (a snapshot plus the log loses
nothing else). A sealed segment is fsynced by the next sync (never inline on the append path,
where an fsync of a whole segment would stall every writer), before the active one; so a
process crash tears at most the last segment, and only a power loss within the policy's window
can leave a torn tail in the previous one too (reported as corruption, naming the file: cut it
at the reported offset). :meth:`~UpdateLog.sync` and :meth:`~UpdateLog.close` always fsync
everything appended (``never`` included).

Torn tail or corruption
-----------------------
Opening a directory validates every record of every segment (:mod:`.log_scan`). Only the end
of the **last** segment may hold bytes that are not an intact record:

- A **torn tail** is a prefix of the next record — fewer than 21 bytes, a plausible header of
  the next seq whose payload runs past the end of the file, or all zero bytes (pages a power
  loss left unwritten). It was never acknowledged: it is cut with a warning under every mode,
  and appends continue with the next seq.
- A **corrupt tail** — a complete record (header and ``stored`` payload bytes within the file)
  that fails its checksum, a header that is present but implausible (another seq, fields that
  disagree), invalid bytes followed by an intact record — may hold acknowledged updates.
  ``LogConfig.recovery`` decides, after RocksDB's WAL recovery modes: ``absolute_consistency``
  (the default under ``always``) refuses to open with :class:`~embeddb.errors.CorruptDataError`
  naming the file, the byte offset and the seq; ``point_in_time`` (the default under
  ``interval`` and ``never``, whose power-loss window allows it) cuts it, logged at ERROR.
  ``LogConfig.cut_corrupt_tail`` (``embeddb serve --cut-corrupt-log-tail``) cuts it under
  either mode; it is also the only way past a hole (invalid bytes, then intact records).

Every cut is recorded before the file is truncated, so nothing is destroyed silently: a JSON
line in ``log-cuts.jsonl`` and the cut bytes in ``log-cuts/<segment>-<offset>.bin``, in
``LogConfig.cuts_dir``; :attr:`UpdateLog.cuts` lists the cuts of this opening. Anything else is
corruption under every mode: an invalid record or header in an earlier segment, a gap or
repeat in the seqs between records or segments, a segment header that does not match its name.

Failures while appending
------------------------
A failed ``write(2)`` (full disk, file size limit, I/O error) raises
:class:`~embeddb.errors.StorageError` with the errno message and the file, and the log cuts the
file back to the end of its last complete record, so the seq is not used and a later append
never follows a partial record. If that cut fails too, or an fsync fails (after which the
kernel may have dropped the unwritten pages, so a retry proves nothing), the log is marked
failed: every later append and every wait for an undurable seq raises. Reads keep working.
"""

from __future__ import annotations

import bisect
import enum
import errno
import fcntl
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeAlias

import lz4.frame

from embeddb.config import LogRecovery
from embeddb.durability.log_scan import (
    FIELDS,
    FILE_MODE,
    LZ4,
    RECORD_HEADER,
    SEGMENT_HEADER,
    LogCut,
    Segment,
    TailPolicy,
    decode,
    os_error,
    read_record,
    scan_log,
    segment_header,
)
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    InvalidArgumentError,
    OutOfRangeError,
    StorageError,
    UnavailableError,
)

__all__ = ["FsyncPolicy", "LogConfig", "LogCut", "LogRecord", "LogTruncatedError", "UpdateLog"]

_logger = logging.getLogger(__name__)

PayloadPart: TypeAlias = bytes | bytearray | memoryview

_MAX_LENGTH = 0xFFFF_FFFF
_PROBE_BYTES = 64 << 10  # payloads of 4x this are probed before a full LZ4 attempt
_IOV_MAX = 1000  # below the kernel's 1024 buffers per writev
_TIMES = 1 << 14  # append times remembered (a ring indexed by seq), for followers' lag
_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class FsyncPolicy(str, enum.Enum):
    """When an appended record is fsynced (see the module docstring for the loss windows)."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True)
class LogConfig:
    """Settings of one update log.

    Attributes:
        fsync: the fsync policy; a string (``"always"``) is converted.
        interval_ms: how often the ``interval`` policy's background thread fsyncs.
        segment_bytes: a segment is sealed before a record would take it past this size (a
            record larger than this gets a segment of its own).
        lz4_min_bytes: payloads of at least this many bytes are stored LZ4-compressed when that
            shrinks them; 0 turns compression off.
        recovery: what opening does with a corrupt tail (see the module docstring); ``auto``
            is ``absolute_consistency`` under ``always``, else ``point_in_time``. A string is
            converted.
        cut_corrupt_tail: cut a corrupt tail of the last segment whatever ``recovery`` says:
            the operator accepts losing its records (the cut is recorded).
        cuts_dir: where cuts are recorded (``log-cuts.jsonl``, ``log-cuts/``); None: the
            log's directory.

    Raises:
        ConfigError: a value is out of range.
    """

    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    interval_ms: float = 5.0
    segment_bytes: int = 64 << 20
    lz4_min_bytes: int = 4096
    recovery: LogRecovery = LogRecovery.AUTO
    cut_corrupt_tail: bool = False
    cuts_dir: Path | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "fsync", FsyncPolicy(self.fsync))
        except ValueError:
            raise ConfigError(
                "fsync", f"must be always, interval or never, got {self.fsync!r}"
            ) from None
        try:
            object.__setattr__(self, "recovery", LogRecovery(self.recovery))
        except ValueError:
            modes = ", ".join(m.value for m in LogRecovery)
            raise ConfigError("recovery", f"must be {modes}, got {self.recovery!r}") from None
        if not self.interval_ms > 0:
            raise ConfigError("interval_ms", f"must be > 0, got {self.interval_ms!r}")
        if self.segment_bytes < 1:
            raise ConfigError("segment_bytes", f"must be > 0, got {self.segment_bytes!r}")
        if self.lz4_min_bytes < 0:
            raise ConfigError("lz4_min_bytes", f"must be >= 0, got {self.lz4_min_bytes!r}")

    @property
    def tail_recovery(self) -> LogRecovery:
        """``recovery`` in force: ``auto`` resolved by the fsync policy."""
        if self.recovery is not LogRecovery.AUTO:
            return self.recovery
        if self.fsync is FsyncPolicy.ALWAYS:
            return LogRecovery.ABSOLUTE_CONSISTENCY
        return LogRecovery.POINT_IN_TIME


class LogRecord(NamedTuple):
    """One record read back: its seq and the payload as appended (decompressed)."""

    seq: int
    payload: bytes


class LogTruncatedError(OutOfRangeError, StorageError):
    """A reader asked for records that :meth:`UpdateLog.truncate_before` already deleted.

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


class UpdateLog:
    """The append-only, segmented, checksummed update log of one shard.

    Args:
        directory: the log's directory (created if missing). One :class:`UpdateLog` at a time
            may open it (an exclusive ``flock``).
        config: fsync policy, segment size, compression.
        start_seq: when the directory holds no log, the first record gets ``start_seq + 1``
            (after restoring a snapshot taken at ``start_seq``). An existing log must reach at
            least ``start_seq``.

    Raises:
        StorageError: the directory cannot be created, opened or locked, or an existing log ends
            before ``start_seq``.
        CorruptDataError: a segment fails validation (see the module docstring); torn tails,
            and corrupt ones where ``config`` allows it, are cut instead (:attr:`cuts`).

    All methods are thread-safe.
    """

    def __init__(
        self, directory: str | os.PathLike[str], config: LogConfig | None = None, start_seq: int = 0
    ) -> None:
        if start_seq < 0:
            raise InvalidArgumentError(f"start_seq must be >= 0, got {start_seq}")
        self.directory = Path(directory)
        self.config = config if config is not None else LogConfig()
        self._lock = threading.Lock()  # appends, segment list, counters
        self._sync_lock = threading.Lock()  # one fsync at a time; taken before _lock, never after
        self._failed: StorageError | None = None
        self._closed = False
        self._retired: list[int] = []  # fds of sealed segments, closed by a _sync_lock holder
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self._appended = threading.Condition(self._lock)  # notified by append when _waiting
        self._waiting = 0
        self._times: list[float] = [0.0] * _TIMES  # wall-clock append time of seq, at seq % _TIMES
        self._cuts: tuple[LogCut, ...] = ()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error(f"cannot open update log directory {self.directory}", exc) from exc
        self._fd = -1
        try:
            try:
                fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                raise os_error(
                    f"update log directory {self.directory} is in use by another UpdateLog", exc
                ) from exc
            self._segments, self._last_seq = self._recover(start_seq)
            active = self._segments[-1]
            try:
                self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                # What an earlier process wrote may still be only in the page cache.
                _fdatasync(self._fd)
                os.fsync(self._dir_fd)
            except OSError as exc:
                raise os_error(f"cannot open update log segment {active.path}", exc) from exc
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._dir_fd)  # also releases the flock
            raise
        self._durable_seq = self._last_seq
        self._first_seq = self._segments[0].first_seq
        self._timed_from = self._last_seq + 1  # append times are known from this seq on
        if self.config.fsync is FsyncPolicy.INTERVAL:
            self._syncer = threading.Thread(
                target=self._sync_every,
                args=(self.config.interval_ms / 1000.0,),
                name=f"embeddb-log-sync:{self.directory.name}",
                daemon=True,
            )
            self._syncer.start()

    # ------------------------------------------------------------------------------ properties

    @property
    def last_seq(self) -> int:
        """The highest seq appended (``start_seq``, 0 by default, for an empty log)."""
        return self._last_seq

    @property
    def cuts(self) -> tuple[LogCut, ...]:
        """The tails cut off the last segment when this log opened (also in ``log-cuts.jsonl``)."""
        return self._cuts

    @property
    def durable_seq(self) -> int:
        """The highest seq known to be fsynced."""
        return self._durable_seq

    @property
    def first_seq(self) -> int:
        """The lowest seq still held (``last_seq + 1`` when the log holds no record)."""
        return self._first_seq

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
        parts = [_byte_view(p) for p in payload_parts]
        length = sum(len(p) for p in parts)
        if length > _MAX_LENGTH:
            raise InvalidArgumentError(f"an update log payload is at most 4 GiB - 1, got {length}")
        flags = 0
        min_bytes = self.config.lz4_min_bytes
        if min_bytes and length >= min_bytes:
            packed = _compress(parts, length)
            if packed is not None:
                parts, flags = [packed], LZ4
        if len(parts) > _IOV_MAX:
            parts = [b"".join(parts)]
        stored = len(parts[0]) if flags else length
        crc = 0
        for p in parts:
            crc = zlib.crc32(p, crc)
        size = RECORD_HEADER.size + stored
        with self._lock:
            self._check_writable()
            seq = self._last_seq + 1
            active = self._segments[-1]
            if active.size > SEGMENT_HEADER.size and active.size + size > self.config.segment_bytes:
                active = self._roll(seq)
            fields = FIELDS.pack(stored, seq, length, flags)
            header = RECORD_HEADER.pack(zlib.crc32(fields, crc), stored, seq, length, flags)
            try:
                _write_all(self._fd, [header, *parts], size)
            except OSError as exc:
                self._cut_back(active, exc)
                raise os_error(
                    f"update log segment {active.path}: cannot append seq {seq}", exc
                ) from exc
            active.mark(seq, active.size)
            active.size += size
            self._last_seq = seq
            self._times[seq % _TIMES] = time.time()
            if self._waiting:
                self._appended.notify_all()
        return seq

    def wait_appended(self, after_seq: int, timeout: float | None = None) -> bool:
        """Block until a record with a seq above ``after_seq`` is appended (or already is).

        For readers that tail the log (followers): :meth:`append` wakes the waiters at once, and
        costs nothing extra while nobody waits.

        Args:
            after_seq: wait for ``last_seq > after_seq``.
            timeout: seconds to wait at most; None waits until an append or :meth:`close`.

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

    def wait_durable(self, seq: int) -> None:
        """Block until record ``seq`` is as durable as the fsync policy promises.

        ``always``: until an fsync covering it has completed (sharing one fsync with concurrent
        waiters). ``interval`` and ``never``: returns at once.

        Raises:
            InvalidArgumentError: ``seq`` has not been appended.
            StorageError: the log has failed and ``seq`` is not known to be durable.
        """
        if seq > self._last_seq:
            raise InvalidArgumentError(f"seq {seq} was not appended (last seq {self._last_seq})")
        if self._durable_seq >= seq:
            return
        if self._failed is not None:
            raise self._failure()
        if self.config.fsync is not FsyncPolicy.ALWAYS:
            return
        with self._sync_lock:  # whoever holds it fsyncs for everyone appended so far
            if self._durable_seq < seq:
                self._sync_locked()

    def sync(self) -> None:
        """Fsync every record appended so far, whatever the policy.

        Raises:
            StorageError: the fsync failed (the log is then marked failed).
        """
        with self._sync_lock:
            self._sync_locked()

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
                while True:
                    with self._lock:
                        end, sealed = segment.size, segment.sealed
                    if offset >= end:
                        if sealed:
                            break  # on to the next segment
                        return  # caught up with the writer
                    while offset < end:
                        record = read_record(f, offset, end)
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
                _logger.warning("update log %s: fsync of the directory failed: %s", self, exc)
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
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        with self._sync_lock:
            try:
                if self._failed is None:
                    self._sync_locked()
            finally:
                with self._lock:
                    self._close_retired()
                    _close_quietly(self._fd)
                    self._fd = -1
                    _close_quietly(self._dir_fd)  # releases the flock

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

    def _failure(self) -> StorageError:
        err = StorageError(
            f"update log {self.directory} failed earlier and accepts no more appends: "
            f"{self._failed}"
        )
        err.__cause__ = self._failed
        return err

    def _fail(self, err: StorageError) -> None:
        if self._failed is None:
            self._failed = err
            _logger.error("update log %s failed, appends now raise: %s", self.directory, err)

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
        """Seal the active segment and start one at ``seq`` (under ``_lock``). On failure the
        old segment stays active.

        The sealed segment is not fsynced here, on the append path (an fsync of up to a
        segment's worth of data would stall every writer): the next sync — the ``interval``
        thread's, an ``always`` waiter's, or :meth:`close` — fsyncs it before the active one,
        so ``durable_seq`` never covers an unsynced record. Under ``never`` it is closed
        unsynced, as that policy leaves flushing to the OS."""
        old = self._segments[-1]
        segment, fd = self._create_segment(seq)
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

    def _create_segment(self, first_seq: int) -> tuple[Segment, int]:
        """Create an empty segment (header written, directory fsynced); returns it and its fd."""
        path = self.directory / f"{first_seq:020d}.log"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
            fd = os.open(path, flags, FILE_MODE)
        except OSError as exc:
            raise os_error(f"cannot create update log segment {path}", exc) from exc
        try:
            header = segment_header(first_seq)
            _write_all(fd, [header], len(header))
            os.fsync(self._dir_fd)
        except OSError as exc:
            os.close(fd)
            err = os_error(f"cannot create update log segment {path}", exc)
            try:
                path.unlink()
            except OSError:
                # A stray segment would break the seq order on reopen.
                self._fail(err)
            raise err from exc
        return Segment(path, first_seq, len(header), sealed=False), fd

    def _close_retired(self) -> None:
        for fd in self._retired:  # callers have fsynced them, or need not (``never``)
            _close_quietly(fd)
        self._retired = []

    def _sync_locked(self) -> None:
        """One fsync covering every record appended so far (``_sync_lock`` held)."""
        with self._lock:
            if self._failed is not None:
                raise self._failure()
            if self._fd < 0:
                return
            target, fd = self._last_seq, self._fd
            retired, self._retired = self._retired, []
        try:
            for old in retired:  # sealed segments first: their records precede the active's
                _fdatasync(old)
                _close_quietly(old)
                retired = retired[1:]
        except OSError as exc:
            with self._lock:
                self._retired = retired + self._retired
            err = os_error(f"update log {self.directory}: fsync of a sealed segment failed", exc)
            with self._lock:
                self._fail(err)
            raise err from exc
        if target <= self._durable_seq:
            return
        try:
            _fdatasync(fd)  # stays open: only a _sync_lock holder closes fds
        except OSError as exc:
            err = os_error(f"update log {self.directory}: fsync failed", exc)
            with self._lock:
                self._fail(err)
            raise err from exc
        with self._lock:
            self._durable_seq = max(self._durable_seq, target)

    def _sync_every(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            if self._durable_seq >= self._last_seq:
                continue
            try:
                self.sync()
            except StorageError:
                return  # the log is marked failed and logged; appends now raise

    # -------------------------------------------------------------------------------- recovery

    def _recover(self, start_seq: int) -> tuple[list[Segment], int]:
        """Scan and validate the segments, cutting what the config allows (:mod:`.log_scan`);
        create the first segment of a new log. Returns the segments and the last seq."""
        cfg = self.config
        policy = TailPolicy(cfg.tail_recovery, cfg.cut_corrupt_tail, cfg.cuts_dir or self.directory)
        segments, next_seq, cuts = scan_log(self.directory, policy)
        self._cuts = tuple(cuts)
        if not segments:
            segment, fd = self._create_segment(start_seq + 1)
            os.close(fd)
            return [segment], start_seq
        last_seq = next_seq - 1
        if start_seq > last_seq:
            raise StorageError(
                f"update log {self.directory} ends at seq {last_seq}, before start_seq "
                f"{start_seq}: it is older than the state it should continue"
            )
        return segments, last_seq


# ------------------------------------------------------------------------------------ helpers


def _close_quietly(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError as exc:
            _logger.warning("closing an update log file failed: %s", exc)


def _byte_view(part: PayloadPart) -> bytes | memoryview:
    if isinstance(part, bytes):
        return part
    view = memoryview(part)
    if view.ndim == 1 and view.format == "B" and view.c_contiguous:
        return view
    try:
        return view.cast("B")
    except TypeError as exc:
        raise InvalidArgumentError(f"an update log payload part must be contiguous: {exc}") from exc


def _compress(parts: list[bytes | memoryview], length: int) -> bytes | None:
    """The payload as one LZ4 frame, or None when that would not shrink it by 10%.

    A large payload is probed first: three windows (start, middle, end) of its largest part
    (for a shard's records, the rows) are compressed, and if they do not shrink by 10% the
    full attempt is skipped — float vectors and optimizer state rarely compress.
    """
    if length >= 4 * _PROBE_BYTES:
        big = max(parts, key=len)
        view = memoryview(big).cast("B") if isinstance(big, memoryview) else memoryview(big)
        if len(view) >= _PROBE_BYTES:
            window = _PROBE_BYTES // 4
            starts = (0, (len(view) - window) // 2, len(view) - window)
            sample = b"".join(view[a : a + window] for a in starts)
            if len(lz4.frame.compress(sample)) >= 0.9 * len(sample):
                return None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    packed: bytes = lz4.frame.compress(data)
    return packed if len(packed) < 0.9 * length else None


def _write_all(fd: int, buffers: list[bytes | memoryview], total: int) -> None:
    """``writev`` all of ``buffers``, resuming after short writes."""
    done = os.writev(fd, buffers)
    while done < total:
        if done == 0:
            raise OSError(errno.EIO, "write(2) wrote nothing")
        rest: list[bytes | memoryview] = []
        for b in buffers:
            if done >= len(b):
                done -= len(b)
                continue
            rest.append(memoryview(b)[done:])
            done = 0
        buffers = rest
        total = sum(len(b) for b in rest)
        done = os.writev(fd, buffers)
