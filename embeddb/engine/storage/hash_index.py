"""Compiled open-addressing hash index: uint64 id → RAM-tier slot, with a recency stamp.

The index is one ``uint64`` array of shape ``(buckets, 2)`` (a power of two, at least twice the
slot capacity, so the load factor stays ≤ 0.5)::

    bucket b:  [ id        | stamp << 32  |  slot + 1 ]
                 col 0       col 1: high 32 bits = last training access (a tick),
                                    low 32 bits  = slot + 1 (0 means the bucket is empty)

Keeping the stamp next to the key means a training lookup reads the key, refreshes the stamp
and learns the slot from one cache line. Collisions use linear probing from
``mix64(id ^ BUCKET_SALT) & mask``; deletion uses backward shifting, so there are no tombstones
and probe chains never degrade. Every function here is ``numba.njit(nogil=True)``: callers hold
their stripe's lock, not the GIL.
"""

from __future__ import annotations

import numba
import numpy as np

from embeddb.common._routing_kernel import mix as _mix
from embeddb.common.routing import STRIPE_SALT
from embeddb.config.ram_budget import index_buckets

__all__ = [
    "collect_victims",
    "dedup_sum",
    "insert",
    "lookup_gather",
    "new_index",
    "probe",
    "remove",
]

BUCKET_SALT = np.uint64(0x2545F4914F6CDD1D)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_GATHER_BLOCK = 32  # ids per block of lookup_gather's passes


def new_index(capacity: int) -> np.ndarray:
    """An empty index for ``capacity`` slots (buckets: next power of two ≥ 2 * capacity)."""
    return np.zeros((index_buckets(capacity), 2), dtype=np.uint64)


@numba.njit(nogil=True, cache=True, inline="always")
def _home(key, mask):
    return _mix(key ^ BUCKET_SALT) & mask


@numba.njit(nogil=True, cache=True)
def partition(ids, shift, n_stripes, order_out, ids_out, bounds_out):
    """Counting sort of ``ids`` by stripe ``mix64(id ^ STRIPE_SALT) >> shift``.

    Writes ``order_out`` (original positions) and ``ids_out`` (the ids) grouped by stripe, in
    their original relative order; stripe ``s`` occupies ``[bounds_out[s], bounds_out[s+1])``.
    """
    n = ids.size
    stripe_of = np.empty(n, dtype=np.int64)
    for s in range(n_stripes + 1):
        bounds_out[s] = 0
    sh = np.uint64(shift)
    for i in range(n):
        s = np.int64(_mix(ids[i] ^ STRIPE_SALT) >> sh)
        stripe_of[i] = s
        bounds_out[s + 1] += 1
    for s in range(n_stripes):
        bounds_out[s + 1] += bounds_out[s]
    cursor = bounds_out[:n_stripes].copy()
    for i in range(n):
        s = stripe_of[i]
        p = cursor[s]
        order_out[p] = i
        ids_out[p] = ids[i]
        cursor[s] = p + 1


@numba.njit(nogil=True, cache=True)
def lookup_gather(index, rows, ids, positions, out, tick, touch, miss_out):
    """Copy the vectors of resident ids into ``out`` and list the misses.

    For each ``i``: if ``ids[i]`` is resident, ``out[positions[i]] = rows[slot, :dim]`` (``dim``
    is ``out.shape[1]``) and, when ``touch``, its stamp becomes ``tick``; otherwise ``i`` is
    appended to ``miss_out``.

    Returns:
        The number of misses written to ``miss_out``.
    """
    mask = np.uint64(index.shape[0] - 1)
    dim = out.shape[1]
    stamp = np.uint64(tick) << _S32
    n_miss = 0
    # Blocks of _GATHER_BLOCK ids in three passes: the home buckets' loads (independent, so the
    # CPU overlaps their cache misses), the probes (on cached buckets), then the row copies
    # (independent again). One id at a time, each miss waited for the last: ~30% slower.
    homes = np.empty(_GATHER_BLOCK, dtype=np.uint64)
    first = np.empty(_GATHER_BLOCK, dtype=np.uint64)
    slots = np.empty(_GATHER_BLOCK, dtype=np.int64)
    for start in range(0, ids.size, _GATHER_BLOCK):
        count = min(_GATHER_BLOCK, ids.size - start)
        for j in range(count):
            b = _home(ids[start + j], mask)
            homes[j] = b
            first[j] = index[b, 1]
        for j in range(count):
            i = start + j
            key = ids[i]
            b = homes[j]
            v = first[j]
            slots[j] = -1
            while True:
                if v == 0:
                    miss_out[n_miss] = i
                    n_miss += 1
                    break
                if index[b, 0] == key:
                    low = v & _LOW32
                    if touch:
                        index[b, 1] = stamp | low
                    slots[j] = np.int64(low) - 1
                    break
                b = (b + _ONE) & mask
                v = index[b, 1]
        for j in range(count):
            slot = slots[j]
            if slot >= 0:
                p = positions[start + j]
                for d in range(dim):
                    out[p, d] = rows[slot, d]
    return n_miss


@numba.njit(nogil=True, cache=True)
def probe(index, ids, tick, touch, slots_out):
    """``slots_out[i]`` = slot of ``ids[i]`` or -1; when ``touch``, found rows get stamp ``tick``.

    Returns:
        The number of missing ids.
    """
    mask = np.uint64(index.shape[0] - 1)
    stamp = np.uint64(tick) << _S32
    missing = 0
    for i in range(ids.size):
        key = ids[i]
        b = _home(key, mask)
        slots_out[i] = -1
        while True:
            v = index[b, 1]
            if v == 0:
                missing += 1
                break
            if index[b, 0] == key:
                low = v & _LOW32
                if touch:
                    index[b, 1] = stamp | low
                slots_out[i] = np.int64(low) - 1
                break
            b = (b + _ONE) & mask
    return missing


@numba.njit(nogil=True, cache=True)
def insert(index, keys, slots, tick):
    """Insert ``keys[k] → slots[k]`` with stamp ``tick``. The keys must be absent."""
    mask = np.uint64(index.shape[0] - 1)
    stamp = np.uint64(tick) << _S32
    for k in range(keys.size):
        key = keys[k]
        b = _home(key, mask)
        while index[b, 1] != 0:
            b = (b + _ONE) & mask
        index[b, 0] = key
        index[b, 1] = stamp | np.uint64(slots[k] + 1)


@numba.njit(nogil=True, cache=True)
def remove(index, keys, slots_out):
    """Remove ``keys``; ``slots_out[k]`` = the freed slot or -1 if absent. Returns #removed.

    Backward-shift deletion: after emptying bucket ``i``, each following entry of the probe
    run moves back into the hole unless its home lies cyclically in ``(i, j]``.
    """
    mask = np.uint64(index.shape[0] - 1)
    removed = 0
    for k in range(keys.size):
        key = keys[k]
        b = _home(key, mask)
        slots_out[k] = -1
        while True:
            v = index[b, 1]
            if v == 0:
                break
            if index[b, 0] == key:
                slots_out[k] = np.int64(v & _LOW32) - 1
                removed += 1
                i = b
                j = b
                while True:
                    j = (j + _ONE) & mask
                    if index[j, 1] == 0:
                        break
                    h = _home(index[j, 0], mask)
                    # the entry at j stays iff its home lies cyclically in (i, j]
                    stays = (i < h and h <= j) if i <= j else (i < h or h <= j)
                    if not stays:
                        index[i, 0] = index[j, 0]
                        index[i, 1] = index[j, 1]
                        i = j
                index[i, 0] = 0
                index[i, 1] = 0
                break
            b = (b + _ONE) & mask
    return removed


_HIST_BINS = 1 << 16


@numba.njit(nogil=True, cache=True)
def collect_victims(index, count, below_tick, keys_out, slots_out):
    """Choose up to ``count`` least recently used entries whose stamp is ``< below_tick``.

    Exact at tick granularity: every chosen entry is at least as old as every entry not chosen
    (ties at the threshold stamp are broken by bucket order). Two passes over the buckets: a
    histogram of ages ``below_tick - stamp`` (the last bin gathers every age ≥ 2**16 - 1) finds
    the threshold stamp, then the victims are picked. Only when the threshold falls among the
    very old entries of the last bin does an exact partition of those entries decide it.

    Returns:
        The number of victims written to ``keys_out`` / ``slots_out``.
    """
    nb = index.shape[0]
    if count <= 0:
        return 0
    limit = np.uint64(below_tick)
    top = _HIST_BINS - 1
    hist = np.zeros(_HIST_BINS, dtype=np.int64)
    for b in range(nb):  # branch-light: an empty bucket or a too-new stamp lands in no bin
        v = index[b, 1]
        st = v >> _S32
        ok = (v != 0) & (st < limit)
        age = np.int64(limit - st) if ok else 0
        hist[min(age, top)] += 1 if ok else 0
    n = 0
    for h in range(_HIST_BINS):
        n += hist[h]
    if n == 0:
        return 0
    take_equal = 0
    if count >= n:
        threshold = limit  # everything eligible goes
    else:
        above = 0  # entries strictly older than the threshold
        h = top
        while above + hist[h] < count:
            above += hist[h]
            h -= 1
        if h < top:
            threshold = limit - np.uint64(h)
        else:  # the threshold lies among ages >= top: decide it exactly
            old = np.empty(hist[top], dtype=np.uint64)
            r = 0
            for b in range(nb):
                v = index[b, 1]
                st = v >> _S32
                if v != 0 and st < limit and limit - st >= np.uint64(top):
                    old[r] = st
                    r += 1
            threshold = np.partition(old, count - 1)[count - 1]
            above = 0
            for x in range(r):
                if old[x] < threshold:
                    above += 1
        take_equal = count - above
    out = 0
    for b in range(nb):
        v = index[b, 1]
        if v == 0:
            continue
        st = v >> _S32
        if st < threshold or (st == threshold and take_equal > 0 and st < limit):
            if st == threshold:
                take_equal -= 1
            keys_out[out] = index[b, 0]
            slots_out[out] = np.int64(v & _LOW32) - 1
            out += 1
            if out == count:
                break
    return out


@numba.njit(nogil=True, cache=True, inline="always")
def add_to_sum(scratch, slot, grads, row, uniq_out, sums_out, k):
    """Add ``grads[row]`` to the sum of ``slot``: ``scratch[slot]`` is its position in
    ``sums_out`` (-1 before its first row, which appends it as ``uniq_out[k]``). Returns the
    new count of distinct slots."""
    pos = scratch[slot]
    if pos < 0:
        scratch[slot] = k
        uniq_out[k] = slot
        for j in range(grads.shape[1]):
            sums_out[k, j] = grads[row, j]
        return k + 1
    for j in range(grads.shape[1]):
        sums_out[pos, j] += grads[row, j]
    return k


@numba.njit(nogil=True, cache=True)
def dedup_sum(slots, grads, rows_of, scratch, uniq_out, sums_out):
    """Sum gradient rows that share a slot, in first-appearance order.

    The gradient of ``slots[i]`` is ``grads[rows_of[i]]`` (read in place, no copy). ``scratch``
    is an int64 array over all slots filled with -1; it is restored before return. Negative
    slots are skipped.

    Returns:
        ``k``: ``uniq_out[:k]`` are the distinct slots, ``sums_out[:k]`` their summed gradients.
    """
    k = 0
    for i in range(slots.size):
        s = slots[i]
        if s >= 0:
            k = add_to_sum(scratch, s, grads, rows_of[i], uniq_out, sums_out, k)
    for x in range(k):
        scratch[uniq_out[x]] = -1
    return k


@numba.njit(nogil=True, cache=True)
def scatter_rows(rows, slots, src, flags, flag):
    """``rows[slots[k]] = src[k]`` and ``flags[slots[k]] |= flag`` (publishing prepared rows:
    about 5x faster than numpy's fancy assignment on these shapes)."""
    width = rows.shape[1]
    for k in range(slots.size):
        s = slots[k]
        for j in range(width):
            rows[s, j] = src[k, j]
        flags[s] |= flag
