"""One lock stripe of a table's RAM tier: preallocated rows, a hash index and a free list.

A stripe owns a fixed number of slots. Row storage is one contiguous float32 array::

    rows[slot] = [ v_0 .. v_dim-1 | s_0 .. s_state-1 ]     (see embeddb.engine.optim.Optimizer)

    e.g. dim=4, Adagrad:  slot 7 = [0.01 -0.02 0.00 0.03 | 0.01 0.01 0.01 0.01]

The hash index (``embeddb.engine.storage.hash_index``) maps ids to slots and keeps each row's last
training tick; free slots sit on a stack; ``flags[slot]`` records whether the row has a copy in
the disk tier (``ON_DISK``) and whether the RAM copy changed since it was last written there
(``DIRTY``). A stripe is guarded by its own lock; the compiled kernels it calls release the
GIL, so stripes of one table work in parallel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from embeddb.engine.storage import creation, hash_index
from embeddb.engine.storage.admission import FrequencySketch

__all__ = ["DIRTY", "ON_DISK", "WINDOW", "Counters", "RamStripe"]

_MAX_TICK = (1 << 32) - 2
DIRTY = np.uint8(1)  # the RAM copy differs from the disk copy (or there is none)
ON_DISK = np.uint8(2)  # the disk tier holds a copy of this row (possibly older)
WINDOW = np.uint8(4)  # tinylfu: admitted into the window, not yet compared (admission module)


@dataclass
class Counters:
    """Event counts of one stripe (summed over stripes by the table).

    Lookup counts are per looked-up id (duplicates count each time); creation counts are per
    distinct id.
    """

    lookup_ids: int = 0
    ram_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    admitted: int = 0
    rejected: int = 0
    evicted: int = 0
    written_back: int = 0
    promoted: int = 0
    overflow: int = 0
    not_admitted: int = 0
    update_ids: int = 0
    updated_rows: int = 0
    nan_skipped: int = 0
    missing_updates: int = 0
    assigned_rows: int = 0
    deleted_rows: int = 0
    disk_rows: int = 0

    def add(self, other: Counters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class RamStripe:
    """Fixed-capacity slot storage with an id index and LRU stamps.

    Args:
        capacity: number of slots (rows) this stripe holds.
        width: floats per row (``dim + state_dim``).
        eviction_chunk: least number of rows evicted at once when the stripe is full (LRU).
        tinylfu: admit rows by frequency (:mod:`embeddb.engine.storage.admission`) rather
            than evicting the least recently used rows for every miss.
    """

    def __init__(
        self, capacity: int, width: int, eviction_chunk: int = 1, tinylfu: bool = False
    ) -> None:
        self.capacity = capacity
        self.width = width
        self.eviction_chunk = max(1, eviction_chunk)
        self.index = hash_index.new_index(capacity)
        self.rows = np.zeros((capacity, width), dtype=np.float32)
        self.flags = np.zeros(capacity, dtype=np.uint8)
        self.ids = np.zeros(capacity, dtype=np.uint64)  # the id held in each occupied slot
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self.n_free = capacity
        self.scratch = np.full(capacity, -1, dtype=np.int64)
        self.tick = 0
        # Bumped on every disk-tier write or delete of this stripe's ids (under the lock), so a
        # call that read the disk tier without the lock can tell whether its copies are current.
        self.disk_generation = 0
        # Bumped whenever rows become resident (under the lock): a lookup whose misses saw the
        # same count needs no second probe for them.
        self.placed = 0
        self.lock = threading.Lock()
        self.counters = Counters()
        self.sketch = FrequencySketch(capacity) if tinylfu else None

    @property
    def nbytes(self) -> int:
        """Bytes of the stripe's arrays (:func:`embeddb.config.ram_budget.table_ram_bytes`)."""
        arrays = (self.index, self.rows, self.flags, self.ids, self._free, self.scratch)
        sketch = 0 if self.sketch is None else self.sketch.nbytes
        return sum(a.nbytes for a in arrays) + sketch

    @property
    def size(self) -> int:
        """Resident rows."""
        return self.capacity - self.n_free

    def next_tick(self) -> int:
        """Advance and return the stripe's clock (renumbering stamps before it would wrap)."""
        if self.tick >= _MAX_TICK:
            self._renumber_stamps()
        self.tick += 1
        return self.tick

    def take_slots(self, n: int) -> npt.NDArray[np.int64]:
        """Pop ``n`` free slots (``n <= n_free``)."""
        start = self.n_free - n
        slots: npt.NDArray[np.int64] = self._free[start : self.n_free][::-1].copy()
        self.n_free = start
        return slots

    def free_stack(self, m: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The slots the ``m``-th ids of the next :meth:`place` will take."""
        slots: npt.NDArray[np.int64] = self._free[self.n_free - 1 - m]
        return slots

    def place(
        self,
        ids: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        on_disk: npt.NDArray[np.bool_],
        tick: int,
        dirty: bool,
    ) -> int:
        """Make absent ``ids`` resident with ``rows`` in free slots (``ids.size <= n_free``),
        stamped ``tick``: flagged ``ON_DISK`` where ``on_disk``, ``DIRTY`` where ``dirty`` or
        there is no disk copy. One compiled pass (slots popped as :meth:`take_slots` pops them).

        Returns:
            How many of ``ids`` have a disk copy.
        """
        n = ids.size
        promoted = creation.place_rows(
            self.index,
            self.rows,
            self.ids,
            self.flags,
            self._free,
            self.n_free,
            ids,
            rows,
            on_disk,
            tick,
            dirty,
            ON_DISK,
            DIRTY,
        )
        self.n_free -= n
        self.placed += 1
        return int(promoted)

    def release_slots(self, slots: npt.NDArray[np.int64]) -> None:
        """Return slots to the free list and zero their rows and flags."""
        n = slots.size
        self._free[self.n_free : self.n_free + n] = slots
        self.n_free += n
        self.rows[slots] = 0.0
        self.flags[slots] = 0

    def ram_only_rows(self) -> int:
        """Resident rows that have no disk-tier copy."""
        return self.size - int(np.count_nonzero(self.flags & ON_DISK))

    def resident(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """``(ids, slots)`` of every resident row, in bucket order."""
        occupied = self.index[:, 1] != 0
        ids = self.index[occupied, 0].copy()
        slots = (self.index[occupied, 1] & np.uint64(0xFFFFFFFF)).astype(np.int64) - 1
        return ids, slots

    def _renumber_stamps(self) -> None:
        """Compress stamps to their ranks (keeps LRU order) so the 32-bit clock can go on."""
        col = self.index[:, 1]
        occupied = col != 0
        stamps = col[occupied] >> np.uint64(32)
        _, rank = np.unique(stamps, return_inverse=True)
        low = col[occupied] & np.uint64(0xFFFFFFFF)
        col[occupied] = ((rank.astype(np.uint64) + np.uint64(1)) << np.uint64(32)) | low
        self.tick = int(rank.max()) + 1 if rank.size else 0
