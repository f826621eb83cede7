"""Storage tiers of one shard: the RAM tier (hash index + LRU), the RocksDB disk tier, and the
tiered table that moves rows between them; :mod:`embeddb.engine.storage.paths` confines the file
names
that stored data gives (a manifest's, a checkpoint's listing) to their directory."""

from __future__ import annotations

from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.stats import ShardStats, TableStats, UpdateResult
from embeddb.engine.storage.table import TieredTable

__all__ = ["DiskTier", "ShardStats", "TableStats", "TieredTable", "UpdateResult"]
