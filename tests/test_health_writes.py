"""gRPC health of a shard whose storage refuses writes (issue 23): a real server on 127.0.0.1
port 0, faults injected through the shard's file layer (:class:`FaultyIO`).

Before: every health name stayed SERVING while the shard refused writes (read-only after ENOSPC,
fail-stop after an I/O error). Now ``""`` and the service's name stay SERVING (reads are
served) and :data:`WRITES_HEALTH_NAME` is NOT_SERVING while writes are refused, SERVING again
once they resume; the ``embeddb_read_only`` gauge, which the EmbeddbReadOnly alert watches,
agrees.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from embeddb.client import Client, ClientOptions
from embeddb.engine.durability.fileio import REAL, FaultyIO, FileIO
from embeddb.engine.shard import Shard
from embeddb.errors import EmbeddbError
from embeddb.server import ServerConfig, build_server
from embeddb.server.app import SERVICE_NAME, WRITES_HEALTH_NAME
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.status import code_of
from tests.conftest import one_table_config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
IDS = np.arange(50, dtype=np.uint64)
NO_RETRY = ClientOptions(retries=0)


class Served:
    def __init__(self, shard: Shard, server: RpcServer, registry: CollectorRegistry) -> None:
        self.shard, self.server, self.registry = shard, server, registry
        self.address = f"127.0.0.1:{server.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def status(self, name: str) -> int:
        request = health_pb2.HealthCheckRequest(service=name)
        return int(self.health.Check(request, timeout=10).status)

    def read_only_gauge(self) -> float | None:
        return self.registry.get_sample_value("embeddb_read_only")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def go(file_io: FileIO = REAL, follower: bool = False) -> Served:
        cfg = one_table_config(dim=4, capacity=1000, stripes=2)
        data = None if follower else tmp_path / f"shard-{len(started)}"
        shard = Shard(cfg, data, file_io=file_io, follower=follower)
        registry = CollectorRegistry()
        server = build_server(shard, ServerConfig(ListenConfig(), metrics_registry=registry))
        started.append(Served(shard, server, registry))
        return started[-1]

    yield go
    for served in started:
        served.channel.close()
        served.server.stop(grace=0)
        served.shard.close()


def assign(client: Client, value: float) -> None:
    client.assign("t", IDS, np.full((IDS.size, 4), value, np.float32))


def test_writes_health_follows_a_full_disk_and_comes_back_with_space(
    serve: Callable[..., Served],
) -> None:
    io = FaultyIO("write", 1 << 30, errno.ENOSPC)
    node = serve(io)
    with Client([node.address], NO_RETRY) as client:
        assign(client, 1.0)
        assert [node.status(n) for n in ("", SERVICE_NAME, WRITES_HEALTH_NAME)] == [SERVING] * 3
        assert node.read_only_gauge() == 0
        io.nth = io.calls["write"] + 1  # the disk is full from the next write on
        with pytest.raises(EmbeddbError) as failed:
            assign(client, 2.0)
        assert code_of(failed.value).name == "RESOURCE_EXHAUSTED"
        assert node.status(WRITES_HEALTH_NAME) == NOT_SERVING
        assert node.status("") == node.status(SERVICE_NAME) == SERVING  # reads are served
        assert node.read_only_gauge() == 1  # what the EmbeddbReadOnly alert fires on
        assert np.all(client.lookup("t", IDS, train=False) == 1.0)
        io.free()  # space is back: the next write succeeds and writes are healthy again
        assign(client, 3.0)
        assert node.status(WRITES_HEALTH_NAME) == SERVING
        assert node.read_only_gauge() == 0


def test_writes_health_stays_down_after_an_io_error_until_a_restart(
    serve: Callable[..., Served],
) -> None:
    io = FaultyIO("write", 1 << 30, errno.EIO)
    node = serve(io)
    with Client([node.address], NO_RETRY) as client:
        assign(client, 1.0)
        io.nth = io.calls["write"] + 1
        with pytest.raises(EmbeddbError) as failed:
            assign(client, 2.0)
        assert code_of(failed.value).name == "UNAVAILABLE"
        assert node.status(WRITES_HEALTH_NAME) == NOT_SERVING
        with pytest.raises(EmbeddbError):  # fail-stop: the disk works again, writes do not
            assign(client, 3.0)
        assert node.status(WRITES_HEALTH_NAME) == NOT_SERVING
        assert node.status(SERVICE_NAME) == SERVING
        assert node.read_only_gauge() == 1


def test_a_follower_serves_reads_but_not_writes(serve: Callable[..., Served]) -> None:
    node = serve(follower=True)
    assert node.status(SERVICE_NAME) == SERVING
    assert node.status(WRITES_HEALTH_NAME) == NOT_SERVING
    node.server.set_serving(False)  # e.g. a follower before its bootstrap
    assert node.status(SERVICE_NAME) == node.status(WRITES_HEALTH_NAME) == NOT_SERVING
