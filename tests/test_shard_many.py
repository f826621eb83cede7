"""Calls spanning tables served in one pass (embeddb.engine.storage.many): the same rows,
results, counters and log as one call per table, whatever the mix of resident and
non-resident ids, optimizers, dims, NaN gradients and overflowing updates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import lz4.frame
import numpy as np
import numpy.typing as npt
import pytest

from embeddb.common.routing import shard_of
from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.durability import log_format, records
from embeddb.engine.shard import Shard
from embeddb.engine.storage import TieredTable
from embeddb.engine.storage.stats import UpdateResult
from embeddb.errors import FailedPreconditionError, InvalidArgumentError, TableNotFoundError

UNIVERSE = np.arange(600, dtype=np.uint64)
ADAGRAD = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1)
TABLES = {  # two tables share an optimizer (one group), the others do not
    "a": TableConfig(name="a", dim=4, capacity=4096, optimizer=ADAGRAD),
    "b": TableConfig(name="b", dim=4, capacity=4096, optimizer=ADAGRAD),
    "c": TableConfig(
        name="c", dim=8, capacity=4096, weight_bound=0.5,
        optimizer=OptimizerConfig(kind=OptimizerKind.SGD, lr=0.5),
    ),
    "d": TableConfig(
        name="d", dim=4, capacity=4096, optimizer=OptimizerConfig(kind=OptimizerKind.ADAM)
    ),
    "small": TableConfig(name="small", dim=4, capacity=64, optimizer=ADAGRAD),  # overflows to disk
}  # fmt: skip


def config(**tables: TableConfig) -> EmbeddingConfig:
    store = StoreConfig(ram=RamTierConfig(stripes=4, min_stripe_rows=1))
    store = replace(store, log=replace(store.log, lz4_min_bytes=0))
    return EmbeddingConfig(tables=tables or TABLES, store=store)


def state(shard: Shard) -> dict[str, tuple[npt.NDArray[Any], npt.NDArray[Any]]]:
    return {t: shard.peek(t, UNIVERSE) for t in shard.tables}


def counters(shard: Shard) -> dict[str, tuple[int, ...]]:
    keep = ("lookup_ids", "ram_hits", "disk_hits", "misses", "admitted", "update_ids",
            "updated_rows", "nan_skipped", "missing_updates", "rows")  # fmt: skip
    return {n: tuple(getattr(s, k) for k in keep) for n, s in shard.stats().tables.items()}


def assert_same(one: Shard, many: Shard) -> None:
    a, b = state(one), state(many)
    for t in a:
        np.testing.assert_array_equal(a[t][0], b[t][0], err_msg=t)
        np.testing.assert_array_equal(a[t][1], b[t][1], err_msg=t)
    assert counters(one) == counters(many)


def batch(seed: int, dims: dict[str, int]) -> dict[str, tuple[npt.NDArray[np.uint64], Any]]:
    """Per table: ids (with duplicates) and float32 gradients."""
    rng = np.random.default_rng(seed)
    out = {}
    for t, dim in dims.items():
        ids = rng.choice(UNIVERSE[:300], size=int(rng.integers(1, 200))).astype(np.uint64)
        out[t] = (ids, rng.standard_normal((ids.size, dim)).astype(np.float32))
    return out


def test_calls_spanning_tables_equal_one_call_per_table(tmp_path: Path) -> None:
    dims = {n: t.dim for n, t in TABLES.items()}
    with Shard(config(), tmp_path / "many") as many, Shard(config()) as one:
        for seed in range(6):
            parts = batch(seed, dims)
            if seed == 3:  # NaN and Inf gradients: skipped and counted in the right table
                parts["a"][1][0, 1] = np.nan
                parts["b"][1][-1, 0] = np.inf
            looked = many.lookup_many([(t, ids, True) for t, (ids, _) in parts.items()])
            for (t, (ids, _)), vectors in zip(parts.items(), looked, strict=True):
                np.testing.assert_array_equal(vectors, one.lookup(t, ids, True), err_msg=t)
            if seed >= 2:  # ids never looked up: missing in their table, alone in the call
                parts["b"] = (np.concatenate([parts["b"][0], UNIVERSE[500:503]]),
                              np.ones((parts["b"][0].size + 3, 4), np.float32))  # fmt: skip
            pushed = many.apply_gradients_many([(t, i, g) for t, (i, g) in parts.items()])
            for (t, (ids, grads)), result in zip(parts.items(), pushed, strict=True):
                assert result == one.apply_gradients(t, ids, grads), (seed, t)
            assert_same(one, many)
        expected = state(many)
    with Shard(config(), tmp_path / "many") as recovered:  # the log replays to the same rows
        for t, (found, rows) in expected.items():
            np.testing.assert_array_equal(state(recovered)[t][0], found)
            np.testing.assert_array_equal(state(recovered)[t][1], rows)


def test_a_push_of_resident_rows_logs_one_record_with_one_change_per_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All resident: the one-pass path (no per-table preparation), one change per table."""
    logged: list[list[records.Change]] = []
    encode = records.encode
    monkeypatch.setattr(
        records, "encode", lambda changes: logged.append(changes) or encode(changes)
    )
    with Shard(config(), tmp_path) as shard:
        ids = UNIVERSE[:100]
        shard.lookup_many([(t, ids, True) for t in ("a", "b", "d")])
        logged.clear()

        def refuse(*_: object) -> None:
            raise AssertionError("a resident part took the per-table path")

        monkeypatch.setattr(TieredTable, "prepare_update", refuse)
        monkeypatch.setattr(TieredTable, "lookup_begin", refuse)
        shard.lookup_many([(t, ids, True) for t in ("a", "b", "d")])
        grads = np.ones((ids.size, 4), np.float32)
        results = shard.apply_gradients_many([(t, ids, grads) for t in ("d", "a", "b")])
    assert results == [UpdateResult(100, 0, 0)] * 3
    (record,) = logged
    assert sorted(c.table for c in record) == ["a", "b", "d"]
    for c in record:
        assert np.array_equal(np.sort(c.ids), ids)


def test_an_overflowing_update_is_skipped_and_counted_in_its_own_table() -> None:
    sgd = OptimizerConfig(kind=OptimizerKind.SGD, lr=1.0)
    tables = {n: TableConfig(name=n, dim=2, capacity=1024, optimizer=sgd) for n in ("x", "y")}
    ids = np.arange(8, dtype=np.uint64)
    big = np.full((8, 2), 3e38, np.float32)
    with Shard(config(**tables)) as many, Shard(config(**tables)) as one:
        for s in (many, one):
            for t in tables:
                s.assign(t, ids, -big)
        grads = np.zeros((8, 2), np.float32)
        grads[2] = 3e38  # -3e38 - 3e38 overflows float32: row 2 of x is skipped
        results = many.apply_gradients_many(
            [("x", ids, grads), ("y", ids, np.ones((8, 2), np.float32))]
        )
        assert results == [UpdateResult(7, 1, 0), UpdateResult(8, 0, 0)]
        assert results[0] == one.apply_gradients("x", ids, grads)
        assert results[1] == one.apply_gradients("y", ids, np.ones((8, 2), np.float32))
        assert_same(one, many)


def test_a_call_spanning_tables_fails_whole_on_a_bad_part() -> None:
    with Shard(config()) as shard:
        ids = UNIVERSE[:10]
        shard.lookup_many([(t, ids, True) for t in ("a", "b")])
        before = state(shard)
        with pytest.raises(Exception, match="grads"):
            shard.apply_gradients_many(
                [("a", ids, np.ones((10, 4), np.float32)), ("b", ids, np.ones((10, 5), np.float32))]
            )
        after = state(shard)
        assert all(np.array_equal(before[t][1], after[t][1]) for t in before)


def test_many_small_incompressible_parts_skip_the_full_lz4_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record of 26 tables' rows: probed on a sample, not compressed whole."""
    sizes: list[int] = []
    compress = lz4.frame.compress
    monkeypatch.setattr(lz4.frame, "compress", lambda b: sizes.append(len(b)) or compress(b))
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(4096).astype(np.float32).tobytes() for _ in range(26)]
    framed = log_format.frame(parts, 1)
    assert framed.flags == 0  # stored as it is
    assert sizes and max(sizes) < sum(len(p) for p in parts) // 4


def test_calls_with_no_parts_or_empty_parts_change_nothing() -> None:
    with Shard(config()) as shard:
        assert shard.lookup_many([]) == []
        assert shard.apply_gradients_many([]) == []
        empty = np.empty(0, np.uint64)
        (vectors,) = shard.lookup_many([("a", empty, True)])
        assert vectors.shape == (0, 4)
        assert shard.apply_gradients_many([("a", empty, np.empty((0, 4), np.float32))]) == [
            UpdateResult(0, 0, 0)
        ]
        assert shard.stats().tables["a"].rows == 0


def test_a_refused_call_names_the_first_bad_part_in_order() -> None:
    """The quick check of every part at once falls back to the part-by-part check, so the
    error is the one the first bad part gives, whatever comes after it."""
    ids = np.arange(64, dtype=np.uint64)
    mine, theirs = ids[shard_of(ids, 2) == 0], ids[shard_of(ids, 2) == 1]
    g = np.zeros((mine.size, 4), np.float32)
    with Shard(config(), shard_index=0, num_shards=2) as shard:
        with pytest.raises(FailedPreconditionError, match=r"updates\[1\]\.ids\[2\]"):
            shard.apply_gradients_many(
                [("a", mine, g), ("b", np.concatenate([mine[:2], theirs]), g), ("nope", mine, g)]
            )
        with pytest.raises(InvalidArgumentError, match=r"lookups\[0\]\.ids"):
            shard.lookup_many([("a", [-1], True), ("nope", mine, True)])
        with pytest.raises(TableNotFoundError):
            shard.lookup_many([("a", mine, True), ("nope", theirs, True)])
        with pytest.raises(FailedPreconditionError, match=r"lookups\[0\]"):
            shard.lookup_many([("a", theirs, True), ("b", mine, True)])
        assert shard.stats().tables["a"].rows == 0
