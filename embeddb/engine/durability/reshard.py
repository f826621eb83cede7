"""Rewrite a job checkpoint of N shards into M shards (docs/architecture.md §5: restore into a
different number of shards).

A **job checkpoint** here is a cluster's data root in which every shard holds a snapshot of
the same id, as a coordinated snapshot leaves it::

    FROM/                                   N = 2 (read from the manifests)
      shard-0/snapshots/<id>/               manifest: shard_index 0, num_shards 2, seq 811
        ram/<table>.{ids,rows,flags}          the RAM tier at the snapshot (rows DIRTY or not)
        disk/                                 RocksDB checkpoint of the disk tier
      shard-1/snapshots/<id>/               manifest: shard_index 1, num_shards 2, seq 790

    TO/                                     M = 3, written by :func:`reshard`
      shard-0/snapshots/<id>/               manifest: shard_index 0, num_shards 3, seq 0
        ram/<table>.{ids,rows,flags}          empty: every row is in the disk tier
        disk/                                 a new RocksDB database
      shard-1/snapshots/<id>/  ...
      shard-2/snapshots/<id>/  ...
      reshard.json                          written last: what was done (source, N, M, rows)

``Shard(config, TO/shard-j, shard_index=j, num_shards=M)`` then recovers from the snapshot
(there is no log and no clean-shutdown record, so the newest snapshot is loaded). Its seq
starts again at 0: the source shards' logs and seqs do not carry over.

Every row — vector **and** optimizer state — of the N source snapshots ends on target shard
``shard_of(id, M)`` exactly once. A row may be in a source's RAM tier, its disk tier, or both:
a RAM row flagged ``DIRTY`` differs from its disk copy, one flagged ``ON_DISK`` and not
``DIRTY`` equals it. The RAM version always wins; the disk copies of resident ids are skipped
(counted as ``stale``).

Streaming, per source shard and table:

1. :func:`open_checkpoint` reads every manifest, checks that they agree (same N, indices
   0..N-1 all present, same tables) and :func:`~embeddb.engine.durability.snapshot.verify` checks
   every file of every snapshot, before anything is written. Every file read afterwards is
   resolved inside its snapshot directory too
   (:func:`~embeddb.engine.durability.snapshot.table_files`;
   the read-only disk tier confines itself): a manifest or a symbolic link that leads out of
   it is refused.
2. The table's resident ids (``ram/<table>.ids``) are loaded and sorted.
3. The disk checkpoint is opened **read-only** (:class:`~embeddb.engine.storage.DiskTier` with
   ``read_only=True``: nothing is written into the snapshot, whose SST files are hard links
   shared with the live shard) and read in id order, ``chunk_rows`` at a time; ids resident in
   RAM are dropped, the rest are routed with :func:`~embeddb.common.routing.shard_of` and written
   into
   the M target disk tiers (sorted by id within each chunk: RocksDB takes sorted batches about
   2.5 times faster).
4. The RAM rows are read through ``np.memmap`` in chunks, routed and written the same way.

Memory is bounded independently of table size: the sorted resident ids of one table of one
source (8 bytes per RAM-tier row, so at most 8 x the table's RAM ``capacity``), a few copies of
one chunk (``chunk_rows x width x 4`` bytes each), and the targets' RocksDB memtables (about
``M x 2 x buffer_mb`` MiB). Every source row is also checked to belong to its shard
(``shard_of(id, N) == i``), so no row can be written twice.

Nothing is left behind on failure: the snapshots are committed only after every row is written,
and ``TO`` is removed again (or emptied, if it existed empty) when anything fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, U64
from embeddb.common.routing import shard_of
from embeddb.engine.durability import snapshot, unfinished
from embeddb.engine.durability.reshard_target import (
    RESHARD_RECORD,
    check_target,
    locked,
    remove_output,
    shard_dirs,
    unfinished_output,
    write_record,
)
from embeddb.engine.storage import DiskTier
from embeddb.errors import CorruptDataError, InvalidArgumentError, NotFoundError, StorageError

__all__ = [
    "RESHARD_RECORD",
    "ReshardProgress",
    "ReshardResult",
    "SourceShard",
    "TableSpec",
    "open_checkpoint",
    "reshard",
    "table_specs",
]

logger = logging.getLogger(__name__)

_CHUNK_ROWS = 65536
_BUFFER_MB = 16  # memtable budget of each target disk tier
_READ_CACHE_MB = 8  # block cache of each source disk tier (read once, in order)


@dataclass(frozen=True)
class TableSpec:
    """A table as the snapshots describe it: ``width = dim + state_dim``."""

    dim: int
    width: int
    optimizer: str


@dataclass(frozen=True)
class SourceShard:
    """One verified source snapshot: shard ``index`` of the checkpoint, its directory and
    manifest."""

    index: int
    path: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def seq(self) -> int:
        return int(self.manifest["seq"])

    def disk_rows(self, table: str) -> int:
        return int(self.manifest["tables"][table].get("disk_rows", 0))

    def ram_rows(self, table: str) -> int:
        return snapshot.table_files(self.path, table)[0].stat().st_size // 8


@dataclass(frozen=True)
class ReshardProgress:
    """Reported after every chunk: ``rows`` read of about ``total`` (RAM plus disk rows of
    every source, stale disk copies included), ``seconds`` since the start."""

    rows: int
    total: int
    seconds: float


@dataclass(frozen=True)
class ReshardResult:
    """What :func:`reshard` wrote.

    Attributes:
        source_shards: N. target_shards: M.
        rows: ``{table: [rows on target shard j for j in 0..M-1]}``.
        stale: disk copies skipped because the row was resident in RAM.
        seconds: wall time, verification included.
    """

    snapshot_id: str
    source_shards: int
    target_shards: int
    rows: dict[str, list[int]]
    stale: int
    seconds: float

    @property
    def total_rows(self) -> int:
        return sum(sum(per_shard) for per_shard in self.rows.values())

    @property
    def rows_per_s(self) -> float:
        return self.total_rows / self.seconds if self.seconds > 0 else 0.0


def open_checkpoint(root: Path, snapshot_id: str) -> list[SourceShard]:
    """The N snapshots ``root/shard-i/snapshots/<snapshot_id>``, checked to form one complete
    checkpoint and verified file by file.

    Directories ``shard-k`` with ``k >= N`` that do not hold the snapshot are ignored.

    Raises:
        InvalidArgumentError: a bad snapshot id.
        NotFoundError: ``root`` is not a directory, or no shard of it holds the snapshot.
        CorruptDataError: the manifests disagree (shard count, index, tables), a shard's
            snapshot is missing or incomplete, or a file fails verification (named).
    """
    snapshot.check_id(snapshot_id)
    if not root.is_dir():
        raise NotFoundError(f"{root} is not a directory")
    found = shard_dirs(root)
    holding = {i: d / "snapshots" / snapshot_id for i, d in found.items()}
    holding = {i: p for i, p in holding.items() if p.is_dir()}
    if not holding:
        raise NotFoundError(
            f"no shard directory under {root} holds snapshot {snapshot_id!r} "
            f"(looked for {root}/shard-<i>/snapshots/{snapshot_id}; found "
            f"{len(found)} shard directories)"
        )
    manifests = {}
    for i, path in sorted(holding.items()):
        if not (path / snapshot.MANIFEST).exists():
            raise CorruptDataError(f"snapshot {path} is incomplete: it has no manifest")
        manifests[i] = snapshot.read_manifest(path)
    counts = {i: m.get("num_shards") for i, m in manifests.items()}
    if len(set(counts.values())) != 1:
        said = ", ".join(f"shard-{i}: {n}" for i, n in sorted(counts.items()))
        raise CorruptDataError(
            f"the snapshots {snapshot_id!r} under {root} disagree on the shard count ({said})"
        )
    n = next(iter(counts.values()))
    if not isinstance(n, int) or n < 1:
        raise CorruptDataError(f"the snapshots {snapshot_id!r} record num_shards {n!r}")
    for i, m in sorted(manifests.items()):
        if m.get("shard_index") != i:
            raise CorruptDataError(
                f"{holding[i]} records shard_index {m.get('shard_index')!r} of {n}, but it is "
                f"in directory shard-{i}"
            )
    missing = [i for i in range(n) if i not in manifests]
    if missing:
        raise CorruptDataError(
            f"the checkpoint {snapshot_id!r} under {root} is incomplete: its manifests record "
            f"{n} shards but shard(s) {missing} have no snapshot {snapshot_id!r} "
            f"(expected {root}/shard-{missing[0]}/snapshots/{snapshot_id})"
        )
    specs = {i: _table_specs(m, holding[i]) for i, m in manifests.items()}
    if any(s != specs[0] for s in specs.values()):
        differing = next(i for i, s in specs.items() if s != specs[0])
        raise CorruptDataError(
            f"the snapshots {snapshot_id!r} disagree on the tables: shard-0 has {specs[0]}, "
            f"shard-{differing} has {specs[differing]}"
        )
    sources = []
    for i in range(n):
        manifest = snapshot.verify(holding[i])  # every file, against its size and CRC32
        sources.append(SourceShard(i, holding[i], manifest))
    return sources


def table_specs(sources: list[SourceShard]) -> dict[str, TableSpec]:
    """The tables of a checkpoint returned by :func:`open_checkpoint`."""
    return _table_specs(sources[0].manifest, sources[0].path)


def reshard(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    num_shards: int,
    snapshot_id: str,
    *,
    chunk_rows: int = _CHUNK_ROWS,
    buffer_mb: int = _BUFFER_MB,
    progress: Callable[[ReshardProgress], None] | None = None,
) -> ReshardResult:
    """Rewrite the checkpoint ``snapshot_id`` of the shards under ``source`` into
    ``num_shards`` shards under ``target`` (see the module docstring).

    ``num_shards`` equal to the source's count is allowed: a verified copy whose rows all
    move to the disk tier.

    Args:
        source: the source data root (``shard-0`` .. ``shard-(N-1)``).
        target: the new data root; must not exist or be an empty directory.
        num_shards: M >= 1.
        snapshot_id: the snapshot every source shard holds; the targets get the same id.
        chunk_rows: rows read, routed and written at a time.
        buffer_mb: memtable budget of each target disk tier, in MiB.
        progress: called after every chunk.

    Raises:
        InvalidArgumentError: ``num_shards < 1``, a bad id, or ``target`` is not empty.
        NotFoundError, CorruptDataError: see :func:`open_checkpoint`; also a source row that
            does not belong to its shard.
        StorageError: reading or writing failed (nothing is left under ``target``).
    """
    began = time.perf_counter()
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise InvalidArgumentError(f"num_shards must be an integer >= 1, got {num_shards!r}")
    if chunk_rows < 1 or buffer_mb < 1:
        raise InvalidArgumentError("chunk_rows and buffer_mb must be >= 1")
    source, target = Path(source), Path(target)
    check_target(target)
    with ExitStack() as locks:  # every source and target directory, until the end
        if source.is_dir():  # a running shard, or another reshard, refuses this one
            for path in shard_dirs(source).values():
                locks.enter_context(locked(path, "source shard directory", read_only_ok=True))
        sources = open_checkpoint(source, snapshot_id)
        existed = target.exists()
        target.mkdir(parents=True, exist_ok=True)
        try:
            locks.enter_context(locked(target, "reshard target"))
            check_target(target)  # again, now that no other reshard can start here
            if unfinished_output(target):
                for path in shard_dirs(target).values():
                    locks.enter_context(locked(path, "target shard directory"))
                remove_output(target, existed=True)
        except BaseException:
            if not existed:
                shutil.rmtree(target, ignore_errors=True)
            raise
        plan = _Plan(source, target, num_shards, snapshot_id, chunk_rows, buffer_mb)
        return _write(plan, sources, existed, locks, began, progress)


@dataclass(frozen=True)
class _Plan:
    """What :func:`reshard` was asked to do (checked)."""

    source: Path
    target: Path
    num_shards: int
    snapshot_id: str
    chunk_rows: int
    buffer_mb: int


def _write(
    plan: _Plan,
    sources: list[SourceShard],
    existed: bool,
    locks: ExitStack,
    began: float,
    progress: Callable[[ReshardProgress], None] | None,
) -> ReshardResult:
    """The second half of :func:`reshard`: every target shard written, or nothing left."""
    source, target, num_shards, snapshot_id = (
        plan.source, plan.target, plan.num_shards, plan.snapshot_id
    )  # fmt: skip
    specs = table_specs(sources)
    total = sum(s.ram_rows(t) + s.disk_rows(t) for s in sources for t in specs)
    writers: list[snapshot.SnapshotWriter] = []
    tiers: list[DiskTier] = []
    marked = {
        "snapshot_id": snapshot_id,
        "source": str(source.resolve()),
        "target": str(target.resolve()),
        "num_shards": num_shards,
    }
    try:
        unfinished.mark(target, unfinished.RESHARDING, operation="reshard", **marked)
        widths = {name: spec.width for name, spec in specs.items()}
        for j in range(num_shards):
            shard_dir = target / f"shard-{j}"
            shard_dir.mkdir(mode=0o700)
            locks.enter_context(locked(shard_dir, "target shard directory"))
            unfinished.mark(shard_dir, unfinished.RESHARDING, operation="reshard", **marked)
            writer = snapshot.SnapshotWriter(shard_dir / "snapshots", snapshot_id)
            writers.append(writer)
            tiers.append(
                DiskTier(writer.disk_dir, widths, _READ_CACHE_MB, write_buffer_mb=plan.buffer_mb)
            )
        mover = _Mover(tiers, specs, len(sources), plan.chunk_rows, total, began, progress)
        for src in sources:
            mover.move_shard(src)
        for tier in tiers:
            tier.close()
        tiers.clear()
        empty_ids = np.empty(0, dtype=np.uint64)
        empty_flags = np.empty(0, dtype=np.uint8)
        for j, writer in enumerate(writers):
            for name, spec in specs.items():
                empty_rows = np.empty((0, spec.width), dtype=np.float32)
                writer.write_table(name, empty_ids, empty_rows, empty_flags)
            meta = {
                "shard_index": j,
                "num_shards": num_shards,
                "tables": {
                    name: {
                        "dim": spec.dim,
                        "width": spec.width,
                        "optimizer": spec.optimizer,
                        "disk_rows": mover.rows[name][j],
                    }
                    for name, spec in specs.items()
                },
                "resharded_from": {
                    "num_shards": len(sources),
                    "seqs": [s.seq for s in sources],
                },
            }
            writer.commit(0, meta)
        seconds = time.perf_counter() - began
        result = ReshardResult(
            snapshot_id, len(sources), num_shards, mover.rows, mover.stale, seconds
        )
        _write_record(target, source, result, specs)
        for j in range(num_shards):  # the targets first: the root's marker goes last
            unfinished.clear(target / f"shard-{j}", unfinished.RESHARDING)
        unfinished.clear(target, unfinished.RESHARDING)
    except BaseException:
        for tier in tiers:
            try:
                tier.close()
            except StorageError:
                logger.exception("closing a target disk tier after a failed reshard")
        for writer in writers:
            writer.abort()
        remove_output(target, existed)
        raise
    return result


class _Mover:
    """Reads source rows chunk by chunk and writes each into its target shard's disk tier."""

    def __init__(
        self,
        tiers: list[DiskTier],
        specs: dict[str, TableSpec],
        source_shards: int,
        chunk_rows: int,
        total: int,
        began: float,
        progress: Callable[[ReshardProgress], None] | None,
    ) -> None:
        self.tiers = tiers
        self.specs = specs
        self.source_shards = source_shards
        self.chunk_rows = chunk_rows
        self.total = total
        self.began = began
        self.progress = progress
        self.rows = {name: [0] * len(tiers) for name in specs}
        self.stale = 0
        self.read = 0

    def move_shard(self, src: SourceShard) -> None:
        widths = {name: spec.width for name, spec in self.specs.items()}
        checkpoint = snapshot.entry_path(src.path, "disk")  # refused if it leads out
        disk = DiskTier(checkpoint, widths, _READ_CACHE_MB, read_only=True)
        try:
            for name in self.specs:
                self._move_table(src, disk, name)
        finally:
            disk.close()

    def _move_table(self, src: SourceShard, disk: DiskTier, name: str) -> None:
        width = self.specs[name].width
        ids_file, rows_file, flags_file = snapshot.table_files(src.path, name)
        resident = np.fromfile(ids_file, dtype="<u8").astype(np.uint64, copy=False)
        n_ram = resident.size
        rows_bytes = rows_file.stat().st_size
        if rows_bytes != 4 * width * n_ram or flags_file.stat().st_size != n_ram:
            raise CorruptDataError(
                f"table {name!r} of snapshot {src.path}: the RAM files do not agree on "
                f"{n_ram} rows of width {width}"
            )
        resident.sort()  # only the sorted copy is kept: 8 bytes per resident row
        n_disk = 0
        for ids, rows in disk.iter_rows(name, self.chunk_rows):
            n_disk += ids.size
            stale = _members(ids, resident)
            self.stale += int(stale.sum())
            self._route(src, name, ids[~stale], rows[~stale])
            self._report(ids.size)
        if n_disk != src.disk_rows(name):
            logger.warning(
                "table %r of snapshot %s: the manifest counts %d disk rows, the checkpoint "
                "holds %d (all were moved)",
                name, src.path, src.disk_rows(name), n_disk,
            )  # fmt: skip
        del resident
        if n_ram == 0:
            return  # np.memmap cannot map an empty file
        ids_map = np.memmap(ids_file, dtype="<u8", mode="r", shape=(n_ram,))
        rows_map = np.memmap(rows_file, dtype="<f4", mode="r", shape=(n_ram, width))
        try:
            for start in range(0, n_ram, self.chunk_rows):
                stop = min(start + self.chunk_rows, n_ram)
                ids = np.array(ids_map[start:stop], dtype=np.uint64)
                rows = np.array(rows_map[start:stop], dtype=np.float32)
                self._route(src, name, ids, rows)
                self._report(ids.size)
        finally:
            del ids_map, rows_map

    def _route(self, src: SourceShard, name: str, ids: U64, rows: F32) -> None:
        if ids.size == 0:
            return
        if self.source_shards > 1:
            owner = shard_of(ids, self.source_shards)
            wrong = np.flatnonzero(owner != src.index)
            if wrong.size:
                k = int(wrong[0])
                raise CorruptDataError(
                    f"snapshot {src.path} (shard {src.index} of {self.source_shards}) holds id "
                    f"{int(ids[k])} of table {name!r}, which belongs to shard {int(owner[k])}"
                )
        dest = shard_of(ids, len(self.tiers))
        order = np.lexsort((ids, dest))  # by target shard, then id (sorted batches)
        bounds = np.searchsorted(dest[order], np.arange(len(self.tiers) + 1))
        for j, tier in enumerate(self.tiers):
            picked = order[bounds[j] : bounds[j + 1]]
            if picked.size:
                tier.put(name, ids[picked], rows[picked])
                self.rows[name][j] += int(picked.size)

    def _report(self, n: int) -> None:
        self.read += n
        if self.progress is not None:
            elapsed = time.perf_counter() - self.began
            self.progress(ReshardProgress(self.read, self.total, elapsed))


def _members(ids: U64, sorted_set: U64) -> npt.NDArray[np.bool_]:
    """``ids[i] in sorted_set`` for every i (binary search: no sort of the large set)."""
    if sorted_set.size == 0:
        return np.zeros(ids.size, dtype=bool)
    pos = np.searchsorted(sorted_set, ids)
    pos[pos == sorted_set.size] = 0
    hit: npt.NDArray[np.bool_] = sorted_set[pos] == ids
    return hit


def _table_specs(manifest: dict[str, Any], path: Path) -> dict[str, TableSpec]:
    try:
        return {
            str(name): TableSpec(int(t["dim"]), int(t["width"]), str(t.get("optimizer", "")))
            for name, t in manifest["tables"].items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDataError(f"{path / snapshot.MANIFEST} has a malformed table: {exc}") from exc


def _write_record(
    target: Path, source: Path, result: ReshardResult, specs: dict[str, TableSpec]
) -> None:
    record = {
        "format_version": 1,
        "snapshot_id": result.snapshot_id,
        "source": str(source.resolve()),
        "source_shards": result.source_shards,
        "num_shards": result.target_shards,
        "tables": {
            name: {
                "dim": spec.dim,
                "width": spec.width,
                "optimizer": spec.optimizer,
                "rows": result.rows[name],
            }
            for name, spec in specs.items()
        },
        "rows": result.total_rows,
        "stale_disk_copies": result.stale,
        "seconds": round(result.seconds, 3),
        "created": time.time(),
    }
    write_record(target, record)
