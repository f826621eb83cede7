"""The compiled ownership check of :func:`embeddb.common.routing.first_foreign`.

Apart from :mod:`embeddb.common.routing` so that importing the routing functions (the client, tools)
does not load numba.
"""

from __future__ import annotations

import numba
import numpy as np

from embeddb.common.splitmix import GAMMA, MULTIPLIER_1, MULTIPLIER_2, SHIFT_1, SHIFT_2, SHIFT_3

__all__ = ["first_foreign_kernel", "mix"]


@numba.njit(nogil=True, cache=True, inline="always")
def mix(z):
    """:func:`embeddb.common.routing.mix64` of one uint64, compiled: the one copy every kernel
    inlines
    (``storage.hash_index``, ``initializers``, ``client._kernels``, the ownership check)."""
    z = z + GAMMA
    z = (z ^ (z >> SHIFT_1)) * MULTIPLIER_1
    z = (z ^ (z >> SHIFT_2)) * MULTIPLIER_2
    return z ^ (z >> SHIFT_3)


@numba.njit(nogil=True, cache=True)
def first_foreign_kernel(ids, salt, num_shards, shard_index):
    """Position of the first id whose shard is not ``shard_index`` (-1: none); ``shard_of``
    fused into one pass."""
    count = np.uint64(num_shards)
    want = np.uint64(shard_index)
    for i in range(ids.size):
        z = mix(ids[i] ^ salt)
        if ((z >> np.uint64(32)) * count) >> np.uint64(32) != want:
            return i
    return -1
