"""Taking a shard's snapshots, and finding one to send.

The files, their manifest and their checks are :mod:`embeddb.engine.durability.snapshot`'s; this
module captures a consistent state of a shard's tables into them (:meth:`ShardSnapshots.take`)
and lists and opens the complete ones. The :class:`~embeddb.engine.shard.Shard` facade holds the
lock that serializes taking, pruning and opening, and truncates its update log afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from embeddb.common.routing import Topology
from embeddb.engine.durability import snapshot, snapshot_dirs
from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.engine.durability.snapshot_dirs import SnapshotInfo
from embeddb.engine.durability.snapshot_transfer import SnapshotReader
from embeddb.engine.storage import DiskTier, TieredTable, capture
from embeddb.engine.storage.parallel import StripePool
from embeddb.errors import NotFoundError

__all__ = ["ShardSnapshots", "SnapshotResult"]


@dataclass(frozen=True)
class SnapshotResult:
    """A snapshot just taken: the snapshot, how long serving paused and the whole call took."""

    info: SnapshotInfo
    pause_s: float
    seconds: float


class ShardSnapshots:
    """The snapshots of one shard (its ``snapshots/`` directory).

    Args:
        root: the ``snapshots/`` directory.
        disk: the shard's disk tier. tables: its tables. pool: its stripe pool.
        topology: the shard's place in its cluster, recorded in each manifest.
        file_io: the file layer the snapshot files are written through (the update log's).

    A failed snapshot (a full disk, an I/O error) fails only that call: no snapshot is left,
    the older ones stay, and the shard keeps serving — its update log, the commit point, is
    untouched, so the shard stops taking writes only if the log itself fails.
    """

    def __init__(
        self,
        root: Path,
        disk: DiskTier,
        tables: Mapping[str, TieredTable],
        pool: StripePool,
        topology: Topology,
        file_io: FileIO = REAL,
    ) -> None:
        self.root = root
        self._disk = disk
        self._tables = tables
        self._pool = pool
        self._topology = topology
        self._io = file_io

    def complete(self) -> list[SnapshotInfo]:
        """Complete snapshots, oldest first."""
        return [s for s in snapshot_dirs.list_snapshots(self.root) if s.seq >= 0]

    def take(
        self, snapshot_id: str | None, current_seq: Callable[[], int]
    ) -> tuple[SnapshotInfo, float]:
        """Write a snapshot holding exactly the mutations up to ``current_seq()`` (read while
        no mutation can run); the caller serializes snapshots.

        Returns:
            The snapshot and how long mutations paused (seconds).

        Raises:
            InvalidArgumentError: a bad or existing id. StorageFullError (RESOURCE_EXHAUSTED),
                StorageFaultError (UNAVAILABLE): a write failed (no partial snapshot is left).
        """
        name = snapshot_id
        if name is None:
            now = time.time()
            name = time.strftime("snap-%Y%m%dT%H%M%S", time.gmtime(now)) + (
                f"{now % 1:.6f}"[1:] + "Z"
            )
        writer = snapshot.SnapshotWriter(self.root, name, self._io)
        try:
            # Deleted rows must leave the files the checkpoint hard-links, not only be masked
            # by tombstones: compact their key ranges (again under the locks, for deletes that
            # arrive meanwhile; usually nothing then).
            self._disk.purge_deleted()
            buffers = {n: capture.capture_buffers(t.stripes) for n, t in self._tables.items()}
            with ExitStack() as locked:
                paused = time.perf_counter()
                for table in self._tables.values():
                    for stripe in table.stripes:
                        locked.enter_context(stripe.lock)
                seq = current_seq()
                # one item per stripe, so that the pool threads copy them in parallel
                work = [
                    (t, k, buf) for n, t in self._tables.items() for k, buf in enumerate(buffers[n])
                ]
                self._pool.map(
                    lambda w: capture.capture_into(w[0].stripes, [w[2]], w[1]), work, 1 << 62
                )
                disk_rows = {n: capture.disk_rows(t.stripes) for n, t in self._tables.items()}
                self._disk.purge_deleted()
                self._disk.checkpoint(writer.disk_dir)
                pause = time.perf_counter() - paused
            for n in list(buffers):  # each table's buffers go as soon as they are written
                writer.write_table_parts(n, capture.captured_parts(buffers.pop(n)))
            meta = {
                "shard_index": self._topology.shard_index,
                "num_shards": self._topology.num_shards,
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
            done = self.complete()  # the newest one's SST checksums are reused where they can be
            info = writer.commit(seq, meta, done[-1].path if done else None)
        except BaseException:
            writer.abort()
            raise
        return info, pause

    def prune(self, keep: int) -> None:
        """Delete complete snapshots beyond the newest ``keep``."""
        snapshot_dirs.prune(self.root, keep)

    def open(self, snapshot_id: str | None) -> SnapshotReader:
        """Open complete snapshot ``snapshot_id`` (None: the newest) for sending; the caller
        keeps it from being pruned meanwhile.

        Raises:
            NotFoundError: no such complete snapshot. CorruptDataError: see
                :class:`SnapshotReader`.
        """
        found = [s for s in self.complete() if snapshot_id is None or s.snapshot_id == snapshot_id]
        if not found:
            raise NotFoundError(
                f"shard {self._topology.shard_index} has no complete snapshot {snapshot_id!r}"
            )
        return SnapshotReader.open(found[-1])
