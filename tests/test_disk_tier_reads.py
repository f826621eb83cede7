"""The disk tier's multi-gets split over a pool, its sorted write batches, its RocksDB settings
(one block cache for every table) and databases written with the previous settings."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rocksdict

from embeddb.config.store import ParallelConfig
from embeddb.engine.storage import disk_tier
from embeddb.engine.storage.disk_tier import DiskTier
from embeddb.engine.storage.parallel import StripePool
from embeddb.errors import CorruptDataError
from tests.conftest import MakeShard, one_table_config
from tests.test_disk_data_loss import damage_the_middle

WIDTH = 8
STORED = 12_000  # even ids 0..2*STORED-2 are stored
ASKED = 9_000  # above the tier's parallel threshold


class CountingView:
    """Stands in for a table's RocksDB view: counts multi-gets and the keys they ask for."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.calls: list[int] = []

    def get(self, keys: list[bytes]) -> Any:
        self.calls.append(len(keys))
        return self.view.get(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)


def stored_rows(ids: np.ndarray) -> np.ndarray:
    """Row of each id: its id in every float (so a mix-up shows)."""
    rows = np.repeat(ids.astype(np.float32)[:, None], WIDTH, axis=1) + np.arange(WIDTH)
    return rows.astype(np.float32)


@pytest.fixture
def pool() -> Iterator[StripePool]:
    p = StripePool(2, 1)
    yield p
    p.close()


@pytest.fixture
def written(tmp_path: Path) -> Path:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH})
    ids = np.arange(0, 2 * STORED, 2, dtype=np.uint64)
    disk.put("t", ids, stored_rows(ids))
    disk.close()
    return tmp_path / "disk"


def test_a_pooled_multi_get_answers_like_a_serial_one_in_order(
    written: Path, pool: StripePool
) -> None:
    rng = np.random.default_rng(5)
    asked = rng.integers(0, 2 * STORED + 500, ASKED).astype(np.uint64)  # absent ids, duplicates
    asked[:50] = asked[50:100]
    serial = DiskTier(written, {"t": WIDTH})
    try:
        want_found, want_rows = serial.get("t", asked)
    finally:
        serial.close()
    pooled = DiskTier(written, {"t": WIDTH}, pool=pool)
    try:
        view = CountingView(pooled._views["t"])
        pooled._views["t"] = view
        found, rows = pooled.get("t", asked)
    finally:
        pooled.close()
    inside = int((asked <= 2 * STORED - 2).sum())  # the rest lie beyond the stored span
    assert len(view.calls) == 2 and sum(view.calls) == inside  # split over the pool's 2 threads
    expect = (asked % 2 == 0) & (asked < 2 * STORED)
    np.testing.assert_array_equal(found, expect)
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(rows, stored_rows(asked[expect]))
    np.testing.assert_array_equal(rows, want_rows)


def test_a_small_multi_get_stays_on_the_calling_thread(written: Path, pool: StripePool) -> None:
    disk = DiskTier(written, {"t": WIDTH}, pool=pool)
    try:
        view = CountingView(disk._views["t"])
        disk._views["t"] = view
        found, _ = disk.get("t", np.arange(100, dtype=np.uint64))
    finally:
        disk.close()
    assert view.calls == [100] and int(found.sum()) == 50


def test_a_damaged_block_fails_a_pooled_multi_get_counted_and_logged_once(
    tmp_path: Path, pool: StripePool, caplog: pytest.LogCaptureFixture
) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH})
    ids = np.arange(STORED, dtype=np.uint64)
    disk.put("t", ids, stored_rows(ids))
    disk.close()
    damage_the_middle(max((tmp_path / "disk").glob("*.sst"), key=lambda p: p.stat().st_size))
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH}, pool=pool)
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(CorruptDataError, match="Corruption"):
            disk.get("t", ids)
        assert disk.data_loss("t") == 1
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    finally:
        disk.close()


def test_a_write_batch_in_key_order_keeps_the_last_of_repeated_ids(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH})
    try:
        ids = np.array([9, 3, 9, 1, 3], dtype=np.uint64)
        rows = np.arange(5 * WIDTH, dtype=np.float32).reshape(5, WIDTH)
        disk.put("t", ids, rows)
        found, got = disk.get("t", np.array([1, 3, 9], dtype=np.uint64))
        assert found.all()
        np.testing.assert_array_equal(got, rows[[3, 4, 2]])
        disk.delete("t", np.array([9, 1], dtype=np.uint64))
        assert disk.get("t", np.array([1, 3, 9], dtype=np.uint64))[0].tolist() == [
            False,
            True,
            False,
        ]
    finally:
        disk.close()


def test_every_table_shares_one_block_cache_of_the_configured_size(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", {"a": WIDTH, "b": WIDTH}, cache_mb=8)
    try:
        for table in ("a", "b"):
            capacity = disk._views[table].property_int_value("rocksdb.block-cache-capacity")
            assert capacity == 8 << 20
    finally:
        disk.close()


def _previous_options(cache_mb: int) -> rocksdict.Options:
    """The disk tier's options before the measured tuning: default (snappy) compression, one
    block cache per column family, no explicit block size."""
    opt = rocksdict.Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.set_max_background_jobs(2)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(rocksdict.Cache(cache_mb << 20))
    table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())
    opt.set_block_based_table_factory(table)
    opt.set_allow_mmap_reads(True)
    return opt


@pytest.mark.parametrize("read_only", [False, True])
def test_a_database_written_with_the_previous_settings_opens_with_exact_rows(
    tmp_path: Path, read_only: bool
) -> None:
    path = tmp_path / "old"
    db = rocksdict.Rdict(str(path), _previous_options(256))
    db.create_column_family("table.t", _previous_options(256))
    view = db.get_column_family("table.t")
    ids = np.arange(0, 3000, 3, dtype=np.uint64)
    rows = stored_rows(ids)
    keys = ids.astype(">u8").view("V8").tolist()
    for key, value in zip(keys, rows.view(f"V{4 * WIDTH}").ravel().tolist(), strict=True):
        view[key] = value
    view.flush()
    view.close()
    db.close()
    disk = DiskTier(path, {"t": WIDTH}, read_only=read_only)
    try:
        found, got = disk.get("t", np.arange(3000, dtype=np.uint64))
        np.testing.assert_array_equal(found, np.arange(3000) % 3 == 0)
        np.testing.assert_array_equal(got, rows)
        scanned = np.concatenate([r for _, r in disk.iter_rows("t")])
        np.testing.assert_array_equal(scanned, rows)
        if not read_only:
            more = np.array([1, 2], dtype=np.uint64)
            disk.put("t", more, stored_rows(more))
            assert disk.get("t", more)[0].all()
    finally:
        disk.close()


def test_the_default_tuning_writes_uncompressed_files(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", {"t": WIDTH})
    ids = np.arange(5000, dtype=np.uint64)
    disk.put("t", ids, np.zeros((ids.size, WIDTH), dtype=np.float32))  # compresses well
    disk.close()
    size = sum(p.stat().st_size for p in (tmp_path / "disk").glob("*.sst"))
    assert size > ids.size * 4 * WIDTH  # stored as is: the rows' bytes at least
    assert disk_tier.Tuning().compression == "none"


def test_a_shard_reads_a_large_miss_through_its_pool_with_exact_rows(
    make_shard: MakeShard,
) -> None:
    config = one_table_config(capacity=500)
    config = dataclasses.replace(
        config, store=dataclasses.replace(config.store, parallel=ParallelConfig(threads=2))
    )
    shard = make_shard(config)
    keys = np.arange(1, 9001, dtype=np.uint64)
    created = shard.lookup("t", keys, train=True)  # all but 500 rows go to disk
    view = CountingView(shard._disk._views["t"])  # type: ignore[union-attr]
    shard._disk._views["t"] = view  # type: ignore[union-attr]
    again = shard.lookup("t", keys, train=False)
    np.testing.assert_array_equal(again, created)
    assert len(view.calls) == 2 and sum(view.calls) >= 8000  # one miss read in two chunks
