"""The blocking client's topology check and the servers' limits, against real shards on
127.0.0.1 (port 0); no mocks. Helpers shared with ``test_client.py`` and ``test_client_async.py``.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from embeddb.client import (
    Client,
    ClientOptions,
    RemoteError,
    topology,
)
from embeddb.common.arrays import F32
from embeddb.common.routing import ROUTING_ALGORITHM, SHARD_SALT
from embeddb.errors import (
    ConfigError,
    FailedPreconditionError,
    UnavailableError,
)
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.test_client import (
    DIM,
    LR,
    Cluster,
    Recorder,
    serve_cluster,
    sgd_tables,
)


def test_topology_check_catches_a_misordered_address_list(two: Cluster) -> None:
    with Client(two.addresses[::-1]) as client, pytest.raises(ConfigError, match="shard 1 of 2"):
        client.check_topology()


# Shards listed by a client (indices into the cluster's addresses), and the cluster's size.
WRONG_LISTS = {
    "2 shards reversed": (2, [1, 0]),
    "3 shards, 1 and 2 swapped": (3, [0, 2, 1]),  # shard 0 is right: it must get nothing either
    "3 shards rotated": (3, [1, 2, 0]),
    "1 address of 2 shards": (2, [0]),
    "the other address of 2 shards": (2, [1]),
}


def wrong_list(cluster: Cluster, order: list[int]) -> tuple[list[str], int]:
    """The addresses a misconfigured client lists, and the position of the first wrong one."""
    n = len(cluster.shards)
    first = next(i for i, k in enumerate(order) if (k, n) != (i, len(order)))
    return [cluster.addresses[k] for k in order], first


def data_calls(client: Client, ids: npt.NDArray[np.uint64]) -> dict[str, Callable[[], object]]:
    """Every kind of call, each of which writes rows if it reaches a shard (or reads)."""
    ones = np.ones((ids.size, DIM), np.float32)
    return {
        "lookup": lambda: client.lookup("t", ids),
        "lookup_many": lambda: client.lookup_many({"t": ids}),
        "assign": lambda: client.assign("t", ids, ones),
        "apply_gradients": lambda: client.apply_gradients("t", ids, ones),
        "apply_gradients_many": lambda: client.apply_gradients_many({"t": (ids, ones)}),
        "delete": lambda: client.delete("t", ids),
        "stats": client.stats,
        "list_tables": client.list_tables,
        "check_topology": client.check_topology,
    }


def rows_per_shard(cluster: Cluster) -> list[int]:
    return [shard.stats().tables["t"].rows for shard in cluster.shards]


@pytest.mark.parametrize("case", sorted(WRONG_LISTS))
def test_a_wrong_address_list_is_refused_before_anything_is_sent(
    make_cluster: Callable[[int], Cluster], case: str
) -> None:
    n, order = WRONG_LISTS[case]
    cluster = make_cluster(n)
    addresses, first = wrong_list(cluster, order)
    ids = np.arange(300, dtype=np.uint64)
    with Client(addresses) as client:
        for name, call in data_calls(client, ids).items():
            with pytest.raises(ConfigError) as info:
                call()
            message = str(info.value)
            assert message.startswith(f"addresses[{first}]: {addresses[first]} serves shard "), name
            assert f"of {n}, but the client lists it as shard {first} of {len(order)}" in message
            assert "no data call was sent" in message
    assert rows_per_shard(cluster) == [0] * n  # not even the shards listed in their place
    with Client(cluster.addresses) as right:  # the same calls in shard order work
        assert right.assign("t", ids, np.ones((ids.size, DIM), np.float32)) == ids.size
    assert sum(rows_per_shard(cluster)) == ids.size


def test_without_verification_the_shards_refuse_misrouted_ids(
    make_cluster: Callable[[int], Cluster],
) -> None:
    cluster = make_cluster(2)
    ids = np.arange(300, dtype=np.uint64)
    with Client(cluster.addresses[::-1], ClientOptions(verify_topology=False)) as client:
        assert client.options.verify_topology is False
        with pytest.raises(FailedPreconditionError, match=r"belongs to shard \d of 2"):
            client.lookup("t", ids, train=True)
        with pytest.raises(FailedPreconditionError, match="nothing of the request was applied"):
            client.assign("t", ids, np.ones((ids.size, DIM), np.float32))
        with pytest.raises(ConfigError, match="shard 1 of 2"):  # asked for, it still checks
            client.check_topology()
    assert rows_per_shard(cluster) == [0, 0]


def describe(index: int, count: int, algorithm: str, salt: int) -> pb.DescribeShardResponse:
    return pb.DescribeShardResponse(
        shard_index=index,
        num_shards=count,
        routing=pb.Routing(algorithm=algorithm, salt=salt),
        limits=pb.ServerLimits(max_ids_per_request=7, max_response_bytes=640),
    )


def test_a_shard_routing_another_way_is_refused() -> None:
    good = describe(0, 1, ROUTING_ALGORITHM, int(SHARD_SALT))
    assert topology.shard_limits(["h:1"], [good], verify=True) == (
        topology.ShardLimits(7, 640, topology.DEFAULT_LIMITS.max_message_bytes),
    )
    for bad in (
        describe(0, 1, "modulo-v0", int(SHARD_SALT)),
        describe(0, 1, ROUTING_ALGORITHM, 1),
        describe(0, 1, "", 0),  # a server that does not say
    ):
        with pytest.raises(ConfigError, match=r"addresses\[0\]: h:1 routes ids with .* disagree"):
            topology.shard_limits(["h:1"], [bad], verify=True)
        assert topology.shard_limits(["h:1"], [bad], verify=False)[0].max_ids_per_request == 7
    # A wrong shard is named even when another shard did not answer.
    down = UnavailableError("shard 0 (h:1) DescribeShard failed: UNAVAILABLE")
    wrong = describe(0, 2, ROUTING_ALGORITHM, int(SHARD_SALT))
    with pytest.raises(ConfigError, match=r"addresses\[1\]: h:2 serves shard 0 of 2"):
        topology.shard_limits(["h:1", "h:2"], [down, wrong], verify=True)
    with pytest.raises(UnavailableError, match="h:1"):
        topology.shard_limits(["h:1", "h:2"], [down, good], verify=False)


class FailFirstDescribe(grpc.UnaryUnaryClientInterceptor):
    """Sends the first ``DescribeShard`` to a method no server has (a real UNIMPLEMENTED
    answer) and every other call as it is; records each call's method."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = False
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        with self.lock:
            self.methods.append(details.method.rsplit("/", 1)[-1])
            fail = details.method.endswith("/DescribeShard") and not self.failed
            self.failed = self.failed or fail
        if fail:
            details = CallDetails(
                details.method.replace("DescribeShard", "NoSuchMethod"),
                details.timeout,
                details.metadata,
                details.credentials,
                details.wait_for_ready,
                details.compression,
            )
        return continuation(details, request)


class CallDetails(
    namedtuple(
        "CallDetails",
        ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"],
    ),
    grpc.ClientCallDetails,
):
    """A call's details with another method."""


def test_a_failed_check_is_not_remembered_and_a_good_one_is(two: Cluster) -> None:
    interceptor = FailFirstDescribe()

    def factory(address: str) -> grpc.Channel:
        return grpc.intercept_channel(grpc.insecure_channel(address), interceptor)

    ids = np.arange(100, dtype=np.uint64)
    ones = np.ones((ids.size, DIM), np.float32)
    with Client(two.addresses, channel_factory=factory) as client:
        with pytest.raises(RemoteError, match=r"shard \d .* DescribeShard failed: UNIMPLEMENTED"):
            client.assign("t", ids, ones)
        assert interceptor.methods == ["DescribeShard", "DescribeShard"]  # nothing else sent
        assert rows_per_shard(two) == [0, 0]
        assert client.assign("t", ids, ones) == ids.size  # asks again, and succeeds
        client.lookup("t", ids, train=False)
        client.stats()
    assert sorted(interceptor.methods) == sorted(
        ["DescribeShard"] * 4 + ["Assign"] * 2 + ["DescribeTable"] + ["Lookup"] * 2 + ["Stats"] * 2
    )
    assert sum(rows_per_shard(two)) == ids.size


@pytest.mark.slow
@pytest.mark.parametrize("fp16", [False, True])
def test_requests_fit_the_servers_response_limit(tmp_path: Path, fp16: bool) -> None:
    """At dim 16 the 100k rows of a batch are 6.4 MB (3.6 MB as float16): 1 MiB answers need
    several requests per shard, which one request of a shard's ids would exceed."""
    n, limit = 100_000, 1 << 20
    config = sgd_tables(capacity=n, wide=16, narrow=2)
    rng = np.random.default_rng(5)
    ids = rng.permutation(np.arange(n, dtype=np.uint64) * 3 + 1)
    wide = (rng.integers(-64, 64, size=(n, 16)) / 16).astype(np.float32)  # dyadic: exact sums
    narrow = (rng.integers(-64, 64, size=(n, 2)) / 16).astype(np.float32)
    recorder = Recorder()

    def factory(address: str) -> grpc.Channel:
        return grpc.intercept_channel(grpc.insecure_channel(address), recorder)

    def close(got: F32, want: F32) -> None:
        bound = 2.0**-11 * np.abs(want).max(axis=1, keepdims=True) if fp16 else 0.0
        assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)

    with serve_cluster(tmp_path, 2, config, max_response_bytes=limit) as cluster:
        per_shard = [cluster.owned(ids, k).size for k in range(2)]
        # One shard's ids in one request are refused, before anything is done.
        mine = cluster.owned(ids, 0)
        with grpc.insecure_channel(cluster.addresses[0]) as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            encoding = pb.Encoding(fp16=fp16)
            refused = {
                "Lookup": lambda: stub.Lookup(
                    pb.LookupRequest(
                        table="wide", ids=wire.encode_ids(mine), train=True, encoding=encoding
                    )
                ),
                "Assign, LZ4": lambda: stub.Assign(
                    pb.AssignRequest(
                        table="wide",
                        ids=wire.encode_ids(mine),
                        vectors=wire.encode_matrix(wide[: mine.size], lz4_min_bytes=1),
                    )
                ),
            }
            for name, call in refused.items():
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, name
        assert cluster.shards[0].stats().tables["wide"].rows == 0
        with Client(
            cluster.addresses, ClientOptions(fp16=fp16, lz4_min_bytes=1), channel_factory=factory
        ) as c:
            assert c.assign("wide", ids, wide) == n
            assert c.assign("narrow", ids, narrow) == n
            close(c.lookup("wide", ids, train=False), wide)
            both = c.lookup_many({"wide": ids, "narrow": ids[::-1]}, train=True)
            close(both["wide"], wide)
            close(both["narrow"], narrow[::-1])
            grads = {"wide": (ids, np.ones_like(wide)), "narrow": (ids, np.ones_like(narrow))}
            assert c.apply_gradients_many(grads)["wide"].applied == n
            assert c.apply_gradients("wide", ids, np.ones_like(wide)).applied == n
            close(c.lookup("wide", ids, train=False), wide - 2 * LR)
            assert c.delete("wide", ids) == n
        calls = [method for method, _ in recorder.calls]
        row = 16 * 2 + 4 if fp16 else 16 * 4
        per_request = limit // row  # the most ids whose rows fit one answer
        assert calls.count("Lookup") == 2 * sum(-(-k // per_request) for k in per_shard)
        assert calls.count("LookupMany") >= sum(-(-k * (row + 2 * 4) // limit) for k in per_shard)
        assert calls.count("Assign") >= sum(-(-k * 64 // limit) for k in per_shard) + 2
        assert calls.count("DescribeShard") == 2


def test_requests_fit_the_servers_id_limit(tmp_path: Path) -> None:
    with serve_cluster(tmp_path, 2, max_ids_per_request=100) as cluster:
        ids = np.arange(1000, dtype=np.uint64)
        vectors = np.arange(ids.size * DIM, dtype=np.float32).reshape(-1, DIM)
        with Client(cluster.addresses) as client:
            assert client.assign("t", ids, vectors) == ids.size
            np.testing.assert_array_equal(client.lookup("t", ids, train=False), vectors)
            assert client.delete("t", ids[::2]) == ids.size // 2
        assert sum(rows_per_shard(cluster)) == ids.size // 2
