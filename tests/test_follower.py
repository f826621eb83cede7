"""Followers in-process against a real primary server on 127.0.0.1: bootstrap, applying the
feed (every kind of mutation, deletes included), refusing writes, resuming after the primary
restarts, bootstrapping again when the records were truncated, metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from embeddb.cli.common import packaged_config
from embeddb.client import Client, ClientOptions
from embeddb.common.routing import shard_of
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.config.schema import store_from_keys
from embeddb.engine.shard import Shard
from embeddb.errors import (
    ConfigError,
    FailedPreconditionError,
    PermissionDeniedError,
    StorageError,
    UnavailableError,
)
from embeddb.server import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.server.metrics import FollowerCollector
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Tokens
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import eventually

DIM = 4
UNIVERSE = np.arange(400, dtype=np.uint64)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def config(dim: int = DIM, **store: object) -> EmbeddingConfig:
    """Adagrad (the optimizer state must replicate too); a RAM tier smaller than the ids."""
    cfg = one_table_config(
        dim=dim, capacity=128, stripes=2, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )
    return replace(cfg, store=store_from_keys(store, cfg.store))


@dataclass
class Primary:
    """A primary shard served on a port that survives restarts."""

    cfg: EmbeddingConfig
    data_dir: Path
    tokens: Tokens | None = None
    shard: Shard | None = None
    server: RpcServer | None = None
    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def open(self) -> Primary:
        if self.shard is None:
            self.shard = Shard(self.cfg, self.data_dir)
        return self.serve()

    def serve(self) -> Primary:
        assert self.shard is not None
        self.server = build_server(
            self.shard, ServerConfig(listen=ListenConfig(port=self.port, tokens=self.tokens))
        )
        self.port = self.server.port
        return self

    def stop_serving(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0)
            self.server = None

    def close(self) -> None:
        self.stop_serving()
        if self.shard is not None:
            self.shard.close()
            self.shard = None


@dataclass
class Replica:
    follower: Follower
    server: RpcServer
    channel: grpc.Channel

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def shard(self) -> Shard:
        shard = self.follower.served.current
        assert shard is not None
        return shard

    def health(self) -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[Callable[..., Primary]]:
    made: list[Primary] = []

    def make(cfg: EmbeddingConfig | None = None, tokens: Tokens | None = None) -> Primary:
        p = Primary(cfg or config(), tmp_path / f"primary-{len(made)}", tokens).open()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@contextmanager
def replica(
    address: str, data_dir: Path, cfg: EmbeddingConfig | None = None, start: bool = True, **kw
) -> Iterator[Replica]:
    options = FollowerOptions(address, backoff=0.02, max_backoff=0.2, **kw)
    follower = Follower(cfg or config(), data_dir, options)
    served = build_server(follower.served, serving=False)
    channel = grpc.insecure_channel(f"127.0.0.1:{served.port}")
    node = Replica(follower, served, channel)
    if start:
        follower.start(on_ready=lambda: served.set_serving(True))
    try:
        yield node
    finally:
        channel.close()
        served.stop(grace=0)
        follower.stop()


def caught_up(follower: Follower, shard: Shard) -> None:
    """Wait until the follower has applied the primary's last seq (a follower error fails
    at once)."""
    target = shard.seq

    def applied() -> bool:
        if follower.error is not None:
            pytest.fail(f"the follower failed: {follower.error!r}")
        return follower.applied_seq >= target

    eventually(applied, 30, f"the follower to apply seq {target}")


def churn(client: Client, rng: np.random.Generator) -> None:
    """Training lookups (new rows), gradient pushes, assigns and deletes through a client."""
    for _ in range(3):
        ids = rng.choice(UNIVERSE, size=150).astype(np.uint64)
        client.lookup("t", ids)
        client.apply_gradients("t", ids, rng.standard_normal((ids.size, DIM)).astype(np.float32))
        picked = rng.choice(UNIVERSE, size=20, replace=False).astype(np.uint64)
        client.assign("t", picked, rng.standard_normal((20, DIM)).astype(np.float32))
        client.delete("t", rng.choice(UNIVERSE, size=10, replace=False).astype(np.uint64))


def assert_same_rows(follower: Shard, primary: Shard) -> None:
    found_f, rows_f = follower.peek("t", UNIVERSE)
    found_p, rows_p = primary.peek("t", UNIVERSE)
    np.testing.assert_array_equal(found_f, found_p)
    np.testing.assert_array_equal(rows_f, rows_p)  # vectors and Adagrad state


@pytest.mark.slow
def test_a_follower_serves_the_primarys_rows_and_refuses_writes(primary, tmp_path) -> None:
    p = primary()
    rng = np.random.default_rng(0)
    with Client([p.address]) as writer:
        churn(writer, rng)  # before the bootstrap: comes with the snapshot
        with replica(p.address, tmp_path / "f", start=False) as r:
            assert r.health() == NOT_SERVING
            with (
                Client([r.address], ClientOptions(retries=0)) as early,
                pytest.raises(UnavailableError),
            ):
                early.lookup("t", UNIVERSE[:3], train=False)
            r.follower.start(on_ready=lambda: r.server.set_serving(True))
            assert r.follower.wait_ready(10)
            assert r.health() == SERVING and r.follower.bootstraps == 1
            churn(writer, rng)  # after it: comes through the feed
            deleted = rng.choice(UNIVERSE, size=30, replace=False).astype(np.uint64)
            writer.lookup("t", deleted)
            writer.delete("t", deleted)
            caught_up(r.follower, p.shard)
            assert_same_rows(r.shard, p.shard)
            assert not r.shard.peek("t", deleted)[0].any()  # deletions reached the follower
            with Client([r.address]) as reader:
                np.testing.assert_array_equal(
                    reader.lookup("t", UNIVERSE, train=False),
                    writer.lookup("t", UNIVERSE, train=False),
                )
                writes = {
                    "assign": lambda: reader.assign("t", [1], np.ones((1, DIM), np.float32)),
                    "apply_gradients": lambda: reader.apply_gradients(
                        "t", [1], np.ones((1, DIM), np.float32)
                    ),
                    "delete": lambda: reader.delete("t", [1]),
                    "training lookup": lambda: reader.lookup("t", [1], train=True),
                }
                for name, write in writes.items():
                    with pytest.raises(FailedPreconditionError, match="read-only follower"):
                        write()
                    assert r.shard.seq == p.shard.seq, name  # nothing changed
                assert reader.stats()[0]["tables"]["t"]["rows"] == p.shard.stats().tables["t"].rows


def test_follower_applies_each_assign_and_reports_metrics(primary, tmp_path) -> None:
    """The apply latency is a figure of ``benchmarks/follower_lag.py``, not asserted here."""
    p = primary()
    assert p.shard is not None
    with replica(p.address, tmp_path / "f") as r:
        assert r.follower.wait_ready(10)
        for i in range(20):
            p.shard.assign("t", [i], np.full((1, DIM), float(i), np.float32))
            caught_up(r.follower, p.shard)
        registry = CollectorRegistry()
        registry.register(FollowerCollector(r.follower))
        sample = registry.get_sample_value
        assert sample("embeddb_follower_lag_seq") == 0
        assert sample("embeddb_follower_lag_seconds") == 0
        assert sample("embeddb_follower_applied_seq") == p.shard.seq == 20
        assert sample("embeddb_follower_applied_records_total") == 20
        assert sample("embeddb_follower_bootstraps_total") == 1
        assert sample("embeddb_follower_reconnects_total") == 0
        assert sample("embeddb_follower_bootstrapped") == 1


@dataclass
class BehindFollower:
    """A follower status 5 records and 2.5 seconds behind (a fake for the collector)."""

    applied_records: int = 15
    reconnects: int = 2
    bootstraps: int = 1
    applied_seq: int = 15
    primary_seq: int = 20
    bootstrapped: bool = True

    def lag_seconds(self) -> float:
        return 2.5


def test_follower_collector_exports_lag_and_counters() -> None:
    registry = CollectorRegistry()
    registry.register(FollowerCollector(BehindFollower()))
    expected = {
        "lag_seq": 5,
        "lag_seconds": 2.5,
        "applied_seq": 15,
        "primary_seq": 20,
        "bootstrapped": 1,
        "applied_records_total": 15,
        "reconnects_total": 2,
        "bootstraps_total": 1,
    }
    for name, value in expected.items():
        assert registry.get_sample_value(f"embeddb_follower_{name}") == value, name


@pytest.mark.slow
def test_a_follower_resumes_from_its_seq_after_the_primary_restarts(primary, tmp_path) -> None:
    p = primary()
    rng = np.random.default_rng(1)
    with replica(p.address, tmp_path / "f") as r:
        assert r.follower.wait_ready(10)
        with Client([p.address]) as writer:
            churn(writer, rng)
        caught_up(r.follower, p.shard)
        before = r.follower.applied_seq
        p.close()  # stop serving, close the shard (clean shutdown)
        with Client([r.address]) as reader:  # the follower keeps serving reads meanwhile
            assert reader.lookup("t", UNIVERSE[:5], train=False).shape == (5, DIM)
        p.open()  # reopen the same directory on the same port
        with Client([p.address]) as writer:
            churn(writer, rng)
        caught_up(r.follower, p.shard)
        assert_same_rows(r.shard, p.shard)
        assert r.follower.bootstraps == 1  # resumed from its seq, no new bootstrap
        assert r.follower.reconnects >= 1
        assert r.follower.applied_records == p.shard.seq  # each record once (bootstrap: seq 0)
        assert r.follower.applied_seq > before


@pytest.mark.slow
def test_a_follower_whose_records_were_truncated_bootstraps_again(primary, tmp_path) -> None:
    big = config(dim=64, log_segment_mb=1, log_lz4_min_bytes=0, snapshot_retention=1)
    p = primary(big)
    assert p.shard is not None
    rng = np.random.default_rng(2)
    p.shard.assign("t", UNIVERSE[:10], rng.standard_normal((10, 64)).astype(np.float32))
    with replica(p.address, tmp_path / "f", big) as r:
        assert r.follower.wait_ready(10)
        caught_up(r.follower, p.shard)
        first = r.shard
        p.stop_serving()  # the feed ends: nothing pins the follower's position any more
        for _ in range(3):  # about 1.3 MiB per record: one 1 MiB segment each
            ids = rng.choice(1 << 30, size=5000, replace=False).astype(np.uint64)
            p.shard.assign("t", ids, rng.standard_normal((5000, 64)).astype(np.float32))
        p.shard.assign("t", UNIVERSE[:1], np.ones((1, 64), np.float32))
        p.shard.snapshot("after")  # truncates the log before its seq
        p.serve()
        eventually(lambda: r.follower.bootstraps >= 2 or r.follower.error, 30, "a second bootstrap")
        assert r.follower.error is None
        caught_up(r.follower, p.shard)
        assert r.shard is not first and r.shard.seq == p.shard.seq
        assert not first.data_dir.exists()  # the old replica is closed and deleted
        with Client([r.address]) as reader:  # the server serves the new shard
            np.testing.assert_array_equal(
                reader.lookup("t", UNIVERSE[:1], train=False), np.ones((1, 64), np.float32)
            )


@pytest.mark.slow
def test_a_follower_through_a_replica_token(primary, tmp_path) -> None:
    rw, ro, rep = "rw-" + "x" * 20, "ro-" + "y" * 20, "replica-" + "z" * 20
    p = primary(tokens=Tokens(frozenset({rw}), frozenset({ro}), frozenset({rep})))
    assert p.shard is not None
    p.shard.assign("t", [5], np.ones((1, DIM), np.float32))
    with replica(p.address, tmp_path / "f", client=ClientOptions(token=rep)) as r:
        assert r.follower.wait_ready(10)
        caught_up(r.follower, p.shard)
        assert_same_rows(r.shard, p.shard)


def test_a_follower_with_a_read_only_token_stops_naming_the_replica_role(primary, tmp_path) -> None:
    """An ro token may not read the update log or snapshots: retrying cannot fix that, so the
    follower stops (embeddb serve exits 1) and the primary took no snapshot for it."""
    rw, ro = "rw-" + "x" * 20, "ro-" + "y" * 20
    p = primary(tokens=Tokens(frozenset({rw}), frozenset({ro})))
    assert p.shard is not None
    p.shard.assign("t", [5], np.ones((1, DIM), np.float32))
    with replica(p.address, tmp_path / "f", client=ClientOptions(token=ro)) as r:
        assert r.follower.done.wait(10)
        assert isinstance(r.follower.error, PermissionDeniedError)
        assert "replica token" in str(r.follower.error)
        assert not r.follower.bootstrapped
    assert p.shard.snapshots() == []


def test_a_primary_data_dir_and_a_wrong_shard_are_refused(primary, tmp_path) -> None:
    p = primary()
    assert p.shard is not None
    follower = Follower(config(), p.shard.data_dir, FollowerOptions(p.address))
    with pytest.raises(StorageError, match="holds a shard's data"):
        follower.start()
    wrong = Follower(
        config(), tmp_path / "f", FollowerOptions(p.address), shard_index=1, num_shards=2
    )
    wrong.start()
    try:
        assert wrong.done.wait(10)
        assert isinstance(wrong.error, ConfigError)
        assert "serves shard 0 of 1; this follower was started as shard 1 of 2" in str(wrong.error)
    finally:
        wrong.stop()
    with pytest.raises(ConfigError, match="host:port"):
        FollowerOptions("nowhere")


# ------------------------------------------------------------------ what the primary serves
@pytest.mark.slow
def test_a_follower_without_config_or_place_serves_its_primarys(tmp_path: Path) -> None:
    """No config, no shard index: the follower asks its primary (shard 1 of 2, one table the
    packaged default config lacks) and serves that; DescribeShard is UNAVAILABLE until it
    knows (a client retries) rather than a made-up place (before: the packaged tables, and
    the place 0 of 1, refused against this primary)."""
    cfg = config(dim=6)
    ids = UNIVERSE[shard_of(UNIVERSE, 2) == 1]
    vectors = np.random.default_rng(3).standard_normal((ids.size, 6)).astype(np.float32)
    primary = Shard(cfg, tmp_path / "primary", shard_index=1, num_shards=2)
    primary_server = build_server(primary, ServerConfig(shard_index=1, num_shards=2))
    address = f"127.0.0.1:{primary_server.port}"
    follower = Follower(None, tmp_path / "f", FollowerOptions(address, backoff=0.02))
    server = build_server(follower.served, ServerConfig(shard_index=None, num_shards=None))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        primary.assign("t", ids, vectors)
        describe = pb_grpc.EmbeddingStoreServiceStub(channel).DescribeShard
        with pytest.raises(grpc.RpcError) as early:
            describe(pb.DescribeShardRequest(), timeout=5)
        assert early.value.code() == grpc.StatusCode.UNAVAILABLE
        follower.start()
        assert follower.wait_ready(10), follower.error
        answer = describe(pb.DescribeShardRequest(), timeout=5)
        assert (answer.shard_index, answer.num_shards, answer.follower) == (1, 2, True)
        served = follower.served.current
        assert served is not None and list(served.config.tables) == ["t"]
        assert served.config.tables["t"].row_width == cfg.tables["t"].row_width
        options = ClientOptions(verify_topology=False)
        with Client([f"127.0.0.1:{server.port}"], options) as reader:
            np.testing.assert_array_equal(reader.lookup("t", ids, train=False), vectors)
    finally:
        channel.close()
        server.stop(grace=0)
        follower.stop()
        primary_server.stop(grace=0)
        primary.close()


@pytest.mark.parametrize(
    ("make", "difference"),
    [
        (lambda: config(dim=8), "table 't' has dim 4 on the primary, 8 in --config"),
        (
            lambda: one_table_config(dim=DIM, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)),
            "table 't' uses adagrad with 4 state floats per row on the primary, sgd with 0",
        ),
        (lambda: packaged_config("default.yaml"), "it lacks table(s) 't', which the primary"),
    ],
)
def test_a_follower_config_that_disagrees_with_its_primary_is_refused(
    primary, tmp_path, make, difference
) -> None:
    p = primary()
    with replica(p.address, tmp_path / "f", make()) as r:
        assert r.follower.done.wait(10)
        assert isinstance(r.follower.error, ConfigError)
        assert f"the follower's --config disagrees with its primary {p.address}" in str(
            r.follower.error
        )
        assert difference in str(r.follower.error)
        assert not r.follower.bootstrapped
