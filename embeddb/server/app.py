"""Build a gRPC server around one shard: servicer, interceptors, health and reflection."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from embeddb.server.interceptors import ErrorInterceptor
from embeddb.server.servicer import ServicerLimits, StoreServicer
from embeddb.shard import Shard
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

__all__ = ["SERVICE_NAME", "ServerConfig", "ShardServer", "build_server"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbeddingStore"].full_name


@dataclass(frozen=True)
class ServerConfig:
    """How to serve a shard.

    Attributes:
        host: address to bind (``127.0.0.1`` by default; ``0.0.0.0`` for all interfaces).
        port: TCP port; 0 picks a free one (the factory returns it).
        shard_index, num_shards: the shard's place in the cluster.
        max_message_bytes: largest request or response; larger ones get RESOURCE_EXHAUSTED.
        max_ids_per_request: ids one request may carry.
        workers: threads serving requests.
    """

    host: str = "127.0.0.1"
    port: int = 0
    shard_index: int = 0
    num_shards: int = 1
    max_message_bytes: int = 256 << 20
    max_ids_per_request: int = 1 << 22
    workers: int = 8


@dataclass
class ShardServer:
    """A started server and its health servicer (for the shutdown sequence)."""

    server: grpc.Server
    port: int
    health: health.HealthServicer

    def stop(self, grace: float | None = 5.0) -> None:
        """Health NOT_SERVING, then stop accepting and let in-flight calls finish (grace)."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def build_server(shard: Shard, config: ServerConfig | None = None) -> ShardServer:
    """Start serving ``shard``; returns the server and the bound port.

    Raises:
        OSError: the address cannot be bound.
    """
    cfg = config or ServerConfig()
    options = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="embeddb-rpc"),
        interceptors=[ErrorInterceptor()],
        options=options,
    )
    servicer = StoreServicer(
        shard, cfg.shard_index, cfg.num_shards, ServicerLimits(cfg.max_ids_per_request)
    )
    pb_grpc.add_EmbeddingStoreServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    if port == 0:
        raise OSError(f"cannot bind {cfg.host}:{cfg.port}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return ShardServer(server=server, port=port, health=health_servicer)
