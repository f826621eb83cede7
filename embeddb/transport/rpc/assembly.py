"""How every embeddb gRPC server is built: :func:`start_server`, its thread pools and
connection settings, and the ordered shutdown of what it returns (:class:`RpcServer`).

Both servers — a shard's (``embeddb.server.app``) and the model server
(``embeddb.serving.server``) — are one guarded :class:`Service` plus gRPC health
checking and reflection (open: callable without a token), behind the same interceptors,
outermost first::

    boundary   authentication before a byte of the request is parsed, role checks, decoding
               with INVALID_ARGUMENT for garbage, thread pools
               (:mod:`embeddb.transport.rpc.boundary`);
               refused calls are told to ``Service.on_refused``
    metrics    the calls that reached the servicer, with their status (``Service.observe``;
               :mod:`embeddb.transport.rpc.metrics`)
    errors     embeddb exceptions from the servicer to gRPC statuses
               (:mod:`embeddb.transport.rpc.interceptors`)

They serve calls on three pools, so that no kind of call can starve another::

    data pool     ``workers`` threads: unary calls (lookups, gradients, predictions, metadata)
    stream pool   the long-lived server streams (Subscribe, FetchSnapshot), bounded per role
    health pool   grpc.health.v1.Health/Check only: a probe is answered while every other
                  thread is busy (orchestrators restart servers whose probes time out)

Memory (docs/operations.md, "Memory bounds"): a caller refused at the boundary is refused
before its request is read; an admitted request is received whole, up to
``max_receive_bytes`` (a server derives it from its request limits, far below the send limit);
at most ``max_concurrent_rpcs`` calls are accepted at once (RESOURCE_EXHAUSTED beyond, before
anything is read), at most ``max_streams_per_connection`` per connection and
``max_connections`` connections; and the requests and answers of admitted calls share one
memory budget of ``max_inflight_bytes`` (:mod:`embeddb.transport.rpc.budget`). gRPC receives a
request
in the pool thread that serves it, so at most ``workers`` requests are being received at once.

Connections (:func:`connection_options`): besides the message-size limits, an HTTP/2 keepalive
ping every ``keepalive_s`` (a peer that does not answer within ``keepalive_timeout_s`` is
disconnected: dead clients do not hold streams or memory), and a connection without any call
for ``max_idle_s`` is closed (GOAWAY; a client reconnects on its next call).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from embeddb.errors import ConfigError
from embeddb.transport.rpc.auth import AccessPolicy
from embeddb.transport.rpc.boundary import Boundary, Cost, RefusalObserver
from embeddb.transport.rpc.budget import MemoryBudget
from embeddb.transport.rpc.interceptors import ErrorInterceptor
from embeddb.transport.rpc.listen import ListenConfig
from embeddb.transport.rpc.metrics import MetricsInterceptor, Observe
from embeddb.transport.rpc.metrics_http import MetricsEndpoint, serve_metrics
from embeddb.transport.rpc.reflection import SERVICE_NAMES as REFLECTION_SERVICES
from embeddb.transport.rpc.reflection import enable_reflection

__all__ = [
    "HEALTH_CHECK",
    "OPEN_SERVICES",
    "ConnectionConfig",
    "RpcServer",
    "ServerPools",
    "Service",
    "connection_options",
    "start_server",
]

logger = logging.getLogger(__name__)

HEALTH_CHECK = f"/{health.SERVICE_NAME}/Check"
"""The method served on the health pool."""

OPEN_SERVICES = frozenset({health.SERVICE_NAME, *REFLECTION_SERVICES})
"""Callable without a token, so orchestrators can probe and tools can discover the API."""


@dataclass(frozen=True)
class ConnectionConfig:
    """Connection-level settings of a gRPC server.

    Attributes:
        max_message_bytes: largest response message (and request, unless
            ``max_receive_bytes`` is set).
        keepalive_s: seconds between keepalive pings the server sends on a connection.
        keepalive_timeout_s: seconds a ping may go unanswered before the connection is closed.
        max_idle_s: a connection without any call for this long is closed.
        max_receive_bytes: largest request message gRPC receives (None: ``max_message_bytes``).
        max_concurrent_rpcs: calls accepted at once, streams and queued calls included; more
            are RESOURCE_EXHAUSTED before their request is read.
        max_streams_per_connection: concurrent calls one HTTP/2 connection may carry.
        max_connections: connections accepted at once.
        max_inflight_bytes: the memory budget of the requests and answers of admitted calls
            (:mod:`embeddb.transport.rpc.budget`); None: unbounded.
        budget_wait_s: seconds a call waits for room in the budget before RESOURCE_EXHAUSTED.

    Raises:
        ConfigError: a value out of range.
    """

    max_message_bytes: int = 256 << 20
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_idle_s: float = 300.0
    max_receive_bytes: int | None = None
    max_concurrent_rpcs: int = 256
    max_streams_per_connection: int = 100
    max_connections: int = 1024
    max_inflight_bytes: int | None = None
    budget_wait_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "max_message_bytes",
            "max_receive_bytes",
            "max_concurrent_rpcs",
            "max_streams_per_connection",
            "max_connections",
            "max_inflight_bytes",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, f"must be >= 1, got {value}")
        if self.budget_wait_s < 0:
            raise ConfigError("budget_wait_s", f"must be >= 0 seconds, got {self.budget_wait_s}")
        for name in ("keepalive_s", "keepalive_timeout_s", "max_idle_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0 seconds, got {getattr(self, name)}")


def connection_options(config: ConnectionConfig) -> list[tuple[str, Any]]:
    """The ``grpc.server`` options of ``config``."""
    receive = config.max_receive_bytes or config.max_message_bytes
    return [
        ("grpc.max_receive_message_length", receive),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(config.max_idle_s * 1000)),
    ]


@dataclass
class ServerPools:
    """The three executors of one server (see the module docstring).

    Args (of :meth:`create`):
        workers: threads of the data pool.
        streams: threads of the stream pool (0: none; streams then share the data pool).
        prefix: thread name prefix.
    """

    data: futures.ThreadPoolExecutor
    health: futures.ThreadPoolExecutor
    streams: futures.ThreadPoolExecutor | None = None

    @classmethod
    def create(cls, workers: int, streams: int = 0, prefix: str = "embeddb") -> ServerPools:
        return cls(
            data=futures.ThreadPoolExecutor(workers, thread_name_prefix=f"{prefix}-rpc"),
            health=futures.ThreadPoolExecutor(2, thread_name_prefix=f"{prefix}-health"),
            streams=(
                futures.ThreadPoolExecutor(streams, thread_name_prefix=f"{prefix}-stream")
                if streams
                else None
            ),
        )

    @property
    def dedicated(self) -> dict[str, futures.ThreadPoolExecutor]:
        """Method → pool, for :class:`~embeddb.transport.rpc.boundary.Boundary`."""
        return {HEALTH_CHECK: self.health}

    def shutdown(self) -> None:
        """Wait for every running call of every pool, then stop their threads."""
        for pool in (self.data, self.streams, self.health):
            if pool is not None:
                pool.shutdown(wait=True)


@dataclass(frozen=True)
class Service:
    """The guarded gRPC service of a server.

    Attributes:
        name: its full name (``embeddb.v1.EmbeddingStoreService``): reflected, and its health
            status set with the server's.
        register: adds its handlers to a ``grpc.Server``.
        policy: what each role may call.
        observe: told of every finished unary call (the metrics interceptor); None: none.
        on_refused: told of every call the boundary refuses; None: none.
        aliases: other full names ``register`` serves the same methods under (a former name):
            guarded, observed and health-checked like ``name``, but not reflected.
        cost: the expected answer bytes of a call, charged to the memory budget with its
            request (:data:`~embeddb.transport.rpc.boundary.Cost`); None: the request only.
        note_bytes: told the size of every request (a malloc trimmer's ``note``).
        health_checks: further health service names, each with whether it is SERVING; asked
            at every Check of that name (and NOT_SERVING while the server is not serving).
    """

    name: str
    register: Callable[[grpc.Server], None]
    policy: AccessPolicy
    observe: Observe | None = None
    on_refused: RefusalObserver | None = None
    aliases: tuple[str, ...] = ()
    cost: Cost | None = None
    note_bytes: Callable[[int], None] | None = None
    health_checks: Mapping[str, Callable[[], bool]] = field(default_factory=dict)


class _Health(health.HealthServicer):  # type: ignore[misc]
    """The health service, with statuses computed at each Check (``Service.health_checks``)."""

    def __init__(self, checks: Mapping[str, Callable[[], bool]]) -> None:
        super().__init__()
        self.checks = dict(checks)
        self.serving = False

    def refresh(self, name: str) -> None:
        try:
            ok = self.serving and self.checks[name]()
        except Exception:  # a probe must be answered; a failing check is not serving
            logger.exception("health check %r failed", name)
            ok = False
        self.set(name, _status(ok))  # a no-op once shutting down

    def Check(self, request: Any, context: Any) -> Any:
        if request.service in self.checks:
            self.refresh(request.service)
        return super().Check(request, context)


def _status(serving: bool) -> Any:
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


@dataclass
class RpcServer:
    """A started server (see :func:`start_server`); ``metrics_registry`` holds its metrics
    (None when off) and ``metrics_endpoint`` serves them (None when not served)."""

    server: grpc.Server
    port: int
    service: str
    health: _Health
    pools: ServerPools
    metrics_registry: CollectorRegistry | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    draining: Callable[[float], None] | None = field(default=None, repr=False)
    release: Callable[[], None] | None = field(default=None, repr=False)
    aliases: tuple[str, ...] = ()
    budget: MemoryBudget | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def executor(self) -> futures.ThreadPoolExecutor:
        """The data pool (unary calls)."""
        return self.pools.data

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint (None when not served)."""
        return None if self.metrics_endpoint is None else self.metrics_endpoint.port

    def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING, for the server (``""``) and for its service; its
        ``health_checks`` follow (NOT_SERVING while not serving, else what they say)."""
        for name in ("", self.service, *self.aliases):
            self.health.set(name, _status(serving))
        self.health.serving = serving
        for name in self.health.checks:
            self.health.refresh(name)

    def stop(self, grace: float | None = 5.0) -> None:
        """Shut down in the fixed order of docs/style.md §13; idempotent::

        health NOT_SERVING    on every service: load balancers stop routing here
        stop accepting        in-flight calls get ``grace`` seconds, then are cancelled
        draining(grace)       meanwhile: end what the grace would wait for (streams)
                              or what serves beside gRPC (an HTTP port)
        pools shut down       every handler still running is waited for
        release()             close what the handlers used (nothing uses it any more)
        metrics endpoint      last, so the final counts can be scraped meanwhile
        """
        if self._stopped:
            return
        self._stopped = True
        self.health.enter_graceful_shutdown()
        done = self.server.stop(grace)
        try:
            if self.draining is not None:
                self.draining(grace or 0.0)
            done.wait()
            self.pools.shutdown()
            if self.release is not None:
                self.release()
        finally:
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.stop()


def start_server(
    listen: ListenConfig,
    service: Service,
    pools: ServerPools,
    connection: ConnectionConfig,
    *,
    metrics_registry: CollectorRegistry | None = None,
    before_start: Callable[[], None] | None = None,
    draining: Callable[[float], None] | None = None,
    release: Callable[[], None] | None = None,
) -> RpcServer:
    """Build, bind and start a server of ``service`` (plus health and reflection); its health
    status stays unset until :meth:`RpcServer.set_serving`.

    Args:
        listen: address, TLS, tokens and metrics endpoint.
        service: the guarded service.
        pools: the server's executors (shut down here if the start fails).
        connection: message sizes, keepalive and idle settings.
        metrics_registry: served by the metrics endpoint when ``listen.metrics_port`` is set.
        before_start: runs once the port is bound, before the server starts (another
            listener of the same server, e.g. an HTTP port).
        draining: the :meth:`RpcServer.stop` step, and on a failed start with 0 (it must cope
            with ``before_start`` not having run).
        release: the :meth:`RpcServer.stop` step, and on a failed start.

    Raises:
        OSError: an address cannot be bound.
    """
    if listen.plaintext_tokens:
        logger.warning("bearer tokens travel in plain text: serving %s without TLS", listen.host)
    budget = (
        MemoryBudget(connection.max_inflight_bytes)
        if connection.max_inflight_bytes is not None
        else None
    )
    interceptors: list[grpc.ServerInterceptor] = [
        Boundary(
            service.policy,
            listen.tokens,
            OPEN_SERVICES,
            on_refused=service.on_refused,
            dedicated_pools=pools.dedicated,
            stream_pool=pools.streams,
            budget=budget,
            cost=service.cost,
            budget_wait_s=connection.budget_wait_s,
            note_bytes=service.note_bytes,
        )
    ]
    if service.observe is not None:
        interceptors.append(MetricsInterceptor((service.name, *service.aliases), service.observe))
    interceptors.append(ErrorInterceptor())
    server = grpc.server(
        pools.data,
        interceptors=interceptors,
        options=connection_options(connection),
        maximum_concurrent_rpcs=connection.max_concurrent_rpcs,
    )
    endpoint: MetricsEndpoint | None = None
    try:
        service.register(server)
        health_servicer = _Health(service.health_checks)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        enable_reflection((service.name, health.SERVICE_NAME), server)
        port = listen.bind(server)
        if before_start is not None:
            before_start()
        if listen.metrics_port is not None and metrics_registry is not None:
            endpoint = serve_metrics(metrics_registry, listen.metrics_address, listen.metrics_port)
        server.start()
    except BaseException:
        server.stop(None)
        try:
            if draining is not None:
                draining(0.0)
            pools.shutdown()
            if release is not None:
                release()
        finally:
            if endpoint is not None:
                endpoint.stop()
        raise
    return RpcServer(
        server=server,
        port=port,
        service=service.name,
        health=health_servicer,
        pools=pools,
        metrics_registry=metrics_registry,
        metrics_endpoint=endpoint,
        draining=draining,
        release=release,
        aliases=service.aliases,
        budget=budget,
    )
