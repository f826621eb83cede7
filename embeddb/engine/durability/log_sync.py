"""The fsync side of the update log: carrying out its fsync policy, and failing safely.

:class:`LogSync` is the base of :class:`~embeddb.engine.durability.log.UpdateLog` that owns the
file descriptors, the durable seq and the log's failure state (the policies and their loss
windows are drawn in :mod:`.log_config`):

- **group commit** (``always``): :meth:`LogSync.wait_durable` takes the sync lock, and whoever
  holds it fsyncs for every record appended so far, so concurrent waiters share one fsync;
- the **interval thread** (``interval``): fsyncs every ``fsync_interval_ms`` while records wait;
- **sealed segments** are fsynced by the next sync (never inline on the append path, where an
  fsync of a whole segment would stall every writer), before the active one, so
  ``durable_seq`` never covers an unsynced record; a process crash tears at most the last
  segment, and only a power loss within the policy's window can leave a torn tail in the
  previous one too (reported as corruption, naming the file: cut it at the reported offset);
- **the page cache**: once fsynced, a record's pages are dropped from the page cache
  (:meth:`~.fileio.FileIO.drop_cache`), except the last :data:`CACHE_KEEP_BYTES` of the active
  segment, which followers tailing the log are about to read. A log is written once and read
  back rarely (recovery, a lagging follower): left cached, its pages would grow the page cache
  by the log's whole write rate, and every append would pay for fresh pages (on a VM whose
  free memory goes back to the host, a page fault on the host per page) instead of reusing the
  ones just freed. Under ``never`` nothing is fsynced, so nothing is dropped;
- a **failed fsync** marks the log failed (the kernel may have dropped the unwritten pages, so
  a retry proves nothing): every later append and every wait for an undurable seq raises,
  reads keep working. Under ``always`` it also cuts the log back to its last durable record
  (:mod:`.log_fence`): the refused calls' records do not come back at a restart.

Lock order: the sync lock (one fsync at a time) is taken before the reader's ``_lock``, never
after.
"""

from __future__ import annotations

import logging
import os
import threading

from embeddb.config import FsyncPolicy
from embeddb.engine.durability.fileio import FileIO
from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_fence import fence
from embeddb.engine.durability.log_format import Segment, os_error
from embeddb.engine.durability.log_read import LogReader
from embeddb.errors import InvalidArgumentError, StorageError

__all__ = ["CACHE_KEEP_BYTES", "LogSync", "close_quietly"]

CACHE_KEEP_BYTES = 16 << 20
"""The fsynced tail of the active segment left in the page cache (for followers tailing it)."""

logger = logging.getLogger(
    "embeddb.engine.durability.log"
)  # the log's own logger: one place to tune


class LogSync(LogReader):
    """Fsyncs and failure state of an open update log (see the module docstring).

    The subclass opens the files and sets ``_fd`` (the active segment), ``_dir_fd``, the
    segments and ``_durable_seq``/``_durable_end``, then calls :meth:`_start_syncer`.
    """

    config: LogConfig
    _io: FileIO
    _fd: int
    _dir_fd: int
    _durable_seq: int
    _durable_end: tuple[Segment, int]  # the segment holding the last durable record, its end

    def _init_sync(self, config: LogConfig, io: FileIO) -> None:
        self.config = config
        self._io = io
        self._sync_lock = threading.Lock()  # one fsync at a time; taken before _lock, never after
        self._failed: StorageError | None = None
        self._retired: list[int] = []  # fds of sealed segments, closed by a _sync_lock holder
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self._uncached: tuple[Segment | None, int] = (None, 0)  # cache dropped below this offset

    def _start_syncer(self) -> None:
        """Start the ``interval`` policy's background thread (other policies have none)."""
        if self.config.fsync is FsyncPolicy.INTERVAL:
            self._syncer = threading.Thread(
                target=self._sync_every,
                args=(self.config.fsync_interval_ms / 1000.0,),
                name=f"embeddb-log-sync:{self.directory.name}",
                daemon=True,
            )
            self._syncer.start()

    def _stop_syncer(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()

    # ------------------------------------------------------------------------------ properties

    @property
    def failed(self) -> bool:
        """Whether the log has failed (a failed fsync, or a write it could not cut back):
        appends raise until it is reopened."""
        return self._failed is not None

    @property
    def durable_seq(self) -> int:
        """The highest seq known to be fsynced."""
        return self._durable_seq

    # ---------------------------------------------------------------------------- durability

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

    # -------------------------------------------------------------------------------- internals

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

    def _close_retired(self) -> None:
        for fd in self._retired:  # callers have fsynced them, or need not (``never``)
            close_quietly(fd)
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
                self._io.drop_cache(old, 0, 0)
                close_quietly(old)
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
        self._drop_synced(fd, *end)

    def _drop_synced(self, fd: int, segment: Segment, end: int) -> None:
        """Drop the page cache of ``segment`` (open as ``fd``, fsynced up to ``end``) but its
        last :data:`CACHE_KEEP_BYTES` (``_sync_lock`` held)."""
        done, start = self._uncached
        start = start if done is segment else 0
        stop = end - CACHE_KEEP_BYTES
        if stop > start:
            self._io.drop_cache(fd, start, stop - start)
            self._uncached = (segment, stop)

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


def close_quietly(fd: int) -> None:
    """Close ``fd`` (nothing when negative), logging a failure instead of raising it."""
    if fd >= 0:
        try:
            os.close(fd)
        except OSError as exc:
            logger.warning("closing an update log file failed: %s", exc)
