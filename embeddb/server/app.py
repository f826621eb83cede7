"""Build a gRPC server around one shard: servicer, interceptors, health and reflection.

The server is assembled by :func:`embeddb.transport.rpc.assembly.start_server` (the interceptors,
outermost first: boundary → metrics → errors; calls on three pools: data calls, streams and
health checks never starve one another); this module adds the shard's servicer, its access
policy (:data:`~embeddb.server.policy.STORE_POLICY`) and its metrics.

Health (``grpc.health.v1``): ``""`` and the service's names are SERVING while the server serves
(reads are served even while writes are refused); :data:`WRITES_HEALTH_NAME` is SERVING only
while the shard takes writes — NOT_SERVING on a follower, and on a primary whose storage
failed: a full disk (until a write succeeds again once space is freed) or an I/O error (until
a restart). It is computed at each Check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from embeddb.common.allocator import Trimmer, limit_arenas, tune_allocator
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError
from embeddb.server.costs import shard_costs
from embeddb.server.metrics import SERVICE_NAME, ShardMetrics
from embeddb.server.policy import STORE_POLICY
from embeddb.server.served_shard import ServedShard
from embeddb.server.servicer import ServicerLimits, StoreServicer, store_handlers
from embeddb.transport.rpc.assembly import (
    ConnectionConfig,
    RpcServer,
    ServerPools,
    Service,
    start_server,
)
from embeddb.transport.rpc.listen import ListenConfig
from embeddb.transport.wire import LEGACY_SERVICE_NAME

__all__ = [
    "REQUEST_OVERHEAD_BYTES",
    "SERVICE_NAME",
    "WRITES_HEALTH_NAME",
    "ServerConfig",
    "build_server",
]

WRITES_HEALTH_NAME = f"{SERVICE_NAME}/writes"
"""The health name that says whether the shard takes writes (see the module docstring)."""

REQUEST_OVERHEAD_BYTES = 1 << 20
"""Room for a request's fields besides its ids and vectors (table names, parts, framing)."""


@dataclass(frozen=True)
class ServerConfig:
    """How to serve a shard.

    Attributes:
        listen: address, TLS, bearer tokens and metrics endpoint
            (:class:`~embeddb.transport.rpc.listen.ListenConfig`).
        shard_index, num_shards: the shard's place in the cluster (``embeddb serve`` opens the
            shard with them; a served :class:`Shard` reports its own, and a follower reports
            these until its first bootstrap, or, when None, none: it learns its primary's).
        max_message_bytes: largest response, and the ceiling of the largest request; larger
            ones get RESOURCE_EXHAUSTED. The request limit gRPC enforces is
            :attr:`max_receive_bytes`, derived from the request limits (reported by
            ``DescribeShard`` as ``max_message_bytes``).
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
            (see :class:`~embeddb.transport.rpc.assembly.ConnectionConfig`).
        metrics_registry: where to record metrics; None with ``listen.metrics_port`` None
            records none. Pass one to read the metrics in-process or to expose them yourself.
        max_inflight_bytes: the memory budget of the requests and answers of all calls in
            flight (:mod:`embeddb.transport.rpc.budget`): a call that does not fit within
            ``budget_wait_s`` seconds is RESOURCE_EXHAUSTED before it builds its answer.
        budget_wait_s: see ``max_inflight_bytes``.
        max_concurrent_rpcs: calls accepted at once (streams and queued calls included);
            more are RESOURCE_EXHAUSTED before their request is read.
        max_connections: connections accepted at once.
        tune_allocator: raise glibc's mmap and trim thresholds for the whole process, so the
            large buffers of each request are reused instead of page-faulted in again (see
            :mod:`embeddb.common.allocator`; about 2.5x faster 4 MiB lookups on a small VM).
    """

    listen: ListenConfig = field(default_factory=ListenConfig)
    shard_index: int | None = 0
    num_shards: int | None = 1
    max_message_bytes: int = 256 << 20
    max_ids_per_request: int = 1 << 22
    max_response_bytes: int = 64 << 20
    workers: int = 8
    max_streams: int = 4
    stream_idle_timeout: float = 30.0
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_idle_s: float = 300.0
    metrics_registry: CollectorRegistry | None = None
    max_inflight_bytes: int = 512 << 20
    budget_wait_s: float = 60.0
    max_concurrent_rpcs: int = 256
    max_connections: int = 1024
    tune_allocator: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.listen, ListenConfig):
            raise ConfigError("listen", f"must be a ListenConfig, not {type(self.listen).__name__}")
        for name in (
            "max_message_bytes",
            "max_ids_per_request",
            "max_response_bytes",
            "workers",
            "max_inflight_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_streams < 1:
            raise ConfigError("max_streams", f"must be >= 1, got {self.max_streams}")
        if not self.stream_idle_timeout > 0:
            raise ConfigError(
                "stream_idle_timeout", f"must be > 0 seconds, got {self.stream_idle_timeout}"
            )
        _ = self.connection  # validates the keepalive and idle settings

    @property
    def max_receive_bytes(self) -> int:
        """The largest request gRPC receives: the most a request within the limits can
        carry — ``max_ids_per_request`` ids, vectors up to ``max_response_bytes`` (clients
        size pushes like answers) and :data:`REQUEST_OVERHEAD_BYTES` — never more than
        ``max_message_bytes``."""
        within = self.max_ids_per_request * 8 + self.max_response_bytes + REQUEST_OVERHEAD_BYTES
        return min(self.max_message_bytes, within)

    @property
    def connection(self) -> ConnectionConfig:
        """The connection-level settings."""
        return ConnectionConfig(
            self.max_message_bytes,
            self.keepalive_s,
            self.keepalive_timeout_s,
            self.max_idle_s,
            max_receive_bytes=self.max_receive_bytes,
            max_concurrent_rpcs=self.max_concurrent_rpcs,
            max_connections=self.max_connections,
            max_inflight_bytes=self.max_inflight_bytes,
            budget_wait_s=self.budget_wait_s,
        )


def build_server(
    shard: Shard | ServedShard, config: ServerConfig | None = None, *, serving: bool = True
) -> RpcServer:
    """Start serving ``shard``; returns the server and the bound port.

    :meth:`RpcServer.stop <embeddb.transport.rpc.assembly.RpcServer.stop>` sets health NOT_SERVING
    on
    every service, stops accepting, ends the streams (followers reconnect elsewhere or later),
    lets in-flight calls finish (grace) and waits for the handlers still running then, so
    nothing touches the shard after it returns and the caller closes the shard.

    Args:
        shard: the shard, or the :class:`ServedShard` a follower swaps its shard in (none
            until bootstrapped).
        config: how to serve it.
        serving: the initial health status; a follower starts NOT_SERVING and calls
            :meth:`RpcServer.set_serving` once bootstrapped.

    Raises:
        OSError: an address cannot be bound.
    """
    cfg = config or ServerConfig()
    if cfg.tune_allocator:
        tune_allocator()
        limit_arenas(1)  # so that a burst's memory can be given back (embeddb.common.allocator)
    registry = cfg.metrics_registry
    if registry is None and cfg.listen.metrics_port is not None:
        registry = CollectorRegistry()
    metrics = ShardMetrics(registry) if registry is not None else None
    # Streams per role: rw and replica (with tokens), or everyone as one role (without); one
    # spare thread answers a stream beyond its role's limit with RESOURCE_EXHAUSTED at once.
    roles = 2 if cfg.listen.tokens is not None else 1
    pools = ServerPools.create(cfg.workers, roles * cfg.max_streams + 1)
    trimmer = Trimmer() if cfg.tune_allocator else None
    served_shard = shard if isinstance(shard, ServedShard) else ServedShard(shard)
    servicer = StoreServicer(
        served_shard,
        cfg.shard_index,
        cfg.num_shards,
        ServicerLimits(
            max_ids_per_request=cfg.max_ids_per_request,
            max_streams=cfg.max_streams,
            stream_idle_timeout=cfg.stream_idle_timeout,
            max_message_bytes=cfg.max_receive_bytes,
            max_response_bytes=cfg.max_response_bytes,
        ),
        trimmer=trimmer,
    )
    if metrics is not None:
        metrics.watch(shard)
        metrics.watch_streams(servicer.streams)

    def writable() -> bool:
        current = served_shard.current
        return current is not None and not current.follower and not current.read_only

    def release() -> None:
        try:
            servicer.close()
        finally:
            if trimmer is not None:
                trimmer.close()

    served = start_server(
        cfg.listen,
        Service(
            SERVICE_NAME,
            lambda server: server.add_generic_rpc_handlers(store_handlers(servicer)),
            STORE_POLICY,
            observe=metrics.observe if metrics is not None else None,
            on_refused=metrics.observe_refused if metrics is not None else None,
            aliases=(LEGACY_SERVICE_NAME,),
            cost=shard_costs(served_shard, cfg.max_response_bytes),
            note_bytes=trimmer.note if trimmer is not None else None,
            health_checks={WRITES_HEALTH_NAME: writable},
        ),
        pools,
        cfg.connection,
        metrics_registry=registry,
        draining=lambda grace: servicer.stop_streams(),
        release=release,
    )
    served.set_serving(serving)
    return served
