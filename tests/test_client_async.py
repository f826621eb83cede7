"""The asyncio client against real shards served on 127.0.0.1 (port 0); no mocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import AsyncClient, DeadlineExceededError, UpdateResult
from embeddb.errors import ConfigError, InvalidArgumentError, NotFoundError, UnavailableError
from embeddb.routing import shard_of
from tests.test_client import DIM, LR, Cluster, batch_with_duplicates, serve_cluster, silent_address


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Cluster]:
    with serve_cluster(tmp_path, 2) as cluster:
        yield cluster


def test_round_trip_on_two_shards(two: Cluster) -> None:
    ids = batch_with_duplicates()
    unique = np.unique(ids)

    async def main() -> None:
        async with AsyncClient(two.addresses) as client:
            got = await client.lookup("t", ids)
            assert got.shape == (ids.size, DIM) and got.dtype == np.float32
            for k, shard in enumerate(two.shards):
                mine = shard_of(ids, 2) == k
                np.testing.assert_array_equal(got[mine], shard.lookup("t", ids[mine], train=False))
            stats = await client.stats()
            assert [s["tables"]["t"]["rows"] for s in stats] == [
                two.owned(unique, k).size for k in range(2)
            ]
            await client.check_topology()

            assert await client.assign("t", unique, np.zeros((unique.size, DIM))) == unique.size
            grads = np.full((ids.size, DIM), 0.25, np.float32)
            assert await client.apply_gradients("t", ids, grads) == UpdateResult(unique.size)
            counts = np.unique(ids, return_counts=True)[1]
            want = (-LR * 0.25 * counts)[np.searchsorted(unique, ids)]
            after = await client.lookup("t", ids, train=False)
            np.testing.assert_array_equal(after, np.repeat(want[:, None], DIM, axis=1))

            assert await client.delete("t", unique[:10]) == 10
            assert (await client.lookup("t", [], train=False)).shape == (0, DIM)
            assert await client.apply_gradients("t", [], np.zeros((0, DIM))) == UpdateResult()
            assert (await client.describe_table("t")).dim == DIM
            assert [t.name for t in await client.list_tables()] == ["t"]

    asyncio.run(main())


def test_concurrent_lookups_with_gather(two: Cluster) -> None:
    batches = [batch_with_duplicates(200, 1000, seed) for seed in range(8)]

    async def main() -> None:
        async with AsyncClient(two.addresses, max_ids_per_message=50) as client:
            await client.lookup("t", np.concatenate(batches))  # admit every row first
            together = await asyncio.gather(*(client.lookup("t", b, train=False) for b in batches))
            for batch, got in zip(batches, together, strict=True):
                np.testing.assert_array_equal(got, await client.lookup("t", batch, train=False))

    asyncio.run(main())


def test_errors(two: Cluster) -> None:
    ids = np.arange(50, dtype=np.uint64)

    async def main() -> None:
        async with AsyncClient(two.addresses) as client:
            with pytest.raises(NotFoundError, match=r"shard \d .*unknown table 'nope'"):
                await client.lookup("nope", ids)
            with pytest.raises(InvalidArgumentError, match="grads must have shape"):
                await client.apply_gradients("t", ids, np.ones((50, DIM + 1), np.float32))
        with silent_address() as address:
            async with AsyncClient([address], timeout=0.2) as client:
                with pytest.raises(DeadlineExceededError, match="shard 0"):
                    await client.lookup("t", ids, train=False)
        two.servers[1].stop(grace=0)
        async with AsyncClient(two.addresses, retries=2, backoff=0.001) as client:
            with pytest.raises(UnavailableError, match=r"shard 1 .* after 3 attempts"):
                await client.lookup("t", ids, train=False)
        async with AsyncClient(two.addresses, retries=3, backoff=0.5) as client:
            start = time.monotonic()
            with pytest.raises(UnavailableError):
                await client.apply_gradients("t", ids, np.zeros((50, DIM), np.float32))
            assert time.monotonic() - start < 0.4
        closed = AsyncClient(two.addresses)
        await closed.close()
        with pytest.raises(UnavailableError, match="closed"):
            await closed.lookup("t", ids)

    asyncio.run(main())


def test_from_address_file(two: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "shards.txt"
    path.write_text("\n".join(["# shards", *two.addresses, ""]))

    async def main() -> None:
        async with AsyncClient.from_address_file(path) as client:
            assert client.num_shards == 2
            await client.check_topology()

    asyncio.run(main())
    with pytest.raises(ConfigError, match="cannot read"):
        AsyncClient.from_address_file(tmp_path / "missing.txt")
