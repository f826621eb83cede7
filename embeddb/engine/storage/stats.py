"""What a table reports: the outcome of a gradient push (:class:`UpdateResult`) and its sizes and
event counters (:class:`TableStats`, per shard :class:`ShardStats`).

The counters are kept per stripe (:class:`~embeddb.engine.storage.ram_tier.Counters`) and summed
by :meth:`~embeddb.engine.storage.table.TieredTable.stats`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ShardStats", "TableStats", "UpdateResult"]


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of one ``apply_gradients`` call (counts of distinct ids)."""

    applied: int
    nan_skipped: int
    missing: int


@dataclass(frozen=True)
class TableStats:
    """A table's sizes and event counters on one shard.

    ``rows`` is the number of distinct rows stored; ``ram_rows`` are resident; ``disk_rows`` are
    the rows with a disk-tier copy (a resident row may have one too, see the module docstring).
    ``data_loss`` counts the disk-tier reads of this table that failed RocksDB's checks (each
    answered ``DATA_LOSS``; see :class:`~embeddb.engine.storage.disk_tier.DiskTier`).
    ``ram_bytes`` is what the RAM tier's preallocated arrays take (vectors, optimizer state,
    index, bookkeeping: :func:`embeddb.config.ram_budget.table_ram_bytes`); summed over tables
    by :meth:`ShardStats.totals`, it is the shard's.
    """

    table: str
    dim: int
    rows: int
    ram_rows: int
    ram_capacity: int
    ram_bytes: int
    disk_rows: int
    lookup_ids: int
    ram_hits: int
    disk_hits: int
    misses: int
    admitted: int
    rejected: int
    evicted: int
    written_back: int
    promoted: int
    overflow: int
    not_admitted: int
    update_ids: int
    updated_rows: int
    nan_skipped: int
    missing_updates: int
    assigned_rows: int
    deleted_rows: int
    data_loss: int

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


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
