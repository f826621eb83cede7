"""The compiled string hash of :func:`embeddb.features.hashing.hash_fields`.

Apart from :mod:`.hashing` so that importing the data package (the launcher does, without
torch) does not load numba: the kernel is imported on the first hash.

One pass over the bytes of every field, O(total bytes) whatever the lengths: the chain of a
field is sequential (each word's mix depends on the previous one), so numpy could only
vectorise it across fields, one word position at a time, which costs a Python iteration per
8 bytes of the longest field (a 4 MB id: half a million).
"""

from __future__ import annotations

import numba
import numpy as np

from embeddb.common._routing_kernel import mix

__all__ = ["hash_ranges"]


@numba.njit(nogil=True, cache=True)
def hash_ranges(buf, starts, ends, seed, out):  # type: ignore[no-untyped-def]
    """``out[i]``: the hash of ``buf[starts[i]:ends[i]]`` under ``seed`` (the chain of the
    :mod:`~embeddb.features.hashing` docstring: 8-byte little-endian words, the last
    zero-padded, then the length)."""
    for i in range(starts.size):
        start = starts[i]
        end = ends[i]
        h = seed
        p = start
        while p + 8 <= end:
            word = np.uint64(0)
            for b in range(8):
                word |= np.uint64(buf[p + b]) << np.uint64(8 * b)
            h = mix(h ^ word)
            p += 8
        if p < end:
            word = np.uint64(0)
            for b in range(end - p):
                word |= np.uint64(buf[p + b]) << np.uint64(8 * b)
            h = mix(h ^ word)
        out[i] = mix(h ^ np.uint64(end - start))
