"""A table's write path: log first, then visible.

Every mutating call of :class:`~embeddb.engine.storage.TieredTable` (assign, delete,
apply_gradients,
the rows a training lookup admits) runs in two steps, with the locks of **every** stripe it
touches held throughout (taken in one fixed order — tables in the shard's order, stripes
ascending, the order a snapshot takes them in — so calls never deadlock):

1. **prepare**: compute the call's resulting rows — new vectors and optimizer state — into
   scratch arrays, publishing nothing. What a preparation may change is invisible to readers:
   promoting a clean disk row into RAM, evicting (and writing back) least recently used rows.
2. **commit**: hand all of the call's changes to the journal at once (the shard's update log
   appends them as **one** record; under ``fsync: always`` it also waits for the fsync), and
   only then **publish** them: write the rows into the tiers.

If the journal raises — a full disk, an I/O error — nothing was published: no reader, no
recovery and no follower ever sees any row of the call. A publication that fails after the
record was appended (the disk tier failed while evicting) leaves the table behind its log: the
table reports it to ``on_failure`` (the shard then refuses writes until a restart, which
rebuilds the rows from the log).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from embeddb.common.arrays import F32, I64, U64
from embeddb.engine.optim import Optimizer
from embeddb.engine.storage import hash_index
from embeddb.engine.storage.changes import Change, Op
from embeddb.engine.storage.ram_tier import DIRTY, RamStripe
from embeddb.engine.storage.tiering import Tiers

__all__ = ["Journal", "Prepared", "commit", "hold"]

T = TypeVar("T")

Journal = Callable[[list[Change]], object]
"""Appends one call's changes (one log record); raises if they are not logged."""


@dataclass
class Prepared(Generic[T]):
    """A prepared call (or a part of one): its changes, and how to publish them."""

    changes: list[Change]
    publish: Callable[[], T]


def hold(locks: Iterable[threading.Lock]) -> ExitStack:
    """Acquire ``locks`` in the order given; closing the returned stack releases them."""
    stack = ExitStack()
    try:
        for lock in locks:
            stack.enter_context(lock)
    except BaseException:
        stack.close()
        raise
    return stack


def commit(
    prepared: Sequence[Prepared[T]],
    journal: Journal | None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> list[T]:
    """Journal every change of ``prepared`` at once, then publish them (the caller holds the
    stripe locks). Returns each part's result, in order.

    Raises:
        whatever ``journal`` raises (nothing published), or what publishing raises (after
        ``on_failure`` was told).
    """
    changes = [c for p in prepared for c in p.changes]
    if journal is not None and changes:
        journal(changes)
    try:
        return [p.publish() for p in prepared]
    except BaseException as exc:
        if on_failure is not None and changes:
            on_failure(exc)
        raise


def combine(parts: list[Prepared[T]], reduce: Callable[[list[T]], T]) -> Prepared[T]:
    """One :class:`Prepared` of several (one per stripe)."""
    return Prepared(
        [c for p in parts for c in p.changes], lambda: reduce([p.publish() for p in parts])
    )


# ---------------------------------------------------------------------- per-stripe preparation
def prepare_assign(
    tiers: Tiers, optimizer: Optimizer, stripe: RamStripe, ids: U64, vectors: F32
) -> Prepared[int]:
    """Assign ``vectors`` to ``ids`` (duplicates: the last wins), state reset."""
    n = ids.size
    uniq, first_in_reversed = np.unique(ids[::-1], return_index=True)
    dim = vectors.shape[1]
    rows = np.empty((uniq.size, dim + optimizer.state_dim), dtype=np.float32)
    rows[:, :dim] = vectors[n - 1 - first_in_reversed]
    rows[:, dim:] = optimizer.initial_state(uniq.size)

    def publish() -> int:
        tiers.put(stripe, uniq, rows)
        stripe.counters.assigned_rows += uniq.size
        return int(uniq.size)

    return Prepared([Change(Op.PUT, tiers.table, uniq, rows)], publish)


def prepare_delete(tiers: Tiers, stripe: RamStripe, ids: U64) -> Prepared[int]:
    uniq = np.unique(ids)
    return Prepared([Change(Op.DELETE, tiers.table, uniq)], lambda: tiers.remove(stripe, uniq))


Counts = tuple[int, int, int]  # applied, skipped (non-finite), missing


def prepare_update(
    tiers: Tiers,
    optimizer: Optimizer,
    stripe: RamStripe,
    ids: U64,
    grads: F32,
    where: I64,
    logged: bool = True,
) -> Prepared[Counts]:
    """Run the optimizer on ``ids`` (``grads[where[i]]`` is the gradient of ``ids[i]``) into
    scratch rows. Rows on disk only are promoted first (clean: no reader sees a change).
    ``logged`` false (a table without a journal: nothing can refuse the call) updates the
    resident rows in place and prepares no change for them."""
    disk, name = tiers.disk, tiers.table
    tick = stripe.next_tick()
    slots = np.empty(ids.size, dtype=np.int64)
    n_miss = hash_index.probe(stripe.index, ids, tick, True, slots)
    missing = 0
    parts: list[Prepared[Counts]] = []
    if n_miss:
        miss = np.flatnonzero(slots < 0)
        uniq = np.unique(ids[miss])
        found, disk_rows = disk.get(name, uniq)
        missing = int((~found).sum())
        tiers.store(stripe, uniq[found], disk_rows, found[found], tick, dirty=False)
        sub_slots = np.empty(miss.size, dtype=np.int64)
        hash_index.probe(stripe.index, ids[miss], tick, False, sub_slots)
        slots[miss] = sub_slots
        still = sub_slots < 0  # overflow rows (on disk) and ids that exist nowhere
        if still.any():
            over = miss[still]
            parts.append(_prepare_on_disk(tiers, optimizer, stripe, ids[over], grads[where[over]]))
    uniq_slots = np.empty(ids.size, dtype=np.int64)
    sums = np.empty((ids.size, grads.shape[1]), dtype=np.float32)
    k = hash_index.dedup_sum(slots, grads, where, stripe.scratch, uniq_slots, sums)
    touched = uniq_slots[:k]
    if logged:  # into scratch rows, published after the journal took them
        # take() gathers ~3x faster than fancy indexing on these shapes
        rows = stripe.rows.take(touched, axis=0)
        nan = optimizer.apply(rows, np.arange(k, dtype=np.int64), sums[:k])
    else:  # no journal that could refuse the call: update in place (the caller holds the lock)
        nan = optimizer.apply(stripe.rows, touched, sums[:k])

    def publish() -> Counts:
        if logged:
            hash_index.scatter_rows(stripe.rows, touched, rows, stripe.flags, DIRTY)
        else:
            stripe.flags[touched] |= DIRTY
        return k - nan, nan, 0

    if k:  # skipped rows are logged unchanged: harmless
        logs = [Change(Op.PUT, name, stripe.ids.take(touched), rows)] if logged else []
        parts.append(Prepared(logs, publish))

    def total() -> Counts:
        counts = [p.publish() for p in parts]
        applied = sum(c[0] for c in counts)
        skipped = sum(c[1] for c in counts)
        c = stripe.counters
        c.update_ids += ids.size
        c.updated_rows += applied
        c.nan_skipped += skipped
        c.missing_updates += missing
        return applied, skipped, missing

    return Prepared([c for p in parts for c in p.changes], total)


def _prepare_on_disk(
    tiers: Tiers, optimizer: Optimizer, stripe: RamStripe, ids: U64, grads: F32
) -> Prepared[Counts]:
    """Gradients of rows that stay on disk (overflow); ids absent everywhere are ignored (they
    were counted as missing)."""
    uniq, inv = np.unique(ids, return_inverse=True)
    found, rows = tiers.disk.get(tiers.table, uniq)
    sums = np.zeros((uniq.size, grads.shape[1]), dtype=np.float32)
    np.add.at(sums, inv, grads)
    sums = sums[found]
    nan = optimizer.apply(rows, np.arange(rows.shape[0], dtype=np.int64), sums)
    kept = uniq[found]

    def publish() -> Counts:
        tiers.disk.put(tiers.table, kept, rows)  # skipped rows are rewritten unchanged
        stripe.disk_generation += 1
        return int(rows.shape[0]) - nan, nan, 0

    return Prepared([Change(Op.PUT, tiers.table, kept, rows)], publish)


def commit_ordered(
    calls: Sequence[tuple[int, list[threading.Lock], Callable[[], Prepared[T]]]],
    journal: Journal | None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> list[T]:
    """One call over several tables: ``(rank, locks, prepare)`` per table, where ``rank`` is
    the table's place in the lock order. Takes every lock (by rank, then as given), prepares
    each table, commits them as one (:func:`commit`) and returns the results in input order.
    """
    order = sorted(range(len(calls)), key=lambda k: calls[k][0])
    with hold(lock for k in order for lock in calls[k][1]):
        done = commit([calls[k][2]() for k in order], journal, on_failure)
    results: list[T | None] = [None] * len(calls)
    for k, result in zip(order, done, strict=True):
        results[k] = result
    return [r for r in results if r is not None]
