"""The blocking client against real shards served on 127.0.0.1 (port 0); no mocks.

The helpers at the top (:func:`serve_cluster`) are shared with ``test_client_async.py``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embeddb.client import (
    Client,
    ClientOptions,
    DeadlineExceededError,
    PushResult,
    TableDescription,
    read_address_file,
)
from embeddb.client.batching import IdBatch
from embeddb.common.routing import shard_of
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.errors import (
    ConfigError,
    EmbeddbError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import RpcServer

DIM = 4
LR = 0.5  # dyadic, so SGD on dyadic gradients is exact in float32


@dataclass
class Cluster:
    """``n`` shards, each served on its own port, in shard order."""

    shards: list[Shard]
    servers: list[RpcServer]
    addresses: list[str] = field(default_factory=list)

    def owned(self, ids: npt.NDArray[np.uint64], k: int) -> npt.NDArray[np.uint64]:
        """The ids among ``ids`` that shard ``k`` owns."""
        return ids[shard_of(ids, len(self.shards)) == k]


def sgd_tables(capacity: int = 1000, **dims: int) -> EmbeddingConfig:
    """SGD tables (learning rate ``LR``) of the given dims; by default one table ``t`` of
    dim ``DIM``."""
    sgd = OptimizerConfig(kind=OptimizerKind.SGD, lr=LR)
    return EmbeddingConfig(
        tables={
            name: TableConfig(name=name, dim=dim, capacity=capacity, optimizer=sgd)
            for name, dim in (dims or {"t": DIM}).items()
        }
    )


@contextmanager
def serve_cluster(
    data_dir: Path, n: int, config: EmbeddingConfig | None = None, **settings: Any
) -> Iterator[Cluster]:
    """Start ``n`` shards (shard ``k`` of ``n`` each) of ``config`` (default: one SGD table
    ``t`` of dim 4), served with the ``ServerConfig`` fields ``settings``; stop and close them
    afterwards."""
    config = config or sgd_tables()
    cluster = Cluster([], [])
    try:
        for k in range(n):
            shard = Shard(config, data_dir / f"shard-{k}", shard_index=k, num_shards=n)
            cluster.shards.append(shard)
            served = ServerConfig(shard_index=k, num_shards=n, **settings)
            server = build_server(shard, served)
            cluster.servers.append(server)
            cluster.addresses.append(f"127.0.0.1:{server.port}")
        yield cluster
    finally:
        for server in cluster.servers:
            server.stop(grace=0)
        for shard in cluster.shards:
            shard.close()


@contextmanager
def silent_address() -> Iterator[str]:
    """A listening TCP port that accepts connections and never speaks HTTP/2."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def batch_with_duplicates(n: int = 300, high: int = 500, seed: int = 0) -> npt.NDArray[np.uint64]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, high, size=n).astype(np.uint64)


# ---------------------------------------------------------------------- pure batching
def test_id_batch_follows_the_documented_layout() -> None:
    batch = IdBatch.of([7, 5, 7, 9])
    assert batch.unique.tolist() == [7, 5, 9]
    assert batch.inverse.tolist() == [0, 1, 0, 2]
    assert batch.counts.tolist() == [2, 1, 1]
    grads = np.array([[1.0], [2.0], [4.0], [8.0]], dtype=np.float32)
    assert batch.sum_rows(grads).ravel().tolist() == [5.0, 2.0, 8.0]
    assert batch.last_rows(grads).ravel().tolist() == [4.0, 2.0, 8.0]
    assert batch.expand(np.array([[7.0], [5.0], [9.0]], np.float32)).ravel().tolist() == [
        7.0,
        5.0,
        7.0,
        9.0,
    ]


def test_sum_rows_mixes_small_and_large_groups() -> None:
    rng = np.random.default_rng(2)
    ids = rng.permutation(np.concatenate([np.full(50, 3), np.full(9, 4), np.arange(10, 40)]))
    batch = IdBatch.of(ids.astype(np.uint64))
    values = (rng.integers(-8, 9, size=(ids.size, 3)) / 8).astype(np.float32)
    want = np.zeros((batch.unique.size, 3), np.float32)
    np.add.at(want, batch.inverse, values)
    np.testing.assert_array_equal(batch.sum_rows(values), want)  # dyadic: exact in any order


@given(
    ids=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 20), max_size=60),
    shards=st.integers(1, 5),
    max_ids=st.integers(1, 8),
)
def test_id_batch_properties(ids: list[int], shards: int, max_ids: int) -> None:
    batch = IdBatch.of(np.array(ids, dtype=np.uint64))
    arr = np.array(ids, dtype=np.uint64)
    np.testing.assert_array_equal(batch.unique[batch.inverse], arr)
    # distinct, in order of first occurrence
    assert batch.unique.tolist() == list(dict.fromkeys(int(i) for i in ids))
    assert batch.counts.tolist() == [ids.count(int(u)) for u in batch.unique]
    values = np.arange(len(ids) * 2, dtype=np.float32).reshape(-1, 2)
    summed = np.zeros((batch.unique.size, 2), np.float32)
    np.add.at(summed, batch.inverse, values)
    np.testing.assert_array_equal(batch.sum_rows(values), summed)
    last = {int(i): values[p] for p, i in enumerate(ids)}
    want = np.array([last[int(i)] for i in batch.unique]).reshape(-1, 2)
    np.testing.assert_array_equal(batch.last_rows(values), want)
    parts = batch.parts(shards, max_ids)
    rows = np.concatenate([p.rows for p in parts]) if parts else np.empty(0, np.intp)
    assert sorted(rows.tolist()) == list(range(batch.unique.size))  # every unique id once
    for p in parts:
        assert 0 < p.rows.size <= max_ids
        assert np.all(shard_of(batch.unique[p.rows], shards) == p.shard)
        if p.whole:  # promises the rows are the whole batch in unique order
            assert p.rows.tolist() == list(range(batch.unique.size))


@pytest.mark.parametrize("high", [50, 70_000, 2**64 - 1])
def test_id_batch_matches_numpy_unique_on_large_batches(high: int) -> None:
    rng = np.random.default_rng(high % 1000)
    ids = rng.integers(0, high, size=200_000, dtype=np.uint64, endpoint=True)
    batch = IdBatch.of(ids)
    want_unique, want_first, want_counts = np.unique(ids, return_index=True, return_counts=True)
    order = np.argsort(want_first)  # numpy sorts by value; ours keeps first occurrence order
    np.testing.assert_array_equal(batch.unique, want_unique[order])
    np.testing.assert_array_equal(batch.counts, want_counts[order])
    np.testing.assert_array_equal(batch.unique[batch.inverse], ids)
    assert batch.has_duplicates == (want_unique.size < ids.size)


# ---------------------------------------------------------------------- round trips
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 4])
def test_lookup_routes_each_id_to_its_shard_and_keeps_order(
    make_cluster: Callable[[int], Cluster], n: int
) -> None:
    cluster = make_cluster(n)
    ids = batch_with_duplicates()
    unique = np.unique(ids)
    with Client(cluster.addresses) as client:
        got = client.lookup("t", ids)
        assert got.shape == (ids.size, DIM) and got.dtype == np.float32
        for k, shard in enumerate(cluster.shards):
            mine = shard_of(ids, n) == k
            np.testing.assert_array_equal(got[mine], shard.lookup("t", ids[mine], train=False))
            found, _ = shard.peek("t", unique)
            np.testing.assert_array_equal(found, shard_of(unique, n) == k)  # only its own ids
        for i in unique[:20]:  # duplicates come back identical
            rows = got[ids == i]
            assert np.all(rows == rows[0])
        stats = client.stats()
        assert [s["shard_index"] for s in stats] == list(range(n))
        for k, s in enumerate(stats):
            assert s["num_shards"] == n and s["address"] == cluster.addresses[k]
            assert s["tables"]["t"]["rows"] == cluster.owned(unique, k).size
        np.testing.assert_array_equal(client.lookup("t", ids, train=False), got)
        client.check_topology()


def test_empty_requests(two: Cluster) -> None:
    with Client(two.addresses) as client:
        empty = client.lookup("t", np.empty(0, np.uint64))
        assert empty.shape == (0, DIM) and empty.dtype == np.float32
        assert client.lookup("t", []).shape == (0, DIM)
        assert client.apply_gradients("t", [], np.zeros((0, DIM))) == PushResult(0, 0, 0)
        assert client.assign("t", [], np.zeros((0, DIM))) == 0
        assert client.delete("t", []) == 0
        with pytest.raises(NotFoundError, match="unknown table 'nope'"):
            client.lookup("nope", [])
    assert all(s.stats().tables["t"].rows == 0 for s in two.shards)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_apply_gradients_sums_duplicates_exactly(
    make_cluster: Callable[[int], Cluster], n: int
) -> None:
    cluster = make_cluster(n)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 40, size=200).astype(np.uint64)
    unique = np.unique(ids)
    grads = (rng.integers(-8, 9, size=(ids.size, DIM)) / 4).astype(np.float32)
    with Client(cluster.addresses) as client:
        assert client.assign("t", unique, np.zeros((unique.size, DIM), np.float32)) == unique.size
        result = client.apply_gradients("t", ids, grads)
        assert result == PushResult(applied=unique.size, nan_skipped=0, missing=0)
        want = {int(i): np.zeros(DIM, np.float64) for i in unique}
        for i, g in zip(ids, grads, strict=True):
            want[int(i)] -= LR * g.astype(np.float64)
        expected = np.array([want[int(i)] for i in ids], dtype=np.float32)
        np.testing.assert_array_equal(client.lookup("t", ids, train=False), expected)
        for k, shard in enumerate(cluster.shards):  # each shard holds exactly its own result
            mine = cluster.owned(unique, k)
            found, rows = shard.peek("t", mine)
            assert found.all()
            np.testing.assert_array_equal(rows[:, :DIM], [want[int(i)] for i in mine])


def test_nan_rows_are_sent_as_is_and_missing_ids_counted(two: Cluster) -> None:
    ids = np.array([1, 2, 2, 3], dtype=np.uint64)
    grads = np.ones((4, DIM), np.float32)
    grads[1, 0] = np.nan  # one occurrence of id 2: its sum is NaN
    with Client(two.addresses) as client:
        client.assign("t", [1, 2], np.zeros((2, DIM), np.float32))
        assert client.apply_gradients("t", ids, grads) == PushResult(1, 1, 1)
        got = client.lookup("t", [1, 2], train=False)
    np.testing.assert_array_equal(got, [[-LR] * DIM, [0.0] * DIM])


def test_assign_last_duplicate_wins_and_delete_counts(two: Cluster) -> None:
    ids = np.array([10, 11, 10, 12, 11], dtype=np.uint64)
    vectors = np.arange(5 * DIM, dtype=np.float32).reshape(5, DIM)
    with Client(two.addresses) as client:
        assert client.assign("t", ids, vectors) == 3
        got = client.lookup("t", [10, 11, 12], train=False)
        np.testing.assert_array_equal(got, vectors[[2, 4, 3]])
        assert client.delete("t", [10, 10, 12, 99]) == 2
        np.testing.assert_array_equal(client.lookup("t", [10], train=False), np.zeros((1, DIM)))


def test_metadata_calls(two: Cluster) -> None:
    with Client(two.addresses) as client:
        want = TableDescription(name="t", dim=DIM, optimizer="sgd", state_dim=0, capacity=1000)
        assert client.list_tables() == [want]
        assert client.describe_table("t") == want


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """A real client interceptor that records each call's method and metadata."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls.append((details.method.rsplit("/", 1)[-1], dict(details.metadata or ())))
        return continuation(details, request)


def test_batches_above_max_ids_per_message_are_split(two: Cluster) -> None:
    ids = np.arange(100, dtype=np.uint64)
    recorder = Recorder()

    def factory(address: str) -> grpc.Channel:
        return grpc.intercept_channel(grpc.insecure_channel(address), recorder)

    grads = (np.arange(100 * DIM).reshape(100, DIM) % 8 / 8).astype(np.float32)
    with (
        Client(two.addresses) as whole,
        Client(
            two.addresses, ClientOptions(max_ids_per_message=7), channel_factory=factory
        ) as split,
    ):
        first = split.lookup("t", ids)
        np.testing.assert_array_equal(first, whole.lookup("t", ids, train=False))
        per_shard = [two.owned(ids, k).size for k in range(2)]
        lookups = [method for method, _ in recorder.calls if method == "Lookup"]
        assert len(lookups) == sum(-(-c // 7) for c in per_shard)
        assert split.apply_gradients("t", ids, grads) == PushResult(100, 0, 0)
        split_after = split.lookup("t", ids, train=False)
    np.testing.assert_array_equal(split_after, first - LR * grads)


def test_token_is_sent_as_bearer_metadata(two: Cluster) -> None:
    recorder = Recorder()

    def factory(address: str) -> grpc.Channel:
        return grpc.intercept_channel(grpc.insecure_channel(address), recorder)

    with Client(two.addresses, ClientOptions(token="s3cret"), channel_factory=factory) as client:
        client.lookup("t", [1, 2, 3], train=False)
    assert recorder.calls
    assert all(md["authorization"] == "Bearer s3cret" for _, md in recorder.calls)


@pytest.mark.parametrize(("fp16", "lz4"), [(True, 0), (False, 1), (True, 1)])
def test_fp16_and_lz4_stay_within_the_documented_bound(two: Cluster, fp16: bool, lz4: int) -> None:
    ids = np.arange(500, dtype=np.uint64)
    with (
        Client(two.addresses) as exact_client,
        Client(two.addresses, ClientOptions(fp16=fp16, lz4_min_bytes=lz4)) as client,
    ):
        exact = exact_client.lookup("t", ids)
        got = client.lookup("t", ids, train=False)
    bound = 2.0**-11 * np.abs(exact).max(axis=1, keepdims=True) if fp16 else 0.0
    assert np.all(np.abs(got - exact) <= bound)


# ---------------------------------------------------------------------- errors
def test_unknown_table_names_the_shard(two: Cluster) -> None:
    with Client(two.addresses) as client, pytest.raises(NotFoundError) as info:
        client.lookup("nope", np.arange(50, dtype=np.uint64))
    message = str(info.value)
    assert "shard 0" in message and two.addresses[0] in message
    assert "unknown table 'nope'" in message
    assert isinstance(info.value.__cause__, grpc.RpcError)


def test_bad_arguments(two: Cluster) -> None:
    with Client(two.addresses) as client:
        with pytest.raises(InvalidArgumentError, match="grads must have shape"):
            client.apply_gradients("t", [1, 2], np.ones((2, DIM + 1), np.float32))
        with pytest.raises(InvalidArgumentError, match="one row per id"):
            client.apply_gradients("t", [1, 2], np.ones((3, DIM), np.float32))
        with pytest.raises(InvalidArgumentError, match="non-negative"):
            client.lookup("t", [-1])
        with pytest.raises(InvalidArgumentError, match="vectors must be finite"):
            client.assign("t", [1], np.full((1, DIM), np.inf, np.float32))


def test_a_stopped_shard_is_retried_only_for_idempotent_calls(two: Cluster) -> None:
    ids = np.arange(50, dtype=np.uint64)
    quick = Client(two.addresses, ClientOptions(retries=2, backoff=0.001))
    patient = Client(two.addresses, ClientOptions(retries=3, backoff=0.5))
    for described in (quick, patient):  # both have checked the cluster while it was whole
        described.check_topology()
    two.servers[1].stop(grace=0)
    fresh = Client(two.addresses, ClientOptions(retries=2, backoff=0.001))
    with fresh, pytest.raises(UnavailableError, match=r"shard 1 .* DescribeShard failed after 3"):
        fresh.lookup("t", two.owned(ids, 0), train=False)  # cannot check: sends nothing
    with quick as client:
        with pytest.raises(UnavailableError, match=r"shard 1 .* Lookup failed after 3 attempts"):
            client.lookup("t", ids, train=False)
        with pytest.raises(UnavailableError, match="after 3 attempts"):
            client.delete("t", ids)
        np.testing.assert_array_equal(  # shard 0 still answers for its own ids
            client.lookup("t", two.owned(ids, 0), train=False).shape, (two.owned(ids, 0).size, DIM)
        )
    with patient as client:
        for call in (
            lambda: client.apply_gradients("t", ids, np.zeros((50, DIM), np.float32)),
            lambda: client.lookup("t", ids, train=True),
        ):
            start = time.monotonic()
            with pytest.raises(UnavailableError) as info:
                call()
            assert time.monotonic() - start < 0.4
            assert "attempts" not in str(info.value)


def test_deadline_exceeded_is_a_timeout_error_and_not_retried() -> None:
    with (
        silent_address() as address,
        Client([address], ClientOptions(timeout=0.2, retries=3)) as client,
    ):
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            client.lookup("t", [1, 2, 3], train=False)
        assert time.monotonic() - start < 1.0
    assert isinstance(info.value, DeadlineExceededError) and isinstance(info.value, EmbeddbError)
    # The first call is the topology check, which times out like any call.
    assert f"shard 0 ({address}) DescribeShard failed: DEADLINE_EXCEEDED" in str(info.value)


def test_a_closed_client_refuses_calls(two: Cluster) -> None:
    client = Client(two.addresses)
    client.close()
    client.close()
    with pytest.raises(UnavailableError, match="closed"):
        client.lookup("t", [1])


# ---------------------------------------------------------------------- topology and limits
# are in test_client_topology.py


# ---------------------------------------------------------------------- construction
def test_from_address_file(two: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "shards.txt"
    path.write_text(f"# shard order matters\n\n{two.addresses[0]}  # zero\n{two.addresses[1]}\n")
    assert read_address_file(path) == tuple(two.addresses)
    with Client.from_address_file(path, ClientOptions(timeout=5.0)) as client:
        assert client.num_shards == 2 and client.options.timeout == 5.0
        client.check_topology()


def test_address_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Client.from_address_file(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(ConfigError, match="lists no"):
        Client.from_address_file(empty)
    bad = tmp_path / "bad.txt"
    bad.write_text("127.0.0.1:1\nlocalhost\n")
    with pytest.raises(ConfigError, match=r"bad\.txt:2"):
        Client.from_address_file(bad)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"addresses": []}, "addresses"),
        ({"addresses": "127.0.0.1:1"}, "addresses"),
        ({"addresses": ["127.0.0.1"]}, r"addresses\[0\]"),
        ({"addresses": ["h:1"], "timeout": 0}, "timeout"),
        ({"addresses": ["h:1"], "retries": -1}, "retries"),
        ({"addresses": ["h:1"], "max_ids_per_message": 0}, "max_ids_per_message"),
    ],
)
def test_bad_construction(kwargs: dict[str, Any], key: str) -> None:
    options = {k: v for k, v in kwargs.items() if k != "addresses"}
    with pytest.raises(ConfigError, match=key):
        Client(kwargs["addresses"], ClientOptions(**options))
