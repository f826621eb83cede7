"""What a table's RAM tier costs in bytes, and how a shard's ``ram_budget`` sizes its tables.

A table's RAM tier is ``n`` lock stripes (:func:`stripe_capacities`), each preallocated in
full when the table opens (``embeddb.engine.storage.ram_tier.RamStripe``)::

    per slot   rows     float32 x width     4 * width   (width = dim + optimizer state floats)
               flags    uint8               1
               ids      uint64              8
               scratch  int64               8
               free     int64 (free stack)  8
    per stripe index    uint64 (buckets, 2) 16 * buckets, buckets = the power of two
                                            >= 2 * slots (at least 16): 32 to 64 per slot
               sketch   uint8 (tinylfu)     the power of two >= 16 * slots, in 64-byte
                                            blocks: 16 to 32 per slot (lru tables: none)

    table_ram_bytes = sum over stripes of  c * (4 * width + 25) + 16 * buckets(c) [+ sketch(c)]

e.g. dim 16, row-wise Adagrad (width 17), 1,000,000 rows in 4 stripes of 250,000: each
stripe's index has 524,288 buckets, so 4 * (250,000 * 93 + 8,388,608) = 126,554,432 bytes,
126.6 bytes a row. Python objects, locks and counters (a few KiB a table) are not counted,
nor the transient buffers of a snapshot capture.

With ``store.ram_budget`` set, every table's RAM tier must fit in it together
(:func:`resolve_capacities`): tables with an explicit ``capacity`` keep it, the others share
what is left (docs/database.md, "RAM budget").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from embeddb.config.store import RamTierConfig
from embeddb.config.tables import Eviction, TableConfig
from embeddb.errors import ConfigError

__all__ = [
    "INDEX_BUCKET_BYTES",
    "SLOT_BYTES",
    "capacity_for_bytes",
    "has_sketch",
    "index_buckets",
    "ram_bytes_per_row",
    "resolve_capacities",
    "sketch_bytes",
    "split_budget",
    "stripe_capacities",
    "stripe_count",
    "table_ram_bytes",
]

INDEX_BUCKET_BYTES = 16  # two uint64 per bucket: the id, and stamp << 32 | slot + 1
SLOT_BYTES = 1 + 8 + 8 + 8  # flags uint8, ids uint64, scratch int64, free stack int64
_MIN_BUCKETS_BITS = 4
SKETCH_BLOCK = 64  # one-byte counters per block: one cache line
SKETCH_COUNTERS_PER_SLOT = 16


def index_buckets(capacity: int) -> int:
    """Buckets of a stripe index of ``capacity`` slots: the power of two >= 2 * capacity,
    at least 16 (load factor <= 0.5)."""
    return 1 << max(_MIN_BUCKETS_BITS, int(2 * max(capacity, 1) - 1).bit_length())


def sketch_bytes(capacity: int) -> int:
    """Bytes of a tinylfu stripe's frequency sketch (``embeddb.engine.storage.admission``):
    16 one-byte counters per slot, in whole 64-byte blocks, rounded up to a power of two of
    blocks."""
    blocks = 1 << max(
        0, (SKETCH_COUNTERS_PER_SLOT * max(capacity, 1) // SKETCH_BLOCK - 1).bit_length()
    )
    return blocks * SKETCH_BLOCK


def stripe_count(requested: int, capacity: int, min_rows: int) -> int:
    """Largest power of two <= ``requested`` that leaves every stripe >= ``min_rows`` slots."""
    s = requested
    while s > 1 and capacity // s < min_rows:
        s //= 2
    return s


def stripe_capacities(capacity: int, ram: RamTierConfig) -> list[int]:
    """The slots of each stripe of a table of ``capacity`` RAM rows (equal but for one)."""
    n = stripe_count(ram.stripes, capacity, ram.min_stripe_rows)
    return [capacity // n + (1 if i < capacity % n else 0) for i in range(n)]


def table_ram_bytes(capacity: int, width: int, ram: RamTierConfig, sketch: bool = False) -> int:
    """Bytes of the RAM tier of a table of ``capacity`` rows of ``width`` float32 values, with
    a tinylfu frequency sketch per stripe when ``sketch`` (see the module docstring): exactly
    the ``nbytes`` of its stripes' arrays."""
    per_slot = 4 * width + SLOT_BYTES
    return sum(
        c * per_slot + INDEX_BUCKET_BYTES * index_buckets(c) + (sketch_bytes(c) if sketch else 0)
        for c in stripe_capacities(capacity, ram)
    )


def has_sketch(table: TableConfig) -> bool:
    """Whether ``table``'s stripes keep a frequency sketch (``eviction: tinylfu``)."""
    return table.eviction is Eviction.TINYLFU


def ram_bytes_per_row(table: TableConfig, ram: RamTierConfig) -> float:
    """The RAM bytes per row of ``table``'s RAM tier at its capacity (the index's share
    depends on how full its power-of-two buckets are: 32 to 64 bytes a row)."""
    cost = table_ram_bytes(table.capacity, table.row_width, ram, has_sketch(table))
    return cost / table.capacity


def capacity_for_bytes(allowance: int, width: int, ram: RamTierConfig, sketch: bool = False) -> int:
    """The most rows a table of ``width`` (with a sketch when ``sketch``) gets within
    ``allowance`` bytes (0: not one)."""
    if table_ram_bytes(1, width, ram, sketch) > allowance:
        return 0
    low, high = 1, max(2, allowance // (4 * width + SLOT_BYTES) + 1)  # high never fits
    while high - low > 1:
        mid = (low + high) // 2
        if table_ram_bytes(mid, width, ram, sketch) <= allowance:
            low = mid
        else:
            high = mid
    return low


def split_budget(
    budget: int,
    widths: Mapping[str, int],
    ram: RamTierConfig,
    needs: Mapping[str, int] | None = None,
    sketches: Collection[str] = (),
) -> dict[str, int]:
    """Capacities of the tables ``widths`` (name -> row width; the tables in ``sketches`` keep
    a tinylfu sketch) sharing ``budget`` bytes.

    Equal bytes for each, except that a table with a known need (``needs``: name -> rows; at
    least 1) gets no more rows than it needs, and what it leaves is shared again among the
    others (max-min fairness); what no table needs stays unallocated. A capacity is the most
    rows whose :func:`table_ram_bytes` fit in the table's share; it is 0 where not one does.
    """
    wanted = dict(needs or {})
    left = budget
    open_tables = list(widths)
    capacity: dict[str, int] = {}
    while open_tables:
        share = left // len(open_tables)
        satisfied = [
            t
            for t in open_tables
            if t in wanted and table_ram_bytes(wanted[t], widths[t], ram, t in sketches) <= share
        ]
        if not satisfied:
            for t in open_tables:
                capacity[t] = capacity_for_bytes(share, widths[t], ram, t in sketches)
            break
        for t in satisfied:
            capacity[t] = wanted[t]
            left -= table_ram_bytes(wanted[t], widths[t], ram, t in sketches)
            open_tables.remove(t)
    return {t: capacity[t] for t in widths}


def resolve_capacities(
    tables: Mapping[str, TableConfig],
    shared: frozenset[str],
    ram: RamTierConfig,
    key: str = "ram_budget",
) -> dict[str, TableConfig]:
    """``tables`` with the capacities of the ``shared`` ones (tables whose capacity was not
    given) set from ``ram.budget`` (:func:`split_budget`, equal shares); the others keep theirs.

    Raises:
        ConfigError: under ``key``: the explicit capacities alone exceed the budget (naming
            each table and its bytes), or the rest leaves a shared table not one row.
    """
    budget = ram.budget
    if budget is None:
        return dict(tables)
    fixed = {
        n: table_ram_bytes(t.capacity, t.row_width, ram, has_sketch(t)) for n, t in tables.items()
    }
    fixed = {n: b for n, b in fixed.items() if n not in shared}
    used = sum(fixed.values())
    if used > budget:
        listed = ", ".join(
            f"{n} (capacity {tables[n].capacity}: {b} bytes)" for n, b in fixed.items()
        )
        raise ConfigError(
            key,
            f"{budget} bytes are less than the {used} bytes the RAM tiers of the tables with "
            f"an explicit capacity take: {listed}",
        )
    widths = {n: t.row_width for n, t in tables.items() if n in shared}
    sketches = {n for n, t in tables.items() if n in shared and has_sketch(t)}
    rows = split_budget(budget - used, widths, ram, sketches=sketches)
    starved = [n for n, c in rows.items() if c == 0]
    if starved:
        raise ConfigError(
            key,
            f"{budget} bytes leave {budget - used} bytes after the tables with an explicit "
            f"capacity ({used} bytes), not one row for table(s) {', '.join(starved)}",
        )
    return {
        n: dataclasses.replace(t, capacity=rows[n]) if n in rows else t for n, t in tables.items()
    }
