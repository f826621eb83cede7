"""Read-only paging through one table's rows in ascending id order (the ``Scan`` RPC).

A page is the ``limit`` smallest stored ids above a cursor ``after`` (exclusive), with their
vectors; the next page starts after the page's last id, so a scan resumes from a single
``uint64`` and needs no server-side state. For example, a table holding ids ``{3, 9, 12, 40}``
scanned with ``limit = 2``::

    scan_table(t, None, 2) -> ids [3, 9],   done False
    scan_table(t, 9, 2)    -> ids [12, 40], done True

Each page takes, per RAM stripe under its lock, the resident ids above the cursor (one numpy
pass over the stripe's slots, keeping the ``limit + 1`` smallest), then the first ``limit + 1``
disk-tier keys above it (RocksDB keys are big-endian ids, so key order is id order). The RAM
tier is read first: a row evicted to disk in between is then still found on disk. The union's
``limit`` smallest ids are read with :meth:`TieredTable.peek` (no side effect: nothing is
inserted, promoted or refreshed). Rows that exist unchanged during the whole scan are returned
exactly once; rows written or deleted meanwhile may or may not appear.

Cost: one pass over the RAM tier's slots per page plus ``limit`` disk keys, so large pages
(thousands of rows) are much cheaper per row than small ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embeddb.common.arrays import F32, U64
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.table import TieredTable

__all__ = ["ScanPage", "scan_table"]


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan.

    Attributes:
        ids: ascending ids, all above the request's cursor.
        vectors: ``(ids.size, dim)`` float32, row ``i`` the vector of ``ids[i]``.
        done: no stored id is above ``ids[-1]`` (or above the cursor, for an empty page).
    """

    ids: U64
    vectors: F32
    done: bool


def _smallest(ids: U64, k: int) -> U64:
    """The ``k`` smallest of ``ids`` (any order)."""
    if ids.size <= k:
        return ids
    return np.partition(ids, k - 1)[:k]


def _ram_ids_after(table: TieredTable, after: int | None, k: int) -> U64:
    """The ``k`` smallest resident ids above ``after``, per stripe, concatenated."""
    parts: list[U64] = []
    bound = np.uint64(after) if after is not None else None
    for stripe in table.stripes:
        with stripe.lock:
            ids = stripe.ids[stripe.flags != 0]
        if bound is not None:
            ids = ids[ids > bound]
        parts.append(_smallest(ids, k))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


def scan_table(table: TieredTable, disk: DiskTier, after: int | None, limit: int) -> ScanPage:
    """The rows of ``table`` with the ``limit`` smallest ids above ``after``.

    Args:
        table: the table.
        disk: the shard's disk tier (which holds ``table``'s disk rows).
        after: exclusive cursor; None starts at the smallest id.
        limit: most rows of the page (at least 1; the caller bounds it).

    Returns:
        The page (see :class:`ScanPage`).
    """
    ram = _ram_ids_after(table, after, limit + 1)
    stored = disk.ids_after(table.name, after, limit + 1)
    candidates = np.union1d(ram, stored)  # sorted, unique
    take = candidates[:limit]
    found, rows = table.peek(take)
    ids: U64 = take[found]
    vectors: F32 = np.ascontiguousarray(rows[found, : table.dim])
    return ScanPage(ids=ids, vectors=vectors, done=bool(candidates.size <= limit))
