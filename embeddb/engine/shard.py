"""One shard of embeddb: every table's tiered store, its optimizer, update log and snapshots.

No transport here: the gRPC servicers (and tests) call this class directly. Every argument is
validated once, at this boundary (:mod:`embeddb.engine.validation`), and errors are raised from
:mod:`embeddb.errors`; the layers below trust it.

Durability (docs/architecture.md §5, docs/durability.md). The update log is the commit point:
each mutating call — gradient push, assign, delete, rows created by a training lookup — is
prepared under the locks of every stripe it touches, appended to the log as one record and only
then made visible; a failed append leaves no trace of it (:mod:`embeddb.engine.journal`). A
directory without a clean-shutdown record is **recovered** from its newest verified snapshot or
last clean shutdown, then the log after it (:mod:`embeddb.engine.recovery`). A full disk fails
writes until there is space again; an I/O error stops writes until a restart; reads go on.

:class:`Shard` is a facade: this module keeps its lifecycle (opening, closing, discarding) and
the entry points of its snapshots and followers' feed; the rest is done by parts that each take
only the state they need::

    embeddb.engine.data_plane  DataPlane (the base of Shard): the data calls on the tables
    embeddb.engine.validation  the checks of every request's arguments
    embeddb.engine.recovery    ShardOpener: opens the directory, builds the disk tier, tables
                               and update log the shard takes over; Recovery; shutdown records
    embeddb.engine.journal     Journal: mutations into the update log; read-only mode
    embeddb.engine.snapshots   ShardSnapshots: takes, lists and opens snapshots
    embeddb.engine.feed        LogReaders, RecordApplier: followers' feed and the export
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from types import TracebackType

from embeddb.common.routing import Topology
from embeddb.config import EmbeddingConfig
from embeddb.engine.data_plane import DataPlane
from embeddb.engine.durability import snapshot
from embeddb.engine.durability.export import Exporter
from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.engine.durability.log import LogRecord, UpdateLog
from embeddb.engine.durability.snapshot_dirs import SnapshotInfo
from embeddb.engine.durability.snapshot_transfer import SnapshotReader
from embeddb.engine.feed import LogReaders, RecordApplier, start_export, stop_export
from embeddb.engine.journal import Journal
from embeddb.engine.recovery import (
    BASE,
    Recovery,
    Restore,
    ShardOpener,
    read_record,
    shut_down,
)
from embeddb.engine.snapshots import ShardSnapshots, SnapshotResult
from embeddb.engine.storage import DiskTier, ShardStats, UpdateResult
from embeddb.engine.storage.parallel import StripePool, default_threads
from embeddb.errors import (
    FailedPreconditionError,
)

__all__ = ["Recovery", "Shard", "ShardStats", "SnapshotInfo", "SnapshotResult", "UpdateResult"]


class Shard(DataPlane):
    """The tables of one shard, each a RAM tier (LRU) over a RocksDB disk tier, made durable by
    an update log and snapshots (see the module docstring).

    Thread-safe: each table is split into lock stripes; calls on different stripes proceed in
    parallel and the compiled kernels release the GIL.

    Args:
        config: the embedding configuration (tables and store settings).
        data_dir: the shard's directory. ``None`` uses a private temporary directory that is
            removed on :meth:`close` (no update log, nothing survives). An existing directory is
            reopened (after a clean shutdown) or recovered (after a crash).
        shard_index, num_shards: this shard's place in its cluster: it owns the ids
            :func:`~embeddb.common.routing.shard_of` gives ``shard_index`` and refuses every other
            id
            (``FailedPreconditionError``). Recorded in the directory at its first start (a later
            start as another shard raises ``ConfigError``) and in snapshots.
        restore: restore this snapshot id or :class:`~embeddb.engine.recovery.Restore` (discarding
            the state and log after it; the old log is kept in ``log.before-restore-<time>``).
        fallback: during recovery, if the newest snapshot fails verification, use the next
            older one (logged) instead of refusing to start.
        follower: a read-only replica: client mutations raise
            :class:`FailedPreconditionError`; :meth:`apply_record` applies a primary's log.
        cut_corrupt_log_tail: cut a corrupt tail of the update log (recorded in
            ``log-cuts.jsonl``) instead of refusing to start under ``absolute_consistency``.
        file_io: the update log's file layer (:mod:`embeddb.engine.durability.fileio`; tests inject
            storage faults with it).

    Raises:
        StorageError: the directory is unusable.
        CorruptDataError: a record, snapshot or log segment failed its checks, or the tables
            on disk contradict ``config``.
        ConfigError: the directory holds another shard index or shard count.
    """

    def __init__(
        self,
        config: EmbeddingConfig,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        shard_index: int = 0,
        num_shards: int = 1,
        restore: str | Restore | None = None,
        fallback: bool = False,
        follower: bool = False,
        cut_corrupt_log_tail: bool = False,
        file_io: FileIO = REAL,
    ) -> None:
        began = time.perf_counter()
        self.config = config
        self.topology = Topology(shard_index, num_shards)
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.follower = follower
        self._ephemeral = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="embeddb-")) if data_dir is None else Path(data_dir)
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._log: UpdateLog | None = None
        self._disk: DiskTier | None = None
        self._exporter: Exporter | None = None
        parallel = config.store.parallel
        self._pool = StripePool(parallel.threads or default_threads(), parallel.min_ids)
        opener = ShardOpener(
            config,
            self.data_dir,
            self._pool,
            topology=self.topology,
            ephemeral=self._ephemeral,
            follower=follower,
            cut_corrupt_log_tail=cut_corrupt_log_tail,
            file_io=file_io,
        )
        try:
            recovery = opener.open(restore, fallback)
            assert opener.disk is not None  # every open starts the tables
            self._disk, self._tables, self._log = opener.disk, opener.tables, opener.log
            self._lock = opener.lock
            self._journal = Journal(self._log, follower)
            self._journal.attach(self._tables)
            self._readers = LogReaders(self._log, self._table_check_open)
            self._applier = RecordApplier(self._tables, opener.applied_seq)
            self._snapshots = ShardSnapshots(
                self.data_dir / "snapshots",
                self._disk,
                self._tables,
                self._pool,
                self.topology,
                file_io,
            )
            if not follower:  # a follower's primary exports
                self._exporter = start_export(
                    config, self.data_dir, self._readers, self.topology, self._tables, self.seq
                )
        except BaseException:
            self._abandon(opener)
            raise
        cuts = self._log.cuts if self._log is not None else ()
        self.recovery = Recovery(
            **{**recovery.__dict__, "seconds": time.perf_counter() - began, "log_cuts": cuts}
        )

    # ------------------------------------------------------------------ opening
    def _abandon(self, opener: ShardOpener) -> None:
        """Release what a failed open holds."""
        self._pool.close()
        opener.release()
        if self._ephemeral:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Write dirty rows to disk, record a clean shutdown (with the seq), close the log and
        RocksDB. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._pool.close()
            assert self._disk is not None
            try:
                if self._ephemeral or self.follower:
                    self._disk.close()
                    if self.follower:  # a follower re-bootstraps from its primary on start
                        shutil.rmtree(self.data_dir / "disk", ignore_errors=True)
                    return
                shut_down(
                    self.data_dir,
                    self._disk,
                    self._tables,
                    self._log,
                    lambda: self.seq,
                    lambda: stop_export(self._exporter),
                    self._journal.failed,
                )
            finally:
                stop_export(self._exporter)
                if self._log is not None:
                    self._log.close()
                if self._ephemeral:
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                self._lock.release()  # last: the directory is consistent

    def discard(self) -> None:
        """Close without writing RAM rows back or recording a clean shutdown, as a crash would
        leave the directory (the next open recovers it from snapshots and the update log).
        For throwaway shards (benchmarks) and crash tests. Idempotent; :meth:`close` after it
        does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._pool.close()
            if self._exporter is not None:
                self._exporter.abandon()  # as a crash: the next start exports the rest
            if self._log is not None:
                self._log.close()
            if self._disk is not None:
                self._disk.close()
            if self._ephemeral:
                shutil.rmtree(self.data_dir, ignore_errors=True)
            self._lock.release()

    def __enter__(self) -> Shard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ durability
    @property
    def seq(self) -> int:
        """The seq of the last mutation (followers: the last primary record applied)."""
        if self.follower:
            return self._applier.applied_seq
        return self._log.last_seq if self._log is not None else 0

    @property
    def read_only(self) -> bool:
        """Whether storage faults fail mutations (:mod:`embeddb.engine.journal`); reads go on."""
        return self._journal.read_only

    @property
    def durable_seq(self) -> int:
        """The last seq known fsynced (equal to :attr:`seq` without an update log)."""
        return self._log.durable_seq if self._log is not None else self.seq

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, snapshot_id: str | None = None) -> SnapshotResult:
        """Write a snapshot holding exactly the mutations up to the current seq.

        Mutations pause while the RAM tier is copied and the disk tier checkpointed (reads of
        stripes not being copied go on); the files are written afterwards. Older snapshots
        beyond ``snapshot_retention`` and the log segments no snapshot needs are then deleted.

        Args:
            snapshot_id: the new snapshot's id (letters, digits, ``._-``); default: the UTC
                time and the seq.

        Raises:
            InvalidArgumentError: a bad or existing id. StorageError: the write failed (no
                partial snapshot is left).
        """
        if self._ephemeral:
            raise FailedPreconditionError("a shard without a data directory keeps no snapshots")
        began = time.perf_counter()
        with self._snapshot_lock:
            self._table_check_open()
            info, pause = self._snapshots.take(snapshot_id, lambda: self.seq)
            self._snapshots.prune(self.config.store.snapshots.retention)
            self._truncate_log()
        return SnapshotResult(info, pause, time.perf_counter() - began)

    def snapshots(self) -> list[SnapshotInfo]:
        """Complete snapshots of this shard, oldest first."""
        return self._snapshots.complete()

    def _truncate_log(self) -> None:
        """Delete the log segments that no retained snapshot, base or reader needs."""
        if self._log is None:
            return
        kept = [s.seq for s in self.snapshots()]
        base = read_record(self.data_dir, BASE)
        if base is not None:
            kept.append(int(base["seq"]))
        self._readers.truncate(kept, self._exporter)

    def open_snapshot(
        self, snapshot_id: str | None = None, take_new: bool = False
    ) -> SnapshotReader:
        """Open the files of a complete snapshot for sending (a follower's bootstrap).

        Args:
            snapshot_id: the snapshot to open; None: the newest. A shard without any snapshot
                takes one first when ``snapshot_id`` is None.
            take_new: take a new snapshot first (named ``snapshot_id`` when given) and open it.

        Returns:
            The open snapshot (close it when sent); it stays readable even if pruned meanwhile.

        Raises:
            NotFoundError: no complete snapshot ``snapshot_id``.
            InvalidArgumentError, StorageError, FailedPreconditionError: see :meth:`snapshot`.
            CorruptDataError: the snapshot's manifest is unreadable or lists a file that is
                missing or lies outside its directory (see :class:`SnapshotReader`).
        """
        if snapshot_id is not None:
            snapshot.check_id(snapshot_id)
        if take_new or (snapshot_id is None and not self.snapshots()):
            snapshot_id = self.snapshot(snapshot_id).info.snapshot_id
        with self._snapshot_lock:  # no pruning while the files are opened
            self._table_check_open()
            return self._snapshots.open(snapshot_id)

    # ------------------------------------------------------------------ followers' feed
    def read_log(self, after_seq: int) -> Iterator[LogRecord]:
        """Log records after ``after_seq``, as they are appended (followers' feed); while the
        iterator is alive its position is protected from truncation. It ends once it has
        caught up (see :meth:`tail_log` for one that waits for more).

        Raises:
            FailedPreconditionError: the shard has no update log.
            StorageError: (``LogTruncatedError``) the records were already truncated.
        """
        return self._readers.read(after_seq)

    def tail_log(
        self, after_seq: int, idle_s: float = 0.05
    ) -> Generator[LogRecord | None, None, None]:
        """Every log record after ``after_seq``, then each new one as soon as it is appended
        (the primary's side of a follower's feed).

        The iterator never ends by itself: it yields ``None`` after every ``idle_s`` seconds
        without a new record, so that the consumer can decide whether to go on (close the
        iterator, or stop iterating, to end it). While it is alive its position is protected
        from log truncation (:meth:`snapshot` deletes only segments no reader needs).

        Raises:
            FailedPreconditionError: the shard has no update log (an ephemeral shard, a
                follower).
            OutOfRangeError: ``after_seq`` is beyond this shard's seq (the reader saw a history
                this shard does not have), or (``LogTruncatedError``, while iterating) the
                records after it were truncated away: the reader must bootstrap again.
            UnavailableError: (while iterating) the shard was closed.
        """
        return self._readers.tail(after_seq, idle_s)

    def wait_for_seq(self, after_seq: int, timeout: float | None = None) -> bool:
        """Block until a mutation with a seq above ``after_seq`` is logged (returns at once if
        one is), for at most ``timeout`` seconds. Returns whether one is.

        Raises:
            FailedPreconditionError: the shard has no update log.
        """
        return self._readers.wait_for_seq(after_seq, timeout)

    def append_time(self, seq: int) -> float | None:
        """The wall-clock time (``time.time()``) at which mutation ``seq`` was logged, when
        known (recent mutations since this shard opened); None otherwise."""
        return self._readers.append_time(seq)

    def apply_record(self, seq: int, payload: bytes) -> bool:
        """Apply a primary's log record (followers only). Records at or below the last applied
        seq are ignored (a resumed feed may repeat some); a gap is an error.

        Returns:
            Whether the record was applied.

        Raises:
            FailedPreconditionError: not a follower. CorruptDataError: a gap in seq or an
                unreadable record.
        """
        if not self.follower:
            raise FailedPreconditionError("only a follower applies a primary's log records")
        return self._applier.apply(seq, payload)
