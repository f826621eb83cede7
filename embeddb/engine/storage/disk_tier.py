"""The disk tier: rows evicted from RAM, kept in RocksDB (via ``rocksdict``).

One RocksDB database per shard, one column family per table (``table.<name>``). A key is the
id as 8 big-endian bytes (so RocksDB's order is numeric order); a value is the row's raw
float32 bytes ``[vector | state]``. All traffic is batched: one multi-get per lookup, one write
batch per eviction or promotion.

RocksDB's own write-ahead log is disabled: this tier is a spill area, not the durability
mechanism. The disk tier survives a clean :meth:`close` (the shard first writes back every dirty
RAM row and records that it did); crash recovery is the update log's job.

Each table keeps the **span** of ids it may hold: its first and last key when the tier opens,
widened (under a lock) before every write, never narrowed. A multi-get asks RocksDB only about
the ids inside it, so the first-seen ids of a table with nothing on disk, or beyond every id
it ever spilled, cost no RocksDB call (a rocksdict multi-get costs about a microsecond per key,
found or not).

The rocksdict API takes Python lists of ``bytes``; keys and values are converted with numpy's
void-dtype views (``tolist`` on a ``V8`` array builds the list in C), never a per-id Python loop.

**Read-only** (``read_only=True``, for tools that read a snapshot's checkpoint, such as
``embeddb reshard``): nothing is ever written to ``path``. RocksDB's own read-only mode writes
nothing, but rocksdict rewrites its ``rocksdict-config.json`` on every open (read-only too), and
a snapshot's files are checksummed and partly hard-linked with the live shard. So the tier opens
a private *shadow* directory instead: symlinks to every file of ``path`` except that config file,
removed again by :meth:`close`. Each file is resolved inside ``path``
(:func:`embeddb.engine.storage.paths.resolve_inside`): a symbolic link out of it is refused with
:class:`CorruptDataError`.

**Data loss.** A read that fails RocksDB's checks (a ``Corruption`` status: a block checksum
mismatch, a torn file) raises :class:`CorruptDataError` (gRPC ``DATA_LOSS``); the tier logs one
ERROR line naming the table and RocksDB's message, and counts the failed read per table
(:meth:`data_loss`, shown as ``TableStats.data_loss``). Other rows keep serving: RocksDB checks
each block as it reads it, so only reads that touch a damaged block fail. Iterations
(:meth:`iter_rows`, :meth:`ids_after`, :meth:`count`: scans, exports, reshards, recovery)
check the iterator's status when it stops, so a damaged block fails them the same way instead
of looking like the end of the table.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rocksdict

from embeddb.engine.storage.parallel import StripePool
from embeddb.engine.storage.paths import confined_root, resolve_inside
from embeddb.errors import CorruptDataError, StorageError

__all__ = ["DiskTier", "Tuning"]

logger = logging.getLogger(__name__)

_CF_PREFIX = "table."
_ROCKSDICT_CONFIG = "rocksdict-config.json"  # written by rocksdict on every open
_EVERY_ID = (0, (1 << 64) - 1)
# Multi-gets of at least this many keys are split over the pool's threads: a key costs about
# 2 us of RocksDB work, a hand-off to a pool thread tens of microseconds.
_PARALLEL_MIN_KEYS = 4096


def _keys(ids: npt.NDArray[np.uint64]) -> list[bytes]:
    keys: list[bytes] = ids.astype(">u8").view("V8").tolist()
    return keys


def _key_order(ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp] | None:
    """The stable order that sorts ``ids`` (the last of equal ids stays last, so a write batch
    keeps "last write wins"); ``None`` when they are sorted already."""
    if ids.size < 2 or bool((ids[1:] >= ids[:-1]).all()):
        return None
    return np.argsort(ids, kind="stable")


def _storage_error(what: str, exc: Exception) -> StorageError:
    """Translate a RocksDB failure: its ``Corruption`` status (a checksum mismatch, a torn
    file) becomes :class:`CorruptDataError`, anything else :class:`StorageError`."""
    kind = CorruptDataError if str(exc).startswith("Corruption") else StorageError
    return kind(f"{what}: {exc}")


@dataclass(frozen=True)
class Tuning:
    """RocksDB settings of the disk tier (``benchmarks/disk_tier.py`` measures each one on
    Zipf point reads; benchmarks/README.md has the table). The defaults are the chosen ones,

    measured on 10M rows (ratio of µs per key to these defaults; same-settings runs spread by
    about ±20% on the shared benchmark machine, so only larger differences count):

    * ``block_size`` 4 KiB: a point read decodes one data block; 16 KiB blocks: 1.4x.
    * ``bloom_bits`` 10 (full filters): a read of an absent id rarely touches a data block
      (on found ids no filter is within noise, 0.92x; 16 bits: 1.1x).
      (rocksdict 0.3.29 offers neither ribbon filters nor a whole-key-filtering switch; whole-key
      filtering is RocksDB's default.)
    * ``partitioned`` off: two-level index and filter partitions only pay when index and
      filters do not fit in memory (measured within noise, 0.90x).
    * ``optimize_filters_for_hits`` off: it drops the bottom level's filters, which the reads
      of absent (first-seen) ids inside a table's span need.
    * ``cache_index_and_filter`` off (and so no L0 pinning): index and filter blocks stay in the
      table readers' memory instead of competing with data blocks in the block cache.
    * ``mmap_reads`` on, ``direct_reads`` off: reading SST files through mmap saves a pread and
      a copy per block when the files are in the page cache; direct reads bypass that cache.
    * ``compression`` none: rows are float32 values that do not compress; trying costs CPU on
      every write. Files written with another compression still open (each block records its
      own).
    * ``hyper_clock`` off: RocksDB's lock-free HyperClockCache instead of the LRU cache: within
      noise (0.88x-1.20x over three runs); so is caching index and filter blocks with L0
      pinned (0.91x-0.93x) and a 1 GiB cache (1.02x).
    * Measured against: no mmap 1.25x-1.44x, direct reads 3.4x, lz4 1.0x (and write CPU).
    """

    block_size: int = 4096
    bloom_bits: int = 10
    partitioned: bool = False
    optimize_filters_for_hits: bool = False
    cache_index_and_filter: bool = False
    pin_l0: bool = False
    mmap_reads: bool = True
    direct_reads: bool = False
    compression: str = "none"
    hyper_clock: bool = False


def _options(
    cache: rocksdict.Cache | None = None,
    write_buffer_mb: int | None = None,
    tuning: Tuning = Tuning(),
) -> rocksdict.Options:
    """Options of the database and of each column family; every table shares ``cache``."""
    opt = rocksdict.Options(raw_mode=True)
    opt.create_if_missing(True)
    if write_buffer_mb is not None:
        opt.set_write_buffer_size(write_buffer_mb << 20)
        opt.set_db_write_buffer_size(write_buffer_mb << 20)
    opt.set_max_background_jobs(2)
    table = rocksdict.BlockBasedOptions()
    table.set_block_size(tuning.block_size)
    if tuning.bloom_bits > 0:
        table.set_bloom_filter(tuning.bloom_bits, False)
    if cache is not None:
        table.set_block_cache(cache)
    if tuning.partitioned:
        table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
    table.set_cache_index_and_filter_blocks(tuning.cache_index_and_filter)
    table.set_pin_l0_filter_and_index_blocks_in_cache(tuning.pin_l0)
    # Point lookups only: a hash index inside each data block skips the binary search.
    table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())
    opt.set_block_based_table_factory(table)
    opt.set_optimize_filters_for_hits(tuning.optimize_filters_for_hits)
    opt.set_allow_mmap_reads(tuning.mmap_reads)
    opt.set_use_direct_reads(tuning.direct_reads)
    opt.set_compression_type(getattr(rocksdict.DBCompressionType, tuning.compression)())
    return opt


def _cache(cache_mb: int, tuning: Tuning) -> rocksdict.Cache:
    """One block cache for the whole database (every table's column family shares it)."""
    if tuning.hyper_clock:
        return rocksdict.Cache.new_hyper_clock_cache(cache_mb << 20, 0)
    return rocksdict.Cache(cache_mb << 20)


class DiskTier:
    """RocksDB storage of spilled rows for all tables of one shard.

    Args:
        path: the RocksDB directory (created if missing, unless ``read_only``).
        widths: ``{table name: row width in float32}`` for every table.
        cache_mb: block cache size in MiB.
        read_only: open an existing database (e.g. a snapshot's checkpoint) for reading only,
            through a shadow directory (see the module docstring); writes raise
            :class:`StorageError`.
        write_buffer_mb: cap the memtables of the whole database at about this many MiB
            (default: RocksDB's, 64 MiB per table); bulk writers opening many tiers at once
            set it to bound their memory.
        pool: threads that read the chunks of a large multi-get at once (default: none; the
            shard passes its :class:`StripePool`).
        tuning: RocksDB settings (the defaults are the measured choice, see :class:`Tuning`).

    Raises:
        StorageError: RocksDB cannot open the directory (locked, unwritable, corrupt).
        CorruptDataError: (``read_only``) a table has no column family in the database, or
            an entry of ``path`` is a symbolic link that resolves outside it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        widths: dict[str, int],
        cache_mb: int = 256,
        *,
        read_only: bool = False,
        write_buffer_mb: int | None = None,
        pool: StripePool | None = None,
        tuning: Tuning = Tuning(),
    ) -> None:
        self.path = Path(path)
        self._pool = pool or StripePool(1, 0)
        self.read_only = read_only
        self._widths = dict(widths)
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.disable_wal = True  # type: ignore[method-assign,assignment]  # stub is wrong: a property
        self._shadow: Path | None = None
        self._deleted: dict[str, tuple[int, int]] = {}  # table -> id range holding deletes
        self._deleted_lock = threading.Lock()
        self._views: dict[str, rocksdict.Rdict] = {}
        self._cfs: dict[str, rocksdict.ColumnFamily] = {}
        self._data_loss = dict.fromkeys(self._widths, 0)  # table -> reads failing RocksDB's checks
        self._data_loss_lock = threading.Lock()
        # table -> the id range that may hold rows (None: the table holds none), widened before
        # every write: a multi-get skips the ids outside it (first-seen ids, most often).
        self._spans: dict[str, tuple[int, int] | None] = {}
        self._spans_lock = threading.Lock()
        try:
            if read_only:
                self._db = self._open_read_only(cache_mb, tuning)
                self._spans = {name: self._stored_span(name) for name in self._widths}
                return
            self.path.mkdir(parents=True, exist_ok=True)
            cache = _cache(cache_mb, tuning)
            options = _options(cache, write_buffer_mb, tuning)
            self._db = rocksdict.Rdict(str(self.path), options)
            existing = set(rocksdict.Rdict.list_cf(str(self.path), _options()))
            # Per table: an Rdict view of its column family (multi-get, iteration) and a handle
            # (write batches).
            for name in self._widths:
                cf_name = _CF_PREFIX + name
                if cf_name not in existing:
                    self._db.create_column_family(cf_name, options)
                self._views[name] = self._db.get_column_family(cf_name)
                self._cfs[name] = self._db.get_column_family_handle(cf_name)
                self._spans[name] = self._stored_span(name)
        except StorageError:
            raise
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise _storage_error(f"cannot open disk tier at {self.path}", exc) from exc

    def _stored_span(self, table: str) -> tuple[int, int] | None:
        """The first and last stored id of ``table`` (``None``: no row); every id when they
        cannot be read (a damaged block fails the reads that touch it, not the open)."""
        try:
            it = self._views[table].iter()
            it.seek_to_first()
            if not it.valid():
                it.status()
                return None
            first = it.key()
            it.seek_to_last()
            last = it.key()
            it.status()
        except Exception:
            return _EVERY_ID
        lo, hi = np.frombuffer(first + last, dtype=">u8")
        return int(lo), int(hi)

    def _widen(self, table: str, ids: npt.NDArray[np.uint64]) -> None:
        """Widen ``table``'s span to cover ``ids`` (before they are written)."""
        lo, hi = int(ids.min()), int(ids.max())
        with self._spans_lock:
            span = self._spans[table]
            self._spans[table] = (lo, hi) if span is None else (min(lo, span[0]), max(hi, span[1]))

    def _open_read_only(self, cache_mb: int, tuning: Tuning) -> rocksdict.Rdict:
        if not (self.path / "CURRENT").is_file():
            raise StorageError(f"{self.path} holds no RocksDB database (no CURRENT file)")
        shadow = Path(tempfile.mkdtemp(prefix="embeddb-readonly-"))
        self._shadow = shadow
        try:
            # Only files inside the (resolved) directory: a link in a copied or planted
            # checkpoint must not make RocksDB read a file from elsewhere.
            owner = f"disk tier {self.path}"
            root = confined_root(self.path, owner)
            for name in sorted(os.listdir(root)):
                if name != _ROCKSDICT_CONFIG:
                    os.symlink(resolve_inside(root, name, owner), shadow / name)
            opt = _options(_cache(cache_mb, tuning), None, tuning)
            opt.create_if_missing(False)
            db = rocksdict.Rdict(str(shadow), opt, access_type=rocksdict.AccessType.read_only())
            existing = set(rocksdict.Rdict.list_cf(str(shadow), _options()))
            for name in self._widths:
                cf_name = _CF_PREFIX + name
                if cf_name not in existing:
                    db.close()
                    raise CorruptDataError(
                        f"disk tier at {self.path} has no column family for table {name!r}"
                    )
                self._views[name] = db.get_column_family(cf_name)
        except BaseException:
            shutil.rmtree(shadow, ignore_errors=True)
            self._shadow = None
            raise
        return db

    def get(
        self, table: str, ids: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float32]]:
        """Multi-get ``ids``.

        Returns:
            ``(found, rows)``: ``found[i]`` tells whether ``ids[i]`` is stored; ``rows`` holds
            the found rows only, in the order of ``ids[found]``.

        Raises:
            CorruptDataError: a block holding one of ``ids`` failed RocksDB's checks (logged
                and counted, see :meth:`data_loss`); the whole call fails.
            StorageError: RocksDB failed otherwise.
        """
        width = self._widths[table]
        span = self._spans[table]
        if ids.size == 0 or span is None:  # nothing stored: no multi-get
            return np.zeros(ids.size, dtype=bool), np.empty((0, width), dtype=np.float32)
        if span != _EVERY_ID:
            inside = (ids >= np.uint64(span[0])) & (ids <= np.uint64(span[1]))
            if not inside.all():  # ask RocksDB only about the ids inside the stored span
                found = np.zeros(ids.size, dtype=bool)
                found[inside], rows = self.get(table, ids[inside])
                return found, rows
        found, blob = self._multi_get(table, ids)
        rows = np.frombuffer(blob, dtype=np.float32).reshape(-1, width).copy()
        if rows.shape[0] != int(found.sum()):
            raise StorageError(f"disk tier of table {table!r} holds rows of the wrong width")
        return found, rows

    def _multi_get(
        self, table: str, ids: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.bool_], bytes]:
        """Which of ``ids`` are stored, and their values joined in order. A large call is split
        into contiguous chunks that the pool's threads read at once (rocksdict releases the GIL
        while RocksDB reads; ``benchmarks/disk_tier.py`` measures it)."""
        view = self._views[table]
        keys = ids.astype(">u8")
        parts = self._pool.threads if ids.size >= _PARALLEL_MIN_KEYS else 1
        bounds = [ids.size * k // parts for k in range(parts + 1)]

        def read(k: int) -> tuple[npt.NDArray[np.bool_], bytes]:
            chunk = keys[bounds[k] : bounds[k + 1]]
            values: list[bytes | None] = view.get(chunk.view("V8").tolist())  # type: ignore[assignment]
            # map/filter iterate in C: found where RocksDB returned bytes rather than None
            found = np.fromiter(map(bool, values), dtype=np.bool_, count=chunk.size)
            return found, b"".join(filter(None, values))

        try:
            if parts == 1:
                return read(0)
            chunks = self._pool.map(read, range(parts), ids.size, _PARALLEL_MIN_KEYS)
        except Exception as exc:
            raise self._read_error(table, exc) from exc
        return np.concatenate([f for f, _ in chunks]), b"".join(v for _, v in chunks)

    def data_loss(self, table: str) -> int:
        """Reads of ``table`` that failed RocksDB's checks since the tier opened."""
        return self._data_loss[table]

    def _lost(self, table: str, exc: Exception) -> None:
        with self._data_loss_lock:
            self._data_loss[table] += 1
        logger.error("disk tier data loss in table %r at %s: %s", table, self.path, exc)

    def put(self, table: str, ids: npt.NDArray[np.uint64], rows: npt.NDArray[np.float32]) -> None:
        """Write ``rows[i]`` under ``ids[i]`` in one write batch."""
        if ids.size == 0:
            return
        width = self._widths[table]
        self._widen(table, ids)
        order = _key_order(ids)  # a memtable takes keys in order about twice as fast
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if order is not None:
            ids, rows = ids[order], rows[order]
        values = rows.view(f"V{4 * width}").ravel().tolist()
        batch = rocksdict.WriteBatch(raw_mode=True)
        cf = self._cfs[table]
        for key, value in zip(_keys(ids), values, strict=True):
            batch.put(key, value, cf)
        self._write(batch, table)

    def delete(self, table: str, ids: npt.NDArray[np.uint64]) -> None:
        """Delete ``ids`` (absent ids are ignored) in one write batch."""
        if ids.size == 0:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        cf = self._cfs[table]
        order = _key_order(ids)
        for key in _keys(ids if order is None else ids[order]):
            batch.delete(key, cf)
        self._write(batch, table)
        lo, hi = int(ids.min()), int(ids.max())
        with self._deleted_lock:
            old = self._deleted.get(table)
            self._deleted[table] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    def purge_deleted(self) -> int:
        """Compact the key ranges where rows were deleted since the last purge, so that their
        old values leave the SST files instead of lingering under tombstones (user-data
        removal; a snapshot checkpoint hard-links those files). Returns the tables compacted.

        Raises:
            StorageError: RocksDB failed.
        """
        with self._deleted_lock:
            pending, self._deleted = self._deleted, {}
        for table, (lo, hi) in pending.items():
            keys = _keys(np.array([lo, hi], dtype=np.uint64))
            try:
                self._views[table].flush()  # the tombstones must reach the SST files first
                opts = rocksdict.CompactOptions()
                # Rewrite the bottommost level too: that is where the old values sit.
                opts.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
                self._views[table].compact_range(keys[0], keys[1], opts)
            except Exception as exc:
                with self._deleted_lock:  # still to do
                    self._deleted.setdefault(table, (lo, hi))
                raise _storage_error(
                    f"disk tier compaction failed for table {table!r}", exc
                ) from exc
        return len(pending)

    def _write(self, batch: rocksdict.WriteBatch, table: str) -> None:
        if self.read_only:
            raise StorageError(f"disk tier at {self.path} is open read-only")
        try:
            self._db.write(batch, self._write_opts)
        except Exception as exc:
            raise _storage_error(f"disk tier write failed for table {table!r}", exc) from exc

    def _iterator(self, table: str) -> rocksdict.RdictIter:
        try:
            return self._views[table].iter()
        except Exception as exc:
            raise self._read_error(table, exc) from exc

    def _read_error(self, table: str, exc: Exception) -> StorageError:
        """Translate a failed read of ``table``; a ``Corruption`` is logged and counted."""
        error = _storage_error(f"disk tier read failed for table {table!r}", exc)
        if isinstance(error, CorruptDataError):
            self._lost(table, exc)
        return error

    def _check(self, it: rocksdict.RdictIter, table: str) -> None:
        """Raise the error that stopped ``it``, if any: an iterator that meets a damaged
        block just stops being ``valid()``, which looks like the end of the table."""
        try:
            it.status()
        except Exception as exc:
            raise self._read_error(table, exc) from exc

    def iter_rows(
        self, table: str, chunk: int = 65536
    ) -> Iterator[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]]:
        """Yield ``(ids, rows)`` chunks of every stored row of ``table`` in id order.

        Raises:
            CorruptDataError: a block failed RocksDB's checks (logged and counted, see
                :meth:`data_loss`): the iteration fails instead of ending early.
            StorageError: RocksDB failed otherwise.
        """
        width = self._widths[table]
        it = self._iterator(table)
        it.seek_to_first()
        keys: list[bytes] = []
        values: list[bytes] = []
        while it.valid():
            keys.append(it.key())
            values.append(it.value())
            if len(keys) == chunk:
                yield _decode(keys, values, width)
                keys, values = [], []
            it.next()
        self._check(it, table)
        if keys:
            yield _decode(keys, values, width)

    def ids_after(self, table: str, after: int | None, limit: int) -> npt.NDArray[np.uint64]:
        """The first ``limit`` stored ids of ``table`` above ``after`` (all ids when None), in
        ascending order, read from the keys alone (``embeddb.engine.storage.scan``).

        Raises:
            CorruptDataError: a block failed RocksDB's checks (logged and counted).
            StorageError: RocksDB failed otherwise.
        """
        if after is not None and after >= (1 << 64) - 1:
            return np.empty(0, dtype=np.uint64)
        it = self._iterator(table)
        if after is None:
            it.seek_to_first()
        else:
            it.seek(_keys(np.array([after + 1], dtype=np.uint64))[0])
        keys: list[bytes] = []
        while it.valid() and len(keys) < limit:
            keys.append(it.key())
            it.next()
        self._check(it, table)
        return np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64)

    def count(self, table: str) -> int:
        """Rows stored for ``table`` (a full key scan: used only by crash recovery).

        Raises:
            CorruptDataError: a block failed RocksDB's checks (logged and counted).
            StorageError: RocksDB failed otherwise.
        """
        it = self._iterator(table)
        it.seek_to_first()
        n = 0
        while it.valid():
            n += 1
            it.next()
        self._check(it, table)
        return n

    def checkpoint(self, path: str | os.PathLike[str]) -> None:
        """A RocksDB checkpoint of every table at ``path`` (which must not exist): the
        memtables are flushed and the immutable SST files hard-linked, so it is quick.

        Raises:
            StorageError: RocksDB failed (e.g. ``path`` exists or the disk is full).
        """
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(str(path))
        except Exception as exc:
            raise _storage_error(f"cannot create a disk tier checkpoint at {path}", exc) from exc

    def flush(self) -> None:
        """Flush every table's memtable to SST files."""
        try:
            for view in self._views.values():
                view.flush()
        except Exception as exc:
            raise _storage_error("disk tier flush failed", exc) from exc

    def close(self, flush: bool = True) -> None:
        """Flush (unless read-only or ``flush`` is false: a shutdown that recovers from the
        update log) and close the database; further calls fail."""
        try:
            if flush and not self.read_only:
                self.flush()
            for view in self._views.values():
                view.close()
            self._views.clear()
            self._cfs.clear()
            self._db.close()
        except Exception as exc:
            raise _storage_error("disk tier close failed", exc) from exc
        finally:
            if self._shadow is not None:
                shutil.rmtree(self._shadow, ignore_errors=True)
                self._shadow = None


def _decode(
    keys: list[bytes], values: list[bytes], width: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
    ids = np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64)
    rows = np.frombuffer(b"".join(values), dtype=np.float32).reshape(-1, width).copy()
    return ids, rows
