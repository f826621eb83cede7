"""An ``IdBatch`` passed to the clients is not deduplicated again (``IdBatch.of`` passes it
through), and ``IdBatch.distinct`` skips the hash pass for ids known to be distinct."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import AsyncClient, Client
from embeddb.client.batching import IdBatch
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.shard import Shard
from embeddb.errors import InvalidArgumentError
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import RpcServer

DIM = 4


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Shard, str]]:
    config = EmbeddingConfig.single_table(
        "t", DIM, capacity=1000, optimizer=OptimizerConfig(kind=OptimizerKind.SGD, lr=0.5)
    )
    shard = Shard(config, tmp_path / "shard")
    server: RpcServer = build_server(shard, ServerConfig())
    try:
        yield shard, f"127.0.0.1:{server.port}"
    finally:
        server.stop(grace=0)
        shard.close()


def test_of_passes_a_batch_through() -> None:
    batch = IdBatch.of([7, 5, 7, 9])
    assert IdBatch.of(batch) is batch


def test_distinct_is_its_own_unique_list() -> None:
    ids = np.array([9, 3, 12], dtype=np.uint64)
    batch = IdBatch.distinct(ids)
    assert batch.unique.tolist() == [9, 3, 12]
    assert batch.inverse.tolist() == [0, 1, 2]
    assert batch.counts.tolist() == [1, 1, 1]
    assert not batch.has_duplicates
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert batch.expand(rows) is rows and batch.sum_rows(rows) is rows


@pytest.mark.parametrize("bad", [[-1, 2], [[1, 2]], [1.5]])
def test_distinct_validates_like_of(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        IdBatch.distinct(bad)


def test_clients_answer_a_batch_like_its_ids(served: tuple[Shard, str]) -> None:
    shard, address = served
    ids = np.array([11, 4, 11, 30, 4, 8], dtype=np.uint64)
    with Client([address]) as client:
        plain = client.lookup("t", ids)
        assert plain.shape == (ids.size, DIM)
        np.testing.assert_array_equal(client.lookup("t", IdBatch.of(ids)), plain)
        unique = IdBatch.of(ids).unique
        want = plain[[0, 1, 3, 5]]  # the rows of 11, 4, 30, 8: unique's first occurrences
        np.testing.assert_array_equal(client.lookup("t", IdBatch.distinct(unique)), want)
        many = client.lookup_many({"t": IdBatch.distinct(unique)}, train=False)
        np.testing.assert_array_equal(many["t"], shard.lookup("t", unique, train=False))


def test_a_duplicate_passed_as_distinct_gets_the_shards_answer(served: tuple[Shard, str]) -> None:
    shard, address = served
    ids = np.array([5, 6, 5], dtype=np.uint64)
    with Client([address]) as client:
        got = client.lookup("t", IdBatch.distinct(ids))
        np.testing.assert_array_equal(got, shard.lookup("t", ids, train=False))
        np.testing.assert_array_equal(got[0], got[2])
        result = client.apply_gradients("t", IdBatch.distinct(ids), np.ones((3, DIM), np.float32))
        assert result.applied >= 1  # the shard sums the duplicate's gradients itself
        after = shard.lookup("t", np.array([5], dtype=np.uint64), train=False)[0]
        np.testing.assert_array_equal(after, got[0] - 0.5 * 2.0)  # lr 0.5 x (1 + 1)


def test_async_client_takes_a_batch(served: tuple[Shard, str]) -> None:
    shard, address = served
    ids = np.array([21, 22, 21], dtype=np.uint64)

    async def main() -> np.ndarray:
        async with AsyncClient([address]) as client:
            return await client.lookup("t", IdBatch.of(ids))

    got = asyncio.run(main())
    np.testing.assert_array_equal(got, shard.lookup("t", ids, train=False))
