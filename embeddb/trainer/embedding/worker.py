"""The embedding worker: dedup, lookup, pool, buffer, push — the transport-free core.

One :class:`EmbeddingWorker` serves one NN worker (one per rank). It runs on an ``asyncio``
loop around an :class:`~embeddb.client.AsyncClient`; :mod:`embeddb.trainer.embedding.process` runs
it in its own process behind a pipe, and tests drive it directly.

Per batch (``batch_ref`` joins the NN worker's and the embedding worker's halves of a batch)::

    lookup(batch_ref, features, train)
      1. plan       each feature's ids: truncated (sequence features), encoded (group prefix,
                    hash stack: one id -> ``rounds`` table ids), concatenated table after
                    table and deduplicated per table in one compiled pass (unique ids +
                    inverse index; :mod:`embeddb.trainer.embedding.plan`)
      2. admit      a training batch waits while ``max_staleness`` batches are looked up with
                    gradients not yet applied (FIFO; the staleness bound)
      3. look up    every table's unique ids in one ``lookup_tables`` (tables of one dim:
                    concatenated arrays in and out) or ``lookup_many``: one call per shard for
                    all tables, shards in parallel (retried if a shard is unavailable: a
                    repeated training lookup is harmless)
      4. pool       per feature (:mod:`embeddb.trainer.pooling`), in the batch's feature order
      5. buffer     a training batch keeps its plan until its gradients arrive, at most
                    ``batch_timeout`` seconds; then it expires (counted and logged)
    push_gradients(batch_ref, grads)
      6. un-pool    per feature into one array, hash-stack rounds each get their id's
                    gradient, summed per unique id of every table in one pass
      7. push       every table's gradients in one ``apply_gradients_tables`` (tables of one
                    dim) or ``apply_gradients_many`` (one call per shard;
                    retried when unavailable); once it answered, the batch leaves the
                    staleness window

Example of step 1 for two features reading one table ``demographics`` with group prefixes::

    age_bucket  values [3, 4]   -> encoded [g0|3, g0|4]
    gender      values [1, 1]   -> encoded [g0|1, g0|1]
    table demographics: ids [g0|3, g0|4, g0|1, g0|1] -> unique [g0|3, g0|4, g0|1]
                        inverse [0, 1, 2, 2]; age_bucket rows 0:2, gender rows 2:4

Modes. ``sync`` is ``max_staleness = 1``: the lookup of batch t + 1 waits until batch t's
gradients are acknowledged by the shards. ``hybrid`` lets lookups run ``max_staleness - 1``
batches ahead of the one training (plus the one whose gradients are in flight).

Failures. The worker and its client retry with one policy (``EmbeddingWorkerConfig.retry_policy``).
A lookup that still fails after ``retries`` raises :class:`LookupFailedError`
(the NN worker's ``forward`` raises it); a push that still fails is logged, counted and
reported through ``on_failure`` (the NN worker raises :class:`GradientPushFailedError` at its
next call). Failures count once per operation (a batch's lookup, a batch's push) and their
messages name the batch's tables. A push retried after a lost answer may apply twice (at least
once delivery; a retry re-sends every table's part, also to the shards that had answered): for
stale asynchronous gradients that is harmless, losing them silently is not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import numpy as np

from embeddb.client import AsyncClient, ClientOptions, PushResult, RetryPolicy
from embeddb.client.batching import IdBatch
from embeddb.client.options import SimulatedNetwork
from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, EmbeddbError
from embeddb.trainer.embedding.metrics import WorkerMetrics
from embeddb.trainer.embedding.plan import (
    IdFeature,
    LookupPlan,
    plan_lookup,
    pool_lookup,
    pooling_specs,
)
from embeddb.trainer.embedding.staleness import StalenessWindow
from embeddb.trainer.errors import (
    EmbeddingWorkerError,
    GradientPushFailedError,
    LookupFailedError,
    TrainerError,
)
from embeddb.trainer.pooling import Pooled, Pooling, unpool

__all__ = ["EmbeddingWorker", "EmbeddingWorkerConfig"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EXPIRED_MEMORY = 4096  # refs of expired batches remembered, to name late gradients


@dataclass(frozen=True)
class EmbeddingWorkerConfig:
    """Settings of one embedding worker.

    Attributes:
        max_staleness: training batches that may be looked up with gradients not yet applied
            (>= 1; 1 is the ``sync`` mode).
        batch_timeout: seconds a looked-up training batch waits for its gradients, counted
            from the moment its embeddings are ready; then it expires (PERSIA keeps it forever).
        retries: extra attempts of a training lookup or a gradient push when a shard is
            unavailable or a call times out.
        retry_backoff: seconds before the first retry; doubled for each further one.
        shard_timeout: seconds one client call to one shard may take.
        fp16: vectors and gradients travel to and from the shards as scaled float16.
        pooling: per-feature pooling overriding the config (e.g. ``{"title": Pooling.MEAN}``).
        metrics_port: serve the worker's Prometheus metrics on this port (``None``: not served).
        log_level: the worker process's logging level.
        token: the bearer token its client sends to the shards (a read-write one: training
            lookups and pushes write); ``None`` when the shards require none. Never in ``repr``.
        network: a simulated network to the shards (:class:`~embeddb.client.SimulatedNetwork`:
            each call to a shard waits ``rtt + bytes / bandwidth``); ``None``: none.
        threads: threads the worker process may keep busy besides its event loop and pipe
            threads (its default executor); ``None``: 1, or what the training context's core
            budget gives it (:mod:`embeddb.trainer.cores`).
    """

    max_staleness: int = 4
    batch_timeout: float = 300.0
    retries: int = 3
    retry_backoff: float = 0.2
    shard_timeout: float = 10.0
    fp16: bool = False
    pooling: Mapping[str, Pooling] = field(default_factory=dict)
    metrics_port: int | None = None
    log_level: str = "WARNING"
    token: str | None = field(default=None, repr=False)
    network: SimulatedNetwork | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.token is not None and (not isinstance(self.token, str) or not self.token):
            raise ConfigError("token", "must be a non-empty string or None")
        if not isinstance(self.max_staleness, int) or self.max_staleness < 1:
            raise ConfigError("max_staleness", f"must be an integer >= 1, got {self.max_staleness}")
        for name in ("batch_timeout", "shard_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(name, f"must be a positive number of seconds, got {value!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError("retries", f"must be an integer >= 0, got {self.retries!r}")
        if not self.retry_backoff >= 0:
            raise ConfigError("retry_backoff", f"must be >= 0, got {self.retry_backoff!r}")
        try:
            pooling = {str(k): Pooling(v) for k, v in dict(self.pooling).items()}
        except ValueError as exc:
            raise ConfigError("pooling", str(exc)) from exc
        object.__setattr__(self, "pooling", pooling)
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError("metrics_port", f"must be a TCP port, got {self.metrics_port}")
        if logging.getLevelName(str(self.log_level).upper()) not in range(0, 60):
            raise ConfigError("log_level", f"unknown logging level {self.log_level!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ConfigError("threads", f"must be an integer >= 1 or None, got {self.threads!r}")
        if self.network is not None and not isinstance(self.network, SimulatedNetwork):
            raise ConfigError("network", f"must be a SimulatedNetwork, got {self.network!r}")

    @cached_property
    def retry_policy(self) -> RetryPolicy:
        """The worker's and its client's one policy: ``retries + 1`` attempts, waits ``retry_backoff
        * 2**n`` (no cap, no jitter); retried: UNAVAILABLE, CANCELLED and DEADLINE_EXCEEDED."""
        return RetryPolicy.from_retries(self.retries, self.retry_backoff, jitter=0, timeouts=True)

    def client_options(self) -> ClientOptions:
        """The options of the worker's client of the shards (its retry policy: one policy for
        both layers), whichever way the stage runs."""
        return ClientOptions(
            timeout=self.shard_timeout,
            retry=self.retry_policy,
            fp16=self.fp16,
            token=self.token,
            network=self.network,
        )


@dataclass
class _Buffered:
    plan: LookupPlan
    deadline: float


class EmbeddingWorker:
    """The embedding worker of one NN worker (see the module docstring).

    Args:
        client: the client of the shards; the worker closes it in :meth:`close`.
        embedding_config: tables and features (feature names of batches must be in it).
        config: the worker's settings.
        metrics: where to count (a fresh registry by default).
        on_failure: called with an asynchronous failure (a gradient push that failed after its
            retries), for the NN worker to raise.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        client: AsyncClient,
        embedding_config: EmbeddingConfig,
        config: EmbeddingWorkerConfig,
        *,
        metrics: WorkerMetrics | None = None,
        on_failure: Callable[[TrainerError], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._embedding_config = embedding_config
        self.config = config
        self.metrics = metrics if metrics is not None else WorkerMetrics(config.max_staleness)
        self._on_failure = on_failure if on_failure is not None else (lambda exc: None)
        self._clock = clock
        self._specs = pooling_specs(embedding_config, config.pooling)
        self._window = StalenessWindow(config.max_staleness, self.metrics.set_staleness)
        self._buffer: dict[int, _Buffered] = {}
        self._looking_up: set[int] = set()
        self._discard_after_lookup: set[int] = set()
        self._expired: OrderedDict[int, None] = OrderedDict()
        self._pushes: set[asyncio.Task[None]] = set()
        self._closing = False
        self._policy = config.retry_policy  # the object its client got (worker_process.py)
        self._lookups_in_flight = 0
        self._lookups_drained: asyncio.Event | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Check the cluster: shard order, and every table of the config with its ``dim``.

        Raises:
            ConfigError: a table is missing or has another ``dim``; the shards' topology
                disagrees with the address order.
            embeddb errors of the client: the shards cannot be reached.
        """
        await self._client.check_topology()
        served = {t.name: t for t in await self._client.list_tables()}
        for name in {f.table for f in self._embedding_config.features.values()}:
            spec = self._embedding_config.tables[name]
            if name not in served:
                raise ConfigError(
                    f"tables.{name}", f"the shards serve no table {name!r} ({sorted(served)})"
                )
            if served[name].dim != spec.dim:
                raise ConfigError(
                    f"tables.{name}.dim",
                    f"the shards' table has dim {served[name].dim}, the config says {spec.dim}",
                )

    async def flush(self) -> None:
        """Return once every gradient push received so far has been answered."""
        while self._pushes:
            await asyncio.wait(set(self._pushes))

    async def close(self) -> None:
        """Refuse new lookups, cancel those waiting for admission, let those under way finish,
        drain pending gradient pushes, drop buffered batches (counted as discarded), close the
        client."""
        if self._closing:
            return
        self._closing = True
        self._window.cancel_waiters()
        if self._lookups_in_flight:
            self._lookups_drained = asyncio.Event()
            await self._lookups_drained.wait()
        await self.flush()
        if self._buffer:
            logger.info(
                "closing with %d batches still waiting for gradients (discarded): batch_ref %s",
                len(self._buffer),
                sorted(self._buffer),
            )
        for batch_ref in list(self._buffer):
            self._release(batch_ref)
            self.metrics.batches_discarded.inc()
        await self._client.close()

    @property
    def staleness(self) -> int:
        """Training batches looked up whose gradients are not yet applied."""
        return self._window.in_flight

    @property
    def waiting(self) -> int:
        """Training lookups waiting for admission (the staleness bound holds them back)."""
        return self._window.waiting

    def stats(self) -> dict[str, float]:
        """Every metric's current value (see :mod:`embeddb.trainer.embedding.metrics`)."""
        return self.metrics.snapshot()

    # ------------------------------------------------------------------ forward
    async def lookup(
        self, batch_ref: int, features: Sequence[IdFeature], train: bool
    ) -> list[Pooled]:
        """Look up and pool one batch; a training batch is then buffered for its gradients.

        Returns:
            One pooled array per feature, in ``features`` order: ``(B, dim)`` float32, or for
            a sequence feature ``((B, L, dim) float32, (B, L) bool mask)``.

        Raises:
            LookupFailedError: the lookup failed after its retries.
            EmbeddingWorkerError: the worker is closing.
        """
        if self._closing:
            raise EmbeddingWorkerError("the embedding worker is closing")
        self._lookups_in_flight += 1
        try:
            return await self._lookup(batch_ref, features, train)
        finally:
            self._lookups_in_flight -= 1
            if not self._lookups_in_flight and self._lookups_drained is not None:
                self._lookups_drained.set()

    async def _lookup(
        self, batch_ref: int, features: Sequence[IdFeature], train: bool
    ) -> list[Pooled]:
        started = time.perf_counter()
        plan = self._plan(features)
        planned = time.perf_counter() - started
        if train:
            self._looking_up.add(batch_ref)
            try:
                await self._window.acquire()
            except asyncio.CancelledError:
                self._looking_up.discard(batch_ref)
                raise EmbeddingWorkerError(
                    f"the embedding worker closed before batch {batch_ref} was looked up"
                ) from None
        try:
            fetched = time.perf_counter()
            vectors = await self._lookup_tables(batch_ref, plan, train)
            pooling_started = time.perf_counter()
            pooled = self._pool(plan, vectors)
            done = time.perf_counter()
        except BaseException:
            if train:
                self._looking_up.discard(batch_ref)
                self._discard_after_lookup.discard(batch_ref)
                self._window.release()
            raise
        self.metrics.lookups.labels("true" if train else "false").inc()
        self.metrics.lookup_seconds.observe(pooling_started - fetched)
        self.metrics.pooling_seconds.observe(planned + done - pooling_started)
        if train:
            self._looking_up.discard(batch_ref)
            if batch_ref in self._discard_after_lookup:
                self._discard_after_lookup.discard(batch_ref)
                self._window.release()
                self.metrics.batches_discarded.inc()
            else:
                self._buffer[batch_ref] = _Buffered(plan, self._clock() + self.config.batch_timeout)
        return pooled

    def _plan(self, features: Sequence[IdFeature]) -> LookupPlan:
        return plan_lookup(self._embedding_config, self._specs, features)

    async def _lookup_tables(
        self, batch_ref: int, plan: LookupPlan, train: bool
    ) -> F32 | dict[str, F32]:
        batches = plan.tables
        call: Callable[[], Awaitable[F32 | dict[str, F32]]]
        if len(plan.dims) == 1:  # one dim: one array for every table (no per-table work)
            call = lambda: self._client.lookup_tables(batches, train)  # noqa: E731
        else:
            # Already deduplicated (step 1): IdBatch.distinct spares the client a second pass.
            requests = {t: IdBatch.distinct(batch.unique) for t, batch in batches.items()}
            call = lambda: self._client.lookup_many(requests, train)  # noqa: E731
        # Evaluation lookups are idempotent: the client retries them itself.
        try:
            vectors: F32 | dict[str, F32] = await self._retrying("lookup", call, train)
        except BaseException as exc:
            self.metrics.failures.labels("lookup").inc()
            if not isinstance(exc, Exception):
                raise
            tables = ", ".join(repr(t) for t in batches.names)
            logger.error("lookup of batch %d failed: tables %s: %s", batch_ref, tables, exc)
            raise LookupFailedError(
                f"lookup of batch {batch_ref} failed (tables {tables}): "
                f"{type(exc).__name__}: {exc}",
                cause=type(exc).__name__,
            ) from exc
        self.metrics.lookup_ids.inc(batches.unique.size)
        return vectors

    @staticmethod
    def _pool(plan: LookupPlan, vectors: F32 | Mapping[str, F32]) -> list[Pooled]:
        return pool_lookup(plan, vectors)

    # ------------------------------------------------------------------ backward
    def push_gradients(
        self, batch_ref: int, grads: Sequence[F32 | None], nonfinite: int = 0
    ) -> asyncio.Task[None] | None:
        """Start pushing a batch's gradients (one per feature in lookup order; ``None`` for a
        feature without gradient). Returns the push task, or ``None`` when the batch is
        unknown (expired, discarded, never looked up for training): the gradients are dropped
        and counted."""
        if nonfinite:
            self.metrics.nonfinite_gradients.inc(nonfinite)
        entry = self._buffer.pop(batch_ref, None)
        if entry is None:
            self.metrics.gradients_dropped.inc()
            why = "it expired" if batch_ref in self._expired else "it is unknown"
            logger.warning("dropped the gradients of batch %d: %s", batch_ref, why)
            return None
        task = asyncio.get_running_loop().create_task(self._push(batch_ref, entry.plan, grads))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)
        return task

    async def _push(self, batch_ref: int, plan: LookupPlan, grads: Sequence[F32 | None]) -> None:
        started = time.perf_counter()
        tables: list[str] = []
        try:
            call: Callable[[], Awaitable[dict[str, PushResult]]] | None = None
            concatenated = self._unpool_tables(plan, grads) if len(plan.dims) == 1 else None
            if concatenated is not None:
                batches = plan.tables
                tables = list(batches.names)
                if batches.unique.size:
                    call = lambda: self._client.apply_gradients_tables(  # noqa: E731
                        batches, concatenated
                    )
            else:
                summed = self._unpool(plan, grads)
                tables = list(summed)
                updates = {t: (IdBatch.distinct(plan.tables[t].unique), summed[t]) for t in tables}
                if updates:
                    call = lambda: self._client.apply_gradients_many(updates)  # noqa: E731
            try:
                results = (
                    await self._retrying("gradient_push", call, True) if call is not None else {}
                )
            except Exception as exc:
                self._push_failed(batch_ref, tables, exc)
                return
            total = sum(results.values(), PushResult())
            self.metrics.nan_skipped_ids.inc(total.nan_skipped)
            self.metrics.missing_ids.inc(total.missing)
            self.metrics.gradient_pushes.inc()
            self.metrics.gradient_push_seconds.observe(time.perf_counter() - started)
        except Exception as exc:  # a bug: never lose it silently
            logger.exception("pushing the gradients of batch %d failed", batch_ref)
            self._push_failed(batch_ref, tables, exc)
        finally:
            self._window.release()

    def _push_failed(self, batch_ref: int, tables: list[str], error: BaseException) -> None:
        self.metrics.failures.labels("gradient_push").inc()
        names = ", ".join(repr(t) for t in tables) or "?"
        detail = f"tables {names}: {type(error).__name__}: {error}"
        logger.error("the gradients of batch %d were not applied: %s", batch_ref, detail)
        self._on_failure(
            GradientPushFailedError(
                f"the gradients of batch {batch_ref} were not applied: {detail}",
                cause=type(error).__name__,
            )
        )

    @staticmethod
    def _unpool(plan: LookupPlan, grads: Sequence[F32 | None]) -> dict[str, F32]:
        rows: dict[str, list[F32]] = {}
        present: set[str] = set()
        for fp, grad in zip(plan.features, grads, strict=True):
            if grad is None:
                per_id = np.zeros((fp.stop - fp.start, fp.dim), np.float32)
            else:
                per_id = unpool(grad, fp.segments, fp.spec)
                if fp.rounds > 1:  # d(sum of rounds)/d(round) = 1: each round gets the gradient
                    per_id = np.repeat(per_id, fp.rounds, axis=0)
                present.add(fp.table)
            rows.setdefault(fp.table, []).append(per_id)
        # A table none of whose features got a gradient is not pushed at all.
        return {
            table: plan.tables[table].sum_rows(
                np.ascontiguousarray(chunks[0] if len(chunks) == 1 else np.concatenate(chunks))
            )
            for table, chunks in rows.items()
            if table in present
        }

    @staticmethod
    def _unpool_tables(plan: LookupPlan, grads: Sequence[F32 | None]) -> F32 | None:
        """Step 6 for tables of one dim: every feature's per-id gradients written into one
        array (the concatenated ids' order), summed per unique id of each table in one pass;
        ``None`` when some table got no gradient at all (it is then not pushed: see
        :meth:`_unpool`)."""
        if len(grads) != len(plan.features):
            raise ValueError(f"{len(grads)} gradients for {len(plan.features)} features")
        batches = plan.tables
        if any(g is None for g in grads):
            present = {
                fp.table for fp, g in zip(plan.features, grads, strict=True) if g is not None
            }
            if len(present) < len(batches):
                return None
        dim = plan.features[0].dim if plan.features else 0
        per_id = np.empty((batches.size, dim), np.float32)
        for fp, grad in zip(plan.features, grads, strict=True):
            rows = per_id[fp.offset : fp.offset + fp.stop - fp.start]
            if grad is None:
                rows[:] = 0
            elif fp.rounds == 1 and fp.segments.single and not fp.spec.sequence:
                if grad.shape != rows.shape:  # pooling is the identity: the gradient is per id
                    raise ValueError(
                        f"the gradient of feature {fp.name!r} has shape {grad.shape}, "
                        f"expected {rows.shape}"
                    )
                rows[:] = grad
            else:
                unpooled = unpool(grad, fp.segments, fp.spec)
                if fp.rounds > 1:  # d(sum of rounds)/d(round) = 1: each round gets the gradient
                    unpooled = np.repeat(unpooled, fp.rounds, axis=0)
                rows[:] = unpooled
        return batches.sum_rows(per_id)

    # ------------------------------------------------------------------ release paths
    def discard(self, batch_ref: int) -> None:
        """Release a training batch without gradients (the NN worker will send none)."""
        if batch_ref in self._buffer:
            self._release(batch_ref)
            self.metrics.batches_discarded.inc()
        elif batch_ref in self._looking_up:
            self._discard_after_lookup.add(batch_ref)

    def expire(self) -> list[int]:
        """Expire every buffered batch past its deadline; returns their refs."""
        now = self._clock()
        due = [ref for ref, entry in self._buffer.items() if entry.deadline <= now]
        for batch_ref in due:
            self._release(batch_ref)
            self._expired[batch_ref] = None
            if len(self._expired) > _EXPIRED_MEMORY:
                self._expired.popitem(last=False)
            self.metrics.batches_expired.inc()
        if due:
            logger.warning(
                "%d batches expired: no gradients within %.3g s (batch_ref %s)",
                len(due),
                self.config.batch_timeout,
                due,
            )
        return due

    async def run_expiry(self) -> None:
        """Expire due batches periodically, until cancelled."""
        period = min(1.0, self.config.batch_timeout / 4)
        while True:
            await asyncio.sleep(period)
            self.expire()

    def _release(self, batch_ref: int) -> None:
        del self._buffer[batch_ref]
        self._window.release()

    # ------------------------------------------------------------------ retries
    async def _retrying(self, operation: str, call: Callable[[], Awaitable[T]], retry: bool) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except EmbeddbError as exc:
                delay = self._policy.delay_after(exc, attempt) if retry else None
                if delay is None or self._closing:
                    raise
                self.metrics.retries.labels(operation).inc()
                why, retries = f"{type(exc).__name__}: {exc}", self._policy.retries
                logger.warning(
                    "%s failed (%s); retry %d/%d in %.2g s", operation, why, attempt, retries, delay
                )
                await asyncio.sleep(delay)
