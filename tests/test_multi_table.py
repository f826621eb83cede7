"""Multi-table calls (``LookupMany``, ``ApplyGradientsMany``) against real shards on 127.0.0.1.

Equality with the single-table calls (two identical clusters, one driven each way), one call per
shard per batch (the servers' own request metrics), validation of every part before any is
applied (raw requests: the shard's rows and counters do not move), roles, and a follower.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry

from embeddb.client import AsyncClient, Client, ClientOptions, PushResult
from embeddb.client.batching import Budget, IdBatch, split_many
from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    TableNotFoundError,
    UnavailableError,
)
from embeddb.server import ServerConfig, build_server
from embeddb.transport import wire
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Tokens
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.test_follower import caught_up, replica

DIMS = {"sgd": 4, "ada": 8, "small": 2}
UNIVERSE = np.arange(600, dtype=np.uint64)
RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"


def config() -> EmbeddingConfig:
    """Three tables of different dims: SGD and Adagrad (whose state must match too)."""
    sgd = OptimizerConfig(kind=OptimizerKind.SGD, lr=0.5)
    ada = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1)
    return EmbeddingConfig(
        tables={
            "sgd": TableConfig(name="sgd", dim=4, capacity=1000, optimizer=sgd),
            "ada": TableConfig(name="ada", dim=8, capacity=1000, optimizer=ada),
            "small": TableConfig(name="small", dim=2, capacity=1000, optimizer=sgd),
        }
    )


@dataclass
class Cluster:
    shards: list[Shard] = field(default_factory=list)
    servers: list[RpcServer] = field(default_factory=list)
    registries: list[CollectorRegistry] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.servers]

    def calls(self, method: str, status: str = "OK") -> list[float]:
        """Each shard's count of ``method`` calls so far."""
        labels = {"method": method, "status": status}
        return [
            r.get_sample_value("embeddb_requests_total", labels) or 0.0 for r in self.registries
        ]

    def rows(self) -> list[tuple[bytes, bytes]]:
        """Every shard's full rows (vector and optimizer state) of every table."""
        out: list[tuple[bytes, bytes]] = []
        for shard in self.shards:
            for table in DIMS:
                found, rows = shard.peek(table, UNIVERSE)
                out.append((found.tobytes(), rows.tobytes()))
        return out

    def state(self) -> list[Any]:
        """:meth:`rows` and every shard's counters."""
        return [*self.rows(), *(shard.stats().tables for shard in self.shards)]


@contextmanager
def serve(data_dir: Path, n: int, tokens: Tokens | None = None, **server: Any) -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        for k in range(n):
            cluster.shards.append(
                Shard(config(), data_dir / f"shard-{k}", shard_index=k, num_shards=n)
            )
            cluster.registries.append(CollectorRegistry())
            cluster.servers.append(
                build_server(
                    cluster.shards[-1],
                    ServerConfig(
                        listen=ListenConfig(tokens=tokens),
                        shard_index=k,
                        num_shards=n,
                        metrics_registry=cluster.registries[-1],
                        **server,
                    ),
                )
            )
        yield cluster
    finally:
        for s in cluster.servers:
            s.stop(grace=0)
        for shard in cluster.shards:
            shard.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    """Two identical 2-shard clusters: one driven table by table, one with the *Many calls."""
    with serve(tmp_path / "single", 2) as single, serve(tmp_path / "many", 2) as many:
        yield single, many


def batch(rng: np.random.Generator) -> dict[str, npt.NDArray[np.uint64]]:
    """Ids with duplicates, new and known ones; ``small`` has none this time."""
    return {
        "sgd": rng.choice(UNIVERSE, size=300).astype(np.uint64),
        "ada": rng.choice(UNIVERSE[:200], size=120).astype(np.uint64),
        "small": np.zeros(0, np.uint64),
    }


def gradients(rng: np.random.Generator, ids: dict[str, npt.NDArray[np.uint64]]) -> dict[str, F32]:
    return {t: rng.standard_normal((i.size, DIMS[t])).astype(np.float32) for t, i in ids.items()}


# ------------------------------------------------------------------ equality with single calls
@pytest.mark.slow
@pytest.mark.parametrize("max_ids", [1 << 20, 37])
def test_many_calls_equal_single_table_calls(pair: tuple[Cluster, Cluster], max_ids: int) -> None:
    single, many = pair
    rng = np.random.default_rng(max_ids)
    with (
        Client(single.addresses, ClientOptions(max_ids_per_message=max_ids)) as a,
        Client(many.addresses, ClientOptions(max_ids_per_message=max_ids)) as b,
    ):
        for step in range(3):
            ids = batch(rng)
            ids["small"] = rng.choice(UNIVERSE, size=step * 40).astype(np.uint64)
            for train in (True, False):
                want = {t: a.lookup(t, i, train=train) for t, i in ids.items()}
                got = b.lookup_many(ids, train=train)
                assert list(got) == list(ids)
                for t in ids:
                    assert got[t].shape == (ids[t].size, DIMS[t]) and got[t].flags.writeable
                    np.testing.assert_array_equal(got[t], want[t])
            grads = gradients(rng, ids)
            grads["ada"][:3] = np.nan  # skipped on both, counted per table
            want_results = {t: a.apply_gradients(t, ids[t], grads[t]) for t in ids}
            got_results = b.apply_gradients_many({t: (ids[t], grads[t]) for t in ids})
            assert got_results == want_results
            assert got_results["ada"].nan_skipped >= 1 and got_results["sgd"].applied > 0
            assert single.state() == many.state()  # vectors, Adagrad state, every counter
        fresh = np.arange(1000, 1050, dtype=np.uint64)  # never looked up: missing
        zeros = np.zeros((fresh.size, DIMS["sgd"]), np.float32)
        assert b.apply_gradients_many({"sgd": (fresh, zeros)})["sgd"] == PushResult(
            missing=fresh.size
        )


@pytest.mark.slow
def test_one_call_per_shard_per_batch(pair: tuple[Cluster, Cluster]) -> None:
    _, many = pair
    rng = np.random.default_rng(1)
    ids = batch(rng)
    with Client(many.addresses) as client:
        client.list_tables()  # the dims the client checks against, fetched once
        client.lookup_many(ids, train=True)
        client.apply_gradients_many({t: (i, gradients(rng, ids)[t]) for t, i in ids.items()})
        assert many.calls("LookupMany") == [1, 1]
        assert many.calls("ApplyGradientsMany") == [1, 1]
        assert many.calls("Lookup") == many.calls("ApplyGradients") == [0, 0]
        assert many.calls("ListTables") == [1, 0]  # cached: not asked again
        client.lookup_many({"sgd": [0]}, train=False)  # id 0 lives on one shard only
        assert sum(many.calls("LookupMany")) == 3
        client.lookup_many({})  # nothing to send
        assert sum(many.calls("LookupMany")) == 3
    # The servers count each part's ids under its own table.
    per_table = sum(
        r.get_sample_value("embeddb_request_ids_total", {"method": "LookupMany", "table": "ada"})
        or 0.0
        for r in many.registries
    )
    assert per_table == np.unique(ids["ada"]).size


@pytest.mark.slow
def test_the_first_call_describes_every_shard_once(pair: tuple[Cluster, Cluster]) -> None:
    _, many = pair
    rng = np.random.default_rng(8)
    ids = batch(rng)
    with Client(many.addresses) as client:
        start = threading.Barrier(4)

        def first_call() -> dict[str, F32]:
            start.wait()  # four first calls at once
            return client.lookup_many(ids, train=False)

        with ThreadPoolExecutor(4) as pool:
            answers = [f.result() for f in [pool.submit(first_call) for _ in range(4)]]
        assert all(a["sgd"].shape == (ids["sgd"].size, 4) for a in answers)
        assert many.calls("DescribeShard") == [1, 1]
        client.lookup("ada", ids["ada"])
        client.apply_gradients_many({t: (i, gradients(rng, ids)[t]) for t, i in ids.items()})
        client.stats()
        assert many.calls("DescribeShard") == [1, 1]  # later calls ask no more
        client.check_topology()  # asked for: it asks now
        assert many.calls("DescribeShard") == [2, 2]
    with Client(many.addresses) as checked:  # what the inference server does at start
        checked.check_topology()
        checked.lookup_many(ids, train=False)
        assert many.calls("DescribeShard") == [3, 3]

    async def gathered() -> None:
        async with AsyncClient(many.addresses) as client:
            await asyncio.gather(*(client.lookup_many(ids, train=False) for _ in range(4)))
            assert many.calls("DescribeShard") == [4, 4]
            await client.lookup("sgd", ids["sgd"], train=False)
            await client.list_tables()
            assert many.calls("DescribeShard") == [4, 4]
            await client.check_topology()
            assert many.calls("DescribeShard") == [5, 5]

    asyncio.run(gathered())


def test_split_many_follows_the_documented_example() -> None:
    batches = {"a": IdBatch.of([10, 11, 12]), "b": IdBatch.of([20, 21, 22])}

    def layout(requests: list[list[tuple[str, Any]]]) -> list[list[tuple[str, list[int]]]]:
        return [[(t, p.rows.tolist()) for t, p in pieces] for pieces in requests]

    assert layout(split_many(batches, [Budget(4)])) == [
        [("a", [0, 1, 2]), ("b", [0])],
        [("b", [1, 2])],
    ]
    costs = {"a": (16,), "b": (32,)}
    assert layout(split_many(batches, [Budget(4, (64,))], costs)) == [
        [("a", [0, 1, 2])],
        [("b", [0, 1])],
        [("b", [2])],
    ]
    # A row above the whole budget travels alone (the shard refuses it, naming its limit).
    assert layout(split_many(batches, [Budget(4, (20,))], costs))[3:] == [
        [("b", [0])],
        [("b", [1])],
        [("b", [2])],
    ]


def test_split_many_fits_each_shards_byte_budget() -> None:
    rng = np.random.default_rng(7)
    batches = {t: IdBatch.of(rng.choice(UNIVERSE, size=200)) for t in ("a", "b", "c")}
    costs = {"a": (16, 24), "b": (64, 72), "c": (8, 8)}
    budgets = [Budget(50, (1000, 4000)), Budget(1000, (300, 10_000)), Budget(7, (10**6, 10**6))]
    requests = split_many(batches, budgets, costs)
    sent: dict[str, list[npt.NDArray[np.uint64]]] = {t: [] for t in batches}
    for pieces in requests:
        shard = pieces[0][1].shard
        assert all(p.shard == shard for _, p in pieces)
        assert len({t for t, _ in pieces}) == len(pieces)
        assert sum(p.rows.size for _, p in pieces) <= budgets[shard].ids
        for i, capacity in enumerate(budgets[shard].bytes):
            assert sum(p.rows.size * costs[t][i] for t, p in pieces) <= capacity
        for t, p in pieces:
            sent[t].append(batches[t].unique[p.rows])
    for t, b in batches.items():  # every unique id exactly once
        np.testing.assert_array_equal(np.sort(np.concatenate(sent[t])), np.sort(b.unique))


def test_split_many_respects_the_limit_and_names_each_table_once() -> None:
    rng = np.random.default_rng(2)
    batches = {t: IdBatch.of(rng.choice(UNIVERSE, size=90)) for t in ("a", "b", "c")}
    requests = split_many(batches, [Budget(25)] * 3)
    sent: dict[str, list[npt.NDArray[np.uint64]]] = {t: [] for t in batches}
    for pieces in requests:
        tables = [t for t, _ in pieces]
        assert len(set(tables)) == len(tables)  # a shard refuses a table named twice
        assert sum(p.rows.size for _, p in pieces) <= 25
        assert len({p.shard for _, p in pieces}) == 1
        for t, p in pieces:
            sent[t].append(batches[t].unique[p.rows])
    for t, b in batches.items():  # every unique id exactly once
        np.testing.assert_array_equal(np.sort(np.concatenate(sent[t])), np.sort(b.unique))
    total = sum(b.unique.size for b in batches.values())
    assert len(requests) <= total // 25 + 3  # packed: at most one partial request per shard


@pytest.mark.slow
def test_async_client_equals_the_sync_client(pair: tuple[Cluster, Cluster]) -> None:
    single, many = pair
    rng = np.random.default_rng(3)
    ids = batch(rng)
    grads = gradients(rng, ids)

    async def run() -> tuple[dict[str, F32], dict[str, PushResult], dict[str, F32]]:
        async with AsyncClient(many.addresses) as client:
            looked = await client.lookup_many(ids, train=True)
            pushed = await client.apply_gradients_many({t: (ids[t], grads[t]) for t in ids})
            return looked, pushed, await client.lookup_many(ids, train=False)

    looked, pushed, after = asyncio.run(run())
    with Client(single.addresses) as client:
        for t in ids:
            np.testing.assert_array_equal(looked[t], client.lookup(t, ids[t], train=True))
            assert pushed[t] == client.apply_gradients(t, ids[t], grads[t])
            np.testing.assert_array_equal(after[t], client.lookup(t, ids[t], train=False))
    assert single.state() == many.state()


# ------------------------------------------------------------------ bad input, client side
@pytest.mark.slow
def test_client_checks_every_table_before_sending(pair: tuple[Cluster, Cluster]) -> None:
    _, many = pair
    ids = {"sgd": UNIVERSE[:50], "ada": UNIVERSE[:50]}
    with Client(many.addresses) as client:
        client.lookup_many(ids, train=True)
        before = many.state()
        calls = many.calls("LookupMany")
        with pytest.raises(TableNotFoundError, match=r"unknown table 'nope'.*known tables"):
            client.lookup_many({**ids, "nope": [1, 2]}, train=True)
        grads = {t: (i, np.ones((i.size, DIMS[t]), np.float32)) for t, i in ids.items()}
        with pytest.raises(InvalidArgumentError, match=r"grads of table 'ada'.*\(50, 8\)"):
            client.apply_gradients_many(
                {**grads, "ada": (ids["ada"], np.ones((50, 4), np.float32))}
            )
        with pytest.raises(InvalidArgumentError, match="grads of table 'sgd'"):
            client.apply_gradients_many(
                {**grads, "sgd": (ids["sgd"], np.ones((49, 4), np.float32))}
            )
        with pytest.raises(InvalidArgumentError, match="ids"):
            client.lookup_many({"sgd": [-1]})
        assert many.calls("LookupMany") == calls
        assert sum(many.calls("ApplyGradientsMany")) == 0  # nothing was sent
        assert many.state() == before


@pytest.mark.slow
def test_training_calls_are_not_retried_evaluation_lookups_are(
    pair: tuple[Cluster, Cluster],
) -> None:
    _, many = pair
    ids = {"sgd": UNIVERSE[:100], "ada": UNIVERSE[:100]}
    with Client(many.addresses, ClientOptions(retries=2, backoff=0.001)) as client:
        client.list_tables()
        many.servers[1].stop(grace=0)
        with pytest.raises(
            UnavailableError, match=r"shard 1 .* LookupMany failed after 3 attempts"
        ):
            client.lookup_many(ids, train=False)
        with pytest.raises(UnavailableError) as info:
            client.lookup_many(ids, train=True)
        assert "shard 1" in str(info.value) and "attempts" not in str(info.value)
        grads = {t: (i, np.zeros((100, DIMS[t]), np.float32)) for t, i in ids.items()}
        with pytest.raises(UnavailableError, match="ApplyGradientsMany failed: ") as info:
            client.apply_gradients_many(grads)
        assert "attempts" not in str(info.value)


# ------------------------------------------------------------------ bad input, server side
@pytest.fixture
def one(tmp_path: Path) -> Iterator[tuple[Cluster, pb_grpc.EmbeddingStoreServiceStub]]:
    with serve(tmp_path, 1, max_ids_per_request=100) as cluster:
        cluster.shards[0].lookup("sgd", UNIVERSE[:10], train=True)
        with grpc.insecure_channel(cluster.addresses[0]) as channel:
            yield cluster, pb_grpc.EmbeddingStoreServiceStub(channel)


def lookup_part(table: str, ids: Any, train: bool = True) -> pb.LookupRequest:
    return pb.LookupRequest(
        table=table, ids=wire.encode_ids(np.asarray(ids, np.uint64)), train=train
    )


def grads_part(table: str, ids: Any, grads: F32) -> pb.ApplyGradientsRequest:
    return pb.ApplyGradientsRequest(
        table=table,
        ids=wire.encode_ids(np.asarray(ids, np.uint64)),
        grads=wire.encode_matrix(grads),
    )


NEW = UNIVERSE[100:140]  # not stored yet: a training lookup would insert them
OLD = UNIVERSE[:10]
BAD_LOOKUPS = {
    "unknown table": (
        [lookup_part("sgd", NEW), lookup_part("nope", [1])],
        grpc.StatusCode.NOT_FOUND,
        "unknown table 'nope'",
    ),
    "duplicate table": (
        [lookup_part("sgd", NEW), lookup_part("ada", [1]), lookup_part("sgd", [2], False)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "table 'sgd' is named by more than one part",
    ),
    "too many ids together": (
        [lookup_part("sgd", NEW), lookup_part("ada", UNIVERSE[200:270])],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the 2 parts of lookups have 110 ids together, more than max_ids_per_request 100",
    ),
    "malformed ids": (
        [
            lookup_part("sgd", NEW),
            pb.LookupRequest(table="ada", ids=wire.encode_matrix(np.ones((1, 1), np.float32))),
        ],
        grpc.StatusCode.INVALID_ARGUMENT,
        r"lookups\[1\].ids must be UINT64",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LOOKUPS))
def test_a_bad_lookup_part_rejects_the_whole_request(
    one: tuple[Cluster, pb_grpc.EmbeddingStoreServiceStub], case: str
) -> None:
    cluster, stub = one
    parts, code, message = BAD_LOOKUPS[case]
    before = cluster.state()
    with pytest.raises(grpc.RpcError) as info:
        stub.LookupMany(pb.LookupManyRequest(lookups=parts))
    assert info.value.code() == code
    assert re.search(message, info.value.details() or ""), info.value.details()
    assert cluster.state() == before  # no row inserted, not even a lookup counter moved
    # The server stays up: the good part alone works.
    reply = stub.LookupMany(pb.LookupManyRequest(lookups=parts[:1]))
    assert wire.decode_matrix(reply.results[0].vectors, "v").shape == (NEW.size, DIMS["sgd"])


def test_a_bad_gradient_part_rejects_the_whole_request(
    one: tuple[Cluster, pb_grpc.EmbeddingStoreServiceStub],
) -> None:
    cluster, stub = one
    good = grads_part("sgd", OLD, np.ones((10, 4), np.float32))
    cases = [
        ([good, grads_part("ada", [1], np.ones((1, 4), np.float32))],
         grpc.StatusCode.INVALID_ARGUMENT, r"updates\[1\].grads must have shape \[1, 8\]"),
        ([good, grads_part("nope", [1], np.ones((1, 4), np.float32))],
         grpc.StatusCode.NOT_FOUND, "unknown table 'nope'"),
        ([good, grads_part("sgd", [1], np.ones((1, 4), np.float32))],
         grpc.StatusCode.INVALID_ARGUMENT, "table 'sgd' is named by more than one part"),
        ([good, grads_part("ada", UNIVERSE[:91], np.ones((91, 8), np.float32))],
         grpc.StatusCode.RESOURCE_EXHAUSTED, "101 ids together"),
        ([good, grads_part("small", [1, 2], np.ones((3, 2), np.float32))],
         grpc.StatusCode.INVALID_ARGUMENT, r"updates\[1\].grads must have shape \[2, 2\]"),
    ]  # fmt: skip
    before = cluster.state()
    for parts, code, message in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.ApplyGradientsMany(pb.ApplyGradientsManyRequest(updates=parts))
        assert info.value.code() == code, message
        assert re.search(message, info.value.details() or ""), info.value.details()
        assert cluster.state() == before, message  # part 0 was not applied
    reply = stub.ApplyGradientsMany(pb.ApplyGradientsManyRequest(updates=[good]))
    assert reply.results[0].applied == 10  # the server stays up
    assert cluster.state() != before


def test_nan_gradients_are_skipped_per_part_and_empty_requests_are_valid(
    one: tuple[Cluster, pb_grpc.EmbeddingStoreServiceStub],
) -> None:
    cluster, stub = one
    shard = cluster.shards[0]
    shard.lookup("ada", OLD, train=True)
    sgd = np.ones((10, 4), np.float32)
    sgd[[2, 5]] = np.nan
    ada = np.ones((10, 8), np.float32)
    ada[7, 3] = np.inf
    _, sgd_before = shard.peek("sgd", OLD)
    _, ada_before = shard.peek("ada", OLD)
    missing = UNIVERSE[500:503]
    reply = stub.ApplyGradientsMany(
        pb.ApplyGradientsManyRequest(
            updates=[
                grads_part("sgd", OLD, sgd),
                grads_part("ada", OLD, ada),
                grads_part("small", missing, np.ones((3, 2), np.float32)),
            ]
        )
    )
    got = [(r.applied, r.nan_skipped, r.missing) for r in reply.results]
    assert got == [(8, 2, 0), (9, 1, 0), (0, 0, 3)]
    _, sgd_after = shard.peek("sgd", OLD)
    _, ada_after = shard.peek("ada", OLD)
    np.testing.assert_array_equal(sgd_after[[2, 5]], sgd_before[[2, 5]])
    np.testing.assert_array_equal(ada_after[7], ada_before[7])
    assert not np.array_equal(sgd_after[0], sgd_before[0])
    assert shard.stats().tables["sgd"].nan_skipped == 2
    assert shard.stats().tables["ada"].nan_skipped == 1
    assert list(stub.LookupMany(pb.LookupManyRequest()).results) == []
    assert list(stub.ApplyGradientsMany(pb.ApplyGradientsManyRequest()).results) == []
    # A part with no ids answers an empty matrix of the table's dim.
    reply_many = stub.LookupMany(pb.LookupManyRequest(lookups=[lookup_part("ada", [])]))
    assert wire.decode_matrix(reply_many.results[0].vectors, "v").shape == (0, 8)


# ------------------------------------------------------------------ roles and followers
def test_read_only_token_may_evaluate_but_not_train_or_push(tmp_path: Path) -> None:
    tokens = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}))
    with serve(tmp_path, 2, tokens=tokens) as cluster:
        ids = {"sgd": UNIVERSE[:80], "ada": UNIVERSE[40:120]}
        with Client(cluster.addresses, ClientOptions(token=RW)) as writer:
            writer.lookup_many(ids, train=True)
            want = writer.lookup_many({**ids, "small": UNIVERSE[:5]}, train=False)
        rows = cluster.rows()
        with Client(cluster.addresses, ClientOptions(token=RO)) as reader:
            got = reader.lookup_many({**ids, "small": UNIVERSE[:5]}, train=False)
            for t, v in want.items():
                np.testing.assert_array_equal(got[t], v)
            assert not got["small"].any()  # never trained: zeros, and not inserted
            assert cluster.rows() == rows
            before = cluster.state()
            with pytest.raises(PermissionDeniedError, match="training lookup"):
                reader.lookup_many({"sgd": UNIVERSE[500:510]}, train=True)
            grads = {t: (i, np.ones((i.size, DIMS[t]), np.float32)) for t, i in ids.items()}
            with pytest.raises(PermissionDeniedError, match="may not call ApplyGradientsMany"):
                reader.apply_gradients_many(grads)
        assert cluster.state() == before
        # A training part hidden among evaluation parts is refused too (raw request).
        with grpc.insecure_channel(cluster.addresses[0]) as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            request = pb.LookupManyRequest(
                lookups=[lookup_part("sgd", [1], False), lookup_part("ada", [999], True)]
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.LookupMany(request, metadata=(("authorization", f"Bearer {RO}"),))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert cluster.state() == before


def test_a_follower_serves_evaluation_lookup_many_only(tmp_path: Path) -> None:
    with serve(tmp_path / "primary", 1) as primary:
        ids = {"sgd": UNIVERSE[:100], "ada": UNIVERSE[50:150]}
        with Client(primary.addresses) as writer:
            writer.lookup_many(ids, train=True)
            rng = np.random.default_rng(4)
            writer.apply_gradients_many(
                {t: (i, rng.standard_normal((i.size, DIMS[t])).astype(np.float32))
                 for t, i in ids.items()}
            )  # fmt: skip
            with replica(primary.addresses[0], tmp_path / "follower", config()) as r:
                assert r.follower.wait_ready(10)
                caught_up(r.follower, primary.shards[0])
                with Client([r.address]) as reader:
                    got = reader.lookup_many(ids, train=False)
                    want = writer.lookup_many(ids, train=False)
                    for t in ids:
                        np.testing.assert_array_equal(got[t], want[t])
                    seq = r.shard.seq
                    with pytest.raises(FailedPreconditionError, match="read-only follower"):
                        reader.lookup_many({"sgd": UNIVERSE[300:310]}, train=True)
                    grads = {"sgd": (UNIVERSE[:3], np.ones((3, 4), np.float32))}
                    with pytest.raises(FailedPreconditionError, match="read-only follower"):
                        reader.apply_gradients_many(grads)
                    assert r.shard.seq == seq
                    assert not r.shard.peek("sgd", UNIVERSE[300:310])[0].any()
