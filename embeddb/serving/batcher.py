"""Micro-batching: concurrent requests scored together in one ``predict`` call.

One batcher thread takes requests from a queue and runs them in batches::

    request arrives ──submit()──▶ queue ──▶ batcher thread
                     (a Future)               take the first request; then
                                              · it came after a quiet gap (no request in the
                                                last ``max_delay``): run now with whatever is
                                                already queued (an idle server adds no wait;
                                                when nothing is queued or being scored, the
                                                caller's own thread scores it: no hand-off)
                                              · else wait for more until ``max_delay`` after
                                                the first arrived, or ``max_batch`` samples
                                              merge → predict → split → set each Future

A request that would take the batch past ``max_batch`` samples starts the next batch; one
larger than ``max_batch`` runs alone. An error of ``predict`` fails every request of that
batch (the caller sees it from its Future). Requests queue while a batch runs, so under load
batches form even with ``max_delay`` 0.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from embeddb.common.arrays import F32
from embeddb.errors import ConfigError, UnavailableError
from embeddb.features.batch import Batch
from embeddb.serving.codec import merge_batches, split_scores

__all__ = ["MicroBatcher"]

logger = logging.getLogger(__name__)

Predict = Callable[[Batch], F32]
OnBatch = Callable[[int, float, bool], None]  # samples, seconds, succeeded: one predict call


@dataclass
class _Pending:
    batch: Batch
    size: int
    arrived: float
    quiet: bool  # no request arrived in the ``max_delay`` before this one
    future: Future[F32] = field(default_factory=Future)


_STOP = object()


class MicroBatcher:
    """Merges concurrent requests into ``predict`` calls of at most ``max_batch`` samples.

    Args:
        predict: scores a batch: ``(n,)`` float32 (``InferCtx.predict``).
        max_batch: the most samples per call (a larger single request runs alone).
        max_delay: seconds a request may wait for others to join its batch.
        on_batch: called after each ``predict`` with its samples, seconds and whether it
            succeeded (metrics).

    Raises:
        ConfigError: ``max_batch`` < 1 or ``max_delay`` < 0.
    """

    def __init__(
        self,
        predict: Predict,
        *,
        max_batch: int,
        max_delay: float,
        on_batch: OnBatch | None = None,
    ) -> None:
        if max_batch < 1:
            raise ConfigError("max_batch", f"must be >= 1, got {max_batch}")
        if max_delay < 0:
            raise ConfigError("max_delay", f"must be >= 0, got {max_delay}")
        self._predict = predict
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._on_batch = on_batch
        self._queue: queue.SimpleQueue[_Pending | object] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._last_arrival = -float("inf")
        self._busy = False  # a batch is being scored (by the batcher thread or inline)
        self._thread = threading.Thread(target=self._run, name="embeddb-batcher", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> Future[F32]:
        """Queue ``batch``; its Future gets ``(batch.batch_size,)`` scores or the error.

        Raises:
            UnavailableError: the batcher is closed (the server is shutting down).
        """
        now = time.perf_counter()
        with self._lock:  # no request may slip in behind the stop marker
            if self._closed:
                raise UnavailableError("the model server is shutting down")
            quiet = now - self._last_arrival >= self._max_delay
            self._last_arrival = now
            pending = _Pending(batch, batch.batch_size, now, quiet)
            inline = quiet and not self._busy and self._queue.empty()
            if inline:
                self._busy = True
            else:
                self._queue.put(pending)
        if inline:  # an idle server: score in the caller's thread, no hand-off to the batcher
            try:
                self._score([pending], pending.size)
            finally:
                with self._lock:
                    self._busy = False
        return pending.future

    def close(self) -> None:
        """Score what is queued, then stop the thread. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join()

    # ------------------------------------------------------------------ the batcher thread
    def _run(self) -> None:
        held: _Pending | None = None
        stopping = False
        while True:
            first = held if held is not None else self._queue.get()
            held = None
            if not isinstance(first, _Pending):
                return  # _STOP: every request before it has been run
            group, size = [first], first.size
            deadline = first.arrived + (0.0 if first.quiet else self._max_delay)
            while size < self._max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if not isinstance(item, _Pending):
                    stopping = True
                    break
                if size + item.size > self._max_batch:
                    held = item
                    break
                group.append(item)
                size += item.size
            with self._lock:
                self._busy = True
            try:
                self._score(group, size)
            finally:
                with self._lock:
                    self._busy = False
            if stopping:
                if held is not None:
                    self._score([held], held.size)
                return

    def _score(self, group: list[_Pending], size: int) -> None:
        started = time.perf_counter()
        ok = False
        try:
            scores = self._predict(merge_batches([p.batch for p in group]))
            ok = True
        except BaseException as exc:  # every caller of this batch sees the error
            for p in group:
                p.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            if self._on_batch is not None:
                self._on_batch(size, time.perf_counter() - started, ok)
        for p, part in zip(group, split_scores(scores, [p.size for p in group]), strict=True):
            p.future.set_result(part)
