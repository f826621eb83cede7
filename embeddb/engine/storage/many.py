"""Calls spanning tables, done in one pass: a call touching T tables costs the shard about what
one table holding the same ids costs.

A training step sends a shard one ``lookup_many`` and one ``apply_gradients_many`` holding a
part per table (one table per feature: 26 parts for Criteo). Served table by table, each part
pays the per-call Python cost of every stripe it touches — probe, gradient sums, a scratch
copy, the optimizer, a log change, a lock — 26 tables x 4 stripes is 104 small calls where
one shared table makes 4. Here the parts of a call share that cost instead:

* the shard's stripes are numbered once (:class:`StripeSet`), so one compiled call
  (:mod:`~embeddb.engine.storage.many_kernels`) serves the resident ids of every part: a
  training lookup copies and stamps them, a gradient push probes them, sums duplicate ids'
  gradients and copies the rows into **one** call-wide scratch array;
* the optimizer runs **once** over the rows of every table that shares its settings (kind,
  hyperparameters, dim, weight bound): its update is row by row, so this computes exactly what
  running it per table does;
* each table's updated rows are one contiguous slice of that array, logged as **one** change
  per table (zero-copy; the record format is unchanged) in the call's one record, and
  published by one compiled scatter.

The call holds the locks of every stripe of its tables throughout (tables in the shard's
order, stripes ascending: the order every call spanning tables and every snapshot takes them
in). A part with an id that is not resident — a row to promote from disk, to create, or that
exists nowhere — is left to its table's own path: a lookup part after the locks are released
(:meth:`~embeddb.engine.storage.TieredTable.lookup_begin`), a gradient part under the same
locks and in the same record (:meth:`~embeddb.engine.storage.TieredTable.prepare_update`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import ExitStack
from typing import NamedTuple

import numpy as np

from embeddb.common.arrays import F32, I64, U64
from embeddb.engine.optim import Optimizer
from embeddb.engine.optim.kernels import finite_rows
from embeddb.engine.storage import many_kernels as kernels
from embeddb.engine.storage.changes import Change, Op
from embeddb.engine.storage.ram_tier import DIRTY, RamStripe
from embeddb.engine.storage.stats import UpdateResult
from embeddb.engine.storage.table import TieredTable
from embeddb.engine.storage.writes import Journal, Prepared, commit, hold

__all__ = ["StripeSet", "stripe_row"]


_FIXED_KEPT = 64  # sets of tables whose layout is kept


class _Fixed(NamedTuple):
    """What :meth:`StripeSet.layout` derives from a set of tables alone."""

    first: I64  # each table's first stripe number
    shifts: I64  # each table's stripe shift
    counts: I64  # each table's stripe count
    stripes: I64  # the numbers of every stripe of the tables
    ram: list[RamStripe]  # those stripes
    locks: list[threading.Lock]  # their locks


def stripe_row(s: RamStripe) -> list[int]:
    """The row of stripe ``s`` in a stripe table (:data:`~.many_kernels.COLUMNS`): the
    addresses and shapes of its arrays, which live as long as ``s`` and are never replaced."""
    arrays = (s.index, s.rows, s.ids, s.scratch, s.flags)
    assert all(a.flags.c_contiguous for a in arrays)
    index, rows, ids, scratch, flags = (a.__array_interface__["data"][0] for a in arrays)
    return [index, s.index.shape[0], rows, s.capacity, s.width, ids, scratch, flags]


class StripeSet:
    """Every stripe of a shard's tables, numbered for the compiled calls spanning tables.

    Args:
        tables: the shard's tables, in its lock order.
    """

    def __init__(self, tables: Mapping[str, TieredTable]) -> None:
        self.rank = {name: k for k, name in enumerate(tables)}
        signatures: dict[Hashable, int] = {}  # tables whose rows one optimizer run may update
        self.group = {
            name: signatures.setdefault(t.optimizer.signature, len(signatures))
            for name, t in tables.items()
        }
        self.first: dict[str, int] = {}
        rows: list[list[int]] = []
        self._arrays: list[np.ndarray] = []  # keeps what the addresses point to alive
        for name, table in tables.items():
            self.first[name] = len(rows)
            for s in table.stripes:
                rows.append(stripe_row(s))
                self._arrays.extend((s.index, s.rows, s.ids, s.scratch, s.flags))
        self.table = np.array(rows, dtype=np.int64).reshape(-1, len(kernels.COLUMNS))
        self._fixed: dict[tuple[str, ...], _Fixed] = {}

    def ordered(self, tables: Sequence[TieredTable]) -> list[int]:
        """Positions of ``tables`` in lock order."""
        return sorted(range(len(tables)), key=lambda k: self.rank[tables[k].name])

    def holding(self, tables: Sequence[TieredTable]) -> ExitStack:
        """Hold the lock of every stripe of ``tables`` (given in lock order)."""
        return hold(self._fixed_of(tables).locks)

    def _fixed_of(self, tables: Sequence[TieredTable]) -> _Fixed:
        """What the calls on ``tables`` share (kept: the same few sets come back call after
        call)."""
        names = tuple([t.name for t in tables])
        fixed = self._fixed.get(names)
        if fixed is None:
            if len(self._fixed) >= _FIXED_KEPT:
                self._fixed.clear()
            first = np.array([self.first[n] for n in names], dtype=np.int64)
            counts = np.array([len(t.stripes) for t in tables], dtype=np.int64)
            fixed = self._fixed[names] = _Fixed(
                first,
                np.array([t.stripe_shift for t in tables], dtype=np.int64),
                counts,
                np.concatenate([np.arange(g, g + c) for g, c in zip(first, counts, strict=True)]),
                [s for t in tables for s in t.stripes],
                [s.lock for t in tables for s in t.stripes],
            )
        return fixed

    def layout(
        self, tables: Sequence[TieredTable], ids: Sequence[U64]
    ) -> tuple[U64, I64, I64, I64, I64, I64]:
        """``(ids, bounds, first, shifts, counts, ticks)`` of parts of ``tables`` for the
        kernels; advances the clock of each of their stripes (their locks held)."""
        flat = ids[0] if len(ids) == 1 else np.concatenate(ids)
        bounds = np.zeros(len(ids) + 1, dtype=np.int64)
        bounds[1:] = [i.size for i in ids]
        np.cumsum(bounds, out=bounds)
        fixed = self._fixed_of(tables)
        first, shifts, counts = fixed.first, fixed.shifts, fixed.counts
        ticks = np.zeros(self.table.shape[0], dtype=np.int64)
        ticks[fixed.stripes] = list(map(RamStripe.next_tick, fixed.ram))
        return flat, bounds, first, shifts, counts, ticks

    # ------------------------------------------------------------------------ lookups
    def lookup_resident(self, parts: Sequence[tuple[TieredTable, U64]]) -> list[F32 | None]:
        """Training lookups of ``(table, ids)`` parts whose ids are all resident (a table may
        appear once): the vectors of each such part, ``None`` for the others (nothing of them
        counted; their resident rows may have been stamped)."""
        if not parts:
            return []
        order = self.ordered([t for t, _ in parts])
        out: list[F32 | None] = [None] * len(parts)
        with self.holding([parts[k][0] for k in order]):
            for members in _groups(order, [t.dim for t, _ in parts]).values():
                tables = [parts[k][0] for k in members]
                ids, bounds, first, shifts, counts, ticks = self.layout(
                    tables, [parts[k][1] for k in members]
                )
                vectors = np.empty((ids.size, tables[0].dim), dtype=np.float32)
                missed = np.zeros(len(members), dtype=np.uint8)
                kernels.lookup_resident(
                    ids, bounds, first, shifts, counts, self.table, ticks, vectors, missed
                )
                for j, k in enumerate(members):
                    if missed[j]:
                        continue
                    n = int(bounds[j + 1] - bounds[j])
                    c = tables[j].stripes[0].counters
                    c.lookup_ids += n
                    c.ram_hits += n
                    tables[j].count_lookups(parts[k][1])  # tinylfu's frequencies
                    out[k] = vectors[bounds[j] : bounds[j + 1]]
        return out

    # ------------------------------------------------------------------------ gradients
    def update(
        self,
        items: Sequence[tuple[TieredTable, U64, F32]],
        journal: Journal | None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> list[UpdateResult]:
        """``apply_gradients`` of every ``(table, ids, grads)`` as one call (a table may appear
        once): every stripe's lock held, every table prepared in one pass, one journal call,
        then published. Results in input order."""
        if not items:
            return []
        order = self.ordered([t for t, _, _ in items])
        with self.holding([items[k][0] for k in order]):
            prepared = [
                self._prepare([items[k] for k in members], members)
                for members in _groups(order, [self.group[t.name] for t, _, _ in items]).values()
            ]
            done = commit(prepared, journal, on_failure)
        results: list[UpdateResult] = [UpdateResult(0, 0, 0)] * len(items)
        for part in done:
            for k, result in part:
                results[k] = result
        return results

    def _prepare(
        self, items: Sequence[tuple[TieredTable, U64, F32]], keys: list[int]
    ) -> Prepared[list[tuple[int, UpdateResult]]]:
        """The gradient pushes of tables sharing an optimizer, prepared (locks held)."""
        tables = [t for t, _, _ in items]
        t0 = tables[0]
        ids, bounds, first, shifts, counts, ticks = self.layout(tables, [i for _, i, _ in items])
        grads = items[0][2] if len(items) == 1 else np.concatenate([g for _, _, g in items])
        n_ids, n_segs = ids.size, int(counts.sum())
        missed = np.zeros(len(items), dtype=np.uint8)
        seg_stripe = np.empty(n_segs, dtype=np.int64)
        seg_bounds = np.empty(n_segs + 1, dtype=np.int64)
        seg_ids = np.empty(n_segs, dtype=np.int64)
        slots = np.empty(n_ids, dtype=np.int64)
        sums = np.empty((n_ids, t0.dim), dtype=np.float32)
        rows = np.empty((n_ids, t0.width), dtype=np.float32)
        row_ids = np.empty(n_ids, dtype=np.uint64)
        n, segs = kernels.update_resident(
            ids, bounds, first, shifts, counts, self.table, ticks, grads,
            missed, seg_stripe, seg_bounds, seg_ids, slots, sums, rows, row_ids,
        )  # fmt: skip
        seg_stripe, seg_bounds, seg_ids = seg_stripe[:segs], seg_bounds[: segs + 1], seg_ids[:segs]
        slots, rows = slots[:n], rows[:n]
        skipped = self._apply(t0.optimizer, rows, sums[:n], slots, seg_stripe, seg_bounds)
        # each part's segments: stripes are numbered in lock order, like the parts
        seg_part = np.searchsorted(first, seg_stripe, side="right") - 1
        parts = np.arange(len(items))
        seg_lo = np.searchsorted(seg_part, parts, side="left")
        seg_hi = np.searchsorted(seg_part, parts, side="right")
        row_lo, row_hi = seg_bounds[seg_lo].tolist(), seg_bounds[seg_hi].tolist()
        skips_of = np.zeros(skipped.size + 1, dtype=np.int64)  # running sum over segments
        np.cumsum(skipped, out=skips_of[1:])
        part_skips = (skips_of[seg_hi] - skips_of[seg_lo]).tolist()
        logged = t0.journal is not None
        changes: list[Change] = []
        resident: list[tuple[int, TieredTable, int, int, int]] = []  # key, table, ids, rows, skips
        slow: list[tuple[int, Prepared[UpdateResult]]] = []
        for j, ((t, part_ids, part_grads), miss) in enumerate(
            zip(items, missed.tolist(), strict=True)
        ):
            if miss:  # some id is not resident: the table's own path, same locks, same record
                p = t.prepare_update(t.split(part_ids), part_grads)
                changes.extend(p.changes)
                slow.append((keys[j], p))
                continue
            lo, hi = row_lo[j], row_hi[j]
            if logged and hi > lo:  # skipped rows are logged unchanged: harmless
                changes.append(Change(Op.PUT, t.name, row_ids[lo:hi], rows[lo:hi]))
            resident.append((keys[j], t, part_ids.size, hi - lo, part_skips[j]))

        def publish() -> list[tuple[int, UpdateResult]]:
            kernels.scatter_segments(self.table, seg_stripe, seg_bounds, slots, rows, DIRTY)
            results = []
            for key, t, n_part, touched, skips in resident:
                c = t.stripes[0].counters
                c.update_ids += n_part
                c.updated_rows += touched - skips
                c.nan_skipped += skips
                results.append((key, UpdateResult(touched - skips, skips, 0)))
            results.extend((key, p.publish()) for key, p in slow)
            return results

        return Prepared(changes, publish)

    def _apply(
        self,
        optimizer: Optimizer,
        rows: F32,
        sums: F32,
        slots: I64,
        seg_stripe: I64,
        seg_bounds: I64,
    ) -> I64:
        """Run ``optimizer`` over ``rows`` in place; returns the rows skipped per segment."""
        n = rows.shape[0]
        if n == 0:
            return np.zeros(seg_stripe.size, dtype=np.int64)
        finite = np.empty(n, dtype=np.bool_)
        good = finite_rows(sums, finite)
        skipped = optimizer.apply(rows, np.arange(n, dtype=np.int64), sums)
        if skipped == n - good:  # every skip is a non-finite gradient: count them per segment
            bad: I64 = np.add.reduceat((~finite).astype(np.int64), seg_bounds[:-1])
            return bad
        # an update overflowed somewhere (rare): redo segment by segment to count each one's
        per_seg = np.empty(seg_stripe.size, dtype=np.int64)
        for j, g in enumerate(seg_stripe.tolist()):
            lo, hi = int(seg_bounds[j]), int(seg_bounds[j + 1])
            stripe_rows = self._arrays[5 * g + 1]
            rows[lo:hi] = stripe_rows[slots[lo:hi]]
            per_seg[j] = optimizer.apply(
                rows, np.arange(lo, hi, dtype=np.int64), np.ascontiguousarray(sums[lo:hi])
            )
        return per_seg


def _groups(order: list[int], keys: list[int]) -> dict[int, list[int]]:
    """``order`` split by ``keys[k]``, each group keeping the order."""
    groups: dict[int, list[int]] = {}
    for k in order:
        groups.setdefault(keys[k], []).append(k)
    return groups
