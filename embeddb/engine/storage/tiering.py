"""Moving one table's rows between the RAM stripes and the disk tier of a shard.

A row comes into a stripe through :meth:`Tiers.store` — promoted from the disk tier (its copy
stays there, clean), created, or assigned — and leaves it through :meth:`Tiers.evict`, least
recently used first, once :meth:`Tiers.write_back` has written the *dirty* ones (created,
updated or assigned since they were last written). Rows that do not fit in the stripe
*overflow*: they are written to the disk tier and stay there. In a ``tinylfu`` stripe a full
stripe admits only the rows that are looked up more often than the rows they would evict
(:mod:`embeddb.engine.storage.admission`); the others stay on disk the same way
(``not_admitted``). :mod:`embeddb.engine.storage.table`
tells the life of a row.

Every method runs with the stripe's lock held, keeps the stripe's counters, and bumps its
``disk_generation`` whenever it writes to the disk tier.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, I64, U64
from embeddb.engine.storage import admission, hash_index
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, WINDOW, RamStripe

__all__ = ["Tiers"]

_NO_SLOTS = np.empty(0, dtype=np.int64)
PROPOSALS_PER_NEED = 4  # a tinylfu victim search proposes this many rows per one needed


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
        admit: bool = True,
    ) -> None:
        """Make ``ids`` resident with ``rows``, evicting LRU rows older than ``tick``.

        ``on_disk[k]``: ``ids[k]`` has a disk-tier copy. ``dirty``: ``rows`` differ from those
        copies (assign); otherwise rows with a copy are promoted clean. Rows that do not fit
        overflow to disk: written there unless a clean copy already is. A full ``tinylfu``
        stripe admits rows by frequency (unless ``admit`` is false: a restore puts its rows
        back as LRU would); the rows it turns away are kept on disk as overflowing rows are.
        """
        k = ids.size
        if k == 0:
            return
        c = stripe.counters
        window_slots = _NO_SLOTS
        if stripe.n_free < k:
            if stripe.sketch is not None and admit:
                stripe.sketch.counting = True
                keep, window_slots, unpaired = self._admit(stripe, ids, tick)
                if not keep.all():
                    out = ~keep
                    self._to_disk(stripe, ids[out], rows[out], on_disk[out], dirty)
                    c.overflow += unpaired  # no row to challenge: they did not fit
                    c.not_admitted += int(out.sum()) - unpaired
                    ids, rows, on_disk = ids[keep], rows[keep], on_disk[keep]
                    k = ids.size
            else:
                want = min(max(k - stripe.n_free, stripe.eviction_chunk), stripe.size)
                self.evict(stripe, want, tick)
        fit = min(k, stripe.n_free)
        c.promoted += stripe.place(ids[:fit], rows[:fit], on_disk[:fit], tick, dirty)
        if window_slots.size:
            stripe.flags[window_slots] |= WINDOW
        if fit < k:
            self._to_disk(stripe, ids[fit:], rows[fit:], on_disk[fit:], dirty)
            c.overflow += k - fit

    def _to_disk(
        self, stripe: RamStripe, ids: U64, rows: F32, on_disk: npt.NDArray[np.bool_], dirty: bool
    ) -> None:
        """Keep rows on the disk tier instead of RAM: written there unless a clean copy is."""
        write = np.ones(ids.size, dtype=bool) if dirty else ~on_disk
        if write.any():
            self.disk.put(self.table, ids[write], rows[write])
            stripe.disk_generation += 1
        stripe.counters.disk_rows += int((~on_disk).sum())

    def _admit(
        self, stripe: RamStripe, ids: U64, tick: int
    ) -> tuple[npt.NDArray[np.bool_], I64, int]:
        """TinyLFU admission of ``ids`` into a full stripe: evicts the victims they beat (and
        those the window admissions displace), re-stamps the surviving victims, and returns
        which of ``ids`` to place (they fit in the free slots), the slots the window rows
        among them will take, and how many were turned away for want of a victim to challenge
        (every row of the stripe is in use by this call: they overflow)."""
        sketch = stripe.sketch
        assert sketch is not None
        k = ids.size
        need = k - stripe.n_free
        keys, slots = self._proposals(stripe, need, tick)
        n = keys.size
        room = sketch.window - int(np.count_nonzero(stripe.flags & WINDOW)) if n else 0
        stripe.flags[slots] &= ~WINDOW  # proposed: from now on they compete by frequency
        keep = np.empty(k, dtype=bool)
        window = np.empty(k, dtype=bool)
        evict = np.empty(n, dtype=bool)
        admission.choose(
            sketch.frequencies(ids), stripe.n_free, sketch.frequencies(keys), max(room, 0),
            keep, window, evict,
        )  # fmt: skip
        if evict.any():
            self._evict_rows(stripe, keys[evict], slots[evict])
        survivors = keys[~evict]
        if survivors.size:
            admission.restamp(stripe.index, survivors, tick)
        # the window rows' slots, as place() will pop them: the m-th placed takes
        # free[n_free - 1 - m]; flagged once placed
        m = np.flatnonzero(window[keep])
        return keep, stripe.free_stack(m), need - n

    @staticmethod
    def _proposals(stripe: RamStripe, need: int, tick: int) -> tuple[U64, I64]:
        """Up to ``need`` least recently used rows older than ``tick``, oldest first: the still
        valid ones of the last search; a new search (of ``PROPOSALS_PER_NEED * need`` rows, at
        least ``eviction_chunk``) when they are too few."""
        sketch = stripe.sketch
        assert sketch is not None
        keys, slots, words = sketch.proposals
        if keys.size:
            ok = np.empty(keys.size, dtype=bool)
            admission.unchanged(stripe.index, keys, words, tick, ok)
            keys, slots, words = keys[ok], slots[ok], words[ok]
        if keys.size < need:  # the search costs about the same whatever it returns
            want = min(max(PROPOSALS_PER_NEED * need, stripe.eviction_chunk), stripe.size)
            keys = np.empty(want, dtype=np.uint64)
            slots = np.empty(want, dtype=np.int64)
            n = hash_index.collect_victims(stripe.index, want, tick, keys, slots)
            words = np.empty(n, dtype=np.uint64)
            admission.bucket_words(stripe.index, keys[:n], words)
            oldest = np.argsort(words)  # stamp first: the least recently used are used first
            keys, slots, words = keys[:n][oldest], slots[:n][oldest], words[oldest]
        take = min(need, keys.size)
        sketch.proposals = (keys[take:], slots[take:], words[take:])
        return keys[:take], slots[:take]

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
        if n:
            self._evict_rows(stripe, keys[:n], slots[:n])

    def _evict_rows(self, stripe: RamStripe, keys: U64, slots: I64) -> None:
        """Remove resident ``keys`` (in ``slots``) from RAM, the dirty ones written back first."""
        self.write_back(stripe, keys, slots)  # raises before anything is freed
        freed = np.empty(keys.size, dtype=np.int64)
        hash_index.remove(stripe.index, keys, freed)
        stripe.release_slots(slots)
        stripe.counters.evicted += keys.size

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
