"""Snapshot writes under storage faults (issue 23): ENOSPC and EIO at the n-th write, fsync and
rename of a snapshot, injected through the shard's file layer (:class:`FaultyIO`).

A failed snapshot fails that call only — RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for an
I/O error, no path in the message — and leaves nothing recovery could pick (the manifest is
written last and the directory renamed in after it); the older snapshot still restores, and the
shard is not made read-only: its update log, the commit point, did not fail.
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.durability.fileio import FaultyIO, FileIO, Operation
from embeddb.engine.shard import Shard
from embeddb.errors import StorageError, StorageFaultError
from embeddb.transport.status import code_of


def _two_tables(fsync: str = "always") -> EmbeddingConfig:
    """Tables ``a`` and ``b`` (dim 8, 64 rows of RAM: the rest go to RocksDB, so snapshots
    hold a disk checkpoint too)."""
    opt = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1)
    tables = {n: TableConfig(name=n, dim=8, capacity=64, optimizer=opt) for n in ("a", "b")}
    store = StoreConfig(ram=RamTierConfig(stripes=2, eviction_chunk=1e-6, min_stripe_rows=1))
    return EmbeddingConfig(tables=tables, store=replace(store, log=replace(store.log, fsync=fsync)))


SNAP_IDS = np.arange(300, dtype=np.uint64)


def _fill(shard: Shard, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for table in ("a", "b"):
        shard.assign(table, SNAP_IDS, rng.standard_normal((SNAP_IDS.size, 8), dtype=np.float32))


def _rows(shard: Shard) -> list[np.ndarray]:
    return [shard.peek(table, SNAP_IDS)[1] for table in ("a", "b")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("operation", "nth", "code", "status"),
    [
        ("write", 1, errno.ENOSPC, "RESOURCE_EXHAUSTED"),  # the first RAM file
        ("write", 4, errno.EIO, "UNAVAILABLE"),  # table b's first file
        ("write", 7, errno.ENOSPC, "RESOURCE_EXHAUSTED"),  # the manifest (after 2 x 3 files)
        ("fsync", 1, errno.EIO, "UNAVAILABLE"),  # the first file's fsync
        ("fsync", 2, errno.ENOSPC, "RESOURCE_EXHAUSTED"),
        ("rename", 1, errno.ENOSPC, "RESOURCE_EXHAUSTED"),  # the rename into place
        ("rename", 1, errno.EIO, "UNAVAILABLE"),
    ],
)
def test_a_failed_snapshot_leaves_no_snapshot_and_the_shard_serving(
    tmp_path: Path, operation: Operation, nth: int, code: int, status: str
) -> None:
    """Before: snapshot files were written, fsynced and renamed with :mod:`os` directly, so no
    fault reached them through the shard's file layer (``calls[...]`` stayed put and the
    snapshot succeeded), and a real failure answered INTERNAL with the snapshot's path."""
    io = FaultyIO(operation, 1 << 30, code)  # armed below, once s1 is taken
    data = tmp_path / "p"
    with Shard(_two_tables(), data, file_io=io) as shard:
        _fill(shard, 0)
        shard.snapshot("s1")
        kept = _rows(shard)
        _fill(shard, 1)
        io.nth = io.calls[operation] + nth  # the nth of this operation in snapshot s2
        with pytest.raises(StorageError) as failed:
            shard.snapshot("s2")
        assert io.fired
        assert code_of(failed.value).name == status
        assert str(tmp_path) not in str(failed.value)  # paths go to the server log only
        # No partial snapshot that recovery could pick: no s2, no temporary directory.
        assert [s.snapshot_id for s in shard.snapshots()] == ["s1"]
        assert sorted(p.name for p in (data / "snapshots").iterdir()) == ["s1"]
        # The update log did not fail: the shard is not read-only, and serves reads and writes.
        assert not shard.read_only
        io.free()
        _fill(shard, 2)
        final = _rows(shard)
        assert shard.snapshot("s2").info.snapshot_id == "s2"  # and snapshots again
    with Shard(_two_tables(), data) as reopened:
        assert all(np.array_equal(x, y) for x, y in zip(_rows(reopened), final, strict=True))
    with Shard(_two_tables(), data, restore="s1") as restored:  # the older one still restores
        assert all(np.array_equal(x, y) for x, y in zip(_rows(restored), kept, strict=True))


class _FailAfterRename(FileIO):
    """Fails the first directory fsync after a rename (``snapshots/`` after the snapshot's)."""

    def __init__(self) -> None:
        self.armed = self.renamed = self.fired = False

    def replace(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        super().replace(source, target)
        self.renamed = self.armed

    def fsync_dir(self, fd: int) -> None:
        if self.renamed and not self.fired:
            self.fired = True
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fsync_dir(fd)


def test_an_io_error_after_the_snapshot_rename_removes_it(tmp_path: Path) -> None:
    """The fsync of ``snapshots/`` after the rename fails: the snapshot, whose directory entry
    may not be durable, is removed and the call fails; the shard keeps its older one."""
    io = _FailAfterRename()
    data = tmp_path / "p"
    with Shard(_two_tables(), data, file_io=io) as shard:
        _fill(shard, 0)
        shard.snapshot("s1")
        io.armed = True
        with pytest.raises(StorageFaultError) as failed:
            shard.snapshot("s2")
        assert io.fired
        assert str(tmp_path) not in str(failed.value)
        assert sorted(p.name for p in (data / "snapshots").iterdir()) == ["s1"]
        assert not shard.read_only
        _fill(shard, 1)  # writes go on
