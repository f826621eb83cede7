"""Storage tiers of one shard: the RAM tier (hash index + LRU), the RocksDB disk tier, and the
tiered table that moves rows between them."""

from __future__ import annotations

from embeddb.storage.disk_tier import DiskTier
from embeddb.storage.table import TableStats, TieredTable, UpdateResult

__all__ = ["DiskTier", "TableStats", "TieredTable", "UpdateResult"]
