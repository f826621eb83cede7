"""The shard API boundary: precise errors that damage nothing, and concurrent callers."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Callable

import numpy as np
import pytest

from embeddb.common.routing import shard_of
from embeddb.config import EmbeddingConfig, RamTierConfig, StoreConfig, TableConfig
from embeddb.engine.shard import Shard
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    EmbeddbError,
    FailedPreconditionError,
    InvalidArgumentError,
    TableNotFoundError,
    UnavailableError,
)
from tests.conftest import MakeShard, ids, one_table_config, sgd

UNIVERSE = np.arange(30, dtype=np.uint64)


@pytest.fixture
def filled(make_shard: MakeShard) -> Shard:
    """A shard whose 30 rows are split between RAM (10) and disk (20), with moved state."""
    shard = make_shard(capacity=10, stripes=2)
    shard.lookup("t", UNIVERSE)
    shard.apply_gradients("t", UNIVERSE, np.full((30, 4), 0.25, np.float32))
    return shard


def _state(shard: Shard) -> tuple[np.ndarray, dict[str, int | str]]:
    found, rows = shard.peek("t", UNIVERSE)
    assert found.all()
    return rows, shard.stats().tables["t"].as_dict()


BAD_CALLS: dict[str, tuple[Callable[[Shard], object], type[EmbeddbError], str]] = {
    "unknown table lookup": (lambda s: s.lookup("nope", ids(1)), TableNotFoundError, "nope"),
    "unknown table update": (
        lambda s: s.apply_gradients("nope", ids(1), np.ones((1, 4), np.float32)),
        TableNotFoundError,
        "known tables: t",
    ),
    "unknown table assign": (
        lambda s: s.assign("nope", ids(1), np.ones((1, 4), np.float32)),
        TableNotFoundError,
        "nope",
    ),
    "unknown table delete": (lambda s: s.delete("nope", ids(1)), TableNotFoundError, "nope"),
    "float ids": (lambda s: s.lookup("t", np.array([1.0, 2.0])), InvalidArgumentError, "ids"),
    "negative ids": (lambda s: s.delete("t", np.array([3, -1])), InvalidArgumentError, "negative"),
    "2-D ids": (lambda s: s.lookup("t", np.ones((2, 2), np.uint64)), InvalidArgumentError, "1-D"),
    "string ids": (lambda s: s.lookup("t", ["a", "b"]), InvalidArgumentError, "integer"),
    "float64 grads": (
        lambda s: s.apply_gradients("t", ids(1), np.ones((1, 4))),
        InvalidArgumentError,
        "grads must be float32",
    ),
    "wrong dim": (
        lambda s: s.apply_gradients("t", ids(1, 2), np.ones((2, 5), np.float32)),
        InvalidArgumentError,
        r"grads must have shape \(2, 4\)",
    ),
    "count mismatch": (
        lambda s: s.apply_gradients("t", ids(1, 2, 3), np.ones((2, 4), np.float32)),
        InvalidArgumentError,
        r"\(3, 4\)",
    ),
    "1-D grads": (
        lambda s: s.apply_gradients("t", ids(1), np.ones(4, np.float32)),
        InvalidArgumentError,
        "shape",
    ),
    "assign wrong dim": (
        lambda s: s.assign("t", ids(1), np.ones((1, 3), np.float32)),
        InvalidArgumentError,
        "vectors",
    ),
    "assign NaN": (
        lambda s: s.assign("t", ids(1, 2), np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]], np.float32)),
        InvalidArgumentError,
        "finite",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_precisely_and_damages_nothing(filled: Shard, case: str) -> None:
    call, error, message = BAD_CALLS[case]
    rows_before, stats_before = _state(filled)
    with pytest.raises(error, match=message):
        call(filled)
    rows_after, stats_after = _state(filled)
    assert rows_after.tobytes() == rows_before.tobytes()
    assert stats_after == stats_before
    assert filled.lookup("t", ids(3)).shape == (1, 4)  # still serving


def test_errors_are_also_builtin_types(filled: Shard) -> None:
    with pytest.raises(ValueError):
        filled.lookup("t", np.array([0.5]))
    with pytest.raises(LookupError):
        filled.lookup("missing", ids(1))


def test_non_contiguous_and_other_integer_inputs_are_accepted(make_shard: MakeShard) -> None:
    shard = make_shard(dim=2, capacity=10, optimizer=sgd(lr=1.0))
    shard.assign("t", ids(1, 2, 3), np.zeros((3, 2), np.float32))
    grads = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(6, 2))[::2]
    assert not grads.flags.c_contiguous
    shard.apply_gradients("t", np.array([1, 2, 3], dtype=np.int32), grads)
    _, rows = shard.peek("t", ids(1, 2, 3))
    np.testing.assert_array_equal(rows, -grads)


def test_closed_shard_is_unavailable(make_shard: MakeShard) -> None:
    shard = make_shard()
    shard.close()
    shard.close()  # idempotent
    with pytest.raises(UnavailableError):
        shard.lookup("t", ids(1))
    with pytest.raises(UnavailableError):
        shard.stats()


def test_several_tables_are_independent(tmp_path) -> None:
    cfg = EmbeddingConfig(
        tables={
            "a": TableConfig(name="a", dim=3, capacity=4),
            "b": TableConfig(name="b", dim=8, capacity=4, optimizer=sgd()),
        }
    )
    with Shard(cfg, tmp_path / "d") as shard:
        va = shard.lookup("a", ids(1, 2))
        vb = shard.lookup("b", ids(1, 2))
        assert va.shape == (2, 3) and vb.shape == (2, 8)
        assert not np.array_equal(va, vb[:, :3])  # table name is part of the initializer key
        shard.delete("a", ids(1))
        assert shard.peek("b", ids(1))[0].all() and not shard.peek("a", ids(1))[0].any()
        assert set(shard.stats().tables) == {"a", "b"}
        assert shard.stats().totals()["ram_rows"] == 3  # small tables get one stripe
        assert len(shard._tables["b"].stripes) == 1


@pytest.mark.slow
def test_concurrent_updates_are_neither_lost_nor_torn(tmp_path) -> None:
    """Four threads push gradients on overlapping ids while lookups spill and promote rows
    (capacity 64 for 200 ids, four stripes). Gradients are multiples of 1/8 on zero vectors,
    so float32 sums are exact and the final vectors must equal minus the total gradient."""
    dim = 4
    cfg = EmbeddingConfig(
        tables={"t": TableConfig(name="t", dim=dim, capacity=64, optimizer=sgd(lr=1.0))},
        store=StoreConfig(ram=RamTierConfig(stripes=4, eviction_chunk=0.1, min_stripe_rows=1)),
    )
    universe = np.arange(200, dtype=np.uint64)
    totals = np.zeros((200, dim), np.float64)
    totals_lock = threading.Lock()
    errors: list[BaseException] = []
    with Shard(cfg, tmp_path / "d") as shard:
        shard.assign("t", universe, np.zeros((200, dim), np.float32))

        def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(60):
                    batch = rng.choice(universe, size=40)
                    grads = (rng.integers(-8, 9, size=(40, dim)) / 8).astype(np.float32)
                    shard.lookup("t", batch)
                    result = shard.apply_gradients("t", batch, grads)
                    assert result.missing == 0
                    with totals_lock:
                        np.add.at(totals, batch.astype(np.int64), grads)
                    shard.lookup("t", rng.choice(universe, size=40), train=False)
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        found, rows = shard.peek("t", universe)
        assert found.all()
        np.testing.assert_array_equal(rows, (-totals).astype(np.float32))
        stats = shard.stats().tables["t"]
        assert stats.rows == 200 and stats.ram_rows <= 64
        assert stats.evicted > 0 and stats.promoted > 0


# ---------------------------------------------------------------- ownership and topology
def _owned_and_foreign(index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    universe = np.arange(1, 1000, dtype=np.uint64)
    owner = shard_of(universe, count)
    return universe[owner == index][:30], universe[owner != index][:30]


FOREIGN_CALLS: dict[str, Callable[[Shard, np.ndarray], object]] = {
    "training lookup": lambda s, i: s.lookup("t", i),
    "evaluation lookup": lambda s, i: s.lookup("t", i, train=False),
    "lookup_many": lambda s, i: s.lookup_many([("t", i, False)]),
    "apply_gradients": lambda s, i: s.apply_gradients("t", i, np.ones((i.size, 4), np.float32)),
    "apply_gradients_many": lambda s, i: s.apply_gradients_many(
        [("t", i, np.ones((i.size, 4), np.float32))]
    ),
    "assign": lambda s, i: s.assign("t", i, np.ones((i.size, 4), np.float32)),
    "delete": lambda s, i: s.delete("t", i),
}


@pytest.mark.parametrize("call", sorted(FOREIGN_CALLS))
def test_every_data_call_refuses_an_id_another_shard_owns(tmp_path, call: str) -> None:
    owned, foreign = _owned_and_foreign(2, 3)
    with Shard(one_table_config(capacity=100), tmp_path / "s", shard_index=2, num_shards=3) as s:
        s.assign("t", owned, np.full((owned.size, 4), 0.5, np.float32))
        found_before, before = s.peek("t", np.concatenate([owned, foreign]))
        stats_before = s.stats().tables["t"]
        seq = s.seq
        batch = np.concatenate([owned[:3], foreign[:2], owned[3:]])
        with pytest.raises(FailedPreconditionError) as info:
            FOREIGN_CALLS[call](s, batch)
        message = str(info.value)
        owner = int(shard_of(foreign[:1], 3)[0])
        assert f"[3] = {int(foreign[0])} belongs to shard {owner} of 3" in message
        assert "this server (shard 2 of 3)" in message
        found_after, after = s.peek("t", np.concatenate([owned, foreign]))
        assert found_after.tolist() == found_before.tolist()
        assert after.tobytes() == before.tobytes()
        assert s.stats().tables["t"] == stats_before and s.seq == seq
        FOREIGN_CALLS[call](s, owned)  # its own ids go through


def test_a_directory_records_its_topology_and_refuses_another(tmp_path) -> None:
    data = tmp_path / "s"
    owned, _ = _owned_and_foreign(1, 4)
    with Shard(one_table_config(), data, shard_index=1, num_shards=4) as s:
        s.assign("t", owned[:5], np.ones((5, 4), np.float32))
    assert json.loads((data / "topology.json").read_text())["num_shards"] == 4
    assert stat.S_IMODE((data / "topology.json").stat().st_mode) == 0o600
    for index, count, key in ((0, 1, "num_shards"), (2, 4, "shard_index"), (1, 5, "num_shards")):
        with pytest.raises(ConfigError, match="--shard-index 1 --num-shards 4") as info:
            Shard(one_table_config(), data, shard_index=index, num_shards=count)
        assert info.value.key == key and "embeddb reshard" in str(info.value)
    with Shard(one_table_config(), data, shard_index=1, num_shards=4) as s:
        assert s.stats().tables["t"].rows == 5


def test_a_directory_without_a_record_takes_its_snapshots_topology(tmp_path) -> None:
    """A directory from before topology.json (or written by reshard) is checked against its
    newest snapshot, then recorded."""
    data = tmp_path / "s"
    owned, _ = _owned_and_foreign(0, 2)
    with Shard(one_table_config(), data, shard_index=0, num_shards=2) as s:
        s.assign("t", owned[:5], np.ones((5, 4), np.float32))
        s.snapshot("one")
    (data / "topology.json").unlink()
    (data / "shard-identity.json").unlink()
    with pytest.raises(ConfigError, match=r"holds shard 0 of 2 \(its snapshot one\)"):
        Shard(one_table_config(), data)
    assert not (data / "topology.json").exists()
    with Shard(one_table_config(), data, shard_index=0, num_shards=2) as s:
        assert s.stats().tables["t"].rows == 5
    assert (data / "topology.json").exists()
    (data / "topology.json").write_text('{"format_version": 1, "shard_index": "x"}')
    with pytest.raises(CorruptDataError, match=r"topology\.json is unreadable"):
        Shard(one_table_config(), data, shard_index=0, num_shards=2)
