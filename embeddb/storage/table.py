"""A table's tiered store on one shard: striped RAM tier (LRU) over the RocksDB disk tier.

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
  full stripe runs between ``1 - eviction_chunk`` and 100% occupancy.
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

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from embeddb.arrays import F32, I64, U64
from embeddb.config import RamTierConfig, TableConfig
from embeddb.errors import CorruptDataError
from embeddb.initializers import initial_vectors, table_key
from embeddb.optim import Optimizer
from embeddb.storage import hash_index
from embeddb.storage.changes import Change, Op
from embeddb.storage.disk_tier import DiskTier
from embeddb.storage.parallel import StripePool
from embeddb.storage.ram_tier import DIRTY, ON_DISK, Counters, RamStripe
from embeddb.storage.tiering import Tiers

__all__ = ["TableStats", "TieredTable", "UpdateResult"]


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
    answered ``DATA_LOSS``; see :class:`~embeddb.storage.disk_tier.DiskTier`).
    """

    table: str
    dim: int
    rows: int
    ram_rows: int
    ram_capacity: int
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
class _Misses:
    """One stripe's RAM misses from phase 1 of a lookup."""

    stripe: int
    ids: U64  # missed ids, one per missed position (duplicates kept)
    where: I64  # their positions in the caller's ids
    tick: int
    disk_generation: int


def _stripe_count(requested: int, capacity: int, min_rows: int) -> int:
    """Largest power of two ≤ ``requested`` that leaves every stripe ≥ ``min_rows`` slots."""
    s = requested
    while s > 1 and capacity // s < min_rows:
        s //= 2
    return s


class TieredTable:
    """One table on one shard. Callers validate inputs; this class trusts them.

    Each call is atomic per stripe, not across stripes: if the disk tier fails (``StorageError``)
    while a call works on its third stripe, the first two stripes' work stands.

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
        # Called with each stripe's changes while its lock is held (see embeddb.storage.changes).
        self.journal: Callable[[list[Change]], object] | None = None
        self.name = config.name
        self.dim = config.dim
        self.optimizer = Optimizer(config.optimizer, config.dim, config.weight_bound)
        self.width = config.dim + self.optimizer.state_dim
        self._disk = disk
        self._tiers = Tiers(disk, config.name)  # moves rows between the stripes and disk
        self._key = table_key(config.name, config.seed)
        n = _stripe_count(ram.stripes, config.capacity, ram.min_stripe_rows)
        self._shift = np.uint64(64 - (n.bit_length() - 1))
        caps = [config.capacity // n + (1 if i < config.capacity % n else 0) for i in range(n)]
        self.stripes = [RamStripe(c, self.width, int(c * ram.eviction_chunk)) for c in caps]
        seed_seq = np.random.SeedSequence([config.seed, int(self._key)])
        self._rngs = [np.random.default_rng(s) for s in seed_seq.spawn(n)]
        self.stripes[0].counters.disk_rows = disk_rows

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

        Three phases, so that RocksDB sees one multi-get per call rather than one per stripe
        (about 25% cheaper per key) and no stripe lock is held while it runs: (1) per stripe,
        under its lock, copy resident vectors and collect the misses; (2) read every miss from
        the disk tier; (3) per stripe, under its lock, settle the misses — re-checking RAM and,
        if the stripe wrote to disk meanwhile, the disk copies, since another thread may have
        promoted, updated, evicted or deleted one of these ids between the phases.
        """
        out = np.empty((ids.size, self.dim), dtype=np.float32)

        def gather(part: tuple[int, U64, I64]) -> _Misses | None:
            s, sub, where = part
            stripe = self.stripes[s]
            with stripe.lock:
                return self._gather_stripe(s, stripe, sub, where, out, train)

        gathered = self._pool.map(gather, list(self._split(ids)), ids.size)
        pending = [m for m in gathered if m is not None]
        if not pending:
            return out
        uniq, inverse = np.unique(
            np.concatenate([m.ids for m in pending]), return_inverse=True
        )  # sorted: RocksDB's multi-get is fastest on ordered keys
        found, disk_rows = self._disk.get(self.name, uniq)
        values = np.zeros((uniq.size, self.width), dtype=np.float32)
        values[found] = disk_rows
        start = 0
        for m in pending:
            mine = inverse[start : start + m.ids.size]
            start += m.ids.size
            local, local_inv = np.unique(mine, return_inverse=True)
            stripe = self.stripes[m.stripe]
            with stripe.lock:
                rows = self._settle_stripe(
                    m, stripe, uniq[local], values[local], found[local], local_inv, train
                )
            out[m.where] = rows[local_inv, : self.dim]
        return out

    def apply_gradients(self, ids: U64, grads: F32) -> UpdateResult:
        """Sum duplicate ids' gradients, skip non-finite rows, run the optimizer."""

        def update(part: tuple[int, U64, I64]) -> tuple[int, int, int]:
            s, sub, where = part
            stripe = self.stripes[s]
            with stripe.lock:
                return self._update_stripe(stripe, sub, grads, where)

        counts = self._pool.map(update, list(self._split(ids)), ids.size)
        applied, skipped, missing = (sum(c[k] for c in counts) for k in range(3))
        return UpdateResult(applied, skipped, missing)

    def assign(self, ids: U64, vectors: F32) -> int:
        """Overwrite vectors (creating rows as needed) and reset their optimizer state.

        For duplicate ids the last vector wins. Returns the number of distinct ids written.
        """
        written = 0
        for s, sub, where in self._split(ids):
            stripe = self.stripes[s]
            with stripe.lock:
                written += self._assign_stripe(stripe, sub, vectors[where])
        return written

    def delete(self, ids: U64) -> int:
        """Remove rows from both tiers. Returns how many existed."""
        deleted = 0
        for s, sub, _ in self._split(ids):
            stripe = self.stripes[s]
            with stripe.lock:
                deleted += self._delete_stripe(stripe, sub)
        return deleted

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
            data_loss=self._disk.data_loss(self.name),
            **counts,
        )

    def flush(self) -> None:
        """Write every dirty resident row to the disk tier, so that it holds every row."""
        for stripe in self.stripes:
            with stripe.lock:
                ids, slots = stripe.resident()
                self._tiers.write_back(stripe, ids, slots)

    # ------------------------------------------------------------------ durability
    def replay(self, change: Change) -> None:
        """Apply a logged change (recovery, followers): rows are written as they are, ids
        deleted; nothing is journaled and no optimizer or initializer runs.

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
            with stripe.lock:
                if change.op is Op.PUT:
                    assert change.rows is not None
                    self._put_stripe(stripe, sub, change.rows[where])
                else:
                    self._remove_stripe(stripe, sub)

    def capture_buffers(self) -> list[tuple[F32, npt.NDArray[np.uint8], U64]]:
        """Buffers for :meth:`capture_into`, allocated and touched now — before the caller
        takes the stripe locks — so that the copy under the locks is a plain memcpy."""
        bufs = []
        for stripe in self.stripes:
            rows = np.zeros_like(stripe.rows)  # zeros: the pages are faulted in here
            flags = np.zeros_like(stripe.flags)
            ids = np.zeros_like(stripe.ids)
            bufs.append((rows, flags, ids))
        return bufs

    def capture_into(
        self, bufs: list[tuple[F32, npt.NDArray[np.uint8], U64]], first: int = 0
    ) -> None:
        """Copy the slots of stripes ``first, first + 1, ...`` into ``bufs`` (one per stripe);
        the caller holds their locks."""
        for stripe, (rows, flags, ids) in zip(self.stripes[first:], bufs, strict=False):
            np.copyto(rows, stripe.rows)
            np.copyto(flags, stripe.flags)
            np.copyto(ids, stripe.ids)

    @staticmethod
    def captured(
        bufs: list[tuple[F32, npt.NDArray[np.uint8], U64]],
    ) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
        """``(ids, rows, flags)`` of the resident rows in captured buffers: a slot is occupied
        exactly when its flags are non-zero (every resident row is DIRTY or ON_DISK; a freed
        slot's flags are zeroed)."""
        masks = [flags != 0 for _, flags, _ in bufs]
        ids = np.concatenate([i[m] for (_, _, i), m in zip(bufs, masks, strict=True)])
        rows = np.concatenate([r[m] for (r, _, _), m in zip(bufs, masks, strict=True)])
        flags = np.concatenate([f[m] for (_, f, _), m in zip(bufs, masks, strict=True)])
        return ids, rows, flags

    def capture_ram(self) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
        """``(ids, rows, flags)`` of every resident row. The caller holds every stripe lock."""
        bufs = self.capture_buffers()
        self.capture_into(bufs)
        return self.captured(bufs)

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
                        stripe, sub[mask], rows[rows_of], on_disk[rows_of], tick, is_dirty
                    )
            stripe.counters.promoted -= int(on_disk[where].sum())  # a restore, not promotions

    def stats_unlocked_disk_rows(self) -> int:
        """The disk-tier row count; the caller holds every stripe lock."""
        return sum(s.counters.disk_rows for s in self.stripes)

    def set_disk_rows(self, n: int) -> None:
        """Set the disk-tier row count (after a restore replaced the disk tier)."""
        for i, stripe in enumerate(self.stripes):
            with stripe.lock:
                stripe.counters.disk_rows = n if i == 0 else 0

    # ------------------------------------------------------------------ per-stripe work
    def _gather_stripe(
        self, s: int, stripe: RamStripe, ids: U64, where: I64, out: F32, train: bool
    ) -> _Misses | None:
        """Phase 1 of :meth:`lookup`: copy resident vectors to ``out``, return the misses."""
        c = stripe.counters
        tick = stripe.next_tick() if train else 0
        miss = np.empty(ids.size, dtype=np.int64)
        n_miss = hash_index.lookup_gather(
            stripe.index, stripe.rows, ids, where, out, tick, train, miss
        )
        c.lookup_ids += ids.size
        c.ram_hits += ids.size - n_miss
        if n_miss == 0:
            return None
        miss = miss[:n_miss]
        return _Misses(s, ids[miss], where[miss], tick, stripe.disk_generation)

    def _settle_stripe(
        self,
        m: _Misses,
        stripe: RamStripe,
        uniq: U64,
        values: F32,
        found: npt.NDArray[np.bool_],
        inverse: I64,
        train: bool,
    ) -> F32:
        """Phase 3 of :meth:`lookup` for one stripe's distinct missed ids ``uniq``.

        ``values``/``found`` are what phase 2 read from disk. Returns the full rows to answer
        with; on a training lookup, admitted new rows are created and disk rows promoted.
        """
        c = stripe.counters
        slots = np.empty(uniq.size, dtype=np.int64)
        hash_index.probe(stripe.index, uniq, m.tick, train, slots)
        resident = slots >= 0  # made resident by another call since phase 1
        values[resident] = stripe.rows[slots[resident]]
        absent = ~resident
        if stripe.disk_generation != m.disk_generation and absent.any():
            now_found, now_rows = self._disk.get(self.name, uniq[absent])
            fresh = np.zeros((now_found.size, self.width), dtype=np.float32)
            fresh[now_found] = now_rows
            values[absent] = fresh
            found[absent] = now_found
        occurrences = np.bincount(inverse, minlength=uniq.size)
        c.ram_hits += int(occurrences[resident].sum())
        c.disk_hits += int(occurrences[absent & found].sum())
        c.misses += int(occurrences[absent & ~found].sum())
        if not train:
            return values
        new = absent & ~found
        admitted = new.copy()
        p = self.config.admit_probability
        if p < 1.0 and new.any():
            admitted[new] = self._rngs[m.stripe].random(int(new.sum())) < p
        if admitted.any():
            values[admitted] = self._new_rows(uniq[admitted])
        c.admitted += int(admitted.sum())
        c.rejected += int(new.sum()) - int(admitted.sum())
        keep = absent & (found | admitted)
        self._tiers.store(stripe, uniq[keep], values[keep], found[keep], m.tick, dirty=False)
        if admitted.any() and self.journal is not None:
            self._journal([Change(Op.PUT, self.name, uniq[admitted], values[admitted])])
        return values

    def _update_stripe(
        self, stripe: RamStripe, ids: U64, grads: F32, where: I64
    ) -> tuple[int, int, int]:
        """``grads[where[i]]`` is the gradient of ``ids[i]``."""
        c = stripe.counters
        c.update_ids += ids.size
        tick = stripe.next_tick()
        slots = np.empty(ids.size, dtype=np.int64)
        n_miss = hash_index.probe(stripe.index, ids, tick, True, slots)
        missing = 0
        skipped = 0
        applied = 0
        changes: list[Change] = []
        if n_miss:
            miss = np.flatnonzero(slots < 0)
            uniq = np.unique(ids[miss])
            found, disk_rows = self._disk.get(self.name, uniq)
            missing = int((~found).sum())
            self._tiers.store(stripe, uniq[found], disk_rows, found[found], tick, dirty=False)
            sub_slots = np.empty(miss.size, dtype=np.int64)
            hash_index.probe(stripe.index, ids[miss], tick, False, sub_slots)
            slots[miss] = sub_slots
            still = sub_slots < 0  # overflow rows (on disk) and ids that exist nowhere
            if still.any():
                a, k, change = self._update_on_disk(
                    stripe, ids[miss[still]], grads[where[miss[still]]]
                )
                applied += a
                skipped += k
                changes.append(change)
        uniq_slots = np.empty(ids.size, dtype=np.int64)
        sums = np.empty((ids.size, self.dim), dtype=np.float32)
        k = hash_index.dedup_sum(slots, grads, where, stripe.scratch, uniq_slots, sums)
        touched = uniq_slots[:k]
        nan = self.optimizer.apply(stripe.rows, touched, sums[:k])
        stripe.flags[touched] |= DIRTY
        skipped += nan
        applied += k - nan
        c.updated_rows += applied
        c.nan_skipped += skipped
        c.missing_updates += missing
        if k and self.journal is not None:  # skipped rows are logged unchanged: harmless
            # take() gathers ~3x faster than fancy indexing on these shapes (the log's largest copy)
            changes.append(
                Change(
                    Op.PUT, self.name, stripe.ids.take(touched), stripe.rows.take(touched, axis=0)
                )
            )
        self._journal(changes)
        return applied, skipped, missing

    def _update_on_disk(self, stripe: RamStripe, ids: U64, grads: F32) -> tuple[int, int, Change]:
        """Apply gradients to rows that stay on disk (overflow); ids absent everywhere are
        ignored (they were counted as missing). Returns applied, skipped and the change."""
        uniq, inv = np.unique(ids, return_inverse=True)
        found, rows = self._disk.get(self.name, uniq)
        sums = np.zeros((uniq.size, self.dim), dtype=np.float32)
        np.add.at(sums, inv, grads)
        sums = sums[found]
        nan = self.optimizer.apply(rows, np.arange(rows.shape[0], dtype=np.int64), sums)
        self._disk.put(self.name, uniq[found], rows)  # skipped rows are rewritten unchanged
        stripe.disk_generation += 1
        return int(rows.shape[0]) - nan, nan, Change(Op.PUT, self.name, uniq[found], rows)

    def _assign_stripe(self, stripe: RamStripe, ids: U64, vectors: F32) -> int:
        n = ids.size
        uniq, first_in_reversed = np.unique(ids[::-1], return_index=True)
        vecs = vectors[n - 1 - first_in_reversed]
        rows = np.empty((uniq.size, self.width), dtype=np.float32)
        rows[:, : self.dim] = vecs
        rows[:, self.dim :] = self.optimizer.initial_state(uniq.size)
        self._put_stripe(stripe, uniq, rows)
        stripe.counters.assigned_rows += uniq.size
        self._journal([Change(Op.PUT, self.name, uniq, rows)])
        return int(uniq.size)

    def _put_stripe(self, stripe: RamStripe, uniq: U64, rows: F32) -> None:
        """Overwrite the full rows of distinct ``uniq`` (created as needed), as most recent."""
        tick = stripe.next_tick()
        slots = np.empty(uniq.size, dtype=np.int64)
        hash_index.probe(stripe.index, uniq, tick, True, slots)
        resident = slots >= 0
        stripe.rows[slots[resident]] = rows[resident]
        stripe.flags[slots[resident]] |= DIRTY
        absent = ~resident
        if absent.any():
            on_disk, _ = self._disk.get(self.name, uniq[absent])
            self._tiers.store(stripe, uniq[absent], rows[absent], on_disk, tick, dirty=True)

    def _delete_stripe(self, stripe: RamStripe, ids: U64) -> int:
        uniq = np.unique(ids)
        deleted = self._remove_stripe(stripe, uniq)
        self._journal([Change(Op.DELETE, self.name, uniq)])
        return deleted

    def _remove_stripe(self, stripe: RamStripe, uniq: U64) -> int:
        c = stripe.counters
        freed = np.empty(uniq.size, dtype=np.int64)
        n_ram = hash_index.remove(stripe.index, uniq, freed)
        resident = freed >= 0
        had_copy = (stripe.flags[freed[resident]] & ON_DISK) != 0
        stripe.release_slots(freed[resident])
        rest = uniq[~resident]
        found, _ = self._disk.get(self.name, rest)
        on_disk = np.concatenate([uniq[resident][had_copy], rest[found]])
        self._disk.delete(self.name, on_disk)
        stripe.disk_generation += 1
        c.disk_rows -= on_disk.size
        c.deleted_rows += int(n_ram) + int(found.sum())
        return int(n_ram) + int(found.sum())

    def _journal(self, changes: list[Change]) -> None:
        if self.journal is not None and changes:
            self.journal(changes)

    # ------------------------------------------------------------------ new rows
    def _new_rows(self, ids: U64) -> F32:
        rows = np.empty((ids.size, self.width), dtype=np.float32)
        rows[:, : self.dim] = initial_vectors(ids, self.dim, self.config.initializer, self._key)
        rows[:, self.dim :] = self.optimizer.initial_state(ids.size)
        return rows
