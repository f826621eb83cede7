"""Prometheus metrics of a real server, scraped over HTTP after real RPCs."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.server.metrics import ShardMetrics
from embeddb.transport import wire
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Tokens
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

DIM = 4
Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def ids_tensor(*values: int) -> pb.Tensor:
    return wire.encode_ids(np.array(values, dtype=np.uint64))


def make_shard(path: Path, capacity: int = 100) -> Shard:
    table = TableConfig(
        name="t", dim=DIM, capacity=capacity, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
    )
    store = StoreConfig(ram=RamTierConfig(stripes=1, eviction_chunk=1e-6, min_stripe_rows=1))
    return Shard(EmbeddingConfig(tables={"t": table}, store=store), path)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Served:
    def __init__(self, shard: Shard, server: RpcServer, channel: grpc.Channel) -> None:
        self.shard = shard
        self.server = server
        self.stub = pb_grpc.EmbeddingStoreServiceStub(channel)

    def scrape(self) -> Samples:
        assert self.server.metrics_port is not None
        return scrape(self.server.metrics_port)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    opened: list[tuple[Shard, RpcServer, grpc.Channel]] = []

    def go(capacity: int = 100, **config: object) -> Served:
        shard = make_shard(tmp_path / f"shard-{len(opened)}", capacity)
        server = build_server(shard, ServerConfig(ListenConfig(metrics_port=0, **config)))  # type: ignore[arg-type]
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        opened.append((shard, server, channel))
        return Served(shard, server, channel)

    yield go
    for shard, server, channel in opened:
        channel.close()
        server.stop(grace=1)
        shard.close()


@pytest.mark.slow
def test_request_counters_latency_and_bytes_move_with_real_calls(start) -> None:
    s = start()
    before = s.scrape()
    request = pb.LookupRequest(table="t", ids=ids_tensor(*range(10)), train=True)
    reply = s.stub.Lookup(request)
    s.stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(3, 4, 5)))
    after = s.scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("embeddb_requests_total", method="Lookup", status="OK") == 2
    assert delta("embeddb_request_seconds_count", method="Lookup", status="OK") == 2
    assert delta("embeddb_request_seconds_sum", method="Lookup", status="OK") > 0
    assert delta("embeddb_request_seconds_bucket", method="Lookup", status="OK", le="+Inf") == 2
    assert delta("embeddb_request_ids_total", method="Lookup", table="t") == 13
    assert delta("embeddb_lookup_ids_total", table="t") == 13
    assert delta("embeddb_request_bytes_total", method="Lookup") == (
        request.ByteSize() + pb.LookupRequest(table="t", ids=ids_tensor(3, 4, 5)).ByteSize()
    )
    assert delta("embeddb_response_bytes_total", method="Lookup") >= reply.ByteSize() > 10 * DIM * 4


@pytest.mark.slow
def test_a_failed_call_is_counted_with_its_status(start) -> None:
    s = start()
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Lookup(pb.LookupRequest(table="nope", ids=ids_tensor(1, 2)))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    after = s.scrape()
    assert value(after, "embeddb_requests_total", method="Lookup", status="NOT_FOUND") == 1
    assert value(after, "embeddb_request_seconds_count", method="Lookup", status="NOT_FOUND") == 1
    assert value(after, "embeddb_requests_total", method="Lookup", status="OK") == 0
    # Ids of failed calls are not counted, and an unknown table never becomes a label value.
    assert not any(labels and ("table", "nope") in labels for _, labels in after)


@pytest.mark.slow
def test_shard_stats_are_read_at_scrape_time(start) -> None:
    s = start(capacity=4)
    stub = s.stub
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 2, 3), train=True))
    first = s.scrape()
    assert value(first, "embeddb_index_miss_count_total", table="t") == 3
    assert value(first, "embeddb_admitted_total", table="t") == 3
    assert value(first, "embeddb_rows", table="t") == 3
    assert value(first, "embeddb_tier_rows", table="t", tier="ram") == 3
    assert value(first, "embeddb_ram_capacity", table="t") == 4
    assert value(first, "embeddb_index_miss_ratio", table="t") == 1.0

    # Three more new ids overflow the 4-slot RAM tier: two rows are evicted (and written back).
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(4, 5, 6), train=True))
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 6), train=True))
    grads = np.ones((2, DIM), np.float32)
    grads[0, 0] = np.nan
    stub.ApplyGradients(
        pb.ApplyGradientsRequest(table="t", ids=ids_tensor(6, 999), grads=wire.encode_matrix(grads))
    )
    second = s.scrape()
    stats = s.shard.stats().tables["t"]
    assert value(second, "embeddb_index_miss_count_total", table="t") == 6 == stats.misses
    assert value(second, "embeddb_lookup_ids_total", table="t") == 8 == stats.lookup_ids
    assert value(second, "embeddb_index_miss_ratio", table="t") == pytest.approx(6 / 8)
    assert value(second, "embeddb_evicted_total", table="t") == stats.evicted > 0
    assert value(second, "embeddb_written_back_total", table="t") == stats.written_back > 0
    assert value(second, "embeddb_promoted_total", table="t") == stats.promoted > 0
    assert value(second, "embeddb_tier_hits_total", table="t", tier="disk") == stats.disk_hits > 0
    assert value(second, "embeddb_tier_hits_total", table="t", tier="ram") == stats.ram_hits
    assert value(second, "embeddb_tier_rows", table="t", tier="disk") == stats.disk_rows > 0
    assert value(second, "embeddb_nan_grad_skipped_total", table="t") == 1
    assert value(second, "embeddb_gradient_id_miss_count_total", table="t") == 1
    assert value(second, "embeddb_update_ids_total", table="t") == stats.update_ids == 2
    assert value(second, "embeddb_request_ids_total", method="ApplyGradients", table="t") == 2


@pytest.mark.slow
def test_rejections_are_counted(start, tmp_path: Path) -> None:
    s = start()
    registry = CollectorRegistry()
    shard = Shard(
        EmbeddingConfig(
            tables={
                "t": TableConfig(
                    name="t",
                    dim=DIM,
                    capacity=100,
                    optimizer=OptimizerConfig(kind=OptimizerKind.SGD),
                    admit_probability=1e-12,
                )
            }
        ),
        tmp_path / "rejecting",
    )
    try:
        ShardMetrics(registry).watch(shard)
        shard.lookup("t", [1, 2, 3], train=True)
        assert registry.get_sample_value("embeddb_rejected_total", {"table": "t"}) == 3
        assert registry.get_sample_value("embeddb_rows", {"table": "t"}) == 0
    finally:
        shard.close()
    # A closed shard exports no table samples, and scraping does not fail.
    assert registry.get_sample_value("embeddb_rows", {"table": "t"}) is None
    assert value(s.scrape(), "embeddb_rows", table="t") == 0


@pytest.mark.slow
def test_servers_in_one_process_keep_separate_metrics(start) -> None:
    a, b = start(), start()
    assert a.server.metrics_port != b.server.metrics_port
    a.stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 2), train=True))
    assert value(a.scrape(), "embeddb_lookup_ids_total", table="t") == 2
    assert value(b.scrape(), "embeddb_lookup_ids_total", table="t") == 0
    assert value(b.scrape(), "embeddb_requests_total", method="Lookup", status="OK") == 0


@pytest.mark.slow
def test_refused_calls_are_counted_and_never_reach_the_shard(start) -> None:
    token = "metrics-test-token-0123456789"
    s = start(tokens=Tokens(frozenset({token}), frozenset()))
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1), train=True))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    s.stub.Lookup(
        pb.LookupRequest(table="t", ids=ids_tensor(1), train=True),
        metadata=(("authorization", f"Bearer {token}"),),
    )
    samples = s.scrape()
    assert value(samples, "embeddb_requests_total", method="Lookup", status="UNAUTHENTICATED") == 1
    assert value(samples, "embeddb_requests_total", method="Lookup", status="OK") == 1
    assert value(samples, "embeddb_lookup_ids_total", table="t") == 1


def test_a_registry_can_be_passed_in_without_an_endpoint(tmp_path: Path) -> None:
    shard = make_shard(tmp_path / "shard")
    registry = CollectorRegistry()
    server = build_server(shard, ServerConfig(metrics_registry=registry))
    try:
        assert server.metrics_port is None and server.metrics_registry is registry
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            pb_grpc.EmbeddingStoreServiceStub(channel).Stats(pb.StatsRequest())
        labels = {"method": "Stats", "status": "OK"}
        assert registry.get_sample_value("embeddb_requests_total", labels) == 1
        assert registry.get_sample_value("embeddb_rows", {"table": "t"}) == 0
    finally:
        server.stop(grace=1)
        shard.close()


def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    shard = make_shard(tmp_path / "shard")
    server = build_server(shard)
    try:
        assert server.metrics_registry is None and server.metrics_port is None
    finally:
        server.stop(grace=1)
        shard.close()
