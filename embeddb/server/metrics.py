"""Prometheus metrics of one shard server: its requests, its shard's statistics, its streams.

Everything goes into a :class:`prometheus_client.CollectorRegistry` passed in, never the global
one, so several servers can live in one process (tests, a multi-shard demo).

Request metrics (recorded by :meth:`ShardMetrics.observe`, told of every ``EmbeddingStore``
call by :class:`embeddb.transport.rpc.metrics.MetricsInterceptor`; ``method`` is the short name,
``status`` the gRPC status name)::

    embeddb_requests_total{method,status}           calls, refused ones included
    embeddb_request_seconds{method,status}          histogram of handling time
    embeddb_request_bytes_total{method}             serialized request size (ByteSize)
    embeddb_response_bytes_total{method}            serialized response size
    embeddb_request_ids_total{method,table}         ids carried by successful calls (a
                                                    LookupMany/ApplyGradientsMany call counts
                                                    each part under its own table)
    embeddb_bad_requests_total{method,reason}       requests refused before the servicer for
                                                    what they hold: ``malformed`` (bytes that do
                                                    not parse) or ``bad_enum`` (an enum value
                                                    its enum does not define); any service
    embeddb_streams{role}                           Subscribe/FetchSnapshot streams running
    embeddb_streams_dropped_total{role}             streams whose caller stopped reading for
                                                    longer than the stream idle timeout

Shard metrics (read from ``Shard.stats()`` at scrape time by :class:`ShardStatsCollector`;
label ``table``; named after the fields of ``embeddb.engine.storage.TableStats``)::

    embeddb_rows                    gauge     rows stored in either tier
    embeddb_tier_rows{tier}         gauge     ram: resident rows; disk: rows with a disk copy
    embeddb_ram_capacity            gauge     RAM tier slots
    embeddb_ram_bytes               gauge     bytes of the RAM tier's arrays (ram_budget)
    embeddb_lookup_ids_total        counter   ids looked up (training and evaluation)
    embeddb_tier_hits_total{tier}   counter   looked-up ids found in RAM / on disk
    embeddb_index_miss_count_total  counter   looked-up ids found in neither tier
    embeddb_index_miss_ratio        gauge     index_miss_count / lookup_ids since start
    embeddb_admitted_total          counter   new rows created by training lookups
    embeddb_rejected_total          counter   new ids not admitted
    embeddb_evicted_total           counter   rows evicted from RAM
    embeddb_written_back_total      counter   dirty rows written to disk on eviction
    embeddb_promoted_total          counter   disk rows moved back into RAM
    embeddb_overflow_total          counter   rows served beyond a stripe's capacity
    embeddb_not_admitted_total      counter   rows a full tinylfu RAM tier kept on disk
    embeddb_update_ids_total        counter   ids in gradient updates
    embeddb_updated_rows_total      counter   rows updated by the optimizer
    embeddb_nan_grad_skipped_total  counter   rows whose gradient had NaN/Inf (skipped)
    embeddb_gradient_id_miss_count_total  counter  gradient ids stored nowhere (ignored)
    embeddb_assigned_rows_total     counter   rows written by Assign
    embeddb_deleted_rows_total      counter   rows removed by Delete
    embeddb_disk_data_loss_total    counter   disk-tier reads that failed RocksDB's checks
                                              (answered DATA_LOSS; see docs/operations.md)

Update log metrics (read from ``Shard.recovery.log_cuts`` at scrape time by
:class:`LogCutsCollector`)::

    embeddb_log_tail_cuts_total{kind}  counter  update log tails cut when the shard opened:
                                                corrupt (acknowledged updates may be lost;
                                                DATA_DIR/log-cuts.jsonl) or torn

Durability metrics (read from the shard at scrape time by :class:`DurabilityCollector`)::

    embeddb_log_seq              gauge  seq of the last mutation logged (followers: applied)
    embeddb_log_durable_seq      gauge  the last seq known fsynced
    embeddb_log_unsynced_seconds{fsync}  gauge  age of the oldest logged record not yet
                                        fsynced (0 when every one is): grows when fsyncs are
                                        slow or stuck; ``fsync`` is the policy (always,
                                        interval: stays near fsync_interval_ms; never: grows
                                        until the kernel writes back, do not alert on it)
    embeddb_read_only            gauge  1 while writes fail because of storage: a full disk
                                        (RESOURCE_EXHAUSTED until space is freed) or an I/O
                                        error (UNAVAILABLE until a restart); a follower,
                                        read-only by design, reads 0

Follower metrics (read from a :class:`~embeddb.server.follower.Follower` at scrape time by
:class:`FollowerCollector`; only on a server started with ``embeddb serve --follow``)::

    embeddb_follower_lag_seq               gauge    the primary's seq (as last heard) − applied
    embeddb_follower_lag_seconds           gauge    0 when caught up, else now − the primary's
                                                    time of logging the newest applied record
                                                    (clocks of both hosts; approximate after a
                                                    primary restart)
    embeddb_follower_applied_seq           gauge    the last primary seq applied
    embeddb_follower_primary_seq           gauge    the primary's last seq, as last heard
    embeddb_follower_applied_records_total counter  log records applied
    embeddb_follower_reconnects_total      counter  feeds re-opened after a broken stream
    embeddb_follower_bootstraps_total      counter  bootstraps from a snapshot (first included)
    embeddb_follower_bootstrapped          gauge    1 once serving a bootstrapped shard

Mapping to PERSIA's metric names (``embeddb_`` prefix added; Prometheus adds ``_total`` to
counters):

* ``index_miss_count`` → ``embeddb_index_miss_count_total`` (``TableStats.misses``).
* ``index_miss_ratio`` → ``embeddb_index_miss_ratio``; PERSIA's is per batch, ours is since
  the shard opened (take ``rate()`` of the two counters for a windowed ratio).
* ``gradient_id_miss_count`` → ``embeddb_gradient_id_miss_count_total``
  (``TableStats.missing_updates``).
* ``nan_grad_skipped`` → ``embeddb_nan_grad_skipped_total`` (``TableStats.nan_skipped``).
* ``lookup_hashmap_time_cost_sec`` → ``embeddb_request_seconds{method="Lookup"}``, and
  ``update_gradient_time_cost_sec`` (measured by PERSIA's embedding worker) is closest to
  ``embeddb_request_seconds{method="ApplyGradients"}``; one histogram by method, not one metric
  per method.
* ``estimated_distinct_id`` has no equivalent: ``embeddb_rows`` is exact, and counts stored rows
  (rejected ids are not stored), so it keeps its own name.
* ``embedding_staleness`` / ``staleness`` and ``batch_unique_indices_rate`` are trainer-side
  (embedding worker) quantities; a shard cannot observe them.

The registry also holds the process and Python collectors (``process_*``, ``python_info``,
``python_gc_*``: :func:`embeddb.transport.rpc.metrics_http.add_runtime_collectors`).

The HTTP endpoint (:func:`embeddb.transport.rpc.metrics_http.serve_metrics`) serves
``/metrics`` only, as plain HTTP without authentication; bind it to loopback or a private
network.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from embeddb.engine.shard import Shard
from embeddb.errors import UnavailableError
from embeddb.server.served_shard import ServedShard
from embeddb.server.streams import StreamSlots
from embeddb.transport.rpc.boundary import RefusedCall
from embeddb.transport.rpc.metrics import LATENCY_BUCKETS
from embeddb.transport.rpc.metrics_http import add_runtime_collectors
from embeddb.transport.wire import LEGACY_SERVICE_NAME, SERVICE_NAME

__all__ = [
    "SERVICE_NAME",
    "DurabilityCollector",
    "FollowerCollector",
    "LogCutsCollector",
    "ShardMetrics",
    "ShardStatsCollector",
]


# TableStats field → (metric name without prefix, help). Counters; gauges are handled apart.
_COUNTERS: dict[str, tuple[str, str]] = {
    "lookup_ids": ("lookup_ids", "Ids looked up (training and evaluation)."),
    "misses": ("index_miss_count", "Looked-up ids found in neither tier (PERSIA name)."),
    "admitted": ("admitted", "New rows created by training lookups."),
    "rejected": ("rejected", "New ids a training lookup did not admit."),
    "evicted": ("evicted", "Rows evicted from the RAM tier."),
    "written_back": ("written_back", "Dirty rows written to the disk tier on eviction."),
    "promoted": ("promoted", "Disk-tier rows moved back into the RAM tier."),
    "overflow": ("overflow", "Rows served beyond a stripe's capacity and kept on disk."),
    "not_admitted": (
        "not_admitted",
        "Rows a full tinylfu RAM tier turned away (less frequent than its victims), kept on disk.",
    ),
    "update_ids": ("update_ids", "Ids in gradient updates."),
    "updated_rows": ("updated_rows", "Rows updated by the optimizer."),
    "nan_skipped": ("nan_grad_skipped", "Rows whose summed gradient had NaN/Inf (skipped)."),
    "missing_updates": (
        "gradient_id_miss_count",
        "Gradient ids stored in neither tier, ignored (PERSIA name).",
    ),
    "assigned_rows": ("assigned_rows", "Rows written by Assign."),
    "deleted_rows": ("deleted_rows", "Rows removed by Delete."),
    "data_loss": (
        "disk_data_loss",
        "Disk-tier reads that failed RocksDB's checks, answered DATA_LOSS.",
    ),
}


class ShardStatsCollector(Collector):
    """Reads ``shard.stats()`` at every scrape; a closed shard (or a follower that has not
    bootstrapped yet) yields no samples."""

    def __init__(self, shard: Shard | ServedShard, prefix: str = "embeddb") -> None:
        self._served = shard if isinstance(shard, ServedShard) else ServedShard(shard)
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []  # samples depend on the tables; skip registration-time collection

    def collect(self) -> Iterator[Any]:
        p = self._prefix
        try:
            with self._served.use() as shard:
                stats = shard.stats()
        except UnavailableError:
            return
        rows = GaugeMetricFamily(f"{p}_rows", "Rows stored in either tier.", labels=["table"])
        tier_rows = GaugeMetricFamily(
            f"{p}_tier_rows",
            "Rows per tier (ram: resident; disk: rows with a disk-tier copy).",
            labels=["table", "tier"],
        )
        capacity = GaugeMetricFamily(f"{p}_ram_capacity", "RAM tier slots.", labels=["table"])
        ram_bytes = GaugeMetricFamily(
            f"{p}_ram_bytes", "Bytes of the RAM tier's preallocated arrays.", labels=["table"]
        )
        hits = CounterMetricFamily(
            f"{p}_tier_hits", "Looked-up ids found in each tier.", labels=["table", "tier"]
        )
        ratio = GaugeMetricFamily(
            f"{p}_index_miss_ratio",
            "index_miss_count / lookup_ids since the shard opened (PERSIA name).",
            labels=["table"],
        )
        counters = {
            field: CounterMetricFamily(f"{p}_{name}", text, labels=["table"])
            for field, (name, text) in _COUNTERS.items()
        }
        for table, s in sorted(stats.tables.items()):
            rows.add_metric([table], s.rows)
            tier_rows.add_metric([table, "ram"], s.ram_rows)
            tier_rows.add_metric([table, "disk"], s.disk_rows)
            capacity.add_metric([table], s.ram_capacity)
            ram_bytes.add_metric([table], s.ram_bytes)
            hits.add_metric([table, "ram"], s.ram_hits)
            hits.add_metric([table, "disk"], s.disk_hits)
            ratio.add_metric([table], s.misses / s.lookup_ids if s.lookup_ids else 0.0)
            for field, family in counters.items():
                family.add_metric([table], getattr(s, field))
        yield from (rows, tier_rows, capacity, ram_bytes, hits, ratio, *counters.values())


class _ShardCollector(Collector):
    """A collector reading a shard at scrape time (nothing while it is unavailable)."""

    def __init__(self, shard: Shard | ServedShard, prefix: str = "embeddb") -> None:
        self._served = shard if isinstance(shard, ServedShard) else ServedShard(shard)
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []


class LogCutsCollector(_ShardCollector):
    """Counts the update log tails the shard cut when it opened, by kind (corrupt, torn)."""

    def collect(self) -> Iterator[Any]:
        try:
            with self._served.use() as shard:
                cuts = shard.recovery.log_cuts
        except UnavailableError:
            return
        family = CounterMetricFamily(
            f"{self._prefix}_log_tail_cuts",
            "Update log tails cut when the shard opened: corrupt (acknowledged updates may be "
            "lost; see DATA_DIR/log-cuts.jsonl) or torn (a write a crash interrupted).",
            labels=["kind"],
        )
        for kind in ("corrupt", "torn"):
            family.add_metric([kind], sum(1 for cut in cuts if cut.kind == kind))
        yield family


class DurabilityCollector(_ShardCollector):
    """The update log's position, how far fsyncs lag behind it, and read-only mode."""

    def collect(self) -> Iterator[Any]:
        try:
            with self._served.use() as shard:
                seq, durable = shard.seq, shard.durable_seq
                oldest = shard.append_time(durable + 1) if durable < seq else None
                read_only = shard.read_only
                policy = shard.config.store.log.fsync.value
        except UnavailableError:
            return
        p = self._prefix
        unsynced = max(0.0, time.time() - oldest) if oldest is not None else 0.0
        gauges = (
            ("log_seq", "Seq of the last mutation logged (followers: the last applied).", seq),
            ("log_durable_seq", "The last seq known fsynced.", durable),
            ("read_only", "1 while writes fail because of storage: a full disk (until space "
             "is freed) or an I/O error (until a restart).", int(read_only)),
        )  # fmt: skip
        for name, text, value in gauges:
            yield GaugeMetricFamily(f"{p}_{name}", text, value=value)
        age = GaugeMetricFamily(
            f"{p}_log_unsynced_seconds",
            "Age of the oldest logged record not yet fsynced (0 when every record is), by fsync "
            "policy (under never it grows until the kernel's writeback; alert on the others).",
            labels=["fsync"],
        )
        age.add_metric([policy], unsynced)
        yield age


class ShardMetrics:
    """The request metrics of one server, registered in ``registry``.

    Args:
        registry: where the metrics live (one per server; never the global registry).
        prefix: metric name prefix.
    """

    def __init__(self, registry: CollectorRegistry, prefix: str = "embeddb") -> None:
        self.registry = registry
        self.prefix = prefix
        add_runtime_collectors(registry)  # process_*, python_info, python_gc_*
        self.requests = Counter(
            f"{prefix}_requests",
            "EmbeddingStore calls by method and gRPC status.",
            ["method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_seconds",
            "EmbeddingStore call handling time (deserialized request to response).",
            ["method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.request_bytes = Counter(
            f"{prefix}_request_bytes",
            "Serialized size of EmbeddingStore requests.",
            ["method"],
            registry=registry,
        )
        self.response_bytes = Counter(
            f"{prefix}_response_bytes",
            "Serialized size of EmbeddingStore responses.",
            ["method"],
            registry=registry,
        )
        self.request_ids = Counter(
            f"{prefix}_request_ids",
            "Ids carried by successful EmbeddingStore calls.",
            ["method", "table"],
            registry=registry,
        )
        self.bad_requests = Counter(
            f"{prefix}_bad_requests",
            "Requests refused before the servicer for their content (malformed bytes, "
            "undefined enum values).",
            ["method", "reason"],
            registry=registry,
        )

    def observe_refused(self, call: RefusedCall) -> None:
        """Record one call refused at the boundary (before it reached the servicer)."""
        if call.reason is not None:
            self.bad_requests.labels(call.method, call.reason).inc()
        if call.service in (SERVICE_NAME, LEGACY_SERVICE_NAME):
            self.requests.labels(call.method, call.status).inc()
            self.latency.labels(call.method, call.status).observe(call.seconds)
            self.request_bytes.labels(call.method).inc(call.request_bytes)

    def watch_streams(self, slots: StreamSlots) -> None:
        """Export the running and dropped streams of ``slots``, read at scrape time."""
        self.registry.register(_StreamCollector(slots, self.prefix))

    def watch(self, shard: Shard | ServedShard) -> None:
        """Export ``shard``'s table statistics, update log cuts and durability (log position,
        unsynced age, read-only mode), read at scrape time."""
        self.registry.register(ShardStatsCollector(shard, self.prefix))
        self.registry.register(LogCutsCollector(shard, self.prefix))
        self.registry.register(DurabilityCollector(shard, self.prefix))

    def observe(
        self, method: str, status: str, seconds: float, request: Any, response: Any | None
    ) -> None:
        """Record one finished call."""
        self.requests.labels(method, status).inc()
        self.latency.labels(method, status).observe(seconds)
        self.request_bytes.labels(method).inc(request.ByteSize())
        if response is not None:
            self.response_bytes.labels(method).inc(response.ByteSize())
        if status != "OK":  # only successful calls: their tables exist, the labels stay bounded
            return
        fields = request.DESCRIPTOR.fields_by_name
        if fields.get("ids") is not None:
            self.request_ids.labels(method, request.table).inc(_items(request.ids))
        for name in ("lookups", "updates"):  # LookupMany, ApplyGradientsMany: per part's table
            if fields.get(name) is not None:
                for part in getattr(request, name):
                    self.request_ids.labels(method, part.table).inc(_items(part.ids))


def _items(tensor: Any) -> int:
    n = 1
    for d in tensor.shape:
        n *= max(int(d), 0)
    return n


class _StreamCollector(Collector):
    """``embeddb_streams{role}`` and ``embeddb_streams_dropped_total{role}``."""

    def __init__(self, slots: StreamSlots, prefix: str) -> None:
        self._serveds = slots
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        running = GaugeMetricFamily(
            f"{self._prefix}_streams",
            "Subscribe/FetchSnapshot streams running, by the caller's role.",
            labels=["role"],
        )
        dropped = CounterMetricFamily(
            f"{self._prefix}_streams_dropped",
            "Streams dropped because their caller stopped reading (stream idle timeout).",
            labels=["role"],
        )
        for role, n in sorted(self._serveds.running().items()):
            running.add_metric([role], n)
        for role, n in sorted(self._serveds.dropped().items()):
            dropped.add_metric([role], n)
        yield running
        yield dropped


class FollowerStatus(Protocol):
    """What :class:`FollowerCollector` reads (a :class:`~embeddb.server.follower.Follower`)."""

    applied_records: int
    reconnects: int
    bootstraps: int

    @property
    def applied_seq(self) -> int: ...
    @property
    def primary_seq(self) -> int: ...
    @property
    def bootstrapped(self) -> bool: ...
    def lag_seconds(self) -> float: ...


class FollowerCollector(Collector):
    """The ``embeddb_follower_*`` metrics of a follower, read at every scrape."""

    def __init__(self, follower: FollowerStatus, prefix: str = "embeddb") -> None:
        self._follower = follower
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        p, f = f"{self._prefix}_follower", self._follower
        applied, primary = f.applied_seq, f.primary_seq
        gauges = (
            ("lag_seq", "The primary's last seq (as last heard) minus the applied seq.",
             max(0, primary - applied)),
            ("lag_seconds", "0 when caught up, else seconds since the primary logged the "
             "newest applied record.", f.lag_seconds()),
            ("applied_seq", "The last primary seq applied.", applied),
            ("primary_seq", "The primary's last seq, as last heard.", primary),
            ("bootstrapped", "1 once serving a bootstrapped shard.", int(f.bootstrapped)),
        )  # fmt: skip
        for name, text, value in gauges:
            yield GaugeMetricFamily(f"{p}_{name}", text, value=value)
        counters = (
            ("applied_records", "Update log records applied.", f.applied_records),
            ("reconnects", "Feeds re-opened after a broken stream.", f.reconnects),
            ("bootstraps", "Bootstraps from a snapshot, the first included.", f.bootstraps),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(f"{p}_{name}", text, value=value)
