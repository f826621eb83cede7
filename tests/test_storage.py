"""The tiered store: LRU eviction, spill/promotion, admission, one-tier invariant, reopen."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embeddb.config import EmbeddingConfig, UpdateLogConfig
from embeddb.engine.initializers import initial_vectors, table_key
from embeddb.engine.shard import Shard
from embeddb.errors import CorruptDataError, StorageError
from tests.conftest import MakeShard, ids, one_table_config, sgd


def resident_ids(shard: Shard, table: str = "t") -> set[int]:
    out: set[int] = set()
    for stripe in shard._tables[table].stripes:
        keys, _ = stripe.resident()
        out.update(int(k) for k in keys)
    return out


def disk_ids(shard: Shard, table: str = "t") -> set[int]:
    out: set[int] = set()
    for chunk, _ in shard._disk.iter_rows(table):
        out.update(int(k) for k in chunk)
    return out


@pytest.mark.slow
def test_new_rows_get_the_deterministic_initial_vector(make_shard: MakeShard) -> None:
    shard = make_shard(dim=8, capacity=100)
    got = shard.lookup("t", ids(5, 1, 99))
    spec = shard.config.tables["t"]
    want = initial_vectors(ids(5, 1, 99), 8, spec.initializer, table_key("t", spec.seed))
    np.testing.assert_array_equal(got, want)
    assert np.all(np.abs(got) <= 0.01) and np.unique(got).size == got.size


def test_lookup_keeps_order_and_duplicates(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=100, stripes=4)
    first = shard.lookup("t", np.arange(20))
    query = ids(7, 3, 7, 19, 0, 3)
    np.testing.assert_array_equal(shard.lookup("t", query), first[query.astype(np.int64)])
    assert shard.lookup("t", ids()).shape == (0, 4)


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    accesses=st.lists(st.integers(0, 30), min_size=1, max_size=120),
    capacity=st.integers(1, 12),
)
def test_single_id_lookups_follow_exact_lru(
    make_shard: MakeShard, accesses: list[int], capacity: int
) -> None:
    """With one id per call and evictions of exactly what is needed, the resident set is the
    ``capacity`` most recently used ids, call after call."""
    shard = make_shard(capacity=capacity, stripes=1, eviction_chunk=1e-6, eviction="lru")
    model: OrderedDict[int, None] = OrderedDict()
    for x in accesses:
        shard.lookup("t", ids(x))
        model[x] = None
        model.move_to_end(x)
        while len(model) > capacity:
            model.popitem(last=False)
        assert resident_ids(shard) == set(model)
    stats = shard.stats().tables["t"]
    assert stats.ram_rows == len(model) <= capacity
    assert stats.rows == len(set(accesses))


@pytest.mark.slow
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(
        st.lists(st.integers(0, 200), min_size=0, max_size=40), min_size=1, max_size=15
    ),
    capacity=st.integers(4, 64),
    stripes=st.sampled_from([1, 2, 4]),
)
@pytest.mark.parametrize("eviction", ["lru", "tinylfu"])
def test_random_batches_keep_values_bounds_and_clean_copies(
    make_shard: MakeShard, batches: list[list[int]], capacity: int, stripes: int, eviction: str
) -> None:
    """Under random batch workloads (chunked eviction, several stripes, overflowing calls):
    every row keeps its value across any number of spills, RAM never exceeds capacity, every
    row is in RAM or on disk, and a resident row's disk copy (kept clean by lookups) equals it.
    Both eviction policies."""
    shard = make_shard(capacity=capacity, stripes=stripes, eviction_chunk=0.25, eviction=eviction)
    seen: dict[int, np.ndarray] = {}
    for batch in batches:
        got = shard.lookup("t", np.array(batch, dtype=np.uint64))
        for x, row in zip(batch, got, strict=True):
            if x in seen:
                np.testing.assert_array_equal(row, seen[x])
            seen[x] = row.copy()
        ram, disk = resident_ids(shard), disk_ids(shard)
        assert ram | disk == set(seen)
        both = np.array(sorted(ram & disk), dtype=np.uint64)
        _, in_ram = shard.peek("t", both)
        _, on_disk = shard._disk.get("t", both)
        np.testing.assert_array_equal(on_disk, in_ram)
        stats = shard.stats().tables["t"]
        assert stats.ram_rows == len(ram) <= capacity
        assert stats.disk_rows == len(disk)
        assert stats.rows == len(seen)


def test_eviction_prefers_least_recent_and_eval_lookups_do_not_refresh(
    make_shard: MakeShard,
) -> None:
    shard = make_shard(capacity=4, stripes=1)
    for x in range(4):
        shard.lookup("t", ids(x))  # recency order: 0 (oldest) .. 3
    shard.lookup("t", ids(0), train=True)  # 0 becomes newest; 1 is now the oldest
    shard.lookup("t", ids(1), train=False)  # evaluation: must not save 1
    shard.lookup("t", ids(10))
    assert resident_ids(shard) == {0, 2, 3, 10}
    assert disk_ids(shard) == {1}


def test_eval_lookup_never_inserts_or_promotes(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=2, stripes=1)
    created = shard.lookup("t", ids(1, 2, 3))  # 3 rows, capacity 2: one spilled
    before = shard.stats().tables["t"]
    got = shard.lookup("t", ids(1, 2, 3, 77), train=False)
    np.testing.assert_array_equal(got[:3], created)
    np.testing.assert_array_equal(got[3], np.zeros(4, np.float32))  # unknown: zeros
    after = shard.stats().tables["t"]
    assert (after.ram_rows, after.disk_rows) == (before.ram_rows, before.disk_rows)
    assert after.promoted == before.promoted and after.admitted == before.admitted
    assert after.misses == before.misses + 1 and after.disk_hits == before.disk_hits + 1


def test_spill_and_promotion_preserve_vector_and_state_bit_for_bit(make_shard: MakeShard) -> None:
    shard = make_shard(dim=6, capacity=8, stripes=1, eviction="lru")  # asserts LRU order
    hot = np.arange(8, dtype=np.uint64)
    shard.lookup("t", hot)
    rng = np.random.default_rng(1)
    shard.apply_gradients("t", hot, rng.normal(size=(8, 6)).astype(np.float32))
    found, before = shard.peek("t", hot)
    assert found.all() and np.any(before[:, 6:] != 0.01)  # Adagrad state has moved
    shard.lookup("t", np.arange(100, 108, dtype=np.uint64))  # evicts all eight
    assert resident_ids(shard).isdisjoint(int(x) for x in hot)
    found, on_disk = shard.peek("t", hot)
    np.testing.assert_array_equal(on_disk, before)
    shard.lookup("t", hot)  # promotes them back
    assert set(int(x) for x in hot) <= resident_ids(shard)
    found, promoted = shard.peek("t", hot)
    assert found.all()
    assert before.tobytes() == promoted.tobytes()
    stats = shard.stats().tables["t"]
    assert stats.promoted == 8 and stats.evicted >= 16


def test_admission_probability(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=10_000, admit_probability=0.3, stripes=4)
    got = shard.lookup("t", np.arange(4000, dtype=np.uint64))
    stats = shard.stats().tables["t"]
    admitted = stats.ram_rows
    assert stats.admitted == admitted and stats.rejected == 4000 - admitted
    assert 1000 < admitted < 1400  # Binomial(4000, 0.3): mean 1200, sd 29
    zero_rows = int((~got.any(axis=1)).sum())
    assert zero_rows == stats.rejected  # unadmitted ids read as zeros and store nothing
    again = shard.lookup("t", np.arange(4000, dtype=np.uint64))
    assert shard.stats().tables["t"].ram_rows > admitted  # a rejected id may be admitted later
    kept = got.any(axis=1)
    np.testing.assert_array_equal(again[kept], got[kept])


def test_single_call_larger_than_capacity_overflows_to_disk(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=5, stripes=1)
    many = np.arange(40, dtype=np.uint64)
    first = shard.lookup("t", many)
    stats = shard.stats().tables["t"]
    assert stats.ram_rows == 5 and stats.disk_rows == 35 and stats.overflow == 35
    np.testing.assert_array_equal(shard.lookup("t", many), first)
    grads = np.ones((40, 4), dtype=np.float32)
    result = shard.apply_gradients("t", many, grads)  # most rows cannot be resident at once
    assert result.applied == 40 and result.missing == 0
    _, rows = shard.peek("t", many)
    assert np.all(rows[:, :4] < first)  # every row moved against its gradient


def test_delete_removes_from_both_tiers(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=3, stripes=1)
    shard.lookup("t", np.arange(6, dtype=np.uint64))  # 3 in RAM, 3 on disk
    assert shard.delete("t", ids(0, 5, 5, 42)) == 2
    found, _ = shard.peek("t", np.arange(6, dtype=np.uint64))
    assert found.tolist() == [False, True, True, True, True, False]
    assert 0 not in disk_ids(shard) | resident_ids(shard)
    assert 5 not in disk_ids(shard) | resident_ids(shard)
    stats = shard.stats().tables["t"]
    assert stats.rows == 4 and stats.deleted_rows == 2


def test_assign_creates_overwrites_resets_state_last_wins(make_shard: MakeShard) -> None:
    shard = make_shard(dim=2, capacity=2, stripes=1)
    shard.lookup("t", ids(1))
    shard.apply_gradients("t", ids(1), np.ones((1, 2), np.float32))
    vectors = np.array([[1, 1], [2, 2], [3, 3], [4, 4]], dtype=np.float32)
    assert shard.assign("t", ids(1, 7, 1, 8), vectors) == 3
    found, rows = shard.peek("t", ids(1, 7, 8))
    assert found.all()
    np.testing.assert_array_equal(rows[:, :2], [[3, 3], [2, 2], [4, 4]])
    np.testing.assert_array_equal(rows[:, 2:], np.full((3, 2), 0.01, np.float32))  # reset
    assert shard.stats().tables["t"].ram_rows == 2  # capacity respected, one row on disk


def test_clean_close_and_reopen_keeps_every_row(make_shard: MakeShard, tmp_path) -> None:
    cfg = one_table_config(capacity=10)
    shard = make_shard(cfg, data_dir=tmp_path / "d")
    universe = np.arange(50, dtype=np.uint64)
    shard.lookup("t", universe)
    shard.apply_gradients("t", universe[::2], np.full((25, 4), 0.5, np.float32))
    _, before = shard.peek("t", universe)
    shard.close()
    reopened = make_shard(cfg, data_dir=tmp_path / "d")
    stats = reopened.stats().tables["t"]
    assert stats.ram_rows == 0 and stats.disk_rows == 50
    found, after = reopened.peek("t", universe)
    assert found.all()
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(reopened.lookup("t", universe), before[:, :4])


def _crash(shard: Shard) -> None:
    """Simulate a process crash: drop the shard without flushing RAM or writing a marker."""
    shard._pool.close()
    shard._log.close()  # releases the log's lock, as the kernel does for a dead process
    shard._disk.close()
    shard._lock.release()  # and the data directory's


def test_unclean_shutdown_is_recovered_from_the_update_log(tmp_path) -> None:
    cfg = one_table_config(capacity=4)
    shard = Shard(cfg, tmp_path / "d")
    universe = np.arange(10, dtype=np.uint64)
    shard.lookup("t", universe)
    shard.apply_gradients("t", universe[:6], np.ones((6, 4), np.float32))
    shard.delete("t", universe[8:])
    found_before, before = shard.peek("t", universe)
    _crash(shard)  # RAM rows never reached disk, no marker written
    reopened = Shard(cfg, tmp_path / "d")
    try:
        assert reopened.recovery.source == "log"
        assert reopened.recovery.replayed == reopened.seq > 0
        found, after = reopened.peek("t", universe)
        np.testing.assert_array_equal(found, found_before)
        np.testing.assert_array_equal(after, before)
        assert reopened.stats().tables["t"].rows == 8
    finally:
        reopened.close()


def test_a_directory_without_log_or_marker_is_refused(tmp_path) -> None:
    cfg = one_table_config(capacity=4)
    cfg = replace(cfg, store=replace(cfg.store, log=UpdateLogConfig(enabled=False)))
    shard = Shard(cfg, tmp_path / "d")
    shard.lookup("t", np.arange(10, dtype=np.uint64))
    shard._pool.close()
    shard._disk.close()  # a crash with no update log: RAM rows are lost
    shard._lock.release()  # as the kernel does for a dead process
    with pytest.raises(StorageError, match="not shut down cleanly"):
        Shard(cfg, tmp_path / "d")


def test_reopen_with_a_changed_table_shape_is_refused(make_shard: MakeShard, tmp_path) -> None:
    shard = make_shard(one_table_config(dim=4), data_dir=tmp_path / "d")
    shard.lookup("t", np.arange(10, dtype=np.uint64))
    shard.close()
    with pytest.raises(CorruptDataError, match="dim 4"):
        Shard(one_table_config(dim=8), tmp_path / "d")
    with pytest.raises(CorruptDataError, match="width"):
        Shard(one_table_config(dim=4, optimizer=sgd()), tmp_path / "d")
    Shard(one_table_config(dim=4), tmp_path / "d").close()  # the data survived the refusals


def test_corrupt_shutdown_record_is_refused(make_shard: MakeShard, tmp_path) -> None:
    shard = make_shard(data_dir=tmp_path / "d")
    shard.lookup("t", ids(1))
    shard.close()
    (tmp_path / "d" / "clean-shutdown.json").write_text("{not json")
    with pytest.raises(CorruptDataError, match=r"clean-shutdown\.json"):
        Shard(shard.config, tmp_path / "d")


def test_stats_count_tier_hits(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=2, stripes=1)
    shard.lookup("t", ids(1, 2))  # 2 misses, admitted
    shard.lookup("t", ids(1, 1))  # 2 RAM hits
    shard.lookup("t", ids(3))  # miss; evicts 2
    shard.lookup("t", ids(2))  # disk hit, promoted; evicts 1
    s = shard.stats().tables["t"]
    assert (s.lookup_ids, s.ram_hits, s.disk_hits, s.misses) == (6, 2, 1, 3)
    assert (s.admitted, s.evicted, s.written_back, s.promoted) == (3, 2, 2, 1)
    assert (s.rows, s.ram_rows, s.disk_rows) == (3, 2, 2)  # 2 is resident with a clean copy


def test_write_back_writes_only_dirty_rows(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=2, stripes=1, eviction="lru")  # asserts LRU victims
    shard.lookup("t", ids(1, 2))  # new rows: dirty
    shard.lookup("t", ids(3, 4))  # evicts 1, 2: both written
    assert shard.stats().tables["t"].written_back == 2
    shard.lookup("t", ids(1, 2))  # promoted clean; evicts dirty 3, 4 (written)
    assert shard.stats().tables["t"].written_back == 4
    shard.apply_gradients("t", ids(1), np.ones((1, 4), np.float32))  # 1 becomes dirty
    _, updated = shard.peek("t", ids(1))
    shard.lookup("t", ids(3, 4))  # evicts 1 (dirty: written) and 2 (clean: dropped)
    s = shard.stats().tables["t"]
    assert (s.written_back, s.evicted, s.rows, s.disk_rows) == (5, 6, 4, 4)
    found, on_disk = shard._disk.get("t", ids(1))
    assert found.all()
    np.testing.assert_array_equal(on_disk, updated)  # the update reached the disk copy


def test_delete_removes_the_disk_copy_of_a_resident_row(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=1, stripes=1)
    shard.lookup("t", ids(1))
    shard.lookup("t", ids(2))  # 1 written to disk
    shard.lookup("t", ids(1))  # 1 resident again, with a clean disk copy
    assert 1 in resident_ids(shard) and 1 in disk_ids(shard)
    assert shard.delete("t", ids(1)) == 1
    assert 1 not in resident_ids(shard) | disk_ids(shard)
    s = shard.stats().tables["t"]
    assert (s.rows, s.disk_rows, s.deleted_rows) == (1, 1, 1)


def test_ephemeral_shard_removes_its_directory() -> None:
    shard = Shard(EmbeddingConfig.single_table("t", 4, capacity=8))
    path = shard.data_dir
    shard.lookup("t", np.arange(20, dtype=np.uint64))
    assert path.exists()
    shard.close()
    assert not path.exists()


def _run_between_disk_read_and_settle(shard: Shard, action) -> None:
    """Make the next disk-tier multi-get run ``action`` after reading, before returning: the
    moment between phases 2 and 3 of a lookup, when no stripe lock is held."""
    original = shard._disk.get
    fired = False

    def hooked(table, ids_):
        nonlocal fired
        result = original(table, ids_)
        if not fired:
            fired = True
            action()
        return result

    shard._disk.get = hooked  # instance attribute: the tables call it through the shard's tier


def test_lookup_does_not_resurrect_a_disk_copy_updated_meanwhile(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=2, stripes=1, optimizer=sgd(lr=1.0))
    shard.assign("t", ids(9), np.zeros((1, 4), np.float32))
    shard.lookup("t", ids(1, 2))  # evicts 9 (dirty: its zeros are written to disk)

    def meanwhile() -> None:  # another caller promotes 9, updates it, and evicts it again
        shard.apply_gradients("t", ids(9), np.ones((1, 4), np.float32))
        shard.lookup("t", ids(3, 4))

    _run_between_disk_read_and_settle(shard, meanwhile)
    got = shard.lookup("t", ids(9))  # phase 2 read the stale zeros
    np.testing.assert_array_equal(got, -np.ones((1, 4), np.float32))
    _, row = shard.peek("t", ids(9))
    np.testing.assert_array_equal(row, -np.ones((1, 4), np.float32))


def test_lookup_does_not_resurrect_a_row_deleted_meanwhile(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=1, stripes=1)
    shard.assign("t", ids(9), np.full((1, 4), 5.0, np.float32))
    shard.lookup("t", ids(1))  # 9 goes to disk
    _run_between_disk_read_and_settle(shard, lambda: shard.delete("t", ids(9)))
    got = shard.lookup("t", ids(9))  # recreated from the initializer, not from the old copy
    spec = shard.config.tables["t"]
    want = initial_vectors(ids(9), 4, spec.initializer, table_key("t", spec.seed))
    np.testing.assert_array_equal(got, want)


def test_lookup_uses_a_row_created_by_another_call_meanwhile(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=4, stripes=1)
    _run_between_disk_read_and_settle(
        shard, lambda: shard.assign("t", ids(7), np.full((1, 4), 2.0, np.float32))
    )
    got = shard.lookup("t", ids(7, 7))  # phase 2 found nothing; 7 now exists in RAM
    np.testing.assert_array_equal(got, np.full((2, 4), 2.0, np.float32))
    assert shard.stats().tables["t"].rows == 1  # not inserted twice


def test_corrupt_disk_tier_file_is_detected_not_served(make_shard: MakeShard, tmp_path) -> None:
    cfg = one_table_config(dim=16, capacity=10)
    shard = make_shard(cfg, data_dir=tmp_path / "d")
    universe = np.arange(5000, dtype=np.uint64)
    shard.lookup("t", universe)
    shard.close()
    sst = max((tmp_path / "d" / "disk").glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(sst.read_bytes())
    for offset in range(1000, min(len(data), 60_000), 997):
        data[offset] ^= 0xFF
    sst.write_bytes(bytes(data))
    reopened = Shard(cfg, tmp_path / "d")
    try:
        with pytest.raises(CorruptDataError, match=r"checksum mismatch.*\.sst"):
            reopened.lookup("t", universe)
        with pytest.raises(CorruptDataError):
            reopened.peek("t", universe)
        assert reopened.stats().tables["t"].ram_rows == 0  # nothing corrupt was loaded
    finally:
        reopened.close()


def test_unusable_data_directory_is_a_clear_error(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="a-file"):
        Shard(one_table_config(), blocker / "shard")
