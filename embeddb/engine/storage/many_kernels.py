"""Compiled kernels of the calls spanning tables (:mod:`embeddb.engine.storage.many`).

Each kernel serves every part of one call — a part is one table's ids, ``ids[bounds[p] :
bounds[p + 1]]`` — in one compiled call, so a call touching 26 tables of 4 stripes each pays
one dispatch instead of 104. A table's stripes are numbered in the shard's stripe set: part
``p`` uses stripes ``first[p] .. first[p] + counts[p] - 1`` of the int64 table ``stripes``,
one row per stripe giving the address and shape of its arrays (``COLUMNS``: the index, the
rows, the slot ids, the scratch and the flags; :class:`~embeddb.engine.storage.many.StripeSet`
builds it and keeps the arrays alive — a stripe's arrays are allocated once, with the table,
and never replaced). Arrays of different stripes and tables cannot be passed to one compiled
call otherwise without a typed list, whose methods numba compiles anew in every process
(seconds). An id goes to the stripe
:meth:`~embeddb.engine.storage.TieredTable.split` gives it (``mix64(id ^ STRIPE_SALT) >>
shifts[p]``, stripe 0 when the table has one). Every kernel only reads and stamps resident
rows: a part with an id that is not resident is flagged in ``missed`` and left to the per-table
path, which handles promotion, overflow and new rows.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic
from numba.np.numpy_support import carray

from embeddb.common._routing_kernel import mix as _mix
from embeddb.common.routing import STRIPE_SALT
from embeddb.engine.storage.hash_index import BUCKET_SALT, add_to_sum

__all__ = ["COLUMNS", "lookup_resident", "scatter_segments", "update_resident"]

COLUMNS = ("index", "buckets", "rows", "capacity", "width", "ids", "scratch", "flags")

_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_BLOCK = 32  # ids per block of lookup_resident's passes


def _pointer_to(item: Any) -> Any:
    """A compiled cast of an address (int64) to a pointer to ``item``."""

    @intrinsic
    def cast(typingctx, address):
        pointer = types.CPointer(item)  # type: ignore[no-untyped-call]

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer))

        return pointer(types.int64), codegen

    return cast


_u64_at = _pointer_to(types.uint64)
_i64_at = _pointer_to(types.int64)
_f32_at = _pointer_to(types.float32)
_u8_at = _pointer_to(types.uint8)


@numba.njit(nogil=True, cache=True, inline="always")
def _index(stripes, g):
    return carray(_u64_at(stripes[g, 0]), (stripes[g, 1], 2))


@numba.njit(nogil=True, cache=True, inline="always")
def _rows(stripes, g):
    return carray(_f32_at(stripes[g, 2]), (stripes[g, 3], stripes[g, 4]))


@numba.njit(nogil=True, cache=True, inline="always")
def _ids(stripes, g):
    return carray(_u64_at(stripes[g, 5]), stripes[g, 3])


@numba.njit(nogil=True, cache=True, inline="always")
def _scratch(stripes, g):
    return carray(_i64_at(stripes[g, 6]), stripes[g, 3])


@numba.njit(nogil=True, cache=True, inline="always")
def _flags(stripes, g):
    return carray(_u8_at(stripes[g, 7]), stripes[g, 3])


@numba.njit(nogil=True, cache=True, inline="always")
def _stripe(key, shift, count):
    if count == 1:
        return 0
    return np.int64(_mix(key ^ STRIPE_SALT) >> np.uint64(shift))


@numba.njit(nogil=True, cache=True, inline="always")
def _find(index, key, stamp):
    """The slot of ``key`` (stamped with ``stamp``), or -1."""
    mask = np.uint64(index.shape[0] - 1)
    return _probe(index, key, _mix(key ^ BUCKET_SALT) & mask, mask, stamp)


@numba.njit(nogil=True, cache=True, inline="always")
def _find_from(index, key, home, word, tick):
    """:func:`_find` from ``key``'s home bucket ``home``, whose second word ``word`` the
    caller already loaded, stamping ``tick``."""
    mask = np.uint64(index.shape[0] - 1)
    b = home
    v = word
    stamp = np.uint64(tick) << _S32
    while True:
        if v == 0:
            return np.int64(-1)
        if index[b, 0] == key:
            index[b, 1] = stamp | (v & _LOW32)
            return np.int64(v & _LOW32) - 1
        b = (b + _ONE) & mask
        v = index[b, 1]


@numba.njit(nogil=True, cache=True, inline="always")
def _probe(index, key, b, mask, stamp):
    while True:
        v = index[b, 1]
        if v == 0:
            return np.int64(-1)
        if index[b, 0] == key:
            low = v & _LOW32
            index[b, 1] = stamp | low
            return np.int64(low) - 1
        b = (b + _ONE) & mask


@numba.njit(nogil=True, cache=True)
def lookup_resident(ids, bounds, first, shifts, counts, stripes, ticks, out, missed):
    """A training lookup's resident rows: ``out[i] = rows[stripe][slot, :dim]`` for each
    resident ``ids[i]`` (stamped with its stripe's ``ticks``); ``missed[p] = 1`` for a part
    with an id that is not resident (its other rows are copied and stamped all the same).

    Blocks of ``_BLOCK`` ids in three passes, as ``hash_index.lookup_gather``: the home
    buckets' loads (independent, so their cache misses overlap), the probes, the row copies."""
    dim = out.shape[1]
    stripe_of = np.empty(_BLOCK, dtype=np.int64)
    homes = np.empty(_BLOCK, dtype=np.uint64)
    words = np.empty(_BLOCK, dtype=np.uint64)
    slots = np.empty(_BLOCK, dtype=np.int64)
    for p in range(bounds.size - 1):
        shift, count = shifts[p], counts[p]
        for start in range(bounds[p], bounds[p + 1], _BLOCK):
            n = min(_BLOCK, bounds[p + 1] - start)
            for j in range(n):
                key = ids[start + j]
                g = first[p] + _stripe(key, shift, count)
                index = _index(stripes, g)
                b = _mix(key ^ BUCKET_SALT) & np.uint64(index.shape[0] - 1)
                stripe_of[j] = g
                homes[j] = b
                words[j] = index[b, 1]
            for j in range(n):
                g = stripe_of[j]
                slot = _find_from(_index(stripes, g), ids[start + j], homes[j], words[j], ticks[g])
                slots[j] = slot
                if slot < 0:
                    missed[p] = 1
            for j in range(n):
                slot = slots[j]
                if slot >= 0:
                    r = _rows(stripes, stripe_of[j])
                    i = start + j
                    for d in range(dim):
                        out[i, d] = r[slot, d]


@numba.njit(nogil=True, cache=True)
def update_resident(
    ids, bounds, first, shifts, counts, stripes, ticks, grads,
    missed, seg_stripe, seg_bounds, seg_ids, slots_out, sums_out, rows_out, ids_out,
):  # fmt: skip
    """The first steps of a gradient push on every part whose ids are all resident.

    Per part, per stripe (ids grouped by stripe, in input order within one): probe the ids
    (stamping them with the stripe's ``ticks``), sum the gradients (``grads[i]`` is the
    gradient of ``ids[i]``) of ids sharing a slot, and copy each distinct slot's row and id.
    Each stripe's distinct slots form a segment: ``seg_stripe[j]`` its stripe, rows
    ``[seg_bounds[j], seg_bounds[j + 1])`` of ``slots_out``/``sums_out``/``rows_out``/
    ``ids_out``, ``seg_ids[j]`` its ids counted with duplicates. A part with an id that is not
    resident gets ``missed[p] = 1`` and no rows or segments. Each stripe's scratch is all -1
    and is left so.

    Returns:
        ``(rows, segments)`` written.
    """
    n = 0
    nseg = 0
    seg_bounds[0] = 0
    for p in range(bounds.size - 1):
        lo = bounds[p]
        m = bounds[p + 1] - lo
        ns = counts[p]
        where = np.empty(ns + 1, dtype=np.int64)  # counting sort of the part by stripe
        where[:] = 0
        stripe_of = np.empty(m, dtype=np.int64)
        for x in range(m):
            s = _stripe(ids[lo + x], shifts[p], ns)
            stripe_of[x] = s
            where[s + 1] += 1
        for s in range(ns):
            where[s + 1] += where[s]
        order = np.empty(m, dtype=np.int64)
        cursor = where[:ns].copy()
        for x in range(m):
            s = stripe_of[x]
            order[cursor[s]] = lo + x
            cursor[s] += 1
        n_part, seg_part = n, nseg
        bad = False
        for s in range(ns):
            a, b = where[s], where[s + 1]
            if a == b:
                continue
            g = first[p] + s
            index, scratch = _index(stripes, g), _scratch(stripes, g)
            stamp = np.uint64(ticks[g]) << _S32
            start = n
            for x in range(a, b):
                i = order[x]
                slot = _find(index, ids[i], stamp)
                if slot < 0:
                    bad = True
                    break
                n = add_to_sum(scratch, slot, grads, i, slots_out, sums_out, n)
            for y in range(start, n):
                scratch[slots_out[y]] = -1
            if bad:
                break
            r, rid = _rows(stripes, g), _ids(stripes, g)
            width = r.shape[1]
            for y in range(start, n):
                slot = slots_out[y]
                ids_out[y] = rid[slot]
                for d in range(width):
                    rows_out[y, d] = r[slot, d]
            seg_stripe[nseg] = g
            seg_ids[nseg] = b - a
            nseg += 1
            seg_bounds[nseg] = n
        if bad:
            missed[p] = 1
            n, nseg = n_part, seg_part
    return n, nseg


@numba.njit(nogil=True, cache=True)
def scatter_segments(stripes, seg_stripe, seg_bounds, slots, src, flag):
    """Publish prepared rows: stripe ``g``'s ``rows[slots[y]] = src[y]`` and ``flags[slots[y]]
    |= flag`` for the rows ``y`` of each segment (``g = seg_stripe[j]``)."""
    for j in range(seg_stripe.size):
        g = seg_stripe[j]
        r, f = _rows(stripes, g), _flags(stripes, g)
        width = r.shape[1]
        for y in range(seg_bounds[j], seg_bounds[j + 1]):
            s = slots[y]
            for d in range(width):
                r[s, d] = src[y, d]
            f[s] |= flag
