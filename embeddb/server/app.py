"""Build a gRPC server around one shard: servicer, interceptors, health and reflection.

Interceptors, outermost first: the boundary (:mod:`embeddb.server.boundary`: authentication
before a byte of the request is parsed, role checks, decoding with INVALID_ARGUMENT for
garbage, thread pools; refused calls are counted in the metrics) → metrics (calls that reached
the servicer, with their status) → errors (embeddb exceptions from the servicer to gRPC
statuses). Calls run on three pools (:mod:`embeddb.server.assembly`): data calls, streams and
health checks never starve one another.
"""

from __future__ import annotations

import ipaddress
import logging
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from embeddb.allocator import Trimmer, limit_arenas, tune_allocator
from embeddb.errors import ConfigError
from embeddb.server.assembly import ConnectionConfig, ServerPools, connection_options
from embeddb.server.auth import STORE_POLICY, Tokens
from embeddb.server.boundary import Boundary
from embeddb.server.interceptors import ErrorInterceptor
from embeddb.server.metrics import MetricsEndpoint, MetricsInterceptor, ShardMetrics, serve_metrics
from embeddb.server.servicer import ServicerLimits, StoreServicer, store_handler
from embeddb.server.slot import ShardSlot
from embeddb.shard import Shard
from embeddb.v1 import embeddb_pb2 as pb

__all__ = ["OPEN_SERVICES", "SERVICE_NAME", "ServerConfig", "ShardServer", "build_server"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbeddingStore"].full_name
# Callable without a token, so orchestrators can probe and tools can discover the API.
OPEN_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """How to serve a shard.

    Attributes:
        host: address to bind (``127.0.0.1`` by default; ``0.0.0.0`` for all interfaces).
        port: TCP port; 0 picks a free one (the factory returns it).
        shard_index, num_shards: the shard's place in the cluster (``embeddb serve`` opens the
            shard with them; a served :class:`Shard` reports its own, and a follower reports
            these until its first bootstrap).
        max_message_bytes: largest request or response; larger ones get RESOURCE_EXHAUSTED.
        max_ids_per_request: ids one request may carry.
        max_response_bytes: largest answer, computed before gathering (ids x dim x bytes per
            value); also the most an LZ4-compressed request tensor may decompress to. Larger:
            RESOURCE_EXHAUSTED.
        workers: threads serving unary requests (streams and health checks have pools of
            their own).
        max_streams: ``Subscribe`` and ``FetchSnapshot`` calls (followers) served at once, per
            role; each holds a thread of the stream pool while it runs.
        stream_idle_timeout: seconds a stream's caller may leave a message unread before the
            stream is dropped (its thread and slot freed).
        keepalive_s, keepalive_timeout_s, max_idle_s: connection keepalive and idle closing
            (see :class:`~embeddb.server.assembly.ConnectionConfig`).
        tls_cert, tls_key: PEM certificate chain and private key; when both are set the port
            serves TLS only. Set both or neither.
        tokens: accepted bearer tokens (see :mod:`embeddb.server.auth`); None serves every
            caller.
        metrics_registry: where to record metrics; None with ``metrics_port`` None records
            none. Pass one to read the metrics in-process or to expose them yourself.
        metrics_port: serve the metrics over HTTP at
            ``http://{metrics_host}:{metrics_port}/metrics`` (0 picks a free port; the factory
            returns it); None serves no endpoint. Every other path answers 404.
        metrics_host: address the metrics endpoint binds; None binds ``host``. The endpoint has
            no TLS and no tokens: keep it on loopback or a private network.
        tune_allocator: raise glibc's mmap and trim thresholds for the whole process, so the
            large buffers of each request are reused instead of page-faulted in again (see
            :mod:`embeddb.allocator`; about 2.5x faster 4 MiB lookups on a small VM).
    """

    host: str = "127.0.0.1"
    port: int = 0
    shard_index: int = 0
    num_shards: int = 1
    max_message_bytes: int = 256 << 20
    max_ids_per_request: int = 1 << 22
    max_response_bytes: int = 64 << 20
    workers: int = 8
    max_streams: int = 4
    stream_idle_timeout: float = 30.0
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_idle_s: float = 300.0
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tokens: Tokens | None = None
    metrics_registry: CollectorRegistry | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    tune_allocator: bool = True

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert", "set both tls_cert and tls_key, or neither")
        if self.tls_cert is not None and b"-----BEGIN CERTIFICATE-----" not in self.tls_cert:
            raise ConfigError("tls_cert", "not a PEM certificate (no BEGIN CERTIFICATE line)")
        if self.tls_key is not None and not (
            b"-----BEGIN" in self.tls_key and b"PRIVATE KEY-----" in self.tls_key
        ):
            raise ConfigError("tls_key", "not a PEM private key (no BEGIN ... PRIVATE KEY line)")
        if self.tokens is not None and not isinstance(self.tokens, Tokens):
            raise ConfigError("tokens", f"must be a Tokens, not {type(self.tokens).__name__}")
        for name in ("max_message_bytes", "max_ids_per_request", "max_response_bytes", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_streams < 1:
            raise ConfigError("max_streams", f"must be >= 1, got {self.max_streams}")
        if not self.stream_idle_timeout > 0:
            raise ConfigError(
                "stream_idle_timeout", f"must be > 0 seconds, got {self.stream_idle_timeout}"
            )
        _ = self.connection  # validates the keepalive and idle settings
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"must be in 0..65535, got {self.metrics_port}")
        if self.metrics_host is not None and not self.metrics_host.strip():
            raise ConfigError("metrics_host", "must be an address, not empty (None: host)")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def connection(self) -> ConnectionConfig:
        """The connection-level settings."""
        return ConnectionConfig(
            self.max_message_bytes, self.keepalive_s, self.keepalive_timeout_s, self.max_idle_s
        )


@dataclass
class ShardServer:
    """A started server and its health servicer (for the shutdown sequence).

    ``metrics_registry`` holds the server's metrics (None when off); ``metrics_port`` is the
    bound port of the HTTP endpoint (None when not served).
    """

    server: grpc.Server
    port: int
    health: health.HealthServicer
    pools: ServerPools
    metrics_registry: CollectorRegistry | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    servicer: StoreServicer | None = None
    trimmer: Trimmer | None = None

    @property
    def executor(self) -> futures.ThreadPoolExecutor:
        """The data pool (unary calls)."""
        return self.pools.data

    @property
    def metrics_port(self) -> int | None:
        return None if self.metrics_endpoint is None else self.metrics_endpoint.port

    def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING on every service (a follower serves once it has
        bootstrapped)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def stop(self, grace: float | None = 5.0) -> None:
        """Health NOT_SERVING, end the streams (followers reconnect elsewhere or later), then
        stop accepting and let in-flight calls finish (grace).

        Handlers still running when the grace period ends are waited for (the request pool is
        shut down), so nothing touches the shard after this returns and the caller closes it.
        The metrics endpoint stops last, so the final counts can still be scraped meanwhile.
        """
        self.health.enter_graceful_shutdown()
        if self.servicer is not None:
            self.servicer.stop_streams()
        self.server.stop(grace).wait()
        self.pools.shutdown()
        if self.servicer is not None:
            self.servicer.close()
        if self.trimmer is not None:
            self.trimmer.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()


def build_server(
    shard: Shard | ShardSlot, config: ServerConfig | None = None, *, serving: bool = True
) -> ShardServer:
    """Start serving ``shard``; returns the server and the bound port.

    Args:
        shard: the shard, or the slot a follower swaps its shard in (empty until bootstrapped).
        config: how to serve it.
        serving: the initial health status; a follower starts NOT_SERVING and calls
            :meth:`ShardServer.set_serving` once bootstrapped.

    Raises:
        OSError: an address cannot be bound.
    """
    cfg = config or ServerConfig()
    if cfg.tune_allocator:
        tune_allocator()
        limit_arenas(1)  # so that a burst's memory can be given back (embeddb.allocator)
    registry = cfg.metrics_registry
    if registry is None and cfg.metrics_port is not None:
        registry = CollectorRegistry()
    metrics = ShardMetrics(registry) if registry is not None else None
    if cfg.tokens is not None and not cfg.tls and not _is_loopback(cfg.host):
        logger.warning("bearer tokens travel in plain text: serving %s without TLS", cfg.host)
    # Streams per role: rw and replica (with tokens), or everyone as one role (without); one
    # spare thread answers a stream beyond its role's limit with RESOURCE_EXHAUSTED at once.
    roles = 2 if cfg.tokens is not None else 1
    pools = ServerPools.create(cfg.workers, roles * cfg.max_streams + 1)
    trimmer = Trimmer() if cfg.tune_allocator else None
    servicer = StoreServicer(
        shard,
        cfg.shard_index,
        cfg.num_shards,
        ServicerLimits(
            max_ids_per_request=cfg.max_ids_per_request,
            max_streams=cfg.max_streams,
            stream_idle_timeout=cfg.stream_idle_timeout,
            max_message_bytes=cfg.max_message_bytes,
            max_response_bytes=cfg.max_response_bytes,
        ),
        trimmer=trimmer,
    )
    boundary = Boundary(
        STORE_POLICY,
        cfg.tokens,
        OPEN_SERVICES,
        on_refused=metrics.observe_refused if metrics is not None else None,
        dedicated_pools=pools.dedicated,
        stream_pool=pools.streams,
    )
    interceptors: list[grpc.ServerInterceptor] = [boundary]
    if metrics is not None:
        metrics.watch(shard)
        metrics.watch_streams(servicer.streams)
        interceptors.append(MetricsInterceptor(metrics))
    interceptors.append(ErrorInterceptor())
    server = grpc.server(
        pools.data, interceptors=interceptors, options=connection_options(cfg.connection)
    )
    server.add_generic_rpc_handlers((store_handler(servicer),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{cfg.host}:{cfg.port}"
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        credentials = grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)])
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    endpoint = None
    try:
        if cfg.metrics_port is not None and registry is not None:
            endpoint = serve_metrics(registry, cfg.metrics_host or cfg.host, cfg.metrics_port)
        server.start()
    except BaseException:
        server.stop(None)
        pools.shutdown()
        servicer.close()
        if trimmer is not None:
            trimmer.close()
        if endpoint is not None:
            endpoint.stop()
        raise
    served = ShardServer(
        server=server,
        pools=pools,
        port=port,
        health=health_servicer,
        metrics_registry=registry,
        metrics_endpoint=endpoint,
        servicer=servicer,
        trimmer=trimmer,
    )
    served.set_serving(serving)
    return served


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
