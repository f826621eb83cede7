"""The asyncio client against real shards served on 127.0.0.1 (port 0); no mocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest

from embeddb.client import (
    AsyncClient,
    ClientOptions,
    DeadlineExceededError,
    PushResult,
    RemoteError,
)
from embeddb.common.routing import shard_of
from embeddb.errors import (
    ConfigError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from tests.test_client import (
    DIM,
    LR,
    Cluster,
    batch_with_duplicates,
    serve_cluster,
    sgd_tables,
    silent_address,
)
from tests.test_client_topology import WRONG_LISTS, rows_per_shard, wrong_list


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
            assert await client.apply_gradients("t", ids, grads) == PushResult(unique.size)
            counts = np.unique(ids, return_counts=True)[1]
            want = (-LR * 0.25 * counts)[np.searchsorted(unique, ids)]
            after = await client.lookup("t", ids, train=False)
            np.testing.assert_array_equal(after, np.repeat(want[:, None], DIM, axis=1))

            assert await client.delete("t", unique[:10]) == 10
            assert (await client.lookup("t", [], train=False)).shape == (0, DIM)
            assert await client.apply_gradients("t", [], np.zeros((0, DIM))) == PushResult()
            assert (await client.describe_table("t")).dim == DIM
            assert [t.name for t in await client.list_tables()] == ["t"]

    asyncio.run(main())


def test_concurrent_lookups_with_gather(two: Cluster) -> None:
    batches = [batch_with_duplicates(200, 1000, seed) for seed in range(8)]

    async def main() -> None:
        async with AsyncClient(two.addresses, ClientOptions(max_ids_per_message=50)) as client:
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
            async with AsyncClient([address], ClientOptions(timeout=0.2)) as client:
                with pytest.raises(DeadlineExceededError, match="shard 0"):
                    await client.lookup("t", ids, train=False)
        patient = AsyncClient(two.addresses, ClientOptions(retries=3, backoff=0.5))
        await patient.check_topology()  # while the cluster is whole
        two.servers[1].stop(grace=0)
        async with AsyncClient(two.addresses, ClientOptions(retries=2, backoff=0.001)) as client:
            with pytest.raises(UnavailableError, match=r"shard 1 .* DescribeShard failed after 3"):
                await client.lookup("t", ids, train=False)
        async with patient as client:
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


@pytest.mark.parametrize("case", sorted(WRONG_LISTS))
def test_a_wrong_address_list_is_refused_before_anything_is_sent(tmp_path: Path, case: str) -> None:
    n, order = WRONG_LISTS[case]
    ids = np.arange(300, dtype=np.uint64)
    ones = np.ones((ids.size, DIM), np.float32)

    async def main(client: AsyncClient, first: int) -> None:
        calls = {
            "lookup": lambda: client.lookup("t", ids),
            "lookup_many": lambda: client.lookup_many({"t": ids}),
            "assign": lambda: client.assign("t", ids, ones),
            "apply_gradients": lambda: client.apply_gradients("t", ids, ones),
            "apply_gradients_many": lambda: client.apply_gradients_many({"t": (ids, ones)}),
            "delete": lambda: client.delete("t", ids),
            "stats": client.stats,
            "snapshot": client.snapshot,
            "check_topology": client.check_topology,
        }
        async with client:
            for name, call in calls.items():
                with pytest.raises(ConfigError) as info:
                    await call()
                message = str(info.value)
                assert message.startswith(f"addresses[{first}]: {client.addresses[first]} "), name
                assert f"but the client lists it as shard {first} of {len(order)}" in message

    with serve_cluster(tmp_path, n) as cluster:
        addresses, first = wrong_list(cluster, order)
        asyncio.run(main(AsyncClient(addresses), first))
        assert rows_per_shard(cluster) == [0] * n
        assert all(not shard.snapshots() for shard in cluster.shards)


def test_without_verification_the_shards_refuse_misrouted_ids(two: Cluster) -> None:
    ids = np.arange(300, dtype=np.uint64)

    async def main() -> None:
        async with AsyncClient(two.addresses[::-1], ClientOptions(verify_topology=False)) as client:
            with pytest.raises(FailedPreconditionError, match="belongs to shard"):
                await client.lookup("t", ids, train=True)
            with pytest.raises(FailedPreconditionError, match="belongs to shard"):
                await client.assign("t", ids, np.ones((ids.size, DIM), np.float32))
            with pytest.raises(ConfigError, match="shard 1 of 2"):
                await client.check_topology()

    asyncio.run(main())
    assert rows_per_shard(two) == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("fp16", [False, True])
def test_requests_fit_the_servers_response_limit(tmp_path: Path, fp16: bool) -> None:
    n = 100_000
    rng = np.random.default_rng(6)
    ids = rng.permutation(np.arange(n, dtype=np.uint64))
    wide = (rng.integers(-64, 64, size=(n, 16)) / 16).astype(np.float32)
    config = sgd_tables(capacity=n, wide=16)

    async def main(addresses: list[str]) -> None:
        async with AsyncClient(addresses, ClientOptions(fp16=fp16, lz4_min_bytes=1)) as client:
            assert await client.assign("wide", ids, wide) == n
            got = [
                await client.lookup("wide", ids, train=False),
                (await client.lookup_many({"wide": ids}, train=True))["wide"],
            ]
            bound = 2.0**-11 * np.abs(wide).max(axis=1, keepdims=True) if fp16 else 0.0
            for vectors in got:
                assert np.all(np.abs(vectors - wide) <= bound)
            grads = np.ones_like(wide)
            assert (await client.apply_gradients("wide", ids, grads)).applied == n

    with serve_cluster(tmp_path, 2, config, max_response_bytes=1 << 20) as cluster:
        asyncio.run(main(cluster.addresses))
        assert sum(s.stats().tables["wide"].rows for s in cluster.shards) == n


class FailFirstDescribe(grpc.aio.UnaryUnaryClientInterceptor):
    """Sends the first ``DescribeShard`` to a method no server has (a real UNIMPLEMENTED
    answer) and every other call as it is; records each call's method."""

    def __init__(self) -> None:
        self.failed = False
        self.methods: list[str] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self.methods.append(method.rsplit("/", 1)[-1])
        if method.endswith("/DescribeShard") and not self.failed:
            self.failed = True
            other = method.replace("DescribeShard", "NoSuchMethod")
            details = details._replace(method=other.encode())
        return await continuation(details, request)


def test_a_failed_check_is_not_remembered(two: Cluster) -> None:
    interceptor = FailFirstDescribe()
    ids = np.arange(100, dtype=np.uint64)
    ones = np.ones((ids.size, DIM), np.float32)

    def factory(address: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(address, interceptors=[interceptor])

    async def main() -> None:
        async with AsyncClient(two.addresses, channel_factory=factory) as client:
            with pytest.raises(RemoteError, match=r"DescribeShard failed: UNIMPLEMENTED"):
                await client.assign("t", ids, ones)
            assert interceptor.methods == ["DescribeShard", "DescribeShard"]
            assert rows_per_shard(two) == [0, 0]
            assert await client.assign("t", ids, ones) == ids.size  # asks again, and succeeds
            await client.stats()
        assert sorted(interceptor.methods) == sorted(
            ["DescribeShard"] * 4 + ["Assign"] * 2 + ["Stats"] * 2
        )

    asyncio.run(main())
    assert sum(rows_per_shard(two)) == ids.size
