"""Every compiled copy of the SplitMix64 mix equals :func:`embeddb.common.routing.mix64`.

The constants live once, in :mod:`embeddb.common.splitmix`; each numba module inlines the four-line
mix
on one id (numba freezes the constants when it compiles). These tests call each compiled copy,
and the kernels built on it, on edge-case ids and compare with the numpy reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from embeddb.client import _kernels as client_kernels
from embeddb.common import _routing_kernel
from embeddb.common.routing import SHARD_SALT, STRIPE_SALT, mix64
from embeddb.config import InitializerConfig
from embeddb.engine import initializers
from embeddb.engine.storage import hash_index

U64_MAX = (1 << 64) - 1
EDGE_IDS = np.array(
    sorted(
        {0, 1, 2, 3, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 63) + 1}
        | {U64_MAX - 1, U64_MAX, 0x9E37_79B9_7F4A_7C15, 0x0123_4567_89AB_CDEF}
        | {1 << k for k in range(0, 64, 7)}
    ),
    dtype=np.uint64,
)

COMPILED_MIXES: dict[str, Callable[[np.uint64], np.uint64]] = {
    "embeddb.common._routing_kernel": _routing_kernel.mix,
    "embeddb.engine.initializers": initializers._mix,
    "embeddb.engine.storage.hash_index": hash_index._mix,
    "embeddb.client._kernels": client_kernels._mix,
}


@pytest.mark.parametrize("module", sorted(COMPILED_MIXES))
def test_compiled_mix_equals_mix64(module: str) -> None:
    mix = COMPILED_MIXES[module]
    got = np.array([mix(x) for x in EDGE_IDS], dtype=np.uint64)
    np.testing.assert_array_equal(got, mix64(EDGE_IDS))


@pytest.mark.parametrize("num_shards", [1, 3, 7, 1 << 32])
def test_first_foreign_kernel_routes_like_mix64(num_shards: int) -> None:
    # With 2**32 shards the shard index is the top 32 mixed bits themselves.
    shards = (mix64(EDGE_IDS, SHARD_SALT) >> np.uint64(32)) * np.uint64(num_shards) >> np.uint64(32)
    for shard in {int(s) for s in shards} | {num_shards - 1}:
        foreign = np.flatnonzero(shards != np.uint64(shard))
        want = int(foreign[0]) if foreign.size else -1
        got = _routing_kernel.first_foreign_kernel(EDGE_IDS, SHARD_SALT, num_shards, shard)
        assert got == want, (num_shards, shard)


def test_hash_index_partition_and_home_use_mix64() -> None:
    shift, n_stripes = 61, 8
    order = np.empty(EDGE_IDS.size, dtype=np.int64)
    grouped = np.empty(EDGE_IDS.size, dtype=np.uint64)
    bounds = np.empty(n_stripes + 1, dtype=np.int64)
    hash_index.partition(EDGE_IDS, shift, n_stripes, order, grouped, bounds)
    stripes = (mix64(EDGE_IDS, STRIPE_SALT) >> np.uint64(shift)).astype(np.int64)
    want_order = np.argsort(stripes, kind="stable")
    np.testing.assert_array_equal(order, want_order)
    np.testing.assert_array_equal(grouped, EDGE_IDS[want_order])
    np.testing.assert_array_equal(np.diff(bounds), np.bincount(stripes, minlength=n_stripes))

    mask = np.uint64(1023)
    homes = [hash_index._home(x, mask) for x in EDGE_IDS]
    np.testing.assert_array_equal(homes, mix64(EDGE_IDS, hash_index.BUCKET_SALT) & mask)


def test_uniform_initializer_draws_from_mix64() -> None:
    dim, low, high = 3, -0.5, 0.25
    key = initializers.table_key("t", 7)
    got = initializers.initial_vectors(EDGE_IDS, dim, InitializerConfig(low=low, high=high), key)
    base = mix64(EDGE_IDS, key)
    with np.errstate(over="ignore"):
        counters = base[:, None] + np.arange(dim, dtype=np.uint64)[None, :] * np.uint64(2)
    u = (mix64(counters.ravel()) >> np.uint64(40)).astype(np.float64).reshape(counters.shape)
    want = (low + (high - low) * (u * (1.0 / 16777216.0))).astype(np.float32)
    np.testing.assert_array_equal(got, want)
