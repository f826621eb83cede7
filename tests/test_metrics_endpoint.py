"""The Prometheus endpoint serves ``/metrics`` only and binds the host it is given:
``ServerConfig.metrics_host``, ``embeddb serve|cluster|serve-model --metrics-host``."""

from __future__ import annotations

import gzip
import http.client
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, Counter

from embeddb.cli import main
from embeddb.client import Client
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError
from embeddb.server import ServerConfig, build_server
from embeddb.server.cluster import Cluster, ClusterConfig
from embeddb.transport.rpc import ListenConfig
from embeddb.transport.rpc.metrics_http import MetricsEndpoint, serve_metrics
from tests.conftest import one_table_config
from tests.support import StartServe, free_port_range, serve_processes

METRIC = "embeddb_test_events_total"


@pytest.fixture
def endpoint() -> Iterator[MetricsEndpoint]:
    registry = CollectorRegistry()
    Counter("embeddb_test_events", "Events of the test.", registry=registry).inc(3)
    served = serve_metrics(registry, "127.0.0.1", 0)
    yield served
    served.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


def get(port: int, path: str, host: str = "127.0.0.1", **headers: str) -> tuple[int, Any, bytes]:
    """``GET path`` sent exactly as given (no client-side normalisation of ``..``)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.headers, reply.read()
    finally:
        conn.close()


def second_loopback() -> str:
    """127.0.0.2: a loopback address other than the gRPC host (Linux routes all of 127/8)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.2", 0))
        except OSError:
            pytest.skip("127.0.0.2 cannot be bound on this system")
    return "127.0.0.2"


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def scrapes(host: str, port: int) -> bool:
    status, _, body = get(port, "/metrics", host)
    return status == 200 and b"# TYPE" in body


# ---------------------------------------------------------------------------- paths
OTHER_PATHS = ("/", "/foo", "/metrics/../x", "/metrics/", "/metricsx", "/favicon.ico")


@pytest.mark.slow
def test_only_get_metrics_serves_the_registry(endpoint: MetricsEndpoint) -> None:
    status, headers, body = get(endpoint.port, "/metrics")
    assert status == 200 and f"{METRIC} 3.0".encode() in body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    status, headers, body = get(endpoint.port, "/metrics", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert f"{METRIC} 3.0".encode() in gzip.decompress(body)
    status, _, body = get(endpoint.port, f"/metrics?name[]={METRIC}")
    assert status == 200 and f"{METRIC} 3.0".encode() in body

    for path in OTHER_PATHS:
        status, headers, body = get(endpoint.port, path)
        assert status == 404, path
        assert headers["Content-Type"].startswith("text/plain")
        assert 0 < len(body) < 200 and b"embeddb_" not in body and b"# TYPE" not in body, path
    assert get(endpoint.port, "/metrics")[0] == 200  # still serving


# ---------------------------------------------------------------------------- the host
@pytest.mark.slow
def test_server_config_metrics_host_binds_the_metrics_endpoint_there(tmp_path: Path) -> None:
    other = second_loopback()
    shard = Shard(one_table_config(), tmp_path / "shard")
    server = build_server(
        shard,
        ServerConfig(listen=ListenConfig(host="127.0.0.1", metrics_port=0, metrics_host=other)),
    )
    try:
        assert server.metrics_port is not None
        assert scrapes(other, server.metrics_port)
        assert refused("127.0.0.1", server.metrics_port)  # not on the gRPC host
    finally:
        server.stop(grace=1)
        shard.close()
    with pytest.raises(ConfigError, match="metrics_host"):
        ListenConfig(metrics_port=0, metrics_host="")


@pytest.mark.slow
def test_serve_metrics_host_option_binds_that_host(serve: StartServe) -> None:
    other = second_loopback()
    served = serve("--ephemeral", "--metrics-port", "0", "--metrics-host", other)
    url = served.metrics_url()
    assert url.startswith(f"http://{other}:"), url
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200 and b"embeddb_requests" in reply.read()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert refused("127.0.0.1", port)
    assert get(port, "/", other)[0] == 404
    served.stop()


def test_serve_metrics_host_needs_metrics_port() -> None:
    result = CliRunner().invoke(main, ["serve", "--ephemeral", "--metrics-host", "127.0.0.1"])
    assert result.exit_code == 2 and "--metrics-host needs --metrics-port" in result.output


@pytest.mark.slow
def test_cluster_passes_metrics_host_to_every_shard() -> None:
    other = second_loopback()
    base = free_port_range(2)
    cfg = ClusterConfig(
        num_shards=2,
        ephemeral=True,
        metrics_base_port=base,
        metrics_host=other,
        grace=1.0,
        start_timeout=30.0,
    )
    with Cluster(cfg) as cluster:
        cluster.start()
        addresses = cluster.wait_healthy()
        with Client(addresses) as client:
            client.lookup("item_id", np.arange(10, dtype=np.uint64))
        for index in range(2):
            assert scrapes(other, base + index)
            assert refused("127.0.0.1", base + index)


def test_cluster_metrics_host_option_reaches_the_config() -> None:
    # --base-port 0: the default base port (7070) is checked for being free first, and may be
    # taken on the machine running the tests.
    result = CliRunner().invoke(
        main,
        ["cluster", "--num-shards", "1", "--ephemeral", "--base-port", "0",
         "--metrics-host", "127.0.0.1"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "metrics_host: only meaningful with metrics_base_port" in result.output
    with pytest.raises(ConfigError, match="metrics_host"):
        ClusterConfig(num_shards=1, metrics_host="127.0.0.1")


class _Predictor:
    """Enough of an ``InferCtx`` to start a model server that is never asked to predict."""

    spec = None

    def predict(self, batch: object) -> np.ndarray:
        raise AssertionError("not called")

    def batch_from_records(self, records: object) -> object:
        raise AssertionError("not called")


@pytest.mark.slow
def test_model_server_metrics_host_binds_the_metrics_endpoint_there(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from embeddb.serving.server import ModelServerConfig, build_model_server

    other = second_loopback()
    config = ModelServerConfig(
        listen=ListenConfig(metrics_port=0, metrics_host=other), http_port=None
    )
    server = build_model_server(_Predictor(), config)  # type: ignore[arg-type]
    try:
        assert server.metrics_port is not None
        assert scrapes(other, server.metrics_port)
        assert refused("127.0.0.1", server.metrics_port)
        assert get(server.metrics_port, "/metrics/../x", other)[0] == 404
    finally:
        server.stop(grace=1)
    result = CliRunner().invoke(
        main,
        ["serve-model", "--model", str(tmp_path), "--addresses", "127.0.0.1:1",
         "--metrics-host", "127.0.0.1"],
    )  # fmt: skip
    assert result.exit_code == 2 and "--metrics-host needs --metrics-port" in result.output
