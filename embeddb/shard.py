"""One shard of embeddb: every table's tiered store, its optimizer, update log and snapshots.

No transport here: the gRPC servicers (and tests) call this class directly. It validates every
argument once, at this boundary, and raises from :mod:`embeddb.errors`; the layers below trust
it.

An ID batch as the shard sees it (table ``user``, ``dim = 2``)::

    ids     = [ 7, 42,  7]                      uint64, any order, duplicates allowed
    lookup  → [[a0, a1], [b0, b1], [a0, a1]]    float32 (3, 2), row i is the vector of ids[i]
    grads   = [[g0, g1], [h0, h1], [k0, k1]]    float32 (3, 2); id 7 is updated once with g + k

Data directory layout::

    DATA_DIR/
      disk/                 RocksDB: the disk tier (one column family per table)
      log/                  the update log (embeddb.durability.log): every acknowledged mutation
      snapshots/<id>/       complete snapshots (embeddb.durability.snapshot)
      <export_dir>/         with store.export_dir relative: the incremental export of changed
                            rows (embeddb.durability.export)
      topology.json         which shard of how many the directory holds, recorded at its
                            first start; a start as another shard is refused
                            (embeddb.durability.topology)
      clean-shutdown.json   present only after close(): the disk tier holds every row, at seq
      base.json             the last clean shutdown's record, kept while the shard runs: the
                            disk tier plus the log after its seq rebuild every row

Durability (ARCHITECTURE.md §5). Every mutation — gradient push, assign, delete, rows created by
a training lookup — is journaled while its stripe lock is held, as the resulting rows
(:mod:`embeddb.storage.changes`), and appended to the update log with the next ``seq`` before
the call returns; with ``fsync: always`` the call also waits for the fsync (group commit). On
open, a directory without a clean-shutdown record is **recovered**: from the newest of (a) the
newest complete snapshot — verified file by file — and (b) the last clean shutdown, then every
log record after that seq is replayed. A snapshot that fails verification stops the start
(``CorruptDataError`` naming the file) unless ``fallback=True`` lets the shard use the next
older one. A log whose append fails (full or unwritable disk) puts the shard in read-only mode:
reads go on, mutations raise :class:`FailedPreconditionError`, nothing stored is touched.

Feeding followers (``embeddb.server.follower``): :meth:`Shard.open_snapshot` opens a snapshot's
files for sending (the bootstrap), :meth:`Shard.tail_log` yields every log record after a seq
and then each new one as soon as it is appended (:meth:`Shard.wait_for_seq`), pinning the
reader's position so that snapshots never truncate records a live reader still needs. A
follower shard (``follower=True``) applies them with :meth:`Shard.apply_record`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from embeddb.config import EmbeddingConfig
from embeddb.durability import records, snapshot, topology
from embeddb.durability.export import Exporter
from embeddb.durability.log import FsyncPolicy, LogConfig, LogCut, LogRecord, UpdateLog
from embeddb.durability.snapshot import SnapshotInfo, SnapshotReader
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    StorageError,
    TableNotFoundError,
    UnavailableError,
)
from embeddb.routing import Topology, as_ids
from embeddb.storage import DiskTier, TableStats, TieredTable, UpdateResult
from embeddb.storage.changes import Change
from embeddb.storage.parallel import StripePool, default_threads
from embeddb.storage.private import private_dir

__all__ = ["Recovery", "Shard", "ShardStats", "SnapshotInfo", "SnapshotResult", "UpdateResult"]

log = logging.getLogger(__name__)

_CLEAN_MARKER = "clean-shutdown.json"
_BASE = "base.json"
_FORMAT_VERSION = 2


@dataclass(frozen=True)
class ShardStats:
    """Per-table statistics of one shard."""

    tables: dict[str, TableStats]

    def totals(self) -> dict[str, int]:
        """Counters summed over tables."""
        out: dict[str, int] = {}
        for stats in self.tables.values():
            for key, value in stats.as_dict().items():
                if isinstance(value, int) and key != "dim":
                    out[key] = out.get(key, 0) + value
        return out


@dataclass(frozen=True)
class SnapshotResult:
    """A snapshot just taken: the snapshot, how long serving paused and the whole call took."""

    info: SnapshotInfo
    pause_s: float
    seconds: float


@dataclass(frozen=True)
class Recovery:
    """How :class:`Shard` opened its directory.

    Attributes:
        source: ``"new"``, ``"clean"`` (after a clean shutdown), ``"snapshot"``, ``"base"``
            (the last clean shutdown's disk tier) or ``"log"`` (the whole log replayed).
        snapshot_id: the snapshot restored, if any.
        from_seq: the seq the state was restored at, before the replay.
        replayed: log records replayed after it.
        seq: the shard's seq once open.
        seconds: time taken.
        log_cuts: tails cut off the update log when it opened (torn, or corrupt where
            ``store.log_recovery`` or ``cut_corrupt_log_tail`` allowed it; ``log-cuts.jsonl``).
    """

    source: str
    snapshot_id: str | None
    from_seq: int
    replayed: int
    seq: int
    seconds: float
    log_cuts: tuple[LogCut, ...] = ()


class Shard:
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
            :func:`~embeddb.routing.shard_of` gives ``shard_index`` and refuses every other id
            (``FailedPreconditionError``). Recorded in the directory at its first start (a later
            start as another shard raises ``ConfigError``) and in snapshots.
        restore: restore this snapshot id (discarding the state and the log after it; the old
            log is kept aside in ``log.before-restore-<time>``) instead of the current state.
        fallback: during recovery, if the newest snapshot fails verification, use the next
            older one (logged) instead of refusing to start.
        follower: a read-only replica: client mutations raise
            :class:`FailedPreconditionError`; :meth:`apply_record` applies a primary's log.
        cut_corrupt_log_tail: cut a corrupt tail of the update log (recorded in
            ``log-cuts.jsonl``) instead of refusing to start under ``absolute_consistency``.

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
        restore: str | None = None,
        fallback: bool = False,
        follower: bool = False,
        cut_corrupt_log_tail: bool = False,
    ) -> None:
        began = time.perf_counter()
        self._cut_corrupt_log_tail = cut_corrupt_log_tail
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
        self._failed: StorageError | None = None
        self._pins: dict[int, int] = {}  # reader token -> oldest seq it still needs
        self._pins_lock = threading.Lock()
        self._applied_seq = 0  # followers: the last primary seq applied
        self._log: UpdateLog | None = None
        self._disk: DiskTier | None = None
        self._exporter: Exporter | None = None
        store = config.store
        self._pool = StripePool(store.threads or default_threads(), store.parallel_min_ids)
        self._widths = {n: t.dim + t.optimizer.state_dim(t.dim) for n, t in config.tables.items()}
        try:
            self.recovery = self._open(restore, fallback)
            self._exporter = self._start_export()
        except BaseException:
            self._abandon()
            raise
        cuts = self._log.cuts if self._log is not None else ()
        self.recovery = Recovery(
            **{**self.recovery.__dict__, "seconds": time.perf_counter() - began, "log_cuts": cuts}
        )

    # ------------------------------------------------------------------ opening
    @property
    def _logged(self) -> bool:
        return not self._ephemeral and not self.follower and self.config.store.update_log

    def _open(self, restore: str | None, fallback: bool) -> Recovery:
        snapshots_dir = self.data_dir / "snapshots"
        try:
            private_dir(self.data_dir)  # 0700, created or tightened (ARCHITECTURE.md §6)
        except OSError as exc:
            raise StorageError(f"cannot use data directory {self.data_dir}: {exc}") from exc
        snapshot.remove_incomplete(snapshots_dir)
        if not (self._ephemeral or self.follower):
            topology.check_directory(self.data_dir, self.topology)
        if restore is not None:
            return self._restore_explicitly(restore)
        marker = self._read_record(_CLEAN_MARKER)
        if marker is not None:
            return self._open_clean(marker)
        disk_dir = self.data_dir / "disk"
        has_disk = disk_dir.exists() and any(disk_dir.iterdir())
        log_dir = self.data_dir / "log"
        has_log = log_dir.exists() and any(log_dir.glob("*.log"))
        has_snapshots = bool(snapshot.list_snapshots(snapshots_dir))
        if not (has_disk or has_log or has_snapshots):
            self._start_tables(disk_rows={})
            self._start_log(0)
            return Recovery("new", None, 0, 0, self.seq, 0.0)
        if not has_snapshots and not (self._logged and has_log):
            raise StorageError(
                f"{self.data_dir} holds a disk tier that was not shut down cleanly and no "
                f"update log or snapshot to recover it from; remove the directory to start empty"
            )
        return self._recover(fallback, has_log)

    def _open_clean(self, marker: dict[str, Any]) -> Recovery:
        disk_rows = self._check_tables(marker, _CLEAN_MARKER)
        seq = int(marker.get("seq", 0))
        self._start_tables(disk_rows)
        self._start_log(seq)
        if self._log is not None and self._log.last_seq != seq:
            raise CorruptDataError(
                f"{self.data_dir / _CLEAN_MARKER} records seq {seq} but the update log ends at "
                f"{self._log.last_seq}"
            )
        # From now on the RAM tier may hold rows the disk does not: the marker becomes the base
        # that crash recovery starts from.
        os.replace(self.data_dir / _CLEAN_MARKER, self.data_dir / _BASE)
        return Recovery("clean", None, seq, 0, seq, 0.0)

    def _recover(self, fallback: bool, has_log: bool) -> Recovery:
        base = self._read_record(_BASE)
        base_seq = int(base["seq"]) if base is not None else -1
        listed = snapshot.list_snapshots(self.data_dir / "snapshots")
        # A snapshot whose manifest is unreadable might be the newest: never skip it silently.
        unreadable = [s for s in listed if s.seq < 0]
        candidates = unreadable + [s for s in reversed(listed) if s.seq > base_seq]
        for info in candidates:
            try:
                manifest = snapshot.verify(info.path)
                self._check_manifest(manifest, info.path)
            except CorruptDataError as exc:
                if not fallback:
                    raise CorruptDataError(
                        f"{exc}. The shard refuses to start; pass fallback=True (embeddb serve "
                        f"--fallback-snapshot) to recover from the previous snapshot instead"
                    ) from exc
                log.error("snapshot %s is corrupt (%s); falling back to an older one", info, exc)
                continue
            self._load_snapshot(info.path, manifest)
            (self.data_dir / _BASE).unlink(missing_ok=True)  # the disk tier is the snapshot's
            replayed = self._replay_log(int(manifest["seq"]))
            log.warning(
                "recovered %s from snapshot %s (seq %d) and %d log records",
                self.data_dir, info.snapshot_id, manifest["seq"], replayed,
            )  # fmt: skip
            return Recovery(
                "snapshot", info.snapshot_id, int(manifest["seq"]), replayed, self.seq, 0
            )
        if not (self._logged and has_log):
            raise StorageError(
                f"{self.data_dir} was not shut down cleanly, has no usable snapshot and no update "
                f"log to recover from"
            )
        if base is not None:
            self._check_tables(base, _BASE)
        self._start_tables(disk_rows=None)  # counted from the disk tier
        start = max(base_seq, 0)
        replayed = self._replay_log(start)
        source = "base" if base is not None else "log"
        log.warning(
            "recovered %s from its %s (seq %d) and %d log records",
            self.data_dir,
            "last clean shutdown" if base is not None else "empty state",
            start,
            replayed,
        )
        return Recovery(source, None, start, replayed, self.seq, 0.0)

    def _restore_explicitly(self, snapshot_id: str) -> Recovery:
        path = self.data_dir / "snapshots" / snapshot.check_id(snapshot_id)
        if not (path / snapshot.MANIFEST).exists():
            raise InvalidArgumentError(f"no complete snapshot {snapshot_id!r} in {path.parent}")
        manifest = snapshot.verify(path)
        self._check_manifest(manifest, path)
        log_dir = self.data_dir / "log"
        if log_dir.exists():
            stamp = f"log.before-restore-{time.strftime('%Y%m%dT%H%M%S')}"
            aside = self.data_dir / stamp
            for k in range(2, 1000):  # two restores within a second keep both logs
                if not aside.exists():
                    break
                aside = self.data_dir / f"{stamp}.{k}"
            os.replace(log_dir, aside)
            log.warning("restoring %s: the previous update log is kept in %s", snapshot_id, aside)
        for stale in (_CLEAN_MARKER, _BASE):
            (self.data_dir / stale).unlink(missing_ok=True)
        self._load_snapshot(path, manifest)
        seq = int(manifest["seq"])
        if self.follower:
            self._applied_seq = seq
        return Recovery("snapshot", snapshot_id, seq, 0, self.seq, 0.0)

    def _load_snapshot(self, path: Path, manifest: dict[str, Any]) -> None:
        disk_dir = self.data_dir / "disk"
        shutil.rmtree(disk_dir, ignore_errors=True)
        try:
            snapshot.copy_disk(path, disk_dir)
        except OSError as exc:
            raise StorageError(f"cannot copy the disk tier of snapshot {path}: {exc}") from exc
        tables = manifest["tables"]
        self._start_tables({n: int(t["disk_rows"]) for n, t in tables.items() if n in self._widths})
        for name, table in self._tables.items():
            if name in tables:
                ids, rows, flags = snapshot.load_table(path, name, self._widths[name])
                table.load_ram(ids, rows, flags)
        self._start_log(int(manifest["seq"]))

    def _replay_log(self, after_seq: int) -> int:
        """Open the log (if not yet) and apply every record after ``after_seq``."""
        if self._log is None:
            self._start_log(after_seq)
        assert self._log is not None
        n = 0
        for record in self._log.read(after_seq):
            self._apply(record.payload, f"update log record {record.seq}")
            n += 1
        return n

    def _start_tables(self, disk_rows: dict[str, int] | None) -> None:
        self._disk = DiskTier(self.data_dir / "disk", self._widths, self.config.store.disk_cache_mb)
        self._tables = {
            name: TieredTable(t, self.config.store, self._disk, 0, self._pool)
            for name, t in self.config.tables.items()
        }
        for name, table in self._tables.items():
            n = self._disk.count(name) if disk_rows is None else disk_rows.get(name, 0)
            table.set_disk_rows(n)

    def _start_log(self, start_seq: int) -> None:
        if not self._logged or self._log is not None:
            return
        store = self.config.store
        cfg = LogConfig(
            fsync=FsyncPolicy(store.fsync),
            interval_ms=store.fsync_interval_ms,
            segment_bytes=store.log_segment_mb << 20,
            lz4_min_bytes=store.log_lz4_min_bytes,
            recovery=store.log_recovery,
            cut_corrupt_tail=self._cut_corrupt_log_tail,
            cuts_dir=self.data_dir,
        )
        self._log = UpdateLog(self.data_dir / "log", cfg, start_seq=start_seq)
        for table in self._tables.values():
            table.journal = self._journal

    def _start_export(self) -> Exporter | None:
        """Start the incremental export (``store.export_dir``), which tails the update log."""
        store = self.config.store
        if store.export_dir is None or self.follower:
            return None  # a follower's primary exports
        if self._log is None:
            raise ConfigError(
                "store.export_dir", "the export reads the update log: it needs a data directory "
                "and update_log: true"
            )  # fmt: skip
        directory = Path(store.export_dir.replace("{index}", str(self.shard_index)))
        tables = {n: (t.dim, self._widths[n]) for n, t in self.config.tables.items()}
        return Exporter(
            directory if directory.is_absolute() else self.data_dir / directory,
            self.read_log,
            tables,
            self.seq,
            store.export_interval_s,
            empty=not any(t.stats().rows for t in self._tables.values()),
        )

    def _stop_export(self) -> None:
        """Export the tail (every record logged so far) and stop; a failure is logged, not
        raised: the export resumes from its last finished file at the next start."""
        if self._exporter is None:
            return
        try:
            self._exporter.close()
        except (StorageError, UnavailableError) as exc:
            log.error(
                "the export's last write failed (%s); it resumes after seq %d at the next start",
                exc, self._exporter.exported_seq,
            )  # fmt: skip

    def _read_record(self, name: str) -> dict[str, Any] | None:
        path = self.data_dir / name
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or not isinstance(record.get("tables"), dict):
                raise ValueError("not a shutdown record")
            if record.get("format_version") not in (1, _FORMAT_VERSION):
                raise ValueError(f"unsupported format_version {record.get('format_version')}")
        except (OSError, ValueError) as exc:
            raise CorruptDataError(f"{path} is unreadable: {exc}") from exc
        return record

    def _check_tables(self, record: dict[str, Any], source: str) -> dict[str, int]:
        tables = record["tables"]
        for name, t in self.config.tables.items():
            if name in tables:
                width = self._widths[name]
                if (tables[name]["dim"], tables[name]["width"]) != (t.dim, width):
                    raise CorruptDataError(
                        f"table {name!r} in {self.data_dir} ({source}) has dim "
                        f"{tables[name]['dim']} and row width {tables[name]['width']}, the "
                        f"config says dim {t.dim} and width {width} (changed optimizer or dim?)"
                    )
        return {name: int(v["disk_rows"]) for name, v in tables.items()}

    def _check_manifest(self, manifest: dict[str, Any], path: Path) -> None:
        self._check_tables(manifest, f"snapshot {path.name}")
        index, count = manifest.get("shard_index", 0), manifest.get("num_shards", 1)
        if (index, count) != (self.shard_index, self.num_shards):
            raise CorruptDataError(
                f"snapshot {path} belongs to shard {index} of {count}, this is shard "
                f"{self.shard_index} of {self.num_shards} (use embeddb reshard to change the "
                f"shard count)"
            )

    def _abandon(self) -> None:
        """Release what a failed open holds."""
        self._pool.close()
        if self._log is not None:
            self._log.close()
        if self._disk is not None:
            try:
                self._disk.close()
            except StorageError:
                log.exception("closing the disk tier after a failed open")
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
                for table in self._tables.values():
                    table.flush()
                seq = self.seq
                self._stop_export()  # the tail: every record up to seq
                if self._log is not None:
                    self._log.close()
                record = {
                    "format_version": _FORMAT_VERSION,
                    "seq": seq,
                    "tables": {
                        name: {"dim": t.dim, "width": t.width, "disk_rows": t.stats().disk_rows}
                        for name, t in self._tables.items()
                    },
                }
                self._disk.close()
                tmp = self.data_dir / (_CLEAN_MARKER + ".tmp")
                tmp.write_text(json.dumps(record, indent=2))
                os.replace(tmp, self.data_dir / _CLEAN_MARKER)
            finally:
                self._stop_export()
                if self._log is not None:
                    self._log.close()
                if self._ephemeral:
                    shutil.rmtree(self.data_dir, ignore_errors=True)

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
            return self._applied_seq
        return self._log.last_seq if self._log is not None else 0

    @property
    def durable_seq(self) -> int:
        """The last seq known fsynced (equal to :attr:`seq` without an update log)."""
        return self._log.durable_seq if self._log is not None else self.seq

    def _journal(self, changes: list[Change]) -> None:
        """Append one stripe's changes to the log (called under the stripe's lock)."""
        assert self._log is not None
        try:
            self._log.append(records.encode(changes))
        except StorageError as exc:
            if self._failed is None:
                self._failed = exc
                log.error("update log append failed; the shard is now read-only: %s", exc)
            raise

    def _mutating(self) -> int:
        """Check that a mutation may run; returns the log position before it."""
        if self.follower:
            raise FailedPreconditionError(
                "this shard is a read-only follower: send writes to its primary"
            )
        if self._failed is not None:
            raise FailedPreconditionError(
                f"the update log failed ({self._failed}); the shard serves reads only until "
                f"it is restarted with a writable data directory"
            )
        return self._log.last_seq if self._log is not None else 0

    def _acknowledge(self, before: int) -> None:
        """Wait until this call's log records are as durable as the fsync policy promises."""
        if self._log is not None and self._log.last_seq > before:
            self._log.wait_durable(self._log.last_seq)

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
            name = snapshot_id
            if name is None:
                now = time.time()
                name = time.strftime("snap-%Y%m%dT%H%M%S", time.gmtime(now)) + (
                    f"{now % 1:.6f}"[1:] + "Z"
                )
            writer = snapshot.SnapshotWriter(self.data_dir / "snapshots", name)
            try:
                assert self._disk is not None
                # Deleted rows must leave the files the checkpoint hard-links, not only be
                # masked by tombstones: compact their key ranges (again under the locks, for
                # deletes that arrive meanwhile; usually nothing then).
                self._disk.purge_deleted()
                buffers = {n: t.capture_buffers() for n, t in self._tables.items()}
                with ExitStack() as locked:
                    paused = time.perf_counter()
                    for table in self._tables.values():
                        for stripe in table.stripes:
                            locked.enter_context(stripe.lock)
                    seq = self.seq
                    # one item per stripe, so that the pool threads copy them in parallel
                    work = [
                        (t, k, buf)
                        for n, t in self._tables.items()
                        for k, buf in enumerate(buffers[n])
                    ]
                    self._pool.map(lambda w: w[0].capture_into([w[2]], w[1]), work, 1 << 62)
                    disk_rows = {n: t.stats_unlocked_disk_rows() for n, t in self._tables.items()}
                    self._disk.purge_deleted()
                    self._disk.checkpoint(writer.disk_dir)
                    pause = time.perf_counter() - paused
                captured = {n: TieredTable.captured(b) for n, b in buffers.items()}
                del buffers
                for n, (ids, rows, flags) in captured.items():
                    writer.write_table(n, ids, rows, flags)
                del captured
                meta = {
                    "shard_index": self.shard_index,
                    "num_shards": self.num_shards,
                    "tables": {
                        n: {
                            "dim": t.dim,
                            "width": t.width,
                            "optimizer": t.config.optimizer.kind.value,
                            "disk_rows": disk_rows[n],
                        }
                        for n, t in self._tables.items()
                    },
                }
                info = writer.commit(seq, meta)
            except BaseException:
                writer.abort()
                raise
            snapshot.prune(self.data_dir / "snapshots", self.config.store.snapshot_retention)
            self._truncate_log()
        return SnapshotResult(info, pause, time.perf_counter() - began)

    def snapshots(self) -> list[SnapshotInfo]:
        """Complete snapshots of this shard, oldest first."""
        return [s for s in snapshot.list_snapshots(self.data_dir / "snapshots") if s.seq >= 0]

    def _truncate_log(self) -> None:
        """Delete the log segments that no retained snapshot, base or reader needs."""
        if self._log is None:
            return
        needed = [s.seq for s in self.snapshots()]
        base = self._read_record(_BASE)
        if base is not None:
            needed.append(int(base["seq"]))
        if not needed:
            return  # without a snapshot or a base, recovery replays the whole log
        with self._pins_lock:
            needed.extend(self._pins.values())
        if self._exporter is not None:
            needed.append(self._exporter.exported_seq)  # a restarted export resumes there
        self._log.truncate_before(min(needed) + 1)

    def read_log(self, after_seq: int) -> Iterator[LogRecord]:
        """Log records after ``after_seq``, as they are appended (followers' feed); while the
        iterator is alive its position is protected from truncation. It ends once it has
        caught up (see :meth:`tail_log` for one that waits for more).

        Raises:
            FailedPreconditionError: the shard has no update log.
            StorageError: (``LogTruncatedError``) the records were already truncated.
        """
        if self._log is None:
            raise FailedPreconditionError("this shard keeps no update log")
        records = self._pinned_records(self._log, after_seq, None)
        return (r for r in records if r is not None)

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
        if self._log is None:
            raise FailedPreconditionError("this shard keeps no update log")
        if after_seq > self._log.last_seq:
            raise OutOfRangeError(
                f"seq {after_seq} is beyond this shard's last seq {self._log.last_seq}: the "
                f"reader followed another history (a restore?); bootstrap again from a snapshot"
            )
        return self._pinned_records(self._log, after_seq, idle_s)

    def _pinned_records(
        self, update_log: UpdateLog, after_seq: int, idle_s: float | None
    ) -> Generator[LogRecord | None, None, None]:
        """Records after ``after_seq`` with the reader's position pinned against truncation;
        with ``idle_s``, waits for new ones (yielding None when idle) instead of ending."""
        marker = object()  # alive as long as this generator: its id is a unique pin token
        token = id(marker)
        with self._pins_lock:
            self._pins[token] = after_seq
        try:
            last = after_seq
            while True:
                for record in update_log.read(last):
                    last = record.seq
                    with self._pins_lock:
                        self._pins[token] = last
                    yield record
                if idle_s is None:
                    return
                self._table_check_open()
                if not update_log.wait_appended(last, idle_s):
                    self._table_check_open()
                    yield None
        finally:
            with self._pins_lock:
                self._pins.pop(token, None)

    def wait_for_seq(self, after_seq: int, timeout: float | None = None) -> bool:
        """Block until a mutation with a seq above ``after_seq`` is logged (returns at once if
        one is), for at most ``timeout`` seconds. Returns whether one is.

        Raises:
            FailedPreconditionError: the shard has no update log.
        """
        if self._log is None:
            raise FailedPreconditionError("this shard keeps no update log")
        return self._log.wait_appended(after_seq, timeout)

    def append_time(self, seq: int) -> float | None:
        """The wall-clock time (``time.time()``) at which mutation ``seq`` was logged, when
        known (recent mutations since this shard opened); None otherwise."""
        return self._log.append_time(seq) if self._log is not None else None

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
            found = [
                s for s in self.snapshots() if snapshot_id is None or s.snapshot_id == snapshot_id
            ]
            if not found:
                raise NotFoundError(
                    f"shard {self.shard_index} has no complete snapshot {snapshot_id!r}"
                )
            return SnapshotReader.open(found[-1])

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
        if seq <= self._applied_seq:
            return False
        if seq != self._applied_seq + 1:
            raise CorruptDataError(
                f"record seq {seq} does not follow the last applied seq {self._applied_seq}"
            )
        self._apply(payload, f"record {seq}")
        self._applied_seq = seq
        return True

    def start_following(self, seq: int) -> None:
        """Set the seq a follower's state corresponds to (after a bootstrap)."""
        self._applied_seq = seq

    def _apply(self, payload: bytes, where: str) -> None:
        for change in records.decode(payload, where):
            table = self._tables.get(change.table)
            if table is None:
                raise CorruptDataError(f"{where} changes table {change.table!r}, not configured")
            table.replay(change)

    def _table_check_open(self) -> None:
        if self._closed:
            raise UnavailableError("shard is closed")

    # ------------------------------------------------------------------ validation
    def _table(self, name: str) -> TieredTable:
        if self._closed:
            raise UnavailableError("shard is closed")
        try:
            return self._tables[name]
        except (KeyError, TypeError):
            raise TableNotFoundError(str(name), tuple(self._tables)) from None

    def _owned(self, ids: object, field: str = "ids") -> npt.NDArray[np.uint64]:
        """``ids`` validated, if this shard owns every one (FailedPreconditionError naming
        the first foreign id otherwise)."""
        id_arr = as_ids(ids, field)
        self.topology.check_owned(id_arr, field)
        return id_arr

    @staticmethod
    def _matrix(values: object, n: int, dim: int, field: str) -> npt.NDArray[np.float32]:
        arr = np.asarray(values)
        if arr.dtype != np.float32:
            raise InvalidArgumentError(f"{field} must be float32, got dtype {arr.dtype}")
        if arr.shape != (n, dim):
            raise InvalidArgumentError(
                f"{field} must have shape ({n}, {dim}) (one row of dim {dim} per id), "
                f"got {arr.shape}"
            )
        return np.ascontiguousarray(arr)

    # ------------------------------------------------------------------ data plane
    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def lookup(self, table: str, ids: object, train: bool = True) -> npt.NDArray[np.float32]:
        """Return the ``(len(ids), dim)`` vectors of ``ids`` in input order.

        Args:
            table: table name.
            ids: 1-D non-negative integer ids; duplicates allowed.
            train: a training lookup creates admitted rows, promotes disk rows and refreshes
                recency. ``False`` (evaluation, inference) changes nothing: unknown ids read as
                zeros, disk rows are read in place.

        Raises:
            TableNotFoundError, InvalidArgumentError, StorageError; FailedPreconditionError:
            an id another shard owns (nothing is looked up), or a training lookup on a
            read-only shard.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        if not train:
            return t.lookup(id_arr, False)
        before = self._mutating()
        vectors = t.lookup(id_arr, True)
        self._acknowledge(before)
        return vectors

    def apply_gradients(self, table: str, ids: object, grads: object) -> UpdateResult:
        """Apply the table's optimizer to ``ids`` with ``grads`` (float32, ``(len(ids), dim)``).

        Gradients of duplicate ids are summed first. Ids whose summed gradient contains NaN or
        Inf are skipped and counted; ids stored in neither tier are ignored and counted as
        missing. ``weight_bound`` clamps vectors after the update. Every data call (this one,
        the lookups, :meth:`assign`, :meth:`delete`) refuses a batch holding an id another
        shard owns with :class:`FailedPreconditionError`, changing nothing.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        g = self._matrix(grads, id_arr.size, t.dim, "grads")
        before = self._mutating()
        result = t.apply_gradients(id_arr, g)
        self._acknowledge(before)
        return result

    def lookup_many(
        self, parts: Sequence[tuple[str, object, bool]]
    ) -> list[npt.NDArray[np.float32]]:
        """:meth:`lookup` of several tables at once: one ``(table, ids, train)`` per part.

        Every part is validated before any is looked up, so an invalid part fails the call with
        nothing inserted or refreshed; a call with a training part waits once for durability.

        Returns:
            One ``(len(ids), dim)`` array per part, in order.

        Raises:
            TableNotFoundError, InvalidArgumentError (also: a table named by two parts),
            FailedPreconditionError (a training part on a read-only shard), StorageError.
        """
        checked = [
            (self._table(table), self._owned(ids, f"lookups[{k}].ids"), bool(train))
            for k, (table, ids, train) in enumerate(parts)
        ]
        self._distinct(table for table, _, _ in parts)
        if not any(train for _, _, train in checked):
            return [t.lookup(ids, False) for t, ids, _ in checked]
        before = self._mutating()
        out = [t.lookup(ids, train) for t, ids, train in checked]
        self._acknowledge(before)
        return out

    def apply_gradients_many(
        self, parts: Sequence[tuple[str, object, object]]
    ) -> list[UpdateResult]:
        """:meth:`apply_gradients` of several tables at once: one ``(table, ids, grads)`` per
        part.

        Every part is validated before any is applied, so an invalid part fails the call with
        no row changed; NaN/Inf gradients are skipped and counted per part, as in
        :meth:`apply_gradients`. The call waits once for durability.

        Returns:
            One result per part, in order.

        Raises:
            TableNotFoundError, InvalidArgumentError (also: a table named by two parts),
            FailedPreconditionError, StorageError.
        """
        checked: list[tuple[TieredTable, npt.NDArray[np.uint64], npt.NDArray[np.float32]]] = []
        for k, (table, ids, grads) in enumerate(parts):
            t = self._table(table)
            id_arr = self._owned(ids, f"updates[{k}].ids")
            checked.append((t, id_arr, self._matrix(grads, id_arr.size, t.dim, "grads")))
        self._distinct(table for table, _, _ in parts)
        before = self._mutating()
        results = [t.apply_gradients(ids, g) for t, ids, g in checked]
        self._acknowledge(before)
        return results

    @staticmethod
    def _distinct(tables: Iterable[str]) -> None:
        seen: set[str] = set()
        for table in tables:
            if table in seen:
                raise InvalidArgumentError(
                    f"table {table!r} is named by more than one part of the request; merge "
                    f"its ids into one part"
                )
            seen.add(table)

    def assign(self, table: str, ids: object, vectors: object) -> int:
        """Set vectors (creating rows regardless of admission) and reset optimizer state.

        For duplicate ids the last vector wins. Returns the number of distinct ids written.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        v = self._matrix(vectors, id_arr.size, t.dim, "vectors")
        if not np.isfinite(v).all():
            raise InvalidArgumentError("vectors must be finite (found NaN or Inf)")
        before = self._mutating()
        written = t.assign(id_arr, v)
        self._acknowledge(before)
        return written

    def delete(self, table: str, ids: object) -> int:
        """Remove ``ids`` from both tiers. Returns how many of them existed."""
        t = self._table(table)
        id_arr = self._owned(ids)
        before = self._mutating()
        deleted = t.delete(id_arr)
        self._acknowledge(before)
        return deleted

    def peek(
        self, table: str, ids: object
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float32]]:
        """Full rows ``[vector | optimizer state]`` of ``ids``, changing nothing.

        Returns:
            ``(found, rows)`` with ``rows`` of shape ``(len(ids), dim + state_dim)``; rows of
            ids stored in neither tier are zeros and ``found`` is false there.
        """
        t = self._table(table)
        return t.peek(as_ids(ids))

    def stats(self) -> ShardStats:
        """Sizes and counters of every table."""
        if self._closed:
            raise UnavailableError("shard is closed")
        return ShardStats({name: t.stats() for name, t in self._tables.items()})
