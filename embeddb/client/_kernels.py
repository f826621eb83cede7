"""Compiled batch kernels of the client: hash deduplication and per-id row combination.

Deduplication is one pass over the ids with an open-addressing table of twice the batch size
(linear probing from a SplitMix64 hash), so it costs O(n) instead of a sort: 65,536 distinct ids
take about 0.5 ms here against 4.8 ms for ``np.argsort(kind="stable")``. Unique ids come out in
**first-occurrence order**, so a batch without duplicates is its own unique list and needs no
gather on the way out or back.
"""

from __future__ import annotations

import numba
import numpy as np

from embeddb.common._routing_kernel import mix as _mix

__all__ = ["dedup", "dedup_segments", "last_rows", "sum_rows"]


@numba.njit(nogil=True, cache=True)
def dedup(ids, unique_out, inverse_out, counts_out):
    """Distinct ids in first-occurrence order.

    Writes ``unique_out[:k]``, ``counts_out[:k]`` and ``inverse_out`` (``ids[i] ==
    unique_out[inverse_out[i]]``); all outputs hold ``ids.size`` entries. Returns ``k``.
    """
    table = np.empty(_buckets(ids.size), dtype=np.int64)  # bucket → position in unique_out
    return _dedup_range(ids, 0, ids.size, table, 0, unique_out, inverse_out, counts_out)


@numba.njit(nogil=True, cache=True)
def sum_rows(values, inverse, out):
    """``out[inverse[i]] += values[i]`` for every row, in input order (``out`` starts zeroed)."""
    dim = values.shape[1]
    for i in range(inverse.size):
        r = inverse[i]
        for j in range(dim):
            out[r, j] += values[i, j]


@numba.njit(nogil=True, cache=True)
def last_rows(values, inverse, out):
    """``out[inverse[i]] = values[i]`` in input order, so the last occurrence wins."""
    dim = values.shape[1]
    for i in range(inverse.size):
        r = inverse[i]
        for j in range(dim):
            out[r, j] = values[i, j]


@numba.njit(nogil=True, cache=True)
def dedup_segments(ids, bounds, unique_out, inverse_out, counts_out, unique_bounds_out):
    """:func:`dedup` of each segment ``ids[bounds[t]:bounds[t + 1]]`` on its own (one table's
    ids each), in one call.

    Segment ``t``'s distinct ids land in ``unique_out[unique_bounds_out[t]:unique_bounds_out[t
    + 1]]`` in first-occurrence order; ``inverse_out[i]`` indexes the whole ``unique_out`` (so
    ``ids == unique_out[inverse_out]``). Outputs hold ``ids.size`` entries
    (``unique_bounds_out``: ``bounds.size``). Returns the number of distinct ids, all segments
    together.
    """
    largest = 0
    for t in range(bounds.size - 1):
        largest = max(largest, bounds[t + 1] - bounds[t])
    table = np.empty(_buckets(largest), dtype=np.int64)  # bucket → position in unique_out
    k = 0
    unique_bounds_out[0] = 0
    for t in range(bounds.size - 1):
        k = _dedup_range(
            ids, bounds[t], bounds[t + 1], table, k, unique_out, inverse_out, counts_out
        )
        unique_bounds_out[t + 1] = k
    return k


@numba.njit(nogil=True, cache=True, inline="always")
def _buckets(n):
    """The open-addressing table's size for ``n`` ids: a power of two, at least twice ``n``."""
    buckets = 16
    while buckets < 2 * n:
        buckets *= 2
    return buckets


@numba.njit(nogil=True, cache=True, inline="always")
def _dedup_range(ids, start, stop, table, k, unique_out, inverse_out, counts_out):
    """Deduplicate ``ids[start:stop]`` into ``unique_out[k:]`` (linear probing in ``table``,
    reset here); returns the new ``k``."""
    size = _buckets(stop - start)
    mask = np.uint64(size - 1)
    table[:size] = -1
    for i in range(start, stop):
        key = ids[i]
        b = _mix(key) & mask
        while True:
            pos = table[b]
            if pos < 0:
                table[b] = k
                unique_out[k] = key
                counts_out[k] = 1
                inverse_out[i] = k
                k += 1
                break
            if unique_out[pos] == key:
                counts_out[pos] += 1
                inverse_out[i] = pos
                break
            b = (b + np.uint64(1)) & mask
    return k
