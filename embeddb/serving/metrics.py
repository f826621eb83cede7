"""Prometheus metrics of the model server, in a registry of its own (never the global one).

::

    embeddb_model_requests_total{method,status}   calls; method Predict (gRPC) or http_predict,
                                                  status the gRPC status name (HTTP too)
    embeddb_model_request_seconds{method}         histogram: request handling time
    embeddb_model_batch_samples                   histogram: samples per micro-batch (one
                                                  InferCtx.predict call)
    embeddb_model_batch_seconds                   histogram: time of one InferCtx.predict call
                                                  (lookups + pooling + dense)
    embeddb_model_lookup_seconds                  histogram: the embedding lookups of one
                                                  micro-batch (InferCtx.on_lookup)
    embeddb_model_predictions_total               counter: samples scored
    embeddb_model_bad_requests_total{method,reason}  requests refused for their content
                                                  (gRPC: malformed, bad_enum; HTTP: see the
                                                  HTTP frontend)
    embeddb_model_record_missing_filled_total     counter: numeric values missing from raw
                                                  records (a missing key, null, a marker),
                                                  filled with the training mean
    embeddb_model_record_unknown_keys_total       counter: keys of raw records that no column
                                                  reads (refused with 400 / INVALID_ARGUMENT,
                                                  or ignored by a lenient model)

Not exported: a count of unknown ids. The shards' lookup answer does not say which ids they
store (an unknown id reads as zeros, see ``infer.py``), so the server cannot count them; a
metric that always reads 0 would mislead.

The registry also holds the process and Python collectors (``process_*``, ``python_info``,
``python_gc_*``: :func:`embeddb.transport.rpc.metrics_http.add_runtime_collectors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

from embeddb.transport.rpc.boundary import RefusedCall
from embeddb.transport.rpc.metrics import LATENCY_BUCKETS
from embeddb.transport.rpc.metrics_http import add_runtime_collectors
from embeddb.v1 import model_pb2 as mpb

if TYPE_CHECKING:
    from embeddb.features.records import RecordStats

__all__ = ["BATCH_BUCKETS", "ModelMetrics"]

MODEL_SERVICE_NAME = mpb.DESCRIPTOR.services_by_name["ModelService"].full_name

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


class ModelMetrics:
    """The model server's metrics, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "embeddb_model") -> None:
        self.registry = registry
        add_runtime_collectors(registry)  # process_*, python_info, python_gc_*
        self.requests = Counter(
            f"{prefix}_requests",
            "Predict calls by method (Predict: gRPC, http_predict: HTTP) and gRPC status name.",
            ["method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_seconds",
            "Predict call handling time (request decoded to response ready).",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_samples = Histogram(
            f"{prefix}_batch_samples",
            "Samples per micro-batch (one InferCtx.predict call).",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_seconds = Histogram(
            f"{prefix}_batch_seconds",
            "Time of one InferCtx.predict call (lookups, pooling, dense).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.lookup_seconds = Histogram(
            f"{prefix}_lookup_seconds",
            "Time of the embedding lookups (one LookupMany per shard) of one micro-batch.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.predictions = Counter(f"{prefix}_predictions", "Samples scored.", registry=registry)
        self.bad_requests = Counter(
            f"{prefix}_bad_requests",
            "Requests refused for their content (malformed bytes or JSON, undefined values).",
            ["method", "reason"],
            registry=registry,
        )
        self.missing_filled = Counter(
            f"{prefix}_record_missing_filled",
            "Numeric values missing from raw records, filled with the training mean.",
            registry=registry,
        )
        self.unknown_keys = Counter(
            f"{prefix}_record_unknown_keys",
            "Keys of raw records that no column reads (refused, or ignored by a lenient model).",
            registry=registry,
        )

    def observe_records(self, stats: RecordStats) -> None:
        """What building the batch of one request's raw records found."""
        if stats.missing_filled:
            self.missing_filled.inc(stats.missing_filled)
        if stats.unknown_keys:
            self.unknown_keys.inc(stats.unknown_keys)

    def observe(self, method: str, status: str, seconds: float) -> None:
        """One finished call."""
        self.requests.labels(method, status).inc()
        self.latency.labels(method).observe(seconds)

    def observe_bad_request(self, method: str, reason: str) -> None:
        """One request refused for its content (HTTP: ``method`` is the HTTP method)."""
        self.bad_requests.labels(method, reason).inc()

    def observe_refused(self, call: RefusedCall) -> None:
        """One gRPC call refused before the servicer (``embeddb.transport.rpc.boundary``)."""
        if call.reason is not None:
            self.observe_bad_request(call.method, call.reason)
        if call.service == MODEL_SERVICE_NAME:
            self.observe(call.method, call.status, call.seconds)

    def observe_batch(self, samples: int, seconds: float, ok: bool) -> None:
        """One ``predict`` call of the micro-batcher (``ok``: it succeeded)."""
        self.batch_samples.observe(samples)
        self.batch_seconds.observe(seconds)
        if ok:
            self.predictions.inc(samples)
