"""The model server: an :class:`~embeddb.serving.InferCtx` served over gRPC and HTTP.

::

    gRPC  embeddb.v1.ModelService/Predict ─┐    decode + validate (codec.batch_from_request, or
    HTTP  POST /v1/predict {"records"} ────┤    InferCtx.batch_from_records of raw records:
                                           │    the feature pipeline's), then
                                           ▼
                                   MicroBatcher ── one InferCtx.predict per micro-batch
                                   (batcher.py)    (lookups on the shards, dense), scores
                                                   split back to each request
    gRPC  embeddb.v1.ModelService/DescribeModel: the model's inputs and the limits below
    gRPC  grpc.health.v1 + reflection; HTTP GET /healthz; metrics on their own port

Before any port is bound the predictor is warmed up (``InferCtx.warm_up``: numba kernels
compiled, one dummy record scored; see ``warmup.py``). An idle server scores a lone request
in the gRPC thread that received it, or the HTTP worker thread that parsed it
(``batcher.py``): no hand-off to the batcher, no batching wait.

The gRPC server is assembled like the shard server
(:func:`embeddb.transport.rpc.assembly.start_server`:
boundary with bearer tokens, where every role may call ``Predict`` and ``DescribeModel`` →
metrics → errors, with embeddb exceptions to gRPC statuses). HTTP applies the same
tokens (``Authorization: Bearer``) and maps the same statuses to HTTP codes (:data:`HTTP_STATUS`),
answering ``{"error": message, "status": name}``; its routes, refusals and limits are described
in ``http.py`` (:class:`~embeddb.serving.http.HttpFrontend`).

Bad input never stops the server: it is answered INVALID_ARGUMENT / 400 naming the record and
field, and a request of more than ``max_records`` records (or an HTTP body above
``max_body_bytes``, or a gRPC message above ``max_message_bytes``) RESOURCE_EXHAUSTED / 413.
A JSON body (HTTP, or gRPC's ``records_json``) is measured before it is parsed
(:mod:`.body`): a string over ``max_string_bytes`` or a record over ``max_record_bytes`` is
RESOURCE_EXHAUSTED / 413 naming the limit. Raw records: a missing numeric value is the
training mean, a key no column reads INVALID_ARGUMENT / 400 (ignored by a model exported with
``lenient_records``), both counted (``embeddb_model_record_missing_filled_total``,
``embeddb_model_record_unknown_keys_total``); a score is never NaN (``codec.finite_scores``).

:func:`build_model_server` returns a started :class:`ModelServer` (ports bound, 0 picks free
ones); :meth:`ModelServer.stop` shuts down in the fixed order of docs/style.md §13: health
NOT_SERVING → stop accepting, in-flight calls finish within the grace period → the batcher
scores what is queued → metrics endpoint. Closing the ``InferCtx`` is its owner's job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from embeddb.errors import ConfigError, InvalidArgumentError, ResourceExhaustedError
from embeddb.serving.batcher import MicroBatcher
from embeddb.serving.body import BodyLimits, parse_json
from embeddb.serving.codec import batch_from_request, encode_scores, finite_scores
from embeddb.serving.http import HTTP_STATUS, HttpFrontend, HttpSettings
from embeddb.serving.metrics import ModelMetrics
from embeddb.serving.predictor import Predictor
from embeddb.transport.rpc.assembly import (
    ConnectionConfig,
    RpcServer,
    ServerPools,
    Service,
    start_server,
)
from embeddb.transport.rpc.auth import AccessPolicy, Role
from embeddb.transport.rpc.listen import ListenConfig
from embeddb.v1 import model_pb2 as mpb
from embeddb.v1 import model_pb2_grpc as mpb_grpc

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
# Every role may predict (evaluation lookups only) and describe the model; nothing else is served.
_POLICY = AccessPolicy(allowed={role: frozenset({"Predict", "DescribeModel"}) for role in Role})


@dataclass(frozen=True)
class ModelServerConfig:
    """How to serve a model.

    Attributes:
        listen: the gRPC address (HTTP binds its host too), TLS (gRPC only: put HTTP behind a
            TLS proxy, or serve it on loopback only), bearer tokens (gRPC and HTTP) and the
            metrics endpoint (:class:`~embeddb.transport.rpc.listen.ListenConfig`).
        http_port: HTTP/JSON port; 0 picks a free one; None serves no HTTP.
        max_batch: the most samples one ``InferCtx.predict`` call scores (a larger request
            runs alone).
        max_delay: seconds a request may wait for others to join its micro-batch (a request
            after a quiet gap of that long runs at once; see ``batcher.py``).
        workers: gRPC threads: also the most gRPC requests one micro-batch can merge; HTTP
            has as many threads that parse and score request bodies.
        max_records: the most records of one request (more: RESOURCE_EXHAUSTED / 413).
        max_message_bytes: the largest gRPC request or response.
        max_body_bytes: the largest HTTP request body.
        max_record_bytes: the largest record of a JSON body (HTTP, gRPC ``records_json``), as
            JSON text, measured before parsing.
        max_string_bytes: the longest string of a JSON body (an id, a value, a key), measured
            before parsing.
        http_idle_seconds: an idle HTTP keep-alive connection (or a request stalled in its
            head or body) is closed after this long.
        max_inflight_bytes: the gRPC port's memory budget: the requests of every ``Predict``
            in flight, twice (received and decoded), share it; a call that does not fit
            within 60 s (or its deadline) is RESOURCE_EXHAUSTED
            (:mod:`embeddb.transport.rpc.budget`).
        max_concurrent_rpcs: gRPC calls accepted at once (queued ones included); more are
            RESOURCE_EXHAUSTED before their request is read.
        metrics_registry: where to record metrics; a fresh registry when None.
        warm_up: before binding any port, call the predictor's ``warm_up()`` (if it has one:
            :meth:`InferCtx.warm_up <embeddb.serving.InferCtx.warm_up>` compiles the
            numba kernels and runs one dummy record), so no call pays for a compilation.
    """

    listen: ListenConfig = field(default_factory=ListenConfig)
    http_port: int | None = 0
    max_batch: int = 256
    max_delay: float = 0.002
    workers: int = 8
    max_records: int = 65536
    max_message_bytes: int = 64 << 20
    max_body_bytes: int = 64 << 20
    max_record_bytes: int = 1 << 20
    max_string_bytes: int = 64 << 10
    http_idle_seconds: float = 30.0
    max_inflight_bytes: int = 512 << 20
    max_concurrent_rpcs: int = 256
    metrics_registry: CollectorRegistry | None = None
    warm_up: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.listen, ListenConfig):
            raise ConfigError("listen", f"must be a ListenConfig, not {type(self.listen).__name__}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ConfigError("http_port", f"must be in 0..65535, got {self.http_port}")
        for name in (
            "max_batch",
            "workers",
            "max_records",
            "max_message_bytes",
            "max_body_bytes",
            "max_inflight_bytes",
            "max_concurrent_rpcs",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        self.body_limits()  # the body limits are checked there
        if self.max_delay < 0:
            raise ConfigError("max_delay", f"must be >= 0, got {self.max_delay}")

    def body_limits(self) -> BodyLimits:
        """The bounds of a JSON request body (:class:`~.body.BodyLimits`)."""
        return BodyLimits(self.max_body_bytes, self.max_record_bytes, self.max_string_bytes)

    def http_settings(self) -> HttpSettings:
        """What the HTTP frontend serves with (``http_port`` None: 0)."""
        return HttpSettings(
            host=self.listen.host,
            port=self.http_port or 0,
            tokens=self.listen.tokens,
            limits=self.body_limits(),
            max_records=self.max_records,
            idle_seconds=self.http_idle_seconds,
            workers=self.workers,
        )


class _Servicer(mpb_grpc.ModelServiceServicer):
    def __init__(
        self, predictor: Predictor, batcher: MicroBatcher, config: ModelServerConfig
    ) -> None:
        self._predictor = predictor
        self._spec = predictor.spec
        self._batcher = batcher
        self._max_records = config.max_records
        self._limits = config.body_limits()
        self._config = config

    def DescribeModel(
        self, request: mpb.DescribeModelRequest, context: grpc.ServicerContext
    ) -> mpb.DescribeModelResponse:
        return describe_model(self._predictor, self._config)

    def Predict(
        self, request: mpb.PredictRequest, context: grpc.ServicerContext
    ) -> mpb.PredictResponse:
        if request.records_json:
            records = json_records(request, self._max_records, self._limits)
            batch = self._predictor.batch_from_records(records)
        else:
            batch = batch_from_request(request, self._spec, self._max_records)
        return encode_scores(finite_scores(self._batcher.submit(batch).result()))


def describe_model(predictor: Predictor, config: ModelServerConfig) -> mpb.DescribeModelResponse:
    """The ``DescribeModel`` answer: ``predictor``'s inputs and ``config``'s limits."""
    spec = predictor.spec
    return mpb.DescribeModelResponse(
        id_features=list(spec.id_features),
        non_id_inputs=[mpb.NonIdInput(name=i.name, shape=list(i.shape)) for i in spec.non_id],
        raw_records=getattr(predictor, "pipeline", None) is not None,
        limits=mpb.ModelLimits(
            max_message_bytes=config.max_message_bytes, max_records=config.max_records
        ),
        snapshot_id=getattr(spec, "snapshot_id", None) or "",
    )


def json_records(
    request: mpb.PredictRequest, max_records: int, limits: BodyLimits | None = None
) -> list[object]:
    """The records of a request in the JSON form (``records_json``), checked.

    Raises:
        InvalidArgumentError: columnar features beside the JSON, JSON that is not an array
            (see :func:`~embeddb.serving.body.parse_json`), or ``num_records`` neither
            0 nor the number of records.
        ResourceExhaustedError: more than ``max_records`` records, a string or a record over
            ``limits`` (measured before parsing).
    """
    if request.id_features or request.non_id_features:
        raise InvalidArgumentError(
            "a request carries records_json or id_features/non_id_features, not both"
        )
    records = parse_json(request.records_json, limits, level=2)  # [{...}, ...]
    if not isinstance(records, list):
        raise InvalidArgumentError(
            f"records_json must be a JSON array of records, got a JSON {type(records).__name__}"
        )
    if len(records) > max_records:
        raise ResourceExhaustedError(
            f"{len(records)} records in one request, more than this server accepts "
            f"({max_records}); split the request"
        )
    if request.num_records not in (0, len(records)):
        raise InvalidArgumentError(
            f"num_records is {request.num_records}, records_json holds {len(records)} records"
        )
    return records


@dataclass
class ModelServer:
    """A started model server (see :func:`build_model_server`): its gRPC server, HTTP frontend
    (None when not served) and micro-batcher."""

    rpc: RpcServer
    batcher: MicroBatcher
    metrics: ModelMetrics
    http: HttpFrontend | None = None

    @property
    def port(self) -> int:
        """The bound gRPC port."""
        return self.rpc.port

    @property
    def http_port(self) -> int | None:
        return None if self.http is None else self.http.port

    @property
    def metrics_port(self) -> int | None:
        return self.rpc.metrics_port

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def ports(self) -> dict[str, int | None]:
        """``{"grpc": port, "http": port or None, "metrics": port or None}`` (the port file)."""
        return {"grpc": self.port, "http": self.http_port, "metrics": self.metrics_port}

    def set_serving(self, serving: bool) -> None:
        """gRPC health and ``GET /healthz``: SERVING or NOT_SERVING."""
        self.rpc.set_serving(serving)
        if self.http is not None:
            self.http.serving = serving

    def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING; stop accepting (gRPC and HTTP); in-flight calls get ``grace``
        seconds; the batcher scores what is queued; the metrics endpoint stops last
        (:meth:`RpcServer.stop <embeddb.transport.rpc.assembly.RpcServer.stop>`). Idempotent."""
        self.set_serving(False)
        self.rpc.stop(grace)


def build_model_server(
    predictor: Predictor, config: ModelServerConfig | None = None
) -> ModelServer:
    """Serve ``predictor`` (an ``InferCtx``) over gRPC (and HTTP); returns it started.

    Unless ``config.warm_up`` is false, the predictor's ``warm_up()`` (when it has one) runs
    first: no port is bound, so no call is accepted, before the numba kernels are compiled
    and one dummy record was scored (see ``warmup.py``).

    Raises:
        OSError: a port cannot be bound.
        embeddb errors of the predictor's warm-up (the shards cannot be reached).
    """
    cfg = config or ModelServerConfig()
    warm_up = getattr(predictor, "warm_up", None)
    if cfg.warm_up and warm_up is not None:
        logger.debug("model server warmed up in %.2f s", warm_up())
    metrics = ModelMetrics(cfg.metrics_registry or CollectorRegistry())
    if hasattr(predictor, "on_lookup"):  # InferCtx: time its lookups
        predictor.on_lookup = metrics.lookup_seconds.observe
    if hasattr(predictor, "on_records"):  # InferCtx: count filled values and unknown keys
        predictor.on_records = metrics.observe_records
    batcher = MicroBatcher(
        predictor.predict,
        max_batch=cfg.max_batch,
        max_delay=cfg.max_delay,
        on_batch=metrics.observe_batch,
    )
    http: list[HttpFrontend] = []  # the HTTP port, once bound (after the gRPC port)

    def start_http() -> None:
        http.append(HttpFrontend(predictor, batcher, metrics, cfg.http_settings()))

    def stop_http(grace: float) -> None:  # while gRPC drains: both ports drain together
        for frontend in http:
            frontend.stop(grace)

    servicer = _Servicer(predictor, batcher, cfg)

    def register(server: grpc.Server) -> None:
        mpb_grpc.add_ModelServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    def observe(method: str, status: str, seconds: float, _request: Any, _response: Any) -> None:
        metrics.observe(method, status, seconds)

    rpc = start_server(
        cfg.listen,
        Service(MODEL_SERVICE, register, _POLICY, observe, metrics.observe_refused),
        ServerPools.create(cfg.workers, prefix="embeddb-model"),
        ConnectionConfig(
            max_message_bytes=cfg.max_message_bytes,
            max_concurrent_rpcs=cfg.max_concurrent_rpcs,
            max_inflight_bytes=cfg.max_inflight_bytes,
        ),
        metrics_registry=metrics.registry,
        before_start=start_http if cfg.http_port is not None else None,
        draining=stop_http,
        release=batcher.close,
    )
    served = ModelServer(rpc, batcher, metrics, http[0] if http else None)
    served.set_serving(True)
    return served
