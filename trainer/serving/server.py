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
answering ``{"error": message, "status": name}``.

Bad input never stops the server: it is answered INVALID_ARGUMENT / 400 naming the record and
field, and a request of more than ``max_records`` records (or an HTTP body above
``max_body_bytes``, or a gRPC message above ``max_message_bytes``) RESOURCE_EXHAUSTED / 413.

:func:`build_model_server` returns a started :class:`ModelServer` (ports bound, 0 picks free
ones); :meth:`ModelServer.stop` shuts down in the fixed order of STYLE.md §13: health
NOT_SERVING → stop accepting, in-flight calls finish within the grace period → the batcher
scores what is queued → metrics endpoint. Closing the ``InferCtx`` is its owner's job.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import grpc
import numpy as np
import numpy.typing as npt
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from embeddb.errors import (
    ConfigError,
    EmbeddbError,
    InvalidArgumentError,
    ResourceExhaustedError,
    status_of,
)
from embeddb.server.auth import AuthInterceptor, Tokens, authenticate
from embeddb.server.interceptors import ErrorInterceptor
from embeddb.server.metrics import MetricsEndpoint, MetricsInterceptor, serve_metrics
from embeddb.trainer.batch import Batch
from embeddb.v1 import model_pb2 as mpb
from embeddb.v1 import model_pb2_grpc as mpb_grpc

from .batcher import MicroBatcher
from .codec import ModelInputs, batch_from_request, encode_scores
from .metrics import ModelMetrics

__all__ = [
    "HTTP_STATUS",
    "MODEL_SERVICE",
    "ModelServer",
    "ModelServerConfig",
    "Predictor",
    "build_model_server",
]

log = logging.getLogger(__name__)

MODEL_SERVICE = mpb.DESCRIPTOR.services_by_name["ModelService"].full_name
_PREDICT = f"/{MODEL_SERVICE}/Predict"
_OPEN_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})

# gRPC status name → HTTP status of the JSON API.
HTTP_STATUS: dict[str, int] = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

F32 = npt.NDArray[np.float32]


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
        host: address to bind (gRPC, HTTP and metrics alike).
        port: gRPC port; 0 picks a free one.
        http_port: HTTP/JSON port; 0 picks a free one; None serves no HTTP.
        metrics_port: Prometheus endpoint port (0: free); None serves none.
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
    executor: futures.ThreadPoolExecutor
    http: _HttpFrontend | None = None
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
        self.executor.shutdown(wait=True)
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
    interceptors: list[grpc.ServerInterceptor] = [
        MetricsInterceptor(
            service=MODEL_SERVICE,
            observe=lambda method, status, seconds, _req, _resp: metrics.observe(
                method, status, seconds
            ),
        )
    ]
    if cfg.tokens is not None:
        interceptors.append(AuthInterceptor(cfg.tokens, _OPEN_SERVICES, {_PREDICT}))
        if cfg.tls_cert is None and not _is_loopback(cfg.host):
            log.warning("bearer tokens travel in plain text: serving %s without TLS", cfg.host)
    interceptors.append(ErrorInterceptor())
    executor = futures.ThreadPoolExecutor(cfg.workers, thread_name_prefix="embeddb-model-rpc")
    server = grpc.server(
        executor,
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
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
        raise OSError(f"cannot bind {address}")
    http: _HttpFrontend | None = None
    endpoint: MetricsEndpoint | None = None
    try:
        if cfg.http_port is not None:
            http = _HttpFrontend(predictor, batcher, metrics, cfg)
        if cfg.metrics_port is not None:
            endpoint = serve_metrics(metrics.registry, cfg.host, cfg.metrics_port)
        server.start()
    except BaseException:
        server.stop(None)
        if http is not None:
            http.stop(0)
        if endpoint is not None:
            endpoint.stop()
        batcher.close()
        raise
    served = ModelServer(
        server=server,
        port=port,
        http_port=None if http is None else http.port,
        health=health_servicer,
        batcher=batcher,
        metrics=metrics,
        executor=executor,
        http=http,
        metrics_endpoint=endpoint,
    )
    served.set_serving(True)
    return served


# --------------------------------------------------------------------------------- HTTP
class _HttpFrontend:
    """``POST /v1/predict`` and ``GET /healthz`` on a ThreadingHTTPServer (HTTP/1.1,
    keep-alive), one thread per connection."""

    def __init__(
        self,
        predictor: Predictor,
        batcher: MicroBatcher,
        metrics: ModelMetrics,
        config: ModelServerConfig,
    ) -> None:
        self.predictor = predictor
        self.batcher = batcher
        self.metrics = metrics
        self.config = config
        self.serving = True
        self.stopping = False
        self._lock = threading.Condition()
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self.httpd = ThreadingHTTPServer((config.host, config.http_port or 0), _handler(self))
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="embeddb-model-http",
            daemon=True,
        )
        self._thread.start()

    # connection and request bookkeeping, for a graceful stop
    def opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    def stop(self, grace: float) -> None:
        """Stop accepting; wait up to ``grace`` s for requests in flight; close every
        connection (idle keep-alive ones included); close the socket."""
        self.stopping = True
        self.serving = False
        self.httpd.shutdown()
        self._thread.join()
        deadline = time.monotonic() + grace
        with self._lock:
            while self._in_flight and self._lock.wait(max(0.0, deadline - time.monotonic())):
                pass
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.httpd.server_close()

    def authenticate(self, headers: Any) -> None:
        """UnauthenticatedError unless tokens are off or ``Authorization`` holds one (any
        role may predict)."""
        if self.config.tokens is not None:
            authenticate(self.config.tokens, list(headers.items()))

    def predict(self, body: bytes) -> list[float]:
        """Parse, validate and score one ``POST /v1/predict`` body."""
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidArgumentError(f"the body is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidArgumentError(
                'the body must be a JSON object {"records": [record, ...]}, got a JSON '
                f"{type(doc).__name__}"
            )
        if "records" not in doc:
            raise InvalidArgumentError('the body has no "records": {"records": [record, ...]}')
        extra = sorted(set(doc) - {"records"})
        if extra:
            raise InvalidArgumentError(f"unknown keys {extra} (the body has only 'records')")
        records = doc["records"]
        if isinstance(records, list) and len(records) > self.config.max_records:
            raise ResourceExhaustedError(
                f"{len(records)} records in one request, more than this server accepts "
                f"({self.config.max_records}); split the request"
            )
        batch = self.predictor.batch_from_records(records)
        scores: list[float] = self.batcher.submit(batch).result().tolist()
        return scores


def _handler(front: _HttpFrontend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "embeddb-model"
        timeout = front.config.http_idle_seconds

        def setup(self) -> None:
            super().setup()
            front.opened(self.connection)

        def finish(self) -> None:
            front.closed(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s: " + format, self.address_string(), *args)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/healthz":
                self._send(404, {"error": f"no such path {self.path!r}", "status": "NOT_FOUND"})
                return
            serving = front.serving
            self._send(200 if serving else 503, {"status": "SERVING" if serving else "NOT_SERVING"})

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/v1/predict":
                self.close_connection = True
                self._send(404, {"error": f"no such path {self.path!r}", "status": "NOT_FOUND"})
                return
            front.begin()
            started = time.perf_counter()
            status = "OK"
            try:
                front.authenticate(self.headers)
                self._send(200, {"scores": front.predict(self._body())})
            except EmbeddbError as exc:
                status = status_of(exc)
                self.close_connection = True  # the body may be unread
                self._send(HTTP_STATUS.get(status, 500), {"error": str(exc), "status": status})
            except Exception:
                status = "INTERNAL"
                log.exception("unexpected error in POST /v1/predict")
                self.close_connection = True
                self._send(500, {"error": "internal error; see server log", "status": status})
            finally:
                front.metrics.observe("http_predict", status, time.perf_counter() - started)
                front.end()

        def _body(self) -> bytes:
            raw = self.headers.get("Content-Length")
            if raw is None:
                raise InvalidArgumentError("a Content-Length header is required")
            try:
                length = int(raw)
            except ValueError:
                raise InvalidArgumentError(f"bad Content-Length {raw!r}") from None
            if length < 0:
                raise InvalidArgumentError(f"bad Content-Length {raw!r}")
            if length > front.config.max_body_bytes:
                raise ResourceExhaustedError(
                    f"the body is {length} bytes, more than this server accepts "
                    f"({front.config.max_body_bytes}); split the request"
                )
            return self.rfile.read(length)

        def _send(self, code: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if code == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            if front.stopping:
                self.close_connection = True
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
