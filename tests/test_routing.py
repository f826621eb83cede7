"""Id arithmetic: mix64, shard routing, group prefixes, hash stacks and id validation.

Expectations come from pure-Python references over ints modulo 2**64, written from the
published SplitMix64 finaliser and from the formulas in ``embeddb.common.routing``'s docstrings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embeddb.common.routing import (
    ROUTING_ALGORITHM,
    SHARD_SALT,
    STRIPE_SALT,
    Topology,
    as_ids,
    first_foreign,
    hash_stack,
    mix64,
    shard_of,
    split_by_shard,
    with_group_prefix,
)
from embeddb.errors import FailedPreconditionError, InvalidArgumentError

# ---------------------------------------------------------------- pure-Python references
MASK64 = (1 << 64) - 1
# SplitMix64 (Steele, Lea & Flood 2014; constants as in Vigna's splitmix64.c).
GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB

U64_MAX = MASK64
uint64s = st.integers(min_value=0, max_value=U64_MAX)


def ref_mix64(x: int, salt: int = 0) -> int:
    """SplitMix64 finaliser of ``x ^ salt`` on Python ints."""
    z = ((x ^ salt) + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MUL2) & MASK64
    return z ^ (z >> 31)


def _undo_xorshift(y: int, shift: int) -> int:
    """Invert ``y = x ^ (x >> shift)`` on 64-bit ints."""
    x = y
    for _ in range(64 // shift + 1):
        x = y ^ (x >> shift)
    return x


def ref_unmix64(y: int, salt: int = 0) -> int:
    """Inverse of :func:`ref_mix64` (so the finaliser is a bijection)."""
    z = _undo_xorshift(y, 31)
    z = (z * pow(MUL2, -1, 1 << 64)) & MASK64
    z = _undo_xorshift(z, 27)
    z = (z * pow(MUL1, -1, 1 << 64)) & MASK64
    z = _undo_xorshift(z, 30)
    return ((z - GOLDEN) & MASK64) ^ salt


def ref_shard(x: int, num_shards: int) -> int:
    """Lemire multiply-shift of the top 32 bits of mix64(x ^ SHARD_SALT)."""
    hi = ref_mix64(x, int(SHARD_SALT)) >> 32
    return (hi * num_shards) >> 32


def u64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a sort and a diff: much faster than np.unique on uint64)."""
    ordered = np.sort(values)
    keep = np.ones(ordered.size, dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def chi_square(counts: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic against the uniform distribution and its degrees of freedom."""
    counts = counts.astype(np.float64)
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum()), counts.size - 1


def chi_square_bound(df: int) -> float:
    """A generous acceptance bound: mean + 6 standard deviations of chi-square(df)."""
    return df + 6.0 * math.sqrt(2.0 * df)


EDGE_IDS = sorted(
    {0, 1, U64_MAX, U64_MAX - 1}
    | {1 << k for k in range(64)}
    | {(1 << k) - 1 for k in range(1, 65)}
    | {U64_MAX ^ (1 << k) for k in range(64)}
)
SALTS = [0, int(SHARD_SALT), int(STRIPE_SALT), 1, U64_MAX, GOLDEN, 0x0123456789ABCDEF]


# ---------------------------------------------------------------- reference self-checks
def test_reference_matches_published_splitmix64_outputs() -> None:
    """The reference reproduces splitmix64.c's stream for seed 0 (state advanced by GOLDEN)."""
    # splitmix64 with state s returns finalise(s + GOLDEN); from seed 0 the first outputs are
    # finaliser(0), finaliser(GOLDEN), ... (values from Vigna's reference implementation).
    assert ref_mix64(0) == 0xE220A8397B1DCDAF
    assert ref_mix64(GOLDEN) == 0x6E789E6AA1B965F4
    assert ref_mix64(2 * GOLDEN & MASK64) == 0x06C45D188009454F


@given(x=uint64s, salt=uint64s)
def test_reference_inverse_undoes_reference(x: int, salt: int) -> None:
    assert ref_unmix64(ref_mix64(x, salt), salt) == x


# ---------------------------------------------------------------- mix64
@pytest.mark.parametrize("salt", SALTS)
def test_mix64_matches_reference_on_edge_ids(salt: int) -> None:
    got = mix64(u64(EDGE_IDS), np.uint64(salt))
    assert got.dtype == np.uint64 and got.shape == (len(EDGE_IDS),)
    assert [int(v) for v in got] == [ref_mix64(x, salt) for x in EDGE_IDS]


def test_mix64_default_salt_is_no_salt() -> None:
    ids = u64(EDGE_IDS)
    np.testing.assert_array_equal(mix64(ids), mix64(ids, np.uint64(0)))
    assert [int(v) for v in mix64(ids)] == [ref_mix64(x) for x in EDGE_IDS]


def test_mix64_matches_reference_on_random_ids() -> None:
    rng = np.random.default_rng(20240611)
    ids = rng.integers(0, U64_MAX, size=2000, dtype=np.uint64, endpoint=True)
    for salt in SALTS:
        got = mix64(ids, np.uint64(salt))
        assert [int(v) for v in got] == [ref_mix64(int(x), salt) for x in ids]


@pytest.mark.slow
@settings(max_examples=150)
@given(ids=st.lists(uint64s, max_size=40), salt=uint64s)
def test_mix64_matches_reference_on_arbitrary_uint64_lists(ids: list[int], salt: int) -> None:
    got = mix64(u64(ids), np.uint64(salt))
    assert [int(v) for v in got] == [ref_mix64(x, salt) for x in ids]
    # a bijection: the reference inverse recovers every input
    assert [ref_unmix64(int(v), salt) for v in got] == ids


def test_mix64_is_injective_on_a_large_sample() -> None:
    rng = np.random.default_rng(7)
    sequential = np.arange(1 << 19, dtype=np.uint64)
    strided = np.arange(1 << 18, dtype=np.uint64) << np.uint64(24)
    top = np.uint64(U64_MAX) - np.arange(1 << 18, dtype=np.uint64)
    random = rng.integers(0, U64_MAX, size=1 << 19, dtype=np.uint64, endpoint=True)
    ids = distinct(np.concatenate([sequential, strided, top, random]))
    assert ids.size > 1_500_000
    for salt in (0, int(SHARD_SALT)):
        mixed = mix64(ids, np.uint64(salt))
        assert distinct(mixed).size == ids.size


def test_mix64_avalanche_flips_about_half_the_bits() -> None:
    """Keys that differ in one bit differ in about half the output bits (module docstring)."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, U64_MAX, size=4000, dtype=np.uint64, endpoint=True)
    for bit in (0, 1, 31, 32, 63):
        flipped = base ^ np.uint64(1 << bit)
        diff = mix64(base) ^ mix64(flipped)
        mean_flips = np.mean([int(d).bit_count() for d in diff])
        # each of 64 output bits flips with p≈1/2: mean 32, sd of the mean 4/sqrt(4000)≈0.063
        assert abs(mean_flips - 32.0) < 0.5


# ---------------------------------------------------------------- shard_of
@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7, 16])
def test_shard_of_matches_reference(num_shards: int) -> None:
    rng = np.random.default_rng(num_shards)
    ids = np.concatenate(
        [
            u64(EDGE_IDS),
            np.arange(500, dtype=np.uint64),
            rng.integers(0, U64_MAX, size=1500, dtype=np.uint64, endpoint=True),
        ]
    )
    got = shard_of(ids, num_shards)
    assert got.dtype == np.int64 and got.shape == ids.shape
    assert [int(s) for s in got] == [ref_shard(int(x), num_shards) for x in ids]
    assert got.min() >= 0 and got.max() < num_shards


@given(ids=st.lists(uint64s, max_size=30), num_shards=st.integers(1, 1000))
def test_shard_of_matches_reference_on_arbitrary_ids(ids: list[int], num_shards: int) -> None:
    got = shard_of(u64(ids), num_shards)
    assert [int(s) for s in got] == [ref_shard(x, num_shards) for x in ids]


def test_shard_of_validates_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="num_shards"):
        shard_of(u64([1, 2]), 0)
    with pytest.raises(InvalidArgumentError, match="num_shards"):
        shard_of(u64([1, 2]), -3)
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        shard_of(np.array([1, -2], dtype=np.int64), 4)


N_UNIFORM = 60_000
ID_FAMILIES = {
    "sequential": np.arange(N_UNIFORM, dtype=np.uint64),
    "one_group_prefix": with_group_prefix(np.arange(N_UNIFORM, dtype=np.uint64), 5, 8),
    "wide_group_prefix": with_group_prefix(np.arange(N_UNIFORM, dtype=np.uint64), 1, 32),
    "multiples_of_2_20": np.arange(N_UNIFORM, dtype=np.uint64) << np.uint64(20),
    "multiples_of_2_40": np.arange(N_UNIFORM, dtype=np.uint64) << np.uint64(40),
}


@pytest.mark.parametrize("family", sorted(ID_FAMILIES))
@pytest.mark.parametrize("num_shards", [2, 3, 4, 7, 16, 100])
def test_shard_of_spreads_structured_ids_uniformly(family: str, num_shards: int) -> None:
    ids = ID_FAMILIES[family]
    counts = np.bincount(shard_of(ids, num_shards), minlength=num_shards)
    assert counts.size == num_shards and counts.sum() == ids.size
    stat, df = chi_square(counts)
    assert stat < chi_square_bound(df), (family, num_shards, counts)


def test_chi_square_check_rejects_a_skewed_split() -> None:
    """Guard for the uniformity test itself: a plain modulo of multiples of 2**20 fails it."""
    ids = ID_FAMILIES["multiples_of_2_20"]
    counts = np.bincount((ids % np.uint64(16)).astype(np.int64), minlength=16)
    stat, df = chi_square(counts)
    assert stat > chi_square_bound(df)


# ---------------------------------------------------------------- split_by_shard
def check_split(ids: np.ndarray, num_shards: int) -> None:
    order, bounds = split_by_shard(ids, num_shards)
    n = ids.size
    assert order.dtype == np.int64 and bounds.dtype == np.int64
    assert bounds.shape == (num_shards + 1,)
    assert bounds[0] == 0 and bounds[-1] == n
    assert np.all(np.diff(bounds) >= 0)
    assert sorted(order.tolist()) == list(range(n))  # a permutation of the positions
    shards = [ref_shard(int(x), num_shards) for x in ids]
    for k in range(num_shards):
        segment = order[bounds[k] : bounds[k + 1]].tolist()
        # exactly the positions of shard k, in their original relative order
        assert segment == [i for i in range(n) if shards[i] == k]


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7, 16])
def test_split_by_shard_groups_positions_stably(num_shards: int) -> None:
    rng = np.random.default_rng(100 + num_shards)
    ids = rng.integers(0, 1 << 40, size=700, dtype=np.uint64)
    ids = np.concatenate([ids, ids[:100], np.arange(50, dtype=np.uint64)])  # with duplicates
    check_split(ids, num_shards)


@given(ids=st.lists(uint64s, max_size=40), num_shards=st.integers(1, 9))
def test_split_by_shard_on_arbitrary_ids(ids: list[int], num_shards: int) -> None:
    check_split(u64(ids), num_shards)


def test_split_by_shard_of_no_ids() -> None:
    order, bounds = split_by_shard(u64([]), 5)
    assert order.size == 0
    assert bounds.tolist() == [0] * 6


# ---------------------------------------------------------------- with_group_prefix
@settings(max_examples=150)
@given(data=st.data(), ids=st.lists(uint64s, max_size=20), prefix_bits=st.integers(1, 63))
def test_with_group_prefix_arithmetic(
    data: st.DataObject, ids: list[int], prefix_bits: int
) -> None:
    group = data.draw(st.integers(0, (1 << prefix_bits) - 1), label="group")
    got = with_group_prefix(u64(ids), group, prefix_bits)
    assert got.dtype == np.uint64 and got.shape == (len(ids),)
    low_bits = 64 - prefix_bits
    low_mask = (1 << low_bits) - 1
    for x, y in zip(ids, got.tolist(), strict=True):
        assert y >> low_bits == group  # top bits hold the group
        assert y & low_mask == x & low_mask  # low bits are the id's own
        assert y == (group << low_bits) | (x & low_mask)


def test_with_group_prefix_worked_example() -> None:
    got = with_group_prefix(u64([0x2A, U64_MAX]), 3, 8)
    assert got.tolist() == [0x03000000_0000002A, 0x03FFFFFF_FFFFFFFF]


def test_with_group_prefix_separates_groups_and_keeps_one_group_space() -> None:
    ids = np.arange(1000, dtype=np.uint64)
    a = with_group_prefix(ids, 1, 8)
    b = with_group_prefix(ids, 2, 8)
    assert np.intersect1d(a, b).size == 0
    assert np.unique(a).size == ids.size


@given(ids=st.lists(uint64s, max_size=20), group=st.integers(-5, 1 << 70))
def test_zero_prefix_bits_is_identity(ids: list[int], group: int) -> None:
    got = with_group_prefix(u64(ids), group, 0)
    assert got.dtype == np.uint64
    assert got.tolist() == ids


@pytest.mark.parametrize("prefix_bits", [1, 4, 8, 16, 63])
def test_with_group_prefix_rejects_groups_that_do_not_fit(prefix_bits: int) -> None:
    ids = u64([1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="group index"):
        with_group_prefix(ids, 1 << prefix_bits, prefix_bits)
    with pytest.raises(InvalidArgumentError, match="group index"):
        with_group_prefix(ids, -1, prefix_bits)
    # the largest group that fits is accepted
    top = with_group_prefix(ids, (1 << prefix_bits) - 1, prefix_bits)
    assert all(int(v) >> (64 - prefix_bits) == (1 << prefix_bits) - 1 for v in top)


@pytest.mark.parametrize("prefix_bits", [-1, 64, 65, 100])
def test_with_group_prefix_rejects_prefix_bits_out_of_range(prefix_bits: int) -> None:
    with pytest.raises(InvalidArgumentError, match="prefix_bits"):
        with_group_prefix(u64([1]), 0, prefix_bits)


def test_with_group_prefix_validates_ids() -> None:
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        with_group_prefix(np.array([-1], dtype=np.int64), 0, 8)


# ---------------------------------------------------------------- hash_stack
@pytest.mark.parametrize(("rounds", "size"), [(1, 1), (1, 50), (2, 7), (3, 1000), (5, 16)])
def test_hash_stack_shape_and_ranges(rounds: int, size: int) -> None:
    rng = np.random.default_rng(rounds * 1000 + size)
    ids = np.concatenate(
        [u64(EDGE_IDS), rng.integers(0, U64_MAX, size=2000, dtype=np.uint64, endpoint=True)]
    )
    got = hash_stack(ids, rounds, size)
    assert got.dtype == np.uint64 and got.shape == (ids.size, rounds)
    for r in range(rounds):
        col = got[:, r]
        assert col.min() >= r * size and col.max() < (r + 1) * size
    np.testing.assert_array_equal(hash_stack(ids, rounds, size), got)  # deterministic
    # per id: a row does not depend on the rest of the batch
    for i in (0, 5, ids.size - 1):
        np.testing.assert_array_equal(hash_stack(ids[i : i + 1], rounds, size)[0], got[i])


def test_hash_stack_rounds_are_different_hashes() -> None:
    ids = np.arange(5000, dtype=np.uint64)
    size, rounds = 1000, 4
    got = hash_stack(ids, rounds, size).astype(np.int64)
    local = got - np.arange(rounds, dtype=np.int64) * size  # bucket within each round's range
    for r in range(1, rounds):
        # independent rounds agree on an id with probability 1/size: ~5 of 5000 expected
        assert np.count_nonzero(local[:, r] == local[:, 0]) < 50
    # a full collision in every round is rarer still
    assert np.unique(local, axis=0).shape[0] > ids.size - 5
    # each round spreads ids uniformly over its range
    for r in range(rounds):
        stat, df = chi_square(np.bincount(local[:, r] // 50, minlength=size // 50))
        assert stat < chi_square_bound(df)


def test_hash_stack_of_no_ids() -> None:
    got = hash_stack(u64([]), 3, 10)
    assert got.shape == (0, 3) and got.dtype == np.uint64


@pytest.mark.parametrize(("rounds", "size"), [(0, 10), (-1, 10), (2, 0), (2, -5), (0, 0)])
def test_hash_stack_rejects_bad_arguments(rounds: int, size: int) -> None:
    with pytest.raises(InvalidArgumentError, match="hash stack"):
        hash_stack(u64([1, 2]), rounds, size)


def test_hash_stack_validates_ids() -> None:
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        hash_stack(np.array([3, -1], dtype=np.int32), 2, 10)


# ---------------------------------------------------------------- as_ids
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
def test_as_ids_accepts_non_negative_integer_arrays(dtype: type) -> None:
    info = np.iinfo(dtype)
    values = [0, 1, 7, int(info.max)]
    arr = np.array(values, dtype=dtype)
    got = as_ids(arr)
    assert got.dtype == np.uint64 and got.ndim == 1 and got.flags.c_contiguous
    assert got.tolist() == values
    # the caller's array is never modified
    assert arr.tolist() == values and arr.dtype == dtype


def test_as_ids_makes_strided_input_contiguous() -> None:
    base = np.arange(20, dtype=np.uint64)
    got = as_ids(base[::3])
    assert got.flags.c_contiguous and got.tolist() == list(range(0, 20, 3))


@pytest.mark.parametrize(
    "empty", [[], (), np.array([], dtype=np.int64), np.array([], dtype=np.uint32)]
)
def test_as_ids_accepts_empty_input(empty: object) -> None:
    got = as_ids(empty)
    assert got.dtype == np.uint64 and got.shape == (0,)


def test_as_ids_accepts_python_int_lists() -> None:
    assert as_ids([5, 0, 3]).tolist() == [5, 0, 3]
    assert as_ids([U64_MAX]).tolist() == [U64_MAX]


@given(ids=st.lists(uint64s, min_size=1, max_size=20))
def test_as_ids_accepts_python_lists_of_any_uint64_ids(ids: list[int]) -> None:
    got = as_ids(ids)
    assert got.dtype == np.uint64
    assert got.tolist() == ids
    assert as_ids(tuple(ids)).tolist() == ids


@pytest.mark.parametrize("ids", [[1 << 63, 1], [0, U64_MAX], [U64_MAX, U64_MAX - 1, 3]])
def test_as_ids_accepts_python_lists_mixing_high_and_low_ids(ids: list[int]) -> None:
    """numpy alone reads such a list as float64 (losing the low bits); as_ids must not."""
    got = as_ids(ids, name="user_ids")
    assert got.dtype == np.uint64
    assert got.tolist() == ids


@pytest.mark.parametrize("bad", [[1 << 64], [1 << 64, 1], [-1, U64_MAX], [1, 1 << 70]])
def test_as_ids_rejects_python_ints_outside_uint64(bad: list[int]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^user_ids must be non-negative"):
        as_ids(bad, name="user_ids")


@pytest.mark.parametrize("bad", [[1.5, 1 << 63], [1 << 63, 2.0], [None, 1], [1 << 63, "2"]])
def test_as_ids_rejects_mixed_sequences_holding_non_ints(bad: list[object]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^user_ids must be an integer array"):
        as_ids(bad, name="user_ids")


@pytest.mark.parametrize(
    "bad",
    [
        [1.0, 2.0],
        np.array([1.5], dtype=np.float32),
        np.array([3.0], dtype=np.float64),
        np.array([1, 2], dtype=np.float32)[:0],  # an empty float32 array is still floats
        np.array([True, False]),
        ["1", "2"],
    ],
)
def test_as_ids_rejects_non_integer_dtypes(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^user_ids must be an integer array"):
        as_ids(bad, name="user_ids")


@pytest.mark.parametrize(
    "bad",
    [
        np.array([0, -1], dtype=np.int64),
        np.array([-(2**31)], dtype=np.int32),
        np.array([5, 6, -128], dtype=np.int8),
        [-1, 2],
    ],
)
def test_as_ids_rejects_negative_values(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^user_ids must be non-negative"):
        as_ids(bad, name="user_ids")


@pytest.mark.parametrize(
    "bad",
    [np.zeros((2, 3), dtype=np.uint64), [[1, 2], [3, 4]], np.uint64(5), 7, np.zeros((0, 1))],
)
def test_as_ids_rejects_non_1d_input(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^user_ids must be 1-D"):
        as_ids(bad, name="user_ids")


def test_as_ids_default_name_is_ids() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^ids must be non-negative"):
        as_ids(np.array([-4], dtype=np.int64))


# ---------------------------------------------------------------- the language-neutral contract
VECTORS = (
    Path(__file__).resolve().parents[1]
    / "embeddb"
    / "proto"
    / "embeddb"
    / "v1"
    / "routing_test_vectors.json"
)
PROTO = VECTORS.with_name("embeddb.proto")


def _spec_shard(x: int, num_shards: int, salt: int) -> tuple[int, int]:
    """The algorithm exactly as the .proto's header comment writes it (Python ints)."""
    z = ((x ^ salt) + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    h = z ^ (z >> 31)
    return h, ((h >> 32) * num_shards) >> 32


def test_the_routing_test_vectors_match_the_spec_and_shard_of() -> None:
    doc = json.loads(VECTORS.read_text())
    assert doc["algorithm"] == ROUTING_ALGORITHM
    salt = int(doc["salt"], 16)
    assert salt == int(SHARD_SALT)
    vectors = doc["vectors"]
    assert len(vectors) >= 40
    ids = np.array([int(v["id"]) for v in vectors], dtype=np.uint64)
    assert {0, MASK64, 1 << 63} <= {int(i) for i in ids}  # the edges are covered
    for num_shards in range(1, 9):
        got = shard_of(ids, num_shards)
        for v, shard in zip(vectors, got.tolist(), strict=True):
            h, spec = _spec_shard(int(v["id"]), num_shards, salt)
            assert int(v["hash"], 16) == h == ref_mix64(int(v["id"]), salt)
            assert v["shards"][num_shards - 1] == spec == shard, (v, num_shards)
    for k in range(1, 9):  # the vectors exercise every shard of every cluster size
        assert {v["shards"][k - 1] for v in vectors} == set(range(k))


def test_the_proto_states_the_routing_constants() -> None:
    text = PROTO.read_text()
    for constant in ("0x5D1CE0DB5EED0001", "0x9E3779B97F4A7C15", "0xBF58476D1CE4E5B9",
                     "0x94D049BB133111EB", ">> 30", ">> 27", ">> 31", ROUTING_ALGORITHM,
                     "routing_test_vectors.json"):  # fmt: skip
        assert constant in text, constant


@given(st.lists(uint64s, min_size=1, max_size=50), st.integers(1, 40))
@settings(max_examples=150)
def test_first_foreign_finds_the_first_id_of_another_shard(
    values: list[int], num_shards: int
) -> None:
    ids = u64(values)
    owners = shard_of(ids, num_shards)
    for index in range(min(num_shards, 4)):
        foreign = np.flatnonzero(owners != index)
        want = int(foreign[0]) if foreign.size else -1
        assert first_foreign(ids, index, num_shards) == want
        topology = Topology(index, num_shards)
        if want < 0:
            topology.check_owned(ids)
        else:
            with pytest.raises(FailedPreconditionError) as info:
                topology.check_owned(ids, "lookups[2].ids")
            message = str(info.value)
            assert f"lookups[2].ids[{want}] = {values[want]} belongs to shard" in message
            assert f"{owners[want]} of {num_shards}" in message
            assert f"this server (shard {index} of {num_shards})" in message


def test_a_topology_is_validated() -> None:
    for index, count in ((0, 0), (2, 2), (-1, 3), (0, 1 << 32)):
        with pytest.raises(InvalidArgumentError):
            Topology(index, count)
    assert str(Topology(1, 4)) == "shard 1 of 4"
