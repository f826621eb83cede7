"""The model server: an :class:`~embeddb.trainer.serving.InferCtx` served over gRPC and HTTP.

::

    gRPC  embeddb.v1.ModelService/Predict ─┐    decode + validate (codec.batch_from_request /
    HTTP  POST /v1/predict {"records"} ────┤    InferCtx.batch_from_records), then
                                           ▼
                                   MicroBatcher ── one InferCtx.predict per micro-batch
                                   (batcher.py)    (lookups on the shards, dense), scores
                                                   split back to each request
    gRPC  grpc.health.v1 + reflection; HTTP GET /healthz; metrics on their own port

gRPC interceptors, outermost first, as in the shard server (``embeddb.server.app``): metrics
(refused and failed calls counted with their status) → auth (bearer tokens; a read-only token
may call ``Predict``) → errors (embeddb exceptions to gRPC statuses). HTTP applies the same
tokens (``Authorization: Bearer``) and maps the same statuses to HTTP codes (:data:`HTTP_STATUS`),
answering ``{"error": message, "status": name}``; its routes, refusals and limits are described
in ``http.py`` (:class:`~embeddb.trainer.serving.http.HttpFrontend`).

Bad input never stops the server: it is answered INVALID_ARGUMENT / 400 naming the record and
field, and a request of more than ``max_records`` records (or an HTTP body above
``max_body_bytes``, or a gRPC message above ``max_message_bytes``) RESOURCE_EXHAUSTED / 413.

:func:`build_model_server` returns a started :class:`ModelServer` (ports bound, 0 picks free
ones); :meth:`ModelServer.stop` shuts down in the fixed order of STYLE.md §13: health
NOT_SERVING → stop accepting, in-flight calls finish within the grace period → the batcher
scores what is queued → metrics endpoint. Closing the ``InferCtx`` is its owner's job.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from embeddb.arrays import F32
from embeddb.errors import ConfigError
from embeddb.server.assembly import ConnectionConfig, ServerPools, connection_options
from embeddb.server.auth import AccessPolicy, Role, Tokens
from embeddb.server.boundary import Boundary
from embeddb.server.interceptors import ErrorInterceptor
from embeddb.server.metrics import MetricsEndpoint, MetricsInterceptor, serve_metrics
from embeddb.trainer.batch import Batch
from embeddb.v1 import model_pb2 as mpb
from embeddb.v1 import model_pb2_grpc as mpb_grpc

from .batcher import MicroBatcher
from .codec import ModelInputs, batch_from_request, encode_scores
from .http import HTTP_STATUS, HttpFrontend
from .metrics import ModelMetrics

__all__ = [
    "HTTP_STATUS",
    "MODEL_SERVICE",
    "ModelServer",
    "ModelServerConfig",
    "Predictor",
    "build_model_server",
]

logger = logging.getLogger(__name__)

MODEL_SERVICE = mpb.DESCRIPTOR.services_by_name["ModelService"].full_name
_OPEN_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})
# Every role may predict (evaluation lookups only); nothing else is served.
_POLICY = AccessPolicy(allowed={role: frozenset({"Predict"}) for role in Role})


class Predictor(Protocol):
    """What the server needs of an :class:`~embeddb.trainer.serving.InferCtx`."""

    @property
    def spec(self) -> ModelInputs: ...
    def predict(self, batch: Batch) -> F32: ...
    def batch_from_records(self, records: object) -> Batch: ...


@dataclass(frozen=True)
class ModelServerConfig:
    """How to serve a model.

    Attributes:
        host: address to bind (gRPC and HTTP; metrics too unless ``metrics_host`` is set).
        port: gRPC port; 0 picks a free one.
        http_port: HTTP/JSON port; 0 picks a free one; None serves no HTTP.
        metrics_port: Prometheus endpoint port (0: free); None serves none. It serves
            ``/metrics`` only (404 elsewhere), without TLS or tokens.
        metrics_host: address the metrics endpoint binds; None binds ``host``.
        max_batch: the most samples one ``InferCtx.predict`` call scores (a larger request
            runs alone).
        max_delay: seconds a request may wait for others to join its micro-batch (a request
            after a quiet gap of that long runs at once; see ``batcher.py``).
        workers: gRPC threads: also the most gRPC requests one micro-batch can merge.
        max_records: the most records of one request (more: RESOURCE_EXHAUSTED / 413).
        max_message_bytes: the largest gRPC request or response.
        max_body_bytes: the largest HTTP request body.
        http_idle_seconds: an idle HTTP keep-alive connection is closed after this long.
        tokens: accepted bearer tokens (gRPC and HTTP); None serves every caller.
        tls_cert, tls_key: PEM certificate chain and key: gRPC serves TLS only (HTTP stays
            plain: put it behind a TLS proxy, or serve it on loopback only).
        metrics_registry: where to record metrics; a fresh registry when None.
    """

    host: str = "127.0.0.1"
    port: int = 0
    http_port: int | None = 0
    metrics_port: int | None = None
    metrics_host: str | None = None
    max_batch: int = 256
    max_delay: float = 0.002
    workers: int = 8
    max_records: int = 65536
    max_message_bytes: int = 64 << 20
    max_body_bytes: int = 64 << 20
    http_idle_seconds: float = 30.0
    tokens: Tokens | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    metrics_registry: CollectorRegistry | None = None

    def __post_init__(self) -> None:
        for name in ("port", "http_port", "metrics_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ConfigError(name, f"must be in 0..65535, got {value}")
        for name in ("max_batch", "workers", "max_records", "max_message_bytes", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_delay < 0:
            raise ConfigError("max_delay", f"must be >= 0, got {self.max_delay}")
        if self.metrics_host is not None and not self.metrics_host.strip():
            raise ConfigError("metrics_host", "must be an address, not empty (None: host)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert", "set both tls_cert and tls_key, or neither")
        if self.tokens is not None and not isinstance(self.tokens, Tokens):
            raise ConfigError("tokens", f"must be a Tokens, not {type(self.tokens).__name__}")


class _Servicer(mpb_grpc.ModelServiceServicer):
    def __init__(self, spec: ModelInputs, batcher: MicroBatcher, max_records: int) -> None:
        self._spec = spec
        self._batcher = batcher
        self._max_records = max_records

    def Predict(
        self, request: mpb.PredictRequest, context: grpc.ServicerContext
    ) -> mpb.PredictResponse:
        batch = batch_from_request(request, self._spec, self._max_records)
        return encode_scores(self._batcher.submit(batch).result())


@dataclass
class ModelServer:
    """A started model server (see :func:`build_model_server`)."""

    server: grpc.Server
    port: int
    http_port: int | None
    health: health.HealthServicer
    batcher: MicroBatcher
    metrics: ModelMetrics
    pools: ServerPools
    http: HttpFrontend | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def metrics_port(self) -> int | None:
        return None if self.metrics_endpoint is None else self.metrics_endpoint.port

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def ports(self) -> dict[str, int | None]:
        """``{"grpc": port, "http": port or None, "metrics": port or None}`` (the port file)."""
        return {"grpc": self.port, "http": self.http_port, "metrics": self.metrics_port}

    def set_serving(self, serving: bool) -> None:
        """gRPC health and ``GET /healthz``: SERVING or NOT_SERVING."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", MODEL_SERVICE):
            self.health.set(name, status)
        if self.http is not None:
            self.http.serving = serving

    def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING; stop accepting; in-flight calls get ``grace`` seconds; the
        batcher scores what is queued; the metrics endpoint stops last. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.set_serving(False)
        self.health.enter_graceful_shutdown()
        done = self.server.stop(grace)
        if self.http is not None:
            self.http.stop(grace)
        done.wait()
        self.batcher.close()
        self.pools.shutdown()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()


def build_model_server(
    predictor: Predictor, config: ModelServerConfig | None = None
) -> ModelServer:
    """Serve ``predictor`` (an ``InferCtx``) over gRPC (and HTTP); returns it started.

    Raises:
        OSError: a port cannot be bound.
    """
    cfg = config or ModelServerConfig()
    metrics = ModelMetrics(cfg.metrics_registry or CollectorRegistry())
    if hasattr(predictor, "on_lookup"):  # InferCtx: time its lookups
        predictor.on_lookup = metrics.lookup_seconds.observe
    batcher = MicroBatcher(
        predictor.predict,
        max_batch=cfg.max_batch,
        max_delay=cfg.max_delay,
        on_batch=metrics.observe_batch,
    )
    if cfg.tokens is not None and cfg.tls_cert is None and not _is_loopback(cfg.host):
        logger.warning("bearer tokens travel in plain text: serving %s without TLS", cfg.host)
    pools = ServerPools.create(cfg.workers, prefix="embeddb-model")
    interceptors: list[grpc.ServerInterceptor] = [
        Boundary(
            _POLICY,
            cfg.tokens,
            _OPEN_SERVICES,
            on_refused=metrics.observe_refused,
            dedicated_pools=pools.dedicated,
        ),
        MetricsInterceptor(
            service=MODEL_SERVICE,
            observe=lambda method, status, seconds, _req, _resp: metrics.observe(
                method, status, seconds
            ),
        ),
        ErrorInterceptor(),
    ]
    server = grpc.server(
        pools.data,
        interceptors=interceptors,
        options=connection_options(ConnectionConfig(max_message_bytes=cfg.max_message_bytes)),
    )
    mpb_grpc.add_ModelServiceServicer_to_server(  # type: ignore[no-untyped-call]
        _Servicer(predictor.spec, batcher, cfg.max_records), server
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (MODEL_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{cfg.host}:{cfg.port}"
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        port = server.add_secure_port(
            address, grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)])
        )
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        batcher.close()
        pools.shutdown()
        raise OSError(f"cannot bind {address}")
    http: HttpFrontend | None = None
    endpoint: MetricsEndpoint | None = None
    try:
        if cfg.http_port is not None:
            http = HttpFrontend(predictor, batcher, metrics, cfg)
        if cfg.metrics_port is not None:
            endpoint = serve_metrics(
                metrics.registry, cfg.metrics_host or cfg.host, cfg.metrics_port
            )
        server.start()
    except BaseException:
        server.stop(None)
        if http is not None:
            http.stop(0)
        if endpoint is not None:
            endpoint.stop()
        batcher.close()
        pools.shutdown()
        raise
    served = ModelServer(
        server=server,
        port=port,
        http_port=None if http is None else http.port,
        health=health_servicer,
        batcher=batcher,
        metrics=metrics,
        pools=pools,
        http=http,
        metrics_endpoint=endpoint,
    )
    served.set_serving(True)
    return served


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
