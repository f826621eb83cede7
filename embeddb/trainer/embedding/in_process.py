"""The embedding stage in a thread of the NN worker process (``embedding_stage: thread``).

The same :class:`~embeddb.trainer.embedding.worker.EmbeddingWorker` (its plan, staleness window,
pooling, buffering, pushes, expiry and :class:`~embeddb.client.AsyncClient` to the shards) as
the embedding worker process (:mod:`.process`), on an ``asyncio`` loop in a thread of this
process instead of behind a pipe::

    NN worker process
    ─────────────────
    training thread ── lookup / push_gradients / ... ──▶ embeddb-embedding-stage thread:
      (EmbeddingWorkerThread; call_soon_threadsafe)         asyncio loop: EmbeddingWorker +
    futures resolved by the loop ◀── pooled embeddings      AsyncClient ─▶ shards (gRPC)

While a stage runs, the interpreter's thread switch interval is 0.5 ms
(:data:`SWITCH_INTERVAL_S`; restored when the last stage closes): the training thread gets the
interpreter lock back from the stage's loop sooner after each torch operation.

What it removes: the process crossing of every message and its serialization (a batch's ids,
pooled embeddings and gradients pass by reference: no pickling, no shared-memory copy, no
pipe reader or writer thread). What it costs: the stage's Python work (planning, pooling,
request building) shares this process's interpreter lock with the training loop, where the
process stage ran it on another core. ``benchmarks/profile_step.py --stage`` measures both.

The interface is :class:`~.process.EmbeddingWorkerProcess`'s (``lookup``, ``push_gradients``,
``discard``, ``flush``, ``stats``, ``raise_failure``, ``close``, ``alive``, ``pid``) and so
are the failures: a lookup that fails raises :class:`~embeddb.trainer.errors.LookupFailedError`,
a failed push is raised by the next call as
:class:`~embeddb.trainer.errors.GradientPushFailedError`, and a stage whose loop stops (a bug)
fails every pending call and every later one with
:class:`~embeddb.trainer.errors.EmbeddingWorkerError`. Gradient arrays are read by the stage
after ``push_gradients`` returns: the caller must not write to them afterwards (the context
hands over arrays it never touches again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from embeddb.client import AsyncClient, warm_up_client
from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig
from embeddb.trainer.embedding import protocol as msg
from embeddb.trainer.embedding.front import StageFront
from embeddb.trainer.embedding.metrics import WorkerMetrics
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.embedding.worker import EmbeddingWorker, EmbeddingWorkerConfig
from embeddb.trainer.errors import EmbeddingWorkerError, LookupFailedError, TrainerError
from embeddb.trainer.pooling import Pooled
from embeddb.transport.rpc.metrics_http import MetricsEndpoint, serve_metrics

__all__ = ["EmbeddingWorkerThread"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_JOIN_S = 10.0
#: The interpreter's thread switch interval while a stage runs (seconds; Python's default is
#: 0.005). The training thread and the stage's loop take turns holding the interpreter lock;
#: each time a torch operation hands it back, the training thread waits up to this long to get
#: it again, which at 5 ms doubled the criteo step (``benchmarks/profile_step.py --stage
#: thread``, 13.4k samples/s at 5 ms against 21.6k at 0.5 ms, one interleaved run).
SWITCH_INTERVAL_S = 0.0005


class _SwitchInterval:
    """``sys.setswitchinterval(SWITCH_INTERVAL_S)`` while at least one stage runs; the previous
    value is restored when the last one closes (unless someone else changed it meanwhile)."""

    _lock = threading.Lock()
    _users = 0
    _previous: float | None = None

    @classmethod
    def acquire(cls) -> None:
        with cls._lock:
            cls._users += 1
            if cls._users == 1 and sys.getswitchinterval() > SWITCH_INTERVAL_S:
                cls._previous = sys.getswitchinterval()
                sys.setswitchinterval(SWITCH_INTERVAL_S)

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users == 0 and cls._previous is not None:
                if sys.getswitchinterval() == SWITCH_INTERVAL_S:
                    sys.setswitchinterval(cls._previous)
                cls._previous = None


class EmbeddingWorkerThread(StageFront):
    """Start the embedding stage in a thread of this process and talk to it (thread-safe).

    Returns once the stage has checked the cluster, like
    :class:`~embeddb.trainer.embedding.process.EmbeddingWorkerProcess`.

    Args:
        embedding_config: tables and features.
        addresses: ``host:port`` of every shard, in shard order.
        config: the stage's settings (``threads``: its executor's threads).
        start_timeout: seconds to wait for the stage to be ready.

    Raises:
        ConfigError: the cluster does not serve the config's tables.
        EmbeddingWorkerError: the stage could not reach the shards in time.
    """

    def __init__(
        self,
        embedding_config: EmbeddingConfig,
        addresses: Sequence[str],
        config: EmbeddingWorkerConfig,
        *,
        start_timeout: float = 120.0,
    ) -> None:
        super().__init__()
        self.config = config
        self.pid = os.getpid()
        self._embedding_config = embedding_config
        self._addresses = tuple(addresses)
        self._final: dict[str, float] | None = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._worker: EmbeddingWorker | None = None
        self._endpoint: MetricsEndpoint | None = None
        ready: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="embeddb-embedding-stage", daemon=True
        )
        self._thread.start()
        try:
            ready.result(start_timeout)
        except FutureTimeout:
            self._abort()
            raise EmbeddingWorkerError(
                f"the embedding stage was not ready within {start_timeout:.0f} s"
            ) from None
        except Exception as exc:
            self._thread.join(_JOIN_S)
            raise msg.error_from(
                type(exc).__name__, f"the embedding worker could not start: {exc}"
            ) from exc

    # ------------------------------------------------------------------ calls
    def _submit_lookup(self, batch_ref: int, features: tuple[IdFeature, ...], train: bool) -> None:
        self._call_soon(self._start_lookup, batch_ref, features, train)

    def push_gradients(
        self, batch_ref: int, grads: Sequence[F32 | None], nonfinite: int = 0
    ) -> None:
        """Hand over a batch's embedding gradients (one float32 array or ``None`` per feature;
        not to be written afterwards)."""
        self._call_soon(self._push, batch_ref, tuple(grads), int(nonfinite))

    def discard(self, batch_ref: int) -> None:
        """Tell the stage no gradients will come for ``batch_ref``."""
        self._call_soon(self._discard, batch_ref)

    def flush(self, timeout: float) -> None:
        """Wait until every gradient push handed over so far has been answered by the shards."""
        self._wait(self._flush(), timeout, "flush")

    def stats(self, timeout: float = 30.0) -> dict[str, float]:
        """The stage's metrics (see :mod:`embeddb.trainer.embedding.metrics`)."""
        return self._wait(self._stats(), timeout, "stats")

    def close(self, timeout: float = 60.0) -> dict[str, float] | None:
        """Drain pending pushes, stop the stage, wait for its thread; returns its final
        metrics (``None`` if it was already gone). Idempotent."""
        with self._lock:
            if self._closing:
                return None
            self._closing = True
            dead = self._dead is not None
        if not dead:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the thread is done
                self._loop.call_soon_threadsafe(self._request_stop)
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("the embedding stage did not close within %.0f s", timeout)
                return None
        return self._final

    @property
    def alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    # ------------------------------------------------------------------ the caller's side
    def _call_soon(self, fn: Any, *args: Any) -> None:
        with self._lock:
            self._check_alive()
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            self._mark_dead()
            raise self._dead or EmbeddingWorkerError("the embedding stage is gone") from None

    def _wait(self, coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        with self._lock:
            if self._dead is not None:
                coro.close()
                raise self._dead
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:
            coro.close()
            self._mark_dead()
            raise self._dead or EmbeddingWorkerError("the embedding stage is gone") from None
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise EmbeddingWorkerError(
                f"the embedding stage did not answer {what} within {timeout:.0f} s"
            ) from None
        except FutureCancelled:  # the loop stopped under it: its tasks were cancelled
            raise self._dead or EmbeddingWorkerError("the embedding stage is gone") from None

    def _abort(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_JOIN_S)

    # ------------------------------------------------------------------ the loop's side
    def _run(self, ready: Future[None]) -> None:
        asyncio.set_event_loop(self._loop)
        _SwitchInterval.acquire()
        try:
            self._loop.run_until_complete(self._serve(ready))
        except BaseException as exc:  # the loop stopped or a bug: never die silently
            if not ready.done():
                ready.set_exception(EmbeddingWorkerError(f"the embedding stage stopped: {exc}"))
            elif not self._closing:
                logger.error("the embedding stage stopped: %s: %s", type(exc).__name__, exc)
        finally:
            self._mark_dead()
            with contextlib.suppress(Exception):
                self._shutdown_loop()
            _SwitchInterval.release()

    def _shutdown_loop(self) -> None:
        loop = self._loop
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def _client(self) -> AsyncClient:
        """The stage's client of the shards (its own options; a test or benchmark may give
        another transport)."""
        return AsyncClient(self._addresses, self.config.client_options())

    async def _serve(self, ready: Future[None]) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        loop.set_default_executor(
            ThreadPoolExecutor(cfg.threads or 1, thread_name_prefix="embeddb-stage-executor")
        )
        self._stop = asyncio.Event()
        client = self._client()
        metrics = WorkerMetrics(cfg.max_staleness)
        worker = EmbeddingWorker(
            client, self._embedding_config, cfg, metrics=metrics, on_failure=self._report
        )
        try:
            logger.debug("client kernels warmed up in %.3f s", warm_up_client())
            await worker.start()
            if cfg.metrics_port is not None:
                self._endpoint = serve_metrics(metrics.registry, "127.0.0.1", cfg.metrics_port)
                logger.info("metrics on http://127.0.0.1:%d/metrics", self._endpoint.port)
        except Exception as exc:
            logger.error("cannot start: %s: %s", type(exc).__name__, exc)
            await client.close()
            ready.set_exception(exc)
            return
        self._worker = worker
        ready.set_result(None)
        expiry = loop.create_task(worker.run_expiry())
        await self._stop.wait()
        logger.debug("closing: draining pushes")
        await worker.close()  # lets lookups under way finish, drains the pushes
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        self._final = worker.stats()
        if self._endpoint is not None:
            self._endpoint.stop()

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _start_lookup(self, batch_ref: int, features: tuple[IdFeature, ...], train: bool) -> None:
        self._loop.create_task(self._lookup(batch_ref, features, train))

    async def _lookup(self, batch_ref: int, features: tuple[IdFeature, ...], train: bool) -> None:
        worker = self._worker
        assert worker is not None
        outcome: list[Pooled] | BaseException
        try:
            outcome = await worker.lookup(batch_ref, features, train)
        except TrainerError as exc:
            outcome = exc
        except Exception as exc:  # a bug: report it rather than leave the NN worker waiting
            logger.exception("lookup of batch %d failed", batch_ref)
            outcome = LookupFailedError(str(exc), cause=type(exc).__name__)
        future = self._take_lookup(batch_ref)
        if future is None or future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def _push(self, batch_ref: int, grads: tuple[F32 | None, ...], nonfinite: int) -> None:
        assert self._worker is not None
        self._worker.push_gradients(batch_ref, grads, nonfinite)

    def _discard(self, batch_ref: int) -> None:
        assert self._worker is not None
        self._worker.discard(batch_ref)

    async def _flush(self) -> None:
        assert self._worker is not None
        await self._worker.flush()

    async def _stats(self) -> dict[str, float]:
        assert self._worker is not None
        return self._worker.stats()

    def _report(self, error: TrainerError) -> None:
        self._add_failure(error)

    def _mark_dead(self) -> None:
        self._fail_pending(  # the cause is made under the lock, which guards _closing
            lambda: EmbeddingWorkerError(
                "the embedding stage (a thread of this process) stopped"
                + ("" if self._closing else "; see the error logged above")
            )
        )
