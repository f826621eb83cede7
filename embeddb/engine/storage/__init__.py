"""Storage tiers of one shard: the RAM tier (hash index + LRU), the RocksDB disk tier, and the
tiered table that moves rows between them; :mod:`embeddb.engine.storage.paths` confines the file
names that stored data gives (a manifest's, a checkpoint's listing) to their directory.

Modules: :mod:`~embeddb.engine.storage.table` (:class:`TieredTable`: a table's lock stripes and
its calls), :mod:`~embeddb.engine.storage.lookups` (the three-phase lookup path and the rows it
creates), :mod:`~embeddb.engine.storage.writes` (the write path: logged first, then visible),
:mod:`~embeddb.engine.storage.many` and :mod:`~embeddb.engine.storage.many_kernels` (calls
spanning tables, served in one pass),
:mod:`~embeddb.engine.storage.changes` (what a call hands to the journal),
:mod:`~embeddb.engine.storage.stats` (what a table reports),
:mod:`~embeddb.engine.storage.capture` (a table's RAM tier copied out for a snapshot),
:mod:`~embeddb.engine.storage.tiering` (rows between a stripe and the disk tier),
:mod:`~embeddb.engine.storage.ram_tier` (one stripe's slots, index and counters),
:mod:`~embeddb.engine.storage.hash_index` (the compiled index),
:mod:`~embeddb.engine.storage.disk_tier` (RocksDB), :mod:`~embeddb.engine.storage.scan` (paging
through a table), :mod:`~embeddb.engine.storage.parallel` (the stripes of a call on several
cores), :mod:`~embeddb.engine.storage.paths` and :mod:`~embeddb.engine.storage.private` (file
names and modes).
"""

from __future__ import annotations

from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.stats import ShardStats, TableStats, UpdateResult
from embeddb.engine.storage.table import TieredTable

__all__ = ["DiskTier", "ShardStats", "TableStats", "TieredTable", "UpdateResult"]
