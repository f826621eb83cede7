"""The compiled ownership check of :func:`embeddb.routing.first_foreign`.

Apart from :mod:`embeddb.routing` so that importing the routing functions (the client, tools)
does not load numba.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["first_foreign_kernel"]


@numba.njit(nogil=True, cache=True)
def first_foreign_kernel(ids, salt, num_shards, shard_index):
    """Position of the first id whose shard is not ``shard_index`` (-1: none); ``shard_of``
    fused into one pass."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    count = np.uint64(num_shards)
    want = np.uint64(shard_index)
    for i in range(ids.size):
        z = (ids[i] ^ salt) + golden
        z = (z ^ (z >> np.uint64(30))) * m1
        z = (z ^ (z >> np.uint64(27))) * m2
        z = z ^ (z >> np.uint64(31))
        if ((z >> np.uint64(32)) * count) >> np.uint64(32) != want:
            return i
    return -1
