"""Moving one table's rows between the RAM stripes and the disk tier of a shard.

A row comes into a stripe through :meth:`Tiers.store` — promoted from the disk tier (its copy
stays there, clean), created, or assigned — and leaves it through :meth:`Tiers.evict`, least
recently used first, once :meth:`Tiers.write_back` has written the *dirty* ones (created,
updated or assigned since they were last written). Rows that do not fit in the stripe
*overflow*: they are written to the disk tier and stay there. :mod:`embeddb.engine.storage.table`
tells the life of a row.

Every method runs with the stripe's lock held, keeps the stripe's counters, and bumps its
``disk_generation`` whenever it writes to the disk tier.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, I64, U64
from embeddb.engine.storage import hash_index
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, RamStripe

__all__ = ["Tiers"]


class Tiers:
    """The two tiers of one table: its RAM stripes (passed to each call) over ``disk``.

    Args:
        disk: the shard's disk tier (shared by its tables).
        table: the table's name in ``disk``.
    """

    def __init__(self, disk: DiskTier, table: str) -> None:
        self.disk = disk
        self.table = table

    def store(
        self,
        stripe: RamStripe,
        ids: U64,
        rows: F32,
        on_disk: npt.NDArray[np.bool_],
        tick: int,
        dirty: bool,
    ) -> None:
        """Make ``ids`` resident with ``rows``, evicting LRU rows older than ``tick``.

        ``on_disk[k]``: ``ids[k]`` has a disk-tier copy. ``dirty``: ``rows`` differ from those
        copies (assign); otherwise rows with a copy are promoted clean. Rows that do not fit
        overflow to disk: written there unless a clean copy already is.
        """
        k = ids.size
        if k == 0:
            return
        c = stripe.counters
        if stripe.n_free < k:
            want = min(max(k - stripe.n_free, stripe.eviction_chunk), stripe.size)
            self.evict(stripe, want, tick)
        fit = min(k, stripe.n_free)
        c.promoted += stripe.place(ids[:fit], rows[:fit], on_disk[:fit], tick, dirty)
        if fit < k:
            over_ids, over_rows, over_disk = ids[fit:], rows[fit:], on_disk[fit:]
            write = np.ones(over_ids.size, dtype=bool) if dirty else ~over_disk
            self.disk.put(self.table, over_ids[write], over_rows[write])
            stripe.disk_generation += 1
            c.disk_rows += int((~over_disk).sum())
            c.overflow += over_ids.size

    def write_back(self, stripe: RamStripe, ids: U64, slots: I64) -> None:
        """Write the dirty rows among resident ``ids`` to the disk tier and mark them clean."""
        flags = stripe.flags[slots]
        dirty = (flags & DIRTY) != 0
        if dirty.any():
            self.disk.put(self.table, ids[dirty], stripe.rows[slots[dirty]])
            stripe.disk_generation += 1
        stripe.flags[slots] = (flags | ON_DISK) & ~DIRTY
        stripe.counters.disk_rows += int(np.count_nonzero(dirty & ((flags & ON_DISK) == 0)))
        stripe.counters.written_back += int(dirty.sum())

    def evict(self, stripe: RamStripe, want: int, tick: int) -> None:
        """Free up to ``want`` slots: the least recently used rows older than ``tick`` leave
        RAM, the dirty ones written back first."""
        keys = np.empty(want, dtype=np.uint64)
        slots = np.empty(want, dtype=np.int64)
        n = hash_index.collect_victims(stripe.index, want, tick, keys, slots)
        if n == 0:
            return
        keys, slots = keys[:n], slots[:n]
        self.write_back(stripe, keys, slots)  # raises before anything is freed
        freed = np.empty(n, dtype=np.int64)
        hash_index.remove(stripe.index, keys, freed)
        stripe.release_slots(slots)
        stripe.counters.evicted += n

    def put(self, stripe: RamStripe, uniq: U64, rows: F32) -> None:
        """Overwrite the full rows of distinct ``uniq`` (created as needed), as most recent."""
        tick = stripe.next_tick()
        slots = np.empty(uniq.size, dtype=np.int64)
        hash_index.probe(stripe.index, uniq, tick, True, slots)
        resident = slots >= 0
        stripe.rows[slots[resident]] = rows[resident]
        stripe.flags[slots[resident]] |= DIRTY
        absent = ~resident
        if absent.any():
            on_disk, _ = self.disk.get(self.table, uniq[absent])
            self.store(stripe, uniq[absent], rows[absent], on_disk, tick, dirty=True)

    def remove(self, stripe: RamStripe, uniq: U64) -> int:
        """Remove distinct ``uniq`` from both tiers; returns how many existed."""
        c = stripe.counters
        freed = np.empty(uniq.size, dtype=np.int64)
        n_ram = hash_index.remove(stripe.index, uniq, freed)
        resident = freed >= 0
        had_copy = (stripe.flags[freed[resident]] & ON_DISK) != 0
        stripe.release_slots(freed[resident])
        rest = uniq[~resident]
        found, _ = self.disk.get(self.table, rest)
        on_disk = np.concatenate([uniq[resident][had_copy], rest[found]])
        self.disk.delete(self.table, on_disk)
        stripe.disk_generation += 1
        c.disk_rows -= on_disk.size
        c.deleted_rows += int(n_ram) + int(found.sum())
        return int(n_ram) + int(found.sum())
