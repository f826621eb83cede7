"""Opening a shard's data directory: a new one, one shut down cleanly, or one recovered.

The :class:`~embeddb.engine.shard.Shard` facade builds a :class:`ShardOpener`, which creates the
disk
tier, the tables and the update log and brings them to the newest state the directory holds;
the shard then takes them over (or, after a failed open, :meth:`ShardOpener.release` frees
them). The clean-shutdown and base records it reads are written by :func:`write_record`.

Data directory layout::

    DATA_DIR/
      disk/                 RocksDB: the disk tier (one column family per table)
      log/                  the update log (embeddb.engine.durability.log): every acknowledged
      mutation
      snapshots/<id>/       complete snapshots (embeddb.engine.durability.snapshot)
      <export_dir>/         with store.export_dir relative: the incremental export of changed
                            rows (embeddb.engine.durability.export)
      topology.json         which shard of how many the directory holds, recorded at its
                            first start; a start as another shard is refused
                            (embeddb.engine.durability.topology)
      clean-shutdown.json   present only after close(): the disk tier holds every row, at seq
      base.json             the last clean shutdown's record, kept while the shard runs: the
                            disk tier plus the log after its seq rebuild every row
      embeddb.lock          locked (flock) by the process that has the directory open, first
                            thing on open, until close (embeddb.engine.durability.dirlock)
      restore-in-progress.json, reshard-in-progress.json
                            present only while a restore or reshard is under way, or after one
                            was interrupted: the next open refuses, naming the command that
                            finishes it (embeddb.engine.durability.unfinished)

Recovery (docs/architecture.md §5). A directory without a clean-shutdown record is **recovered**:
from the newest of (a) the newest complete snapshot — verified file by file — and (b) the last
clean shutdown, then every log record after that seq is replayed. A snapshot that fails
verification stops the start (``CorruptDataError`` naming the file) unless ``fallback=True``
lets the shard use the next older one.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embeddb.common.routing import Topology
from embeddb.config import EmbeddingConfig
from embeddb.engine.durability import records, snapshot, snapshot_dirs, topology, unfinished
from embeddb.engine.durability.dirlock import DirectoryLock
from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_scan import LogCut
from embeddb.engine.storage import DiskTier, TieredTable
from embeddb.engine.storage.parallel import StripePool
from embeddb.engine.storage.private import private_dir
from embeddb.engine.storage.writes import hold
from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = [
    "BASE",
    "CLEAN_MARKER",
    "Recovery",
    "Restore",
    "ShardOpener",
    "read_record",
    "replay",
    "shut_down",
    "shutdown_record",
    "write_record",
]

logger = logging.getLogger("embeddb.engine.shard")  # the shard's own logger: one place to tune

CLEAN_MARKER = "clean-shutdown.json"
BASE = "base.json"
_FORMAT_VERSION = 2


@dataclass(frozen=True)
class Restore:
    """A snapshot to restore, with a progress callback (``Shard(restore=Restore(...))``).

    Attributes:
        snapshot_id: the snapshot.
        progress: called with ``(bytes verified, bytes of the snapshot)`` while its files are
            checked against the manifest.
    """

    snapshot_id: str
    progress: Callable[[int, int], None] | None = None


@dataclass(frozen=True)
class Recovery:
    """How :class:`~embeddb.engine.shard.Shard` opened its directory.

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


# ---------------------------------------------------------------------- shutdown records
def shutdown_record(seq: int, tables: Mapping[str, TieredTable]) -> dict[str, Any]:
    """The clean-shutdown record of ``tables`` at ``seq`` (read before the disk tier closes)."""
    return {
        "format_version": _FORMAT_VERSION,
        "seq": seq,
        "tables": {
            name: {"dim": t.dim, "width": t.width, "disk_rows": t.stats().disk_rows}
            for name, t in tables.items()
        },
    }


def write_record(data_dir: Path, name: str, record: dict[str, Any]) -> None:
    """Write ``record`` as ``data_dir/name`` atomically (a temporary file, then a rename)."""
    tmp = data_dir / (name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, data_dir / name)


def shut_down(
    data_dir: Path,
    disk: DiskTier,
    tables: Mapping[str, TieredTable],
    update_log: UpdateLog | None,
    seq: Callable[[], int],
    stop_export: Callable[[], None],
    failed: BaseException | None,
) -> None:
    """A primary's clean shutdown: write dirty rows to the disk tier, close it and the log
    and record a clean shutdown. If the storage failed — a full disk, a failed fsync
    (``failed``: the shard's fail-stop error) — skip what is left and close without the record:
    the update log holds every acknowledged write and the next start recovers from it. Never
    raises for a storage fault (it is logged)."""
    step = "write-back"
    try:
        if failed is not None:
            raise StorageError(f"the shard stopped taking writes: {failed}")
        for table in tables.values():
            table.flush()
        last = seq()
        stop_export()  # the tail: every record up to seq
        if update_log is not None:
            update_log.close()
        step = "close"
        disk.close()
        step = "clean-shutdown record"
        write_record(data_dir, CLEAN_MARKER, shutdown_record(last, tables))
    except OSError as exc:  # StorageError included
        logger.error("shutdown of %s: %s failed (%s); the next start recovers from the update "
                     "log", data_dir, step, exc)  # fmt: skip
        if step == "write-back":
            try:
                disk.close(flush=False)
            except StorageError as close_exc:
                logger.error("shutdown of %s: disk tier close failed: %s", data_dir, close_exc)


def read_record(data_dir: Path, name: str) -> dict[str, Any] | None:
    """The shutdown record ``data_dir/name`` (:data:`CLEAN_MARKER` or :data:`BASE`), if any.

    Raises:
        CorruptDataError: the file is unreadable or not a shutdown record.
    """
    path = data_dir / name
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


def replay(tables: Mapping[str, TieredTable], payload: bytes, where: str) -> None:
    """Apply one update log record's changes to ``tables`` (recovery, followers), atomically
    for readers: with the locks of every stripe it touches held, taken in the order the
    primary takes them (tables in the shard's order, stripes ascending:
    :mod:`embeddb.engine.storage.writes`), so no reader sees part of a record.

    Raises:
        CorruptDataError: an unreadable record, or one that changes a table not configured.
    """
    changes = records.decode(payload, where)
    rank = {name: k for k, name in enumerate(tables)}
    stripes: set[tuple[int, int]] = set()
    for change in changes:
        if change.table not in rank:
            raise CorruptDataError(f"{where} changes table {change.table!r}, not configured")
        table = tables[change.table]
        stripes.update((rank[change.table], p[0]) for p in table.split(change.ids))
    names = list(tables)
    with hold(tables[names[t]].stripes[s].lock for t, s in sorted(stripes)):
        for change in changes:
            tables[change.table].replay(change, locked=True)


# ---------------------------------------------------------------------- opening
class ShardOpener:
    """Opens one shard directory: builds its disk tier, tables and update log and brings them
    to the newest state the directory holds (see the module docstring).

    What it has built so far stays on :attr:`disk`, :attr:`tables` and :attr:`log`, for the
    shard to take over after :meth:`open`, or for :meth:`release` after a failure.

    Args:
        config: the embedding configuration.
        data_dir: the shard's directory (created if missing).
        pool: the shard's stripe pool, shared by its tables.
        topology: this shard's place in its cluster, checked against the directory.
        ephemeral: the directory is a private temporary one (no update log, no topology).
        follower: a read-only replica (no update log, no topology check).
        cut_corrupt_log_tail, file_io: see :class:`~embeddb.engine.shard.Shard`.
    """

    def __init__(
        self,
        config: EmbeddingConfig,
        data_dir: Path,
        pool: StripePool,
        *,
        topology: Topology,
        ephemeral: bool,
        follower: bool,
        cut_corrupt_log_tail: bool,
        file_io: FileIO = REAL,
    ) -> None:
        self._config = config
        self._file_io = file_io
        self._data_dir = data_dir
        self._topology = topology
        self._follower = follower
        self._pool = pool
        self._ephemeral = ephemeral
        self._cut_corrupt_log_tail = cut_corrupt_log_tail
        self._widths = {n: t.dim + t.optimizer.state_dim(t.dim) for n, t in config.tables.items()}
        self.disk: DiskTier | None = None
        self.tables: dict[str, TieredTable] = {}
        self.log: UpdateLog | None = None
        # held from open() until the shard closes; none for an ephemeral shard's own directory
        self.lock = DirectoryLock(data_dir, None)
        self.applied_seq = 0  # followers: the seq of a restored snapshot

    @property
    def logged(self) -> bool:
        """Whether the shard keeps an update log."""
        return not self._ephemeral and not self._follower and self._config.store.log.enabled

    @property
    def seq(self) -> int:
        """The seq of the state opened so far (as :attr:`embeddb.engine.shard.Shard.seq`)."""
        if self._follower:
            return self.applied_seq
        return self.log.last_seq if self.log is not None else 0

    def open(self, restore: str | Restore | None, fallback: bool) -> Recovery:
        """Open the directory; ``restore`` and ``fallback`` as for
        :class:`~embeddb.engine.shard.Shard`.

        Returns:
            How it was opened (``seconds`` and ``log_cuts`` left for the caller to fill in).
        """
        snapshots_dir = self._data_dir / "snapshots"
        try:
            private_dir(self._data_dir)  # 0700, created or tightened (docs/architecture.md §6)
        except OSError as exc:
            raise StorageError(f"cannot use data directory {self._data_dir}: {exc}") from exc
        if not self._ephemeral:  # before anything in it is read or changed
            self.lock = DirectoryLock.acquire(self._data_dir)
            interrupted = unfinished.unfinished(self._data_dir)
            if interrupted is not None and (
                restore is None or unfinished.read_mark(self._data_dir, unfinished.RESHARDING)
            ):
                raise StorageError(interrupted)  # a restore is finished by restoring again
        snapshot_dirs.remove_incomplete(snapshots_dir)
        if not (self._ephemeral or self._follower):
            topology.check_directory(self._data_dir, self._topology)
        if restore is not None:
            return self._restore_explicitly(
                restore if isinstance(restore, Restore) else Restore(restore)
            )
        marker = read_record(self._data_dir, CLEAN_MARKER)
        if marker is not None:
            return self._open_clean(marker)
        disk_dir = self._data_dir / "disk"
        has_disk = disk_dir.exists() and any(disk_dir.iterdir())
        log_dir = self._data_dir / "log"
        has_log = log_dir.exists() and any(log_dir.glob("*.log"))
        has_snapshots = bool(snapshot_dirs.list_snapshots(snapshots_dir))
        if not (has_disk or has_log or has_snapshots):
            self._start_tables(disk_rows={})
            self._start_log(0)
            return Recovery("new", None, 0, 0, self.seq, 0.0)
        if not has_snapshots and not (self.logged and has_log):
            raise StorageError(
                f"{self._data_dir} holds a disk tier that was not shut down cleanly and no "
                f"update log or snapshot to recover it from; remove the directory to start empty"
            )
        return self._recover(fallback, has_log)

    def release(self) -> None:
        """Release what a failed open holds (the update log, the disk tier, then the lock)."""
        try:
            if self.log is not None:
                self.log.close()
            if self.disk is not None:
                try:
                    self.disk.close()
                except StorageError:
                    logger.exception("closing the disk tier after a failed open")
        finally:
            self.lock.release()

    def _restore_hint(self) -> str:
        where = shlex.quote(str(self._data_dir))
        return (
            f"roll it back to a snapshot with embeddb restore --data-dir {where} --snapshot ID "
            f"(without --snapshot it lists them), or remove the directory to start empty"
        )

    def _open_clean(self, marker: dict[str, Any]) -> Recovery:
        disk_rows = self._check_tables(marker, CLEAN_MARKER)
        seq = int(marker.get("seq", 0))
        self._start_tables(disk_rows)
        self._start_log(seq)
        if self.log is not None and self.log.last_seq != seq:
            raise CorruptDataError(
                f"{self._data_dir / CLEAN_MARKER} records seq {seq} but the update log ends at "
                f"{self.log.last_seq}; {self._restore_hint()}"
            )
        # From now on the RAM tier may hold rows the disk does not: the marker becomes the base
        # that crash recovery starts from.
        os.replace(self._data_dir / CLEAN_MARKER, self._data_dir / BASE)
        return Recovery("clean", None, seq, 0, seq, 0.0)

    def _recover(self, fallback: bool, has_log: bool) -> Recovery:
        base = read_record(self._data_dir, BASE)
        base_seq = int(base["seq"]) if base is not None else -1
        listed = snapshot_dirs.list_snapshots(self._data_dir / "snapshots")
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
                logger.error("snapshot %s is corrupt (%s); falling back to an older one", info, exc)
                continue
            self._load_snapshot(info.path, manifest)
            (self._data_dir / BASE).unlink(missing_ok=True)  # the disk tier is the snapshot's
            replayed = self._replay_log(int(manifest["seq"]))
            logger.warning(
                "recovered %s from snapshot %s (seq %d) and %d log records",
                self._data_dir, info.snapshot_id, manifest["seq"], replayed,
            )  # fmt: skip
            return Recovery(
                "snapshot", info.snapshot_id, int(manifest["seq"]), replayed, self.seq, 0
            )
        if not (self.logged and has_log):
            raise StorageError(
                f"{self._data_dir} was not shut down cleanly, has no usable snapshot and no update "
                f"log to recover from; {self._restore_hint()}"
            )
        if base is not None:
            self._check_tables(base, BASE)
        self._start_tables(disk_rows=None)  # counted from the disk tier
        start = max(base_seq, 0)
        replayed = self._replay_log(start)
        source = "base" if base is not None else "log"
        logger.warning(
            "recovered %s from its %s (seq %d) and %d log records",
            self._data_dir,
            "last clean shutdown" if base is not None else "empty state",
            start,
            replayed,
        )
        return Recovery(source, None, start, replayed, self.seq, 0.0)

    def _restore_explicitly(self, restore: Restore) -> Recovery:
        snapshot_id = restore.snapshot_id
        path = self._data_dir / "snapshots" / snapshot.check_id(snapshot_id)
        if not (path / snapshot.MANIFEST).exists():
            raise InvalidArgumentError(f"no complete snapshot {snapshot_id!r} in {path.parent}")
        manifest = snapshot.verify(path, progress=restore.progress)
        self._check_manifest(manifest, path)
        # From here until the snapshot is loaded the directory is neither its old state nor
        # the snapshot's: an interruption leaves this marker, and the next start says so.
        unfinished.mark(self._data_dir, unfinished.RESTORING, snapshot_id=snapshot_id)
        log_dir = self._data_dir / "log"
        if log_dir.exists():
            stamp = f"log.before-restore-{time.strftime('%Y%m%dT%H%M%S')}"
            aside = self._data_dir / stamp
            for k in range(2, 1000):  # two restores within a second keep both logs
                if not aside.exists():
                    break
                aside = self._data_dir / f"{stamp}.{k}"
            os.replace(log_dir, aside)
            logger.warning(
                "restoring %s: the previous update log is kept in %s", snapshot_id, aside
            )
        for stale in (CLEAN_MARKER, BASE):
            (self._data_dir / stale).unlink(missing_ok=True)
        self._load_snapshot(path, manifest)
        unfinished.clear(self._data_dir, unfinished.RESTORING)
        seq = int(manifest["seq"])
        if self._follower:
            self.applied_seq = seq
        return Recovery("snapshot", snapshot_id, seq, 0, self.seq, 0.0)

    def _load_snapshot(self, path: Path, manifest: dict[str, Any]) -> None:
        disk_dir = self._data_dir / "disk"
        shutil.rmtree(disk_dir, ignore_errors=True)
        try:
            snapshot_dirs.copy_disk(path, disk_dir)
        except OSError as exc:
            raise StorageError(f"cannot copy the disk tier of snapshot {path}: {exc}") from exc
        tables = manifest["tables"]
        self._start_tables({n: int(t["disk_rows"]) for n, t in tables.items() if n in self._widths})
        for name, table in self.tables.items():
            if name in tables:
                ids, rows, flags = snapshot.load_table(path, name, self._widths[name])
                table.load_ram(ids, rows, flags)
        self._start_log(int(manifest["seq"]))

    def _replay_log(self, after_seq: int) -> int:
        """Open the log (if not yet) and apply every record after ``after_seq``."""
        if self.log is None:
            self._start_log(after_seq)
        assert self.log is not None
        n = 0
        for record in self.log.read(after_seq):
            replay(self.tables, record.payload, f"update log record {record.seq}")
            n += 1
        return n

    def _start_tables(self, disk_rows: dict[str, int] | None) -> None:
        store = self._config.store
        self.disk = DiskTier(
            self._data_dir / "disk", self._widths, store.disk.cache_mb, pool=self._pool
        )
        self.tables = {
            name: TieredTable(t, store.ram, self.disk, 0, self._pool)
            for name, t in self._config.tables.items()
        }
        for name, table in self.tables.items():
            n = self.disk.count(name) if disk_rows is None else disk_rows.get(name, 0)
            table.set_disk_rows(n)

    def _start_log(self, start_seq: int) -> None:
        if not self.logged or self.log is not None:
            return
        cfg = LogConfig.of(
            self._config.store.log,
            cut_corrupt_tail=self._cut_corrupt_log_tail,
            cuts_dir=self._data_dir,
        )
        self.log = UpdateLog(self._data_dir / "log", cfg, start_seq=start_seq, io=self._file_io)

    def _check_tables(self, record: dict[str, Any], source: str) -> dict[str, int]:
        tables = record["tables"]
        for name, t in self._config.tables.items():
            if name in tables:
                width = self._widths[name]
                if (tables[name]["dim"], tables[name]["width"]) != (t.dim, width):
                    raise CorruptDataError(
                        f"table {name!r} in {self._data_dir} ({source}) has dim "
                        f"{tables[name]['dim']} and row width {tables[name]['width']}, the "
                        f"config says dim {t.dim} and width {width} (changed optimizer or dim?)"
                    )
        return {name: int(v["disk_rows"]) for name, v in tables.items()}

    def _check_manifest(self, manifest: dict[str, Any], path: Path) -> None:
        self._check_tables(manifest, f"snapshot {path.name}")
        index, count = manifest.get("shard_index", 0), manifest.get("num_shards", 1)
        wanted = self._topology
        if (index, count) != (wanted.shard_index, wanted.num_shards):
            raise CorruptDataError(
                f"snapshot {path} belongs to shard {index} of {count}, this is shard "
                f"{wanted.shard_index} of {wanted.num_shards} (use embeddb reshard to change the "
                f"shard count)"
            )
