"""The lookup path of one table: answering a lookup in three phases, and creating new rows.

A lookup runs in three phases, so that RocksDB sees one multi-get per call rather than one per
stripe (about 25% cheaper per key) and no stripe lock is held while it runs:

1. per stripe, under its lock, copy the resident vectors into the answer and collect the misses
   (:meth:`Lookups.begin`; a training lookup stamps the hits with the stripe's tick);
2. read every distinct miss from the disk tier (:meth:`Lookups.begin`, sorted ids);
3. settle the misses (:meth:`Lookups.settle`) — re-checking RAM and, if the stripe wrote to disk
   meanwhile, the disk copies, since another thread may have promoted, updated, evicted or
   deleted one of these ids between the phases. A training lookup promotes the disk rows it
   found (clean) and creates the ids found in neither tier when admitted (probability
   ``admit_probability``, one draw per attempt from the stripe's own generator): their vectors
   come from the deterministic initializer, their state from the optimizer. The rows it admits
   are prepared, not published: the table hands them to its journal first
   (:mod:`embeddb.engine.storage.writes`). Settling one stripe is a few compiled passes
   (:mod:`embeddb.engine.storage.creation`), not one numpy step per decision.

:class:`~embeddb.engine.storage.table.TieredTable` owns one :class:`Lookups` and takes the
locks; this module never takes more than one stripe lock at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, I64, U64
from embeddb.config import TableConfig
from embeddb.engine.initializers import initializer_args, table_key
from embeddb.engine.optim import Optimizer
from embeddb.engine.storage import creation, hash_index
from embeddb.engine.storage.changes import Change, Op
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.parallel import StripePool
from embeddb.engine.storage.ram_tier import RamStripe
from embeddb.engine.storage.tiering import Tiers
from embeddb.engine.storage.writes import Prepared

__all__ = ["LookupPlan", "Lookups"]

Split = Callable[[U64], Iterator[tuple[int, U64, I64]]]


@dataclass(frozen=True)
class _Misses:
    """One stripe's RAM misses from phase 1 of a lookup."""

    stripe: int
    ids: U64  # missed ids, one per missed position (duplicates kept)
    where: I64  # their positions in the caller's ids
    tick: int
    disk_generation: int
    placed: int  # the stripe's placements count when the misses were collected


@dataclass(frozen=True)
class LookupPlan:
    """A lookup after phases 1 and 2: its answer so far, and the misses phase 3 settles."""

    out: F32
    pending: list[_Misses]
    uniq: U64  # the distinct missed ids of every stripe, sorted
    inverse: I64  # the pending misses' ids (concatenated) as indices into uniq
    found: npt.NDArray[np.bool_]  # uniq has a disk copy (as phase 2 read it)
    values: F32  # uniq's disk rows (zeros where not found)
    starts: I64  # pending[k]'s ids are inverse[starts[k] : starts[k + 1]]


_NO_MISSES = (
    np.empty(0, np.uint64),
    np.empty(0, np.int64),
    np.empty(0, bool),
    np.empty((0, 0), np.float32),
    np.zeros(1, np.int64),
)
_NO_DRAWS = np.empty(0, dtype=np.float64)
_RADIX_MIN = 2048  # fewer ids: numpy's sort is as fast as the radix sort's fixed passes


class Lookups:
    """The lookup path of one table (see the module docstring); the caller holds the locks
    :meth:`settle` needs.

    Args:
        config: the table's settings (name, dim, admission, initializer, seed).
        optimizer: the table's optimizer (the state of new rows).
        stripes: the table's RAM stripes.
        disk: the shard's disk tier.
        tiers: moves rows between the stripes and the disk tier.
        pool: runs phase 1 of large calls on several stripes at once.
        split: the table's ids-to-stripes split.
    """

    def __init__(
        self,
        config: TableConfig,
        optimizer: Optimizer,
        stripes: list[RamStripe],
        disk: DiskTier,
        tiers: Tiers,
        pool: StripePool,
        split: Split,
    ) -> None:
        self.config = config
        self.name = config.name
        self.dim = config.dim
        self.optimizer = optimizer
        self.width = config.dim + optimizer.state_dim
        self.stripes = stripes
        self._disk = disk
        self._tiers = tiers
        self._pool = pool
        self._split = split
        self._key = table_key(config.name, config.seed)
        self._initializer = initializer_args(config.initializer)
        self._state = optimizer.initial_state(1)[0].copy()  # every new row's optimizer state
        seed_seq = np.random.SeedSequence([config.seed, int(self._key)])
        self._rngs = [np.random.default_rng(s) for s in seed_seq.spawn(len(stripes))]

    def begin(self, ids: U64, train: bool) -> LookupPlan:
        """Phases 1 and 2 (each stripe's lock taken in turn)."""
        out = np.empty((ids.size, self.dim), dtype=np.float32)

        def gather(part: tuple[int, U64, I64]) -> _Misses | None:
            s, sub, where = part
            stripe = self.stripes[s]
            with stripe.lock:
                return self._gather_stripe(s, stripe, sub, where, out, train)

        gathered = self._pool.map(gather, list(self._split(ids)), ids.size)
        pending = [m for m in gathered if m is not None]
        if not pending:
            return LookupPlan(out, [], *_NO_MISSES)
        uniq, inverse = _sorted_unique(
            np.concatenate([m.ids for m in pending])
        )  # sorted: RocksDB's multi-get is fastest on ordered keys
        found, disk_rows = self._disk.get(self.name, uniq)
        values = np.zeros((uniq.size, self.width), dtype=np.float32)
        values[found] = disk_rows
        starts = np.cumsum([0] + [m.ids.size for m in pending], dtype=np.int64)
        return LookupPlan(out, pending, uniq, inverse, found, values, starts)

    def settle(self, plan: LookupPlan, k: int, train: bool) -> Prepared[F32]:
        """Phase 3 for the misses of ``plan.pending[k]`` (its stripe's lock held): fills their
        rows of ``plan.out``; a training lookup's admitted rows are prepared, not published.
        Publishing returns ``plan.out``.

        The compiled passes (:mod:`embeddb.engine.storage.creation`) work on the plan's arrays
        in place: ``plan.values``/``plan.found`` rows of this stripe's ids end up as this
        stripe's rows (resident, read from disk, created or zeros).
        """
        m = plan.pending[k]
        mine = plan.inverse[plan.starts[k] : plan.starts[k + 1]]
        local, local_inv = _local_unique(mine, plan.uniq.size)
        stripe = self.stripes[m.stripe]
        uniq, values, found = plan.uniq, plan.values, plan.found
        c = stripe.counters
        resident = np.zeros(local.size, dtype=bool)
        absent = local.size
        if stripe.placed != m.placed:  # another call may have made some of them resident
            absent = creation.probe_rows(
                stripe.index, stripe.rows, uniq, local, m.tick, train, values, resident
            )  # those rows as they are now
        if absent and stripe.disk_generation != m.disk_generation:
            gone = local[~resident]
            now_found, now_rows = self._disk.get(self.name, uniq[gone])
            fresh = np.zeros((now_found.size, self.width), dtype=np.float32)
            fresh[now_found] = now_rows
            values[gone] = fresh
            found[gone] = now_found
        p = self.config.admit_probability
        draws = _NO_DRAWS
        if train and p < 1.0 and absent:
            n_new = int(np.count_nonzero(~(resident | found[local])))
            if n_new:  # one draw per attempt, from the stripe's own generator
                draws = self._rngs[m.stripe].random(n_new)
        n_absent = int(absent) if train else 0
        new_rows = np.empty((n_absent, self.width), dtype=np.float32)
        admitted = np.empty(n_absent, dtype=np.int64)
        promoted = np.empty(n_absent, dtype=np.int64)
        counts = np.empty(creation.N_COUNTS, dtype=np.int64)
        kind, a, b = self._initializer
        creation.settle_rows(
            uniq, local, values, found, resident, local_inv, m.where, plan.out, train, draws,
            p, self._key, kind, a, b, self._state, new_rows, admitted, promoted, counts,
        )  # fmt: skip
        c.ram_hits += int(counts[creation.RAM_HITS])
        c.disk_hits += int(counts[creation.DISK_HITS])
        c.misses += int(counts[creation.MISSES])
        if not train:
            return Prepared([], lambda: plan.out)
        up = promoted[: counts[creation.N_PROMOTED]]
        if up.size:  # clean: no reader can tell
            self._tiers.store(stripe, uniq[up], values[up], found[up], m.tick, False)
        n_admitted = int(counts[creation.N_ADMITTED])
        ids, rows = uniq[admitted[:n_admitted]], new_rows[:n_admitted]
        n_new = int(counts[creation.N_NEW])

        def publish() -> F32:
            self._tiers.store(stripe, ids, rows, np.zeros(ids.size, bool), m.tick, dirty=False)
            c.admitted += ids.size
            c.rejected += n_new - ids.size
            return plan.out

        changes = [Change(Op.PUT, self.name, ids, rows)] if ids.size else []
        return Prepared(changes, publish)

    def _gather_stripe(
        self, s: int, stripe: RamStripe, ids: U64, where: I64, out: F32, train: bool
    ) -> _Misses | None:
        """Phase 1 for one stripe (its lock held): copy resident vectors to ``out``, return
        the misses."""
        c = stripe.counters
        tick = stripe.next_tick() if train else 0
        miss = np.empty(ids.size, dtype=np.int64)
        n_miss = hash_index.lookup_gather(
            stripe.index, stripe.rows, ids, where, out, tick, train, miss
        )
        c.lookup_ids += ids.size
        c.ram_hits += ids.size - n_miss
        if train and stripe.sketch is not None:
            stripe.sketch.add(ids)  # recent lookups, for tinylfu admission
        if n_miss == 0:
            return None
        miss = miss[:n_miss]
        return _Misses(s, ids[miss], where[miss], tick, stripe.disk_generation, stripe.placed)


def _sorted_unique(ids: U64) -> tuple[U64, I64]:
    """``np.unique(ids, return_inverse=True)``; a compiled radix sort for large calls."""
    if ids.size < _RADIX_MIN:
        uniq, inverse = np.unique(ids, return_inverse=True)
        return uniq, inverse
    uniq = np.empty(ids.size, dtype=np.uint64)
    inverse = np.empty(ids.size, dtype=np.int64)
    k = creation.sorted_unique(ids, uniq, inverse)
    return uniq[:k], inverse


def _local_unique(mine: I64, size: int) -> tuple[I64, I64]:
    """``np.unique(mine, return_inverse=True)`` of indices into ``range(size)``: one compiled
    pass over the range when ``mine`` covers a good part of it, else numpy's sort."""
    if mine.size * 8 < size:
        local, inverse = np.unique(mine, return_inverse=True)
        return local, inverse
    local = np.empty(mine.size, dtype=np.int64)
    inverse = np.empty(mine.size, dtype=np.int64)
    k = creation.local_unique(mine, size, local, inverse)
    return local[:k], inverse
