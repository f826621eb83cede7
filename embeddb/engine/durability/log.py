"""The update log: one shard's acknowledged mutations, appended in ``seq`` order.

The shard appends one record per mutation while it holds its own lock (:meth:`UpdateLog.append`
only frames the payload and hands it to the kernel with ``write(2)``), releases the lock, and
waits for the record to be as durable as the policy promises (:meth:`UpdateLog.wait_durable`)
before it acknowledges. Restore replays :meth:`UpdateLog.read` after a snapshot's seq; a follower
reads the same stream while appends continue, and tails it with :meth:`UpdateLog.wait_appended`
(a condition that ``append`` notifies only while somebody waits) between reads.

Files
-----
A log is a directory of segments, each named after the seq of its first record; appends go to
the last (the *active*) segment, and a new one starts when the active one would exceed
``segment_bytes``. The segment header and the framing of a record (a CRC-32C-checksummed
header, then the payload, LZ4-compressed when that shrinks it) are drawn in :mod:`.log_format`,
with the format versions: segments of version 1 (zlib CRC-32) are still read, and a log that
ends in one continues in a new version-2 segment when it opens. What is read back is served by
:class:`~.log_read.LogReader`, from which :class:`UpdateLog` derives.

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
Opening a directory validates every record of every segment (:mod:`.log_scan`, which draws the
rules). Only the end of the **last** segment may hold bytes that are not an intact record. A
**torn tail** (a write a crash interrupted) was never acknowledged: it is cut with a warning
under every mode, and appends continue with the next seq. A **corrupt tail** may hold
acknowledged updates: ``LogConfig.recovery`` decides, after RocksDB's WAL recovery modes —
``absolute_consistency`` (the default under ``always``) refuses to open with
:class:`~embeddb.errors.CorruptDataError`, ``point_in_time`` (the default under ``interval`` and
``never``) cuts it — and ``LogConfig.cut_corrupt_tail`` cuts it under either. Every cut is
recorded before the file is truncated (:attr:`UpdateLog.cuts`, ``log-cuts.jsonl``).

Failures while appending
------------------------
A failed ``write(2)`` (full disk, file size limit, I/O error) raises
:class:`~embeddb.errors.StorageError` with the errno message and the file, and the log cuts the
file back to the end of its last complete record, so the seq is not used and a later append
never follows a partial record. If that cut fails too, or an fsync fails (after which the
kernel may have dropped the unwritten pages, so a retry proves nothing), the log is marked
failed: every later append and every wait for an undurable seq raises. Reads keep working.
Under ``always`` a failed fsync also cuts the log back to its last durable record
(:mod:`.log_fence`): the refused calls' records do not come back at a restart.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from embeddb.config import FsyncPolicy, LogRecovery
from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.engine.durability.log_fence import apply_fence, fence
from embeddb.engine.durability.log_format import (
    FILE_MODE,
    RECORD_HEADER,
    SEGMENT_HEADER,
    VERSION,
    PayloadPart,
    Segment,
    create_segment,
    frame,
    os_error,
    record_header,
    segment_header,
    write_all,
)
from embeddb.engine.durability.log_read import LogReader, LogRecord, LogTruncatedError
from embeddb.engine.durability.log_scan import LogCut, TailPolicy, scan_log
from embeddb.errors import ConfigError, InvalidArgumentError, StorageError, UnavailableError

__all__ = ["LogConfig", "LogCut", "LogRecord", "LogTruncatedError", "UpdateLog"]

logger = logging.getLogger(__name__)

_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


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


class UpdateLog(LogReader):
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
        CorruptDataError: a segment fails validation (see the module docstring); torn tails,
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
        self.config = config if config is not None else LogConfig()
        self._io = io
        self._sync_lock = threading.Lock()  # one fsync at a time; taken before _lock, never after
        self._failed: StorageError | None = None
        self._retired: list[int] = []  # fds of sealed segments, closed by a _sync_lock holder
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
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
            apply_fence(self.directory, self._dir_fd)  # a cut a failed fsync left undone
            self._segments, self._last_seq = self._recover(start_seq)
            self._upgrade_active()
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
        self._durable_end = (self._segments[-1], self._segments[-1].size)  # where it ends
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
    def cuts(self) -> tuple[LogCut, ...]:
        """The tails cut off the last segment when this log opened (also in ``log-cuts.jsonl``)."""
        return self._cuts

    @property
    def failed(self) -> bool:
        """Whether the log has failed (a failed fsync, or a write it could not cut back):
        appends raise until it is reopened."""
        return self._failed is not None

    @property
    def durable_seq(self) -> int:
        """The highest seq known to be fsynced."""
        return self._durable_seq

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

    def wait_durable(self, seq: int) -> None:
        """Block until record ``seq`` is as durable as the fsync policy promises.

        ``always``: until an fsync covering it has completed (sharing one fsync with concurrent
        waiters). ``interval`` and ``never``: returns at once.

        Raises:
            InvalidArgumentError: ``seq`` has not been appended.
            StorageError: the log has failed and ``seq`` is not known to be durable.
        """
        if self._durable_seq >= seq:
            return
        if self._failed is not None:
            raise self._failure()
        if seq > self._last_seq:
            raise InvalidArgumentError(f"seq {seq} was not appended (last seq {self._last_seq})")
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
            logger.error("update log %s failed, appends now raise: %s", self.directory, err)

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
        fsyncs it before the active one, so ``durable_seq`` never covers an unsynced record;
        under ``never`` it is closed unsynced, that policy leaves flushing to the OS."""
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
            end = (self._segments[-1], self._segments[-1].size)
            retired, self._retired = self._retired, []
        try:
            for old in retired:  # sealed segments first: their records precede the active's
                self._io.fsync(old)
                _close_quietly(old)
                retired = retired[1:]
        except OSError as exc:
            with self._lock:
                self._retired = retired + self._retired
            err = os_error(f"update log {self.directory}: fsync of a sealed segment failed", exc)
            with self._lock:
                self._fail(err)
                self._cut_to_durable()
            raise err from exc
        if target <= self._durable_seq:
            return
        try:
            self._io.fsync(fd)  # stays open: only a _sync_lock holder closes fds
        except OSError as exc:
            err = os_error(f"update log {self.directory}: fsync failed", exc)
            with self._lock:
                self._fail(err)
                self._cut_to_durable()
            raise err from exc
        with self._lock:
            if target > self._durable_seq:
                self._durable_seq, self._durable_end = target, end

    def _cut_to_durable(self) -> None:
        """After a failed fsync under ``always`` (``_lock`` held): cut off the records after the
        last durable one, the refused calls' (:mod:`.log_fence`); readers end there too."""
        if self.config.fsync is FsyncPolicy.ALWAYS and self._durable_seq < self._last_seq:
            end, seq = self._durable_end, self._durable_seq
            if fence(self.directory, self._dir_fd, self._segments, end, seq, self._io):
                self._last_seq = seq

    def _sync_every(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            if self._durable_seq >= self._last_seq:
                continue
            try:
                self.sync()
            except StorageError:
                return  # the log is marked failed and logged; appends now raise

    # -------------------------------------------------------------------------------- recovery

    def _upgrade_active(self) -> None:
        """Make the active segment one of the format written (:data:`~.log_format.VERSION`):
        an older one that holds records is sealed (fsynced first) and a new segment starts at
        the next seq; one that holds none is replaced, atomically, by a new empty one."""
        active = self._segments[-1]
        if active.version == VERSION:
            return
        old = active.version
        try:
            if active.size > SEGMENT_HEADER.size:
                fd = os.open(active.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _fdatasync(fd)
                finally:
                    os.close(fd)
                segment, fd = create_segment(
                    self.directory, self._dir_fd, self._last_seq + 1, self._fail
                )
                os.close(fd)
                active.sealed = True
                self._segments.append(segment)
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
                os.fsync(self._dir_fd)
                active.version = VERSION
        except OSError as exc:
            raise os_error(
                f"cannot start a format-{VERSION} segment in update log {self.directory}", exc
            ) from exc
        logger.info(
            "update log %s: segment %s has format version %d; appends go to format version %d "
            "from seq %d on",
            self.directory, active.path.name, old, VERSION, self._last_seq + 1,
        )  # fmt: skip

    def _recover(self, start_seq: int) -> tuple[list[Segment], int]:
        """Scan and validate the segments, cutting what the config allows (:mod:`.log_scan`);
        create the first segment of a new log. Returns the segments and the last seq."""
        cfg = self.config
        policy = TailPolicy(cfg.tail_recovery, cfg.cut_corrupt_tail, cfg.cuts_dir or self.directory)
        segments, next_seq, cuts = scan_log(self.directory, policy)
        self._cuts = tuple(cuts)
        if not segments:
            segment, fd = create_segment(self.directory, self._dir_fd, start_seq + 1, self._fail)
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
            logger.warning("closing an update log file failed: %s", exc)
