"""A table's tiered store on one shard: striped RAM tier over the RocksDB disk tier.

Ids are split into ``stripes`` (a power of two) by ``mix64(id ^ STRIPE_SALT)``; each stripe has
its own lock, slots, index and clock, so concurrent calls on different stripes run in parallel.
A table smaller than ``stripes * min_stripe_rows`` gets fewer stripes (down to one).

Life of a row:

* **created** by a training lookup of an id found in neither tier, if admitted (probability
  ``admit_probability``, drawn per attempt); its vector comes from the deterministic
  initializer, its state from the optimizer. An unadmitted id reads as zeros and stores nothing.
* **resident** in RAM; training lookups and gradient updates stamp it with the stripe's tick.
  Evaluation lookups (``train=False``) never insert, promote or re-stamp.
* **evicted** when a stripe needs slots: the least recently used rows (exact LRU at the
  granularity of one call) leave RAM; the *dirty* ones — created, updated or assigned since they
  were last written — are written to RocksDB in one batch first. To amortise the
  ``O(capacity)`` victim search, at least ``eviction_chunk * capacity`` rows go at once, so a
  full stripe runs between ``1 - eviction_chunk`` and 100% occupancy. That is the table's
  ``eviction: lru``; under ``tinylfu`` a full stripe evicts a row only for a row
  looked up more often lately, and serves the others from disk without making them resident
  (:mod:`embeddb.engine.storage.admission`).
* **promoted** back to RAM by a training lookup or update that misses RAM. Its disk copy stays
  (clean): evicting it again unchanged costs no write.
* If a single call touches more distinct ids than a stripe can hold, the excess rows
  **overflow**: they are served from memory for this call and kept on disk.

The RAM tier is a write-back cache over the disk tier (a database buffer pool): a row's
authoritative copy is its RAM copy while resident and its disk copy otherwise; every read path
looks in RAM first, and :meth:`delete` removes both copies. Compared with moving rows
exclusively between tiers, this saves a RocksDB delete on every promotion and a put on every
clean eviction — a disk hit costs one multi-get instead of a get, a delete and a later put.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import asdict
from functools import partial
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, I64, U64
from embeddb.config import Eviction, RamTierConfig, TableConfig
from embeddb.config.ram_budget import stripe_capacities
from embeddb.engine.optim import Optimizer
from embeddb.engine.storage import hash_index, writes
from embeddb.engine.storage.changes import Change, Op
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.lookups import LookupPlan, Lookups
from embeddb.engine.storage.parallel import StripePool
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, Counters, RamStripe
from embeddb.engine.storage.stats import TableStats, UpdateResult
from embeddb.engine.storage.tiering import Tiers
from embeddb.engine.storage.writes import Prepared, commit, hold
from embeddb.errors import CorruptDataError

T = TypeVar("T")
Call = tuple["TieredTable", list[threading.Lock], Callable[[], Prepared[T]]]

__all__ = ["TieredTable"]


class TieredTable:
    """One table on one shard. Callers validate inputs; this class trusts them.

    Each mutating call holds the locks of every stripe it touches, hands all its changes to
    :attr:`journal` at once and publishes them only then (:mod:`embeddb.engine.storage.writes`): a
    journal that raises leaves no trace of the call.

    Args:
        config: the table's settings.
        ram: stripe count and eviction chunk.
        disk: the shard's disk tier (shared by its tables).
        disk_rows: rows of this table already in the disk tier (when reopening).
    """

    def __init__(
        self,
        config: TableConfig,
        ram: RamTierConfig,
        disk: DiskTier,
        disk_rows: int = 0,
        pool: StripePool | None = None,
    ) -> None:
        self.config = config
        self._pool = pool or StripePool(1, 0)
        # Called with each call's changes before any is visible (embeddb.engine.storage.writes), and
        # with the error when publishing logged changes failed.
        self.journal: Callable[[list[Change]], object] | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self.name = config.name
        self.dim = config.dim
        self.optimizer = Optimizer(config.optimizer, config.dim, config.weight_bound)
        self.width = config.dim + self.optimizer.state_dim
        self._disk = disk
        self._tiers = Tiers(disk, config.name)  # moves rows between the stripes and disk
        caps = stripe_capacities(config.capacity, ram)
        self._shift = np.uint64(64 - (len(caps).bit_length() - 1))
        tinylfu = config.eviction is Eviction.TINYLFU
        self.stripes = [
            RamStripe(c, self.width, int(c * ram.eviction_chunk), tinylfu) for c in caps
        ]
        self.stripes[0].counters.disk_rows = disk_rows
        self._lookups = Lookups(
            config, self.optimizer, self.stripes, disk, self._tiers, self._pool, self._split
        )

    # ------------------------------------------------------------------ routing to stripes
    def _split(self, ids: U64) -> Iterator[tuple[int, U64, I64]]:
        """Yield ``(stripe, ids of that stripe, their positions in ids)`` for non-empty stripes."""
        n_stripes = len(self.stripes)
        if n_stripes == 1:
            yield 0, ids, np.arange(ids.size, dtype=np.int64)
            return
        order = np.empty(ids.size, dtype=np.int64)
        grouped = np.empty(ids.size, dtype=np.uint64)
        bounds = np.empty(n_stripes + 1, dtype=np.int64)
        hash_index.partition(ids, self._shift, n_stripes, order, grouped, bounds)
        for s in range(n_stripes):
            lo, hi = bounds[s], bounds[s + 1]
            if hi > lo:
                yield s, grouped[lo:hi], order[lo:hi]

    # ------------------------------------------------------------------ public operations
    def lookup(self, ids: U64, train: bool) -> F32:
        """Vectors of ``ids`` in input order (see the module docstring for what train does).

        Three phases (:mod:`embeddb.engine.storage.lookups`): (1) per stripe, under its lock,
        copy resident vectors and collect the misses; (2) read every miss from the disk tier in
        one multi-get, no lock held; (3) settle the misses. An evaluation lookup settles each
        stripe under its lock in turn; a training lookup holds the locks of every missed stripe
        at once and publishes the rows it admits only once they are logged, as one record
        (:mod:`embeddb.engine.storage.writes`).
        """
        plan = self.lookup_begin(ids, train)
        if not plan.pending:
            return plan.out
        if not train:
            for k, m in enumerate(plan.pending):
                with self.stripes[m.stripe].lock:
                    self._lookups.settle(plan, k, train=False)
            return plan.out
        with hold(self.lookup_locks(plan)):
            (out,) = commit([self.prepare_lookup(plan)], self.journal, self.on_failure)
        return out

    def lookup_begin(self, ids: U64, train: bool) -> LookupPlan:
        """Phases 1 and 2 of :meth:`lookup` (each stripe's lock taken in turn)."""
        return self._lookups.begin(ids, train)

    def lookup_locks(self, plan: LookupPlan) -> list[threading.Lock]:
        """The locks phase 3 of a training lookup holds (its missed stripes, ascending)."""
        return [self.stripes[s].lock for s in sorted(m.stripe for m in plan.pending)]

    def prepare_lookup(self, plan: LookupPlan) -> Prepared[F32]:
        """Phase 3 of a training lookup, prepared (locks of :meth:`lookup_locks` held): the
        rows it admits are published once logged."""
        parts = [self._lookups.settle(plan, k, train=True) for k in range(len(plan.pending))]
        return writes.combine(parts, lambda _: plan.out)

    def apply_gradients(self, ids: U64, grads: F32) -> UpdateResult:
        """Sum duplicate ids' gradients, skip non-finite rows, run the optimizer."""
        parts = list(self._split(ids))
        with hold(self.locks(parts)):
            (result,) = commit([self.prepare_update(parts, grads)], self.journal, self.on_failure)
        return result

    def assign(self, ids: U64, vectors: F32) -> int:
        """Overwrite vectors (creating rows as needed) and reset their optimizer state.

        For duplicate ids the last vector wins. Returns the number of distinct ids written.
        """
        parts = list(self._split(ids))
        with hold(self.locks(parts)):
            (written,) = commit(
                [self.prepare_assign(parts, vectors)], self.journal, self.on_failure
            )
        return written

    def delete(self, ids: U64) -> int:
        """Remove rows from both tiers. Returns how many existed."""
        parts = list(self._split(ids))
        with hold(self.locks(parts)):
            (deleted,) = commit([self.prepare_delete(parts)], self.journal, self.on_failure)
        return deleted

    # ------------------------------------------------------------------ the write path
    @property
    def stripe_shift(self) -> int:
        """An id's stripe is ``mix64(id ^ STRIPE_SALT) >> stripe_shift`` (one stripe: 0)."""
        return int(self._shift)

    def fits_one_pass(self, n_ids: int) -> bool:
        """Whether a call of ``n_ids`` ids runs on its calling thread alone (too small for the
        stripe pool), so a call spanning tables may prepare it in one pass
        (:mod:`embeddb.engine.storage.many`)."""
        return self._pool.threads == 1 or n_ids < self._pool.min_ids

    def split(self, ids: U64) -> list[tuple[int, U64, I64]]:
        """``(stripe, its ids, their positions)`` of each stripe ``ids`` touch, ascending."""
        return list(self._split(ids))

    def locks(self, parts: Iterable[tuple[int, U64, I64]]) -> list[threading.Lock]:
        """The locks of the stripes of ``parts`` (as :meth:`split` gives them), ascending."""
        return [self.stripes[s].lock for s in sorted(p[0] for p in parts)]

    def update_call(self, ids: U64, grads: F32) -> Call[UpdateResult]:
        """:meth:`apply_gradients` as one table's part of a call spanning tables
        (:func:`~embeddb.engine.storage.writes.commit_ordered`)."""
        parts = self.split(ids)
        return self, self.locks(parts), partial(self.prepare_update, parts, grads)

    def lookup_call(self, plan: LookupPlan) -> Call[F32]:
        """Phase 3 of a training lookup as one table's part of a call spanning tables."""
        return self, self.lookup_locks(plan), partial(self.prepare_lookup, plan)

    def prepare_update(
        self, parts: list[tuple[int, U64, I64]], grads: F32
    ) -> Prepared[UpdateResult]:
        """:meth:`apply_gradients`, prepared (:mod:`embeddb.engine.storage.writes`; locks held)."""

        logged = self.journal is not None

        def one(part: tuple[int, U64, I64]) -> Prepared[writes.Counts]:
            s, sub, where = part
            return writes.prepare_update(
                self._tiers, self.optimizer, self.stripes[s], sub, grads, where, logged
            )

        size = sum(p[1].size for p in parts)
        prepared = self._pool.map(one, parts, size)  # the caller's thread holds the locks

        def publish() -> UpdateResult:  # stripes in parallel too (each its own rows)
            counts = self._pool.map(lambda p: p.publish(), prepared, size)
            return UpdateResult(*(sum(c[k] for c in counts) for k in range(3)))

        return Prepared([c for p in prepared for c in p.changes], publish)

    def prepare_assign(self, parts: list[tuple[int, U64, I64]], vectors: F32) -> Prepared[int]:
        """:meth:`assign`, prepared (locks held)."""
        prepared = [
            writes.prepare_assign(self._tiers, self.optimizer, self.stripes[s], sub, vectors[where])
            for s, sub, where in parts
        ]
        return writes.combine(prepared, sum)

    def prepare_delete(self, parts: list[tuple[int, U64, I64]]) -> Prepared[int]:
        """:meth:`delete`, prepared (locks held)."""
        prepared = [writes.prepare_delete(self._tiers, self.stripes[s], sub) for s, sub, _ in parts]
        return writes.combine(prepared, sum)

    def peek(self, ids: U64) -> tuple[npt.NDArray[np.bool_], F32]:
        """Full rows ``[vector | state]`` of ``ids`` without any side effect.

        Returns:
            ``(found, rows)``: ``rows[i]`` is zeros where ``found[i]`` is false.
        """
        found = np.zeros(ids.size, dtype=bool)
        rows = np.zeros((ids.size, self.width), dtype=np.float32)
        for s, sub, where in self._split(ids):
            stripe = self.stripes[s]
            with stripe.lock:
                slots = np.empty(sub.size, dtype=np.int64)
                hash_index.probe(stripe.index, sub, 0, False, slots)
                hit = slots >= 0
                rows[where[hit]] = stripe.rows[slots[hit]]
                on_disk, disk_rows = self._disk.get(self.name, sub[~hit])
                rows[where[~hit][on_disk]] = disk_rows
            found[where] = hit
            found[where[~hit]] = on_disk
        return found, rows

    def count_lookups(self, ids: U64) -> None:
        """Count a training lookup of ``ids`` served without :meth:`lookup` (a call spanning
        tables) in the tinylfu sketches that count (the caller holds the stripes' locks)."""
        if any(s.sketch is not None and s.sketch.counting for s in self.stripes):
            for s, sub, _ in self._split(ids):
                sketch = self.stripes[s].sketch
                if sketch is not None:
                    sketch.add(sub)

    def stats(self) -> TableStats:
        total = Counters()
        for stripe in self.stripes:
            total.add(stripe.counters)
        counts = asdict(total)
        return TableStats(
            table=self.name,
            dim=self.dim,
            rows=total.disk_rows + sum(s.ram_only_rows() for s in self.stripes),
            ram_rows=sum(s.size for s in self.stripes),
            ram_capacity=sum(s.capacity for s in self.stripes),
            ram_bytes=sum(s.nbytes for s in self.stripes),
            data_loss=self._disk.data_loss(self.name),
            **counts,
        )

    def flush(self) -> None:
        """Write every dirty resident row to the disk tier, so that it holds every row."""
        for stripe in self.stripes:
            with stripe.lock:
                ids, slots = stripe.resident()
                self._tiers.write_back(stripe, ids, slots)

    # ------------------------------------------------ durability: rows back from a log or snapshot
    def replay(self, change: Change, locked: bool = False) -> None:
        """Apply a logged change (recovery, followers): rows are written as they are, ids
        deleted; nothing is journaled and no optimizer or initializer runs. ``locked``: the
        caller holds the locks of every stripe it touches (a whole record at once).

        Raises:
            CorruptDataError: rows of another width than this table's, or repeated ids.
        """
        ids = change.ids
        if np.unique(ids).size != ids.size:
            raise CorruptDataError(f"a logged change of table {self.name!r} repeats ids")
        if change.op is Op.PUT:
            rows = change.rows
            if rows is None or rows.shape != (ids.size, self.width):
                got = None if rows is None else rows.shape
                raise CorruptDataError(
                    f"a logged change of table {self.name!r} has rows of shape {got}, the "
                    f"table's rows are ({ids.size}, {self.width})"
                )
        for s, sub, where in self._split(ids):
            stripe = self.stripes[s]
            with nullcontext() if locked else stripe.lock:
                if change.op is Op.PUT:
                    assert change.rows is not None
                    self._tiers.put(stripe, sub, change.rows[where])
                else:
                    self._tiers.remove(stripe, sub)

    def load_ram(self, ids: U64, rows: F32, flags: npt.NDArray[np.uint8]) -> None:
        """Make captured rows resident again (into an empty table), keeping which have a disk
        copy and which differ from it. Rows beyond the RAM capacity overflow to disk."""
        on_disk = (flags & ON_DISK) != 0
        dirty = (flags & DIRTY) != 0
        for s, sub, where in self._split(ids):
            stripe = self.stripes[s]
            with stripe.lock:
                tick = stripe.next_tick()
                for mask, is_dirty in ((~dirty[where], False), (dirty[where], True)):
                    rows_of = where[mask]
                    self._tiers.store(
                        stripe, sub[mask], rows[rows_of], on_disk[rows_of], tick, is_dirty,
                        admit=False,
                    )  # fmt: skip
            stripe.counters.promoted -= int(on_disk[where].sum())  # a restore, not promotions

    def set_disk_rows(self, n: int) -> None:
        """Set the disk-tier row count (after a restore replaced the disk tier)."""
        for i, stripe in enumerate(self.stripes):
            with stripe.lock:
                stripe.counters.disk_rows = n if i == 0 else 0
