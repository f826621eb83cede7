"""One shard of embeddb: every table's tiered store plus its optimizer. No transport here.

The gRPC servicers (and tests) call this class directly. It validates every argument once, at
this boundary, and raises from :mod:`embeddb.errors`; the storage layers below trust it.

An ID batch as the shard sees it (table ``user``, ``dim = 2``)::

    ids     = [ 7, 42,  7]                      uint64, any order, duplicates allowed
    lookup  → [[a0, a1], [b0, b1], [a0, a1]]    float32 (3, 2), row i is the vector of ids[i]
    grads   = [[g0, g1], [h0, h1], [k0, k1]]    float32 (3, 2); id 7 is updated once with g + k

Data directory layout::

    DATA_DIR/
      disk/                 RocksDB: the disk tier (one column family per table)
      clean-shutdown.json   present only after close(): every row had been written to disk
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from embeddb.config import EmbeddingConfig
from embeddb.errors import (
    CorruptDataError,
    InvalidArgumentError,
    StorageError,
    TableNotFoundError,
    UnavailableError,
)
from embeddb.routing import as_ids
from embeddb.storage import DiskTier, TableStats, TieredTable, UpdateResult
from embeddb.storage.parallel import StripePool, default_threads

__all__ = ["Shard", "ShardStats", "UpdateResult"]

_CLEAN_MARKER = "clean-shutdown.json"
_FORMAT_VERSION = 1


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


class Shard:
    """The tables of one shard, each a RAM tier (LRU) over a RocksDB disk tier.

    Thread-safe: each table is split into lock stripes; calls on different stripes proceed in
    parallel and the compiled kernels release the GIL.

    Args:
        config: the embedding configuration (tables and store settings).
        data_dir: directory for the disk tier. ``None`` uses a private temporary directory that
            is removed on :meth:`close`. An existing directory is reopened only if it was closed
            cleanly and its tables match ``config``.

    Raises:
        StorageError: the directory is unusable or was not shut down cleanly.
        CorruptDataError: the clean-shutdown record is unreadable or contradicts the config.
    """

    def __init__(
        self, config: EmbeddingConfig, data_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self.config = config
        self._ephemeral = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="embeddb-")) if data_dir is None else Path(data_dir)
        )
        self._closed = False
        self._close_lock = threading.Lock()
        disk_rows = self._check_previous_shutdown()
        widths = {name: t.dim + t.optimizer.state_dim(t.dim) for name, t in config.tables.items()}
        self._disk = DiskTier(self.data_dir / "disk", widths, config.store.disk_cache_mb)
        store = config.store
        self._pool = StripePool(store.threads or default_threads(), store.parallel_min_ids)
        self._tables = {
            name: TieredTable(t, store, self._disk, disk_rows.get(name, 0), self._pool)
            for name, t in config.tables.items()
        }
        # From now on the RAM tier may hold rows the disk does not: the marker is void.
        (self.data_dir / _CLEAN_MARKER).unlink(missing_ok=True)

    # ------------------------------------------------------------------ lifecycle
    def _check_previous_shutdown(self) -> dict[str, int]:
        disk_dir = self.data_dir / "disk"
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            has_data = disk_dir.exists() and any(disk_dir.iterdir())
        except OSError as exc:
            raise StorageError(f"cannot use data directory {self.data_dir}: {exc}") from exc
        if not has_data:
            return {}
        marker = self.data_dir / _CLEAN_MARKER
        if not marker.exists():
            raise StorageError(
                f"{self.data_dir} holds a disk tier that was not shut down cleanly (no "
                f"{_CLEAN_MARKER}); its RAM-tier rows were lost. Restore from a snapshot, or "
                f"remove the directory to start empty"
            )
        try:
            record = json.loads(marker.read_text())
            tables = record["tables"]
            if record["format_version"] != _FORMAT_VERSION:
                raise ValueError(f"unsupported format_version {record['format_version']}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptDataError(f"{marker} is unreadable: {exc}") from exc
        for name, t in self.config.tables.items():
            if name in tables:
                width = t.dim + t.optimizer.state_dim(t.dim)
                if (tables[name]["dim"], tables[name]["width"]) != (t.dim, width):
                    raise CorruptDataError(
                        f"table {name!r} in {self.data_dir} has dim {tables[name]['dim']} and "
                        f"row width {tables[name]['width']}, the config says dim {t.dim} and "
                        f"width {width} (changed optimizer or dim?)"
                    )
        return {name: int(v["disk_rows"]) for name, v in tables.items()}

    def close(self) -> None:
        """Write dirty rows to disk, record a clean shutdown and close RocksDB. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._pool.close()
            try:
                if self._ephemeral:
                    self._disk.close()
                    return
                for table in self._tables.values():
                    table.flush()
                record = {
                    "format_version": _FORMAT_VERSION,
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

    # ------------------------------------------------------------------ validation
    def _table(self, name: str) -> TieredTable:
        if self._closed:
            raise UnavailableError("shard is closed")
        try:
            return self._tables[name]
        except (KeyError, TypeError):
            raise TableNotFoundError(str(name), tuple(self._tables)) from None

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
            TableNotFoundError, InvalidArgumentError, StorageError.
        """
        t = self._table(table)
        return t.lookup(as_ids(ids), bool(train))

    def apply_gradients(self, table: str, ids: object, grads: object) -> UpdateResult:
        """Apply the table's optimizer to ``ids`` with ``grads`` (float32, ``(len(ids), dim)``).

        Gradients of duplicate ids are summed first. Ids whose summed gradient contains NaN or
        Inf are skipped and counted; ids stored in neither tier are ignored and counted as
        missing. ``weight_bound`` clamps vectors after the update.
        """
        t = self._table(table)
        id_arr = as_ids(ids)
        g = self._matrix(grads, id_arr.size, t.dim, "grads")
        return t.apply_gradients(id_arr, g)

    def assign(self, table: str, ids: object, vectors: object) -> int:
        """Set vectors (creating rows regardless of admission) and reset optimizer state.

        For duplicate ids the last vector wins. Returns the number of distinct ids written.
        """
        t = self._table(table)
        id_arr = as_ids(ids)
        v = self._matrix(vectors, id_arr.size, t.dim, "vectors")
        if not np.isfinite(v).all():
            raise InvalidArgumentError("vectors must be finite (found NaN or Inf)")
        return t.assign(id_arr, v)

    def delete(self, table: str, ids: object) -> int:
        """Remove ``ids`` from both tiers. Returns how many of them existed."""
        t = self._table(table)
        return t.delete(as_ids(ids))

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
