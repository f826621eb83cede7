"""Creating rows for first-seen ids: the compiled phase 3 of a lookup, placing rows in a stripe,
and the disk tier's stored span (multi-gets skip the ids outside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embeddb.config import OptimizerConfig, OptimizerKind
from embeddb.engine.initializers import initial_vectors, table_key
from embeddb.engine.storage import creation
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, RamStripe
from embeddb.engine.storage.writes import commit, hold
from tests.conftest import MakeShard, ids, sgd

WIDTH = 4


class SpyView:
    """Stands in for a table's RocksDB view: records the keys of every multi-get."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.asked: list[int] = []

    def get(self, keys: list[bytes]) -> Any:
        self.asked.extend(int.from_bytes(k, "big") for k in keys)
        return self.view.get(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)


def spy(disk: DiskTier, table: str) -> SpyView:
    view = SpyView(disk._views[table])
    disk._views[table] = view
    return view


def rows(n: int, start: float = 1.0) -> np.ndarray:
    return np.arange(start, start + n * WIDTH, dtype=np.float32).reshape(n, WIDTH)


# ---------------------------------------------------------------- the disk tier's stored span
def test_an_empty_table_answers_a_multi_get_without_asking_rocksdb(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH})
    try:
        view = spy(disk, "t")
        found, got = disk.get("t", ids(1, 2, 3))
        assert not found.any() and got.shape == (0, WIDTH)
        assert view.asked == []
    finally:
        disk.close()


def test_a_multi_get_asks_rocksdb_only_about_ids_inside_the_stored_span(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH, "u": WIDTH})
    try:
        disk.put("t", ids(300, 100), rows(2))
        disk.put("t", ids(200), rows(1, 50.0))  # inside: the span stays [100, 300]
        view = spy(disk, "t")
        found, got = disk.get("t", ids(99, 100, 150, 200, 301, 300, 7))
        assert found.tolist() == [False, True, False, True, False, True, False]
        np.testing.assert_array_equal(got, np.concatenate([rows(2)[[1]], rows(1, 50.0), rows(1)]))
        assert sorted(view.asked) == [100, 150, 200, 300]
        assert disk.get("u", ids(100))[0].tolist() == [False]  # each table its own span
        disk.delete("t", ids(100, 300))  # a delete keeps the span (it may only be too wide)
        assert disk.get("t", ids(100, 200, 300))[0].tolist() == [False, True, False]
    finally:
        disk.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_the_stored_span_is_read_back_when_the_tier_opens(tmp_path: Path, read_only: bool) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH, "u": WIDTH})
    disk.put("t", ids(10, 2**64 - 1, 500), rows(3))
    disk.close()
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH, "u": WIDTH}, read_only=read_only)
    try:
        view, other = spy(disk, "t"), spy(disk, "u")
        found, got = disk.get("t", ids(9, 10, 500, 2**64 - 1))
        assert found.tolist() == [False, True, True, True]
        np.testing.assert_array_equal(got, rows(3)[[0, 2, 1]])
        assert sorted(view.asked) == [10, 500, 2**64 - 1]
        assert not disk.get("u", ids(10))[0].any() and other.asked == []
    finally:
        disk.close()


# ---------------------------------------------------------------- placing rows in a stripe
def test_place_puts_rows_in_the_slots_take_slots_would_pop_with_their_flags() -> None:
    stripe, twin = RamStripe(8, WIDTH), RamStripe(8, WIDTH)
    twin.take_slots(2)
    stripe.take_slots(2)
    keys = ids(5, 6, 7, 8)
    on_disk = np.array([True, False, True, False])
    assert stripe.place(keys, rows(4), on_disk, tick=9, dirty=False) == 2
    slots = twin.take_slots(4)
    assert stripe.n_free == twin.n_free == 2
    got_ids, got_slots = stripe.resident()
    assert dict(zip(got_ids.tolist(), got_slots.tolist(), strict=True)) == dict(
        zip(keys.tolist(), slots.tolist(), strict=True)
    )
    np.testing.assert_array_equal(stripe.rows[slots], rows(4))
    np.testing.assert_array_equal(stripe.ids[slots], keys)
    assert stripe.flags[slots].tolist() == [ON_DISK, DIRTY, ON_DISK, DIRTY]
    stamps = stripe.index[stripe.index[:, 1] != 0, 1] >> np.uint64(32)
    assert stamps.tolist() == [9] * 4
    # dirty: every placed row differs from its disk copy
    assert stripe.place(ids(1, 2), rows(2), np.array([True, False]), tick=10, dirty=True) == 1
    assert stripe.flags[twin.take_slots(2)].tolist() == [ON_DISK | DIRTY, DIRTY]


def test_place_keeps_colliding_ids_findable(make_shard: MakeShard) -> None:
    """Many ids into a small index: probe chains form inside one block of inserts."""
    stripe = RamStripe(200, WIDTH)
    keys = np.arange(1000, 1200, dtype=np.uint64)
    stripe.place(keys, rows(200), np.zeros(200, bool), tick=1, dirty=False)
    got_ids, got_slots = stripe.resident()
    assert sorted(got_ids.tolist()) == keys.tolist()
    np.testing.assert_array_equal(stripe.rows[got_slots], rows(200)[(got_ids - 1000).astype(int)])


# ---------------------------------------------------------------- a lookup's phase 3
def test_a_lookup_answers_resident_disk_and_new_ids_each_from_its_tier(
    make_shard: MakeShard,
) -> None:
    adagrad = OptimizerConfig(kind=OptimizerKind.ADAGRAD, initial_accumulator=0.25)
    shard = make_shard(dim=4, capacity=16, stripes=4, optimizer=adagrad)
    old = np.arange(40, dtype=np.uint64)
    before = shard.lookup("t", old)  # more than fits: the oldest rows go to disk
    spec = shard.config.tables["t"]
    new = ids(1000, 1001)
    query = np.concatenate([old[[39, 0, 39, 1]], new, new[[0]]])
    stats = shard.stats().tables["t"]
    got = shard.lookup("t", query)
    np.testing.assert_array_equal(got[:4], before[[39, 0, 39, 1]])
    want = initial_vectors(new, 4, spec.initializer, table_key("t", spec.seed))
    np.testing.assert_array_equal(got[4:], want[[0, 1, 0]])
    after = shard.stats().tables["t"]
    assert after.lookup_ids - stats.lookup_ids == 7
    assert after.misses - stats.misses == 3 and after.admitted - stats.admitted == 2
    assert after.ram_hits + after.disk_hits - stats.ram_hits - stats.disk_hits == 4
    for stripe in shard._tables["t"].stripes:  # created rows: Adagrad's state, dirty, no copy
        keys, slots = stripe.resident()
        mine = np.isin(keys, new)
        assert (stripe.rows[slots[mine], 4:] == np.float32(0.25)).all()
        assert (stripe.flags[slots[mine]] == DIRTY).all()


def test_admission_draws_once_per_new_id_from_the_stripes_generator(
    make_shard: MakeShard,
) -> None:
    """Two shards of one seed admit the same ids, whatever else the lookups held."""
    a = make_shard(capacity=5000, stripes=4, admit_probability=0.5)
    b = make_shard(capacity=5000, stripes=4, admit_probability=0.5)
    first = np.arange(100, dtype=np.uint64)
    a.lookup("t", first)
    b.lookup("t", np.concatenate([first, first[::3]]))  # duplicates draw nothing more
    second = np.arange(100, 2000, dtype=np.uint64)
    np.testing.assert_array_equal(a.lookup("t", second), b.lookup("t", second))
    sa, sb = a.stats().tables["t"], b.stats().tables["t"]
    assert (sa.admitted, sa.rejected) == (sb.admitted, sb.rejected)
    assert 800 < sa.admitted < 1200  # Binomial(2000, 0.5) over both lookups


def test_rows_another_call_created_between_the_phases_are_answered_not_created_again(
    make_shard: MakeShard,
) -> None:
    """Phase 3 re-probes a stripe that placed rows since phase 1 (else it skips the probe)."""
    shard = make_shard(capacity=100, stripes=4, optimizer=sgd())
    table = shard._tables["t"]
    query = np.arange(40, dtype=np.uint64)
    plan = table.lookup_begin(query, train=True)  # every id missed
    shard.lookup("t", query[::2])  # another call creates half of them, then trains them
    shard.apply_gradients("t", query[::2], np.ones((20, 4), dtype=np.float32))
    trained = shard.lookup("t", query[::2], train=False)
    with hold(table.lookup_locks(plan)):
        (out,) = commit([table.prepare_lookup(plan)], table.journal)
    np.testing.assert_array_equal(out[::2], trained)
    spec = shard.config.tables["t"]
    want = initial_vectors(query[1::2], 4, spec.initializer, table_key("t", spec.seed))
    np.testing.assert_array_equal(out[1::2], want)
    stats = shard.stats().tables["t"]
    assert stats.ram_rows == 40 and stats.admitted == 40
    np.testing.assert_array_equal(shard.lookup("t", query, train=False), out)


@pytest.mark.parametrize(
    "keys",
    [
        np.random.default_rng(1).integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True),
        np.uint64(1 << 40) + np.random.default_rng(2).integers(0, 3000, 5000).astype(np.uint64),
        np.array([2**64 - 1, 0, 7, 2**64 - 1, 7, 1 << 16, 1 << 32, 1 << 48], dtype=np.uint64),
        np.full(3, 9, dtype=np.uint64),
    ],
    ids=["random", "shared-high-digits", "edges", "one-value"],
)
def test_sorted_unique_is_numpys_unique_with_inverse(keys: np.ndarray) -> None:
    uniq = np.empty(keys.size, dtype=np.uint64)
    inverse = np.empty(keys.size, dtype=np.int64)
    k = creation.sorted_unique(keys, uniq, inverse)
    want_uniq, want_inverse = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(uniq[:k], want_uniq)
    np.testing.assert_array_equal(inverse, want_inverse)
