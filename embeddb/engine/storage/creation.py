"""Compiled kernels of phase 3 of a lookup (:mod:`embeddb.engine.storage.lookups`): one pass per
stripe settles its misses and creates the rows of first-seen ids.

A stripe's misses arrive as ``local``, the indices of its distinct missed ids in the lookup's
sorted distinct misses ``uniq``, with ``inverse`` and ``where`` (each miss's place in ``local``
and its looked-up position), and the lookup's ``values`` and ``found``: one full row per
distinct id, holding the disk-tier copy where phase 2 found one, zeros elsewhere. The kernels
work on those arrays in place (each stripe on its own rows of them). Python makes at most five
calls per stripe:

0. :func:`local_unique` — the stripe's distinct ids, without sorting;

1. :func:`probe_rows` — re-probe the hash index (another call may have made an id resident
   since phase 1) and copy the resident rows into ``values``; skipped when nothing was placed
   in the stripe since phase 1 (``RamStripe.placed``);
2. (rare) a second disk multi-get when the stripe wrote to disk meanwhile;
3. one draw of the stripe's admission generator for the new ids (kept in numpy so the stream of
   draws is the generator's own, whatever code consumes it);
4. :func:`settle_rows` — count hits and misses, decide admission, fill each admitted row (the
   deterministic initializer, :func:`embeddb.engine.initializers.fill_row`, and the optimizer's
   initial state), list the admitted and promoted rows compactly and copy the answer vectors.

Publishing the admitted rows is :meth:`embeddb.engine.storage.ram_tier.RamStripe.place`'s
kernel (:func:`place_rows`), after eviction made room. Every kernel is
``numba.njit(nogil=True)``: callers hold the stripe's lock, not the GIL.
"""

from __future__ import annotations

import numba
import numpy as np

from embeddb.engine.initializers import fill_row
from embeddb.engine.storage.hash_index import _home

__all__ = [
    "DISK_HITS",
    "MISSES",
    "N_ADMITTED",
    "N_COUNTS",
    "N_NEW",
    "N_PROMOTED",
    "RAM_HITS",
    "local_unique",
    "place_rows",
    "probe_rows",
    "settle_rows",
    "sorted_unique",
]

_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_BLOCK = 32  # ids per block of place_rows's passes

# settle_rows's counts, by index
RAM_HITS, DISK_HITS, MISSES, N_NEW, N_ADMITTED, N_PROMOTED = range(6)
N_COUNTS = 6


@numba.njit(nogil=True, cache=True)
def probe_rows(index, rows, uniq, local, tick, touch, values, resident_out):
    """For each ``i``, with ``u = local[i]``: ``resident_out[i]`` tells whether ``uniq[u]`` is
    resident; if so its row is copied into ``values[u]`` and, when ``touch``, its stamp becomes
    ``tick``.

    Returns:
        The number of ids not resident.
    """
    mask = np.uint64(index.shape[0] - 1)
    stamp = np.uint64(tick) << _S32
    width = rows.shape[1]
    absent = 0
    for i in range(local.size):
        u = local[i]
        key = uniq[u]
        b = _home(key, mask)
        resident_out[i] = False
        while True:
            v = index[b, 1]
            if v == 0:
                absent += 1
                break
            if index[b, 0] == key:
                low = v & _LOW32
                if touch:
                    index[b, 1] = stamp | low
                slot = np.int64(low) - 1
                for j in range(width):
                    values[u, j] = rows[slot, j]
                resident_out[i] = True
                break
            b = (b + _ONE) & mask
    return absent


@numba.njit(nogil=True, cache=True)
def settle_rows(
    uniq,
    local,
    values,
    found,
    resident,
    inverse,
    where,
    out,
    train,
    draws,
    p,
    key,
    kind,
    a,
    b,
    state,
    new_rows,
    admitted_out,
    promoted_out,
    counts,
):
    """Settle one stripe's misses in one pass (see the module docstring).

    The stripe's ``i``-th distinct id is ``uniq[local[i]]``, its row ``values[local[i]]``, its
    disk copy ``found[local[i]]`` and its residency ``resident[i]``. A training call creates
    the new ids (neither resident nor found) that are admitted (the ``k``-th new one, in
    ``local`` order, when ``p >= 1`` or ``draws[k] < p``) compactly into ``new_rows``: the
    initial vector in the first ``dim = out.shape[1]`` columns, then ``state`` (the optimizer's
    initial state of one row); their rows of ``values`` stay zeros. ``admitted_out`` and
    ``promoted_out`` get the indices (into ``uniq``) of the admitted rows and of the disk rows
    to promote, in ``local`` order. Then ``out[where[t]]`` gets the vector of
    ``uniq[local[inverse[t]]]``.

    ``counts`` (int64, length :data:`N_COUNTS`) receives, per looked-up position, the RAM hits,
    disk hits and misses, then, per distinct id, the new, admitted and promoted counts.
    """
    dim = out.shape[1]
    width = values.shape[1]
    n_state = width - dim
    for c in range(counts.size):
        counts[c] = 0
    k = 0
    n_admitted = 0
    n_promoted = 0
    created = np.full(local.size, -1, dtype=np.int64)  # i -> its row of new_rows, or -1
    for i in range(local.size):
        if resident[i] or not train:
            continue
        u = local[i]
        if found[u]:
            promoted_out[n_promoted] = u
            n_promoted += 1
            continue
        admit = p >= 1.0 or draws[k] < p
        k += 1
        if admit:
            fill_row(uniq[u], key, kind, a, b, new_rows, n_admitted, dim)
            for j in range(n_state):
                new_rows[n_admitted, dim + j] = state[j]
            created[i] = n_admitted
            admitted_out[n_admitted] = u
            n_admitted += 1
    for t in range(inverse.size):
        i = inverse[t]
        u = local[i]
        w = where[t]
        if resident[i]:
            counts[RAM_HITS] += 1
        elif found[u]:
            counts[DISK_HITS] += 1
        else:
            counts[MISSES] += 1
            r = created[i]
            if r >= 0:  # created: its row is in new_rows only
                for j in range(dim):
                    out[w, j] = new_rows[r, j]
                continue
        for j in range(dim):
            out[w, j] = values[u, j]
    counts[N_NEW] = k
    counts[N_ADMITTED] = n_admitted
    counts[N_PROMOTED] = n_promoted


@numba.njit(nogil=True, cache=True)
def place_rows(
    index,
    rows,
    ids,
    flags,
    free,
    n_free,
    new_ids,
    new_rows,
    on_disk,
    tick,
    dirty,
    on_flag,
    dirty_flag,
):
    """Make ``new_ids`` resident with ``new_rows`` in the slots on top of the free stack.

    The ``k``-th id takes slot ``free[n_free - 1 - k]`` (the order ``RamStripe.take_slots``
    pops them in) and stamp ``tick``; its flags get ``on_flag`` when ``on_disk[k]`` and
    ``dirty_flag`` when ``dirty`` or it has no disk copy. The ids must be absent and fit
    (``new_ids.size <= n_free``).

    Returns:
        How many of the ids have a disk copy (promotions).
    """
    mask = np.uint64(index.shape[0] - 1)
    stamp = np.uint64(tick) << _S32
    width = rows.shape[1]
    promoted = 0
    # Blocks of _BLOCK ids: first the home buckets' loads (independent, so the CPU overlaps
    # their cache misses, as lookup_gather does), then the inserts, on cached buckets.
    homes = np.empty(_BLOCK, dtype=np.uint64)
    first = np.empty(_BLOCK, dtype=np.uint64)
    for start in range(0, new_ids.size, _BLOCK):
        count = min(_BLOCK, new_ids.size - start)
        for j in range(count):
            b = _home(new_ids[start + j], mask)
            homes[j] = b
            first[j] = index[b, 1]
        for j in range(count):
            k = start + j
            slot = free[n_free - 1 - k]
            key = new_ids[k]
            for c in range(width):
                rows[slot, c] = new_rows[k, c]
            ids[slot] = key
            copy = on_disk[k]
            flag = on_flag if copy else np.uint8(0)
            if dirty or not copy:
                flag |= dirty_flag
            flags[slot] = flag
            promoted += 1 if copy else 0
            b = homes[j]
            if first[j] != 0 or index[b, 1] != 0:  # taken (before or by this block): probe on
                b = (b + _ONE) & mask
                while index[b, 1] != 0:
                    b = (b + _ONE) & mask
            index[b, 0] = key
            index[b, 1] = stamp | np.uint64(slot + 1)
    return promoted


@numba.njit(nogil=True, cache=True)
def local_unique(mine, size, local_out, inverse_out):
    """``np.unique(mine, return_inverse=True)`` for indices ``mine`` into a range of ``size``,
    without sorting: ``local_out[:k]`` gets the distinct values ascending and ``inverse_out[t]``
    the place of ``mine[t]`` among them.

    Returns:
        ``k``, the number of distinct values.
    """
    rank = np.zeros(size, dtype=np.int64)
    for t in range(mine.size):
        rank[mine[t]] = 1
    k = 0
    for i in range(size):
        if rank[i]:
            local_out[k] = i
            k += 1
            rank[i] = k
    for t in range(mine.size):
        inverse_out[t] = rank[mine[t]] - 1
    return k


_DIGIT = 16  # bits per radix pass of sorted_unique
_BINS = 1 << _DIGIT


@numba.njit(nogil=True, cache=True)
def sorted_unique(keys, uniq_out, inverse_out):
    """``np.unique(keys, return_inverse=True)`` for uint64 ``keys``, by an LSD radix sort
    (16-bit digits; a pass whose digit all keys share is skipped): ``uniq_out[:k]`` gets the
    distinct keys ascending, ``inverse_out[i]`` the place of ``keys[i]`` among them.

    Returns:
        ``k``, the number of distinct keys.
    """
    n = keys.size
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    starts = np.empty(_BINS, dtype=np.int64)
    digit_mask = np.uint64(_BINS - 1)
    for p in range(64 // _DIGIT):
        shift = np.uint64(p * _DIGIT)
        starts[:] = 0
        for i in range(n):
            starts[np.int64((keys[i] >> shift) & digit_mask)] += 1
        if starts[np.int64((keys[0] >> shift) & digit_mask)] == n:
            continue  # every key has this digit: the order stands
        total = 0
        for d in range(_BINS):
            c = starts[d]
            starts[d] = total
            total += c
        for r in range(n):
            i = order[r]
            d = np.int64((keys[i] >> shift) & digit_mask)
            spare[starts[d]] = i
            starts[d] += 1
        order, spare = spare, order
    k = 0
    for r in range(n):
        i = order[r]
        v = keys[i]
        if k == 0 or v != uniq_out[k - 1]:
            uniq_out[k] = v
            k += 1
        inverse_out[i] = k - 1
    return k
