"""Prometheus metrics of one embedding worker (its own registry; served when configured).

=================================================  ======  =====================================
name                                               type    meaning
=================================================  ======  =====================================
``embeddb_trainer_staleness``                      gauge   training batches looked up whose
                                                           gradients are not yet applied
``embeddb_trainer_staleness_limit``                gauge   ``max_staleness`` (the bound)
``embeddb_trainer_staleness_peak``                 gauge   highest staleness so far
``embeddb_trainer_lookups_total{train}``           count   batches looked up
``embeddb_trainer_lookup_ids_total``               count   distinct ids looked up (per table)
``embeddb_trainer_gradient_pushes_total``          count   batches whose gradients were applied
``embeddb_trainer_failures_total{operation}``      count   lookups / gradient pushes that failed
                                                           after retries
``embeddb_trainer_retries_total{operation}``       count   retried lookups / gradient pushes
``embeddb_trainer_batches_expired_total``          count   batches whose gradients never came
``embeddb_trainer_batches_discarded_total``        count   batches released without gradients
                                                           on the NN worker's request or at close
``embeddb_trainer_gradients_dropped_total``        count   gradients of unknown (expired) batches
``embeddb_trainer_nan_skipped_ids_total``          count   ids the shards skipped: NaN/Inf sums
``embeddb_trainer_missing_ids_total``              count   ids no shard stored when updated
``embeddb_trainer_nonfinite_gradients_total``      count   (sample, feature) gradient rows the NN
                                                           worker zeroed because not finite
``embeddb_trainer_lookup_seconds``                 hist.   a batch's lookup (gRPC), per batch
``embeddb_trainer_pooling_seconds``                hist.   a batch's dedup + pooling, per batch
``embeddb_trainer_gradient_push_seconds``          hist.   a batch's un-pooling + push, per batch
=================================================  ======  =====================================

``operation`` is ``lookup`` or ``gradient_push``; ``train`` is ``true`` or ``false``. The registry
also holds the process and Python collectors (``process_*``, ``python_info``, ``python_gc_*``:
:func:`embeddb.transport.rpc.metrics_http.add_runtime_collectors`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from embeddb.transport.rpc.metrics_http import add_runtime_collectors

__all__ = ["WorkerMetrics"]

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
OPERATIONS = ("lookup", "gradient_push")


class WorkerMetrics:
    """The metrics of one embedding worker, in ``registry`` (a fresh one by default)."""

    def __init__(self, max_staleness: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        add_runtime_collectors(r)  # process_*, python_info, python_gc_*
        self.staleness = Gauge(
            "embeddb_trainer_staleness",
            "Training batches looked up whose gradients are not yet applied",
            registry=r,
        )
        self.staleness_limit = Gauge(
            "embeddb_trainer_staleness_limit", "The staleness bound (max_staleness)", registry=r
        )
        self.staleness_limit.set(max_staleness)
        self.staleness_peak = Gauge(
            "embeddb_trainer_staleness_peak", "Highest staleness so far", registry=r
        )
        self.lookups = Counter(
            "embeddb_trainer_lookups", "Batches looked up", ["train"], registry=r
        )
        self.lookup_ids = Counter(
            "embeddb_trainer_lookup_ids", "Distinct ids looked up (per table)", registry=r
        )
        self.gradient_pushes = Counter(
            "embeddb_trainer_gradient_pushes",
            "Batches whose embedding gradients were applied",
            registry=r,
        )
        self.failures = Counter(
            "embeddb_trainer_failures",
            "Lookups and gradient pushes that failed after retries",
            ["operation"],
            registry=r,
        )
        self.retries = Counter(
            "embeddb_trainer_retries",
            "Retried lookups and gradient pushes",
            ["operation"],
            registry=r,
        )
        for op in OPERATIONS:  # export zeros from the start
            self.failures.labels(op)
            self.retries.labels(op)
        for train in ("true", "false"):
            self.lookups.labels(train)
        self.batches_expired = Counter(
            "embeddb_trainer_batches_expired",
            "Training batches whose gradients never arrived within batch_timeout",
            registry=r,
        )
        self.batches_discarded = Counter(
            "embeddb_trainer_batches_discarded",
            "Training batches released without gradients (NN worker's request, or close)",
            registry=r,
        )
        self.gradients_dropped = Counter(
            "embeddb_trainer_gradients_dropped",
            "Gradients that arrived for unknown (expired) batches",
            registry=r,
        )
        self.nan_skipped_ids = Counter(
            "embeddb_trainer_nan_skipped_ids",
            "Ids whose summed gradient the shards skipped as NaN or Inf",
            registry=r,
        )
        self.missing_ids = Counter(
            "embeddb_trainer_missing_ids", "Ids no shard stored when updated", registry=r
        )
        self.nonfinite_gradients = Counter(
            "embeddb_trainer_nonfinite_gradients",
            "Gradient rows (sample, feature) zeroed by the NN worker because not finite",
            registry=r,
        )
        self.lookup_seconds = Histogram(
            "embeddb_trainer_lookup_seconds",
            "Lookup of one batch (gRPC)",
            buckets=_BUCKETS,
            registry=r,
        )
        self.pooling_seconds = Histogram(
            "embeddb_trainer_pooling_seconds",
            "Dedup and pooling of one batch",
            buckets=_BUCKETS,
            registry=r,
        )
        self.gradient_push_seconds = Histogram(
            "embeddb_trainer_gradient_push_seconds",
            "Un-pooling and pushing the gradients of one batch",
            buckets=_BUCKETS,
            registry=r,
        )

    def set_staleness(self, value: int) -> None:
        self.staleness.set(value)
        if value > self.staleness_peak._value.get():
            self.staleness_peak.set(value)

    def snapshot(self) -> dict[str, float]:
        """Every sample of the registry as ``{name{labels}: value}`` (for the NN worker)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket")):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out
