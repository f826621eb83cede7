"""The NN worker's side of an embedding stage, whichever way the stage runs: batch refs, the
futures of pending lookups, asynchronous failures and the stage's death.

Both stages (:class:`~embeddb.trainer.embedding.process.EmbeddingWorkerProcess` across a pipe,
:class:`~embeddb.trainer.embedding.in_process.EmbeddingWorkerThread` on an event loop in this
process) hand a lookup over the same way and fail the same way: a lookup on a dead stage
raises its :class:`~embeddb.trainer.errors.EmbeddingWorkerError`; when the stage dies, every
pending future gets that error; a push that failed after its retries is raised by the next
:meth:`StageFront.raise_failure`. Only how a lookup reaches the stage differs
(:meth:`StageFront._submit_lookup`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from embeddb.errors import EmbeddbError
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.errors import EmbeddingWorkerError
from embeddb.trainer.pooling import Pooled

__all__ = ["StageFront"]


class StageFront:
    """Bookkeeping shared by the embedding stages (thread-safe; ``_lock`` guards the maps,
    ``_failures``, ``_dead`` and ``_closing``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lookups: dict[int, Future[list[Pooled]]] = {}
        self._refs = itertools.count()
        self._failures: list[EmbeddbError] = []
        self._dead: EmbeddingWorkerError | None = None
        self._closing = False

    def lookup(
        self, features: Sequence[IdFeature], train: bool
    ) -> tuple[int, Future[list[Pooled]]]:
        """Ask for a batch's pooled embeddings; returns its ``batch_ref`` and a future.

        Raises:
            EmbeddingWorkerError: the stage is gone.
        """
        batch_ref = next(self._refs)
        future: Future[list[Pooled]] = Future()
        with self._lock:
            self._check_alive()
            self._lookups[batch_ref] = future
        self._submit_lookup(batch_ref, tuple(features), train)
        return batch_ref, future

    def _submit_lookup(self, batch_ref: int, features: tuple[IdFeature, ...], train: bool) -> None:
        """Hand the lookup registered as ``batch_ref`` to the stage."""
        raise NotImplementedError

    def raise_failure(self) -> None:
        """Raise the first asynchronous failure reported since the last call, if any.

        Raises:
            GradientPushFailedError: a push failed after its retries.
            EmbeddingWorkerError: the stage is gone.
        """
        with self._lock:
            if self._failures:
                first = self._failures[0]
                self._failures.clear()
                raise first
            self._check_alive()

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise self._dead

    def _add_failure(self, error: EmbeddbError) -> None:
        with self._lock:
            self._failures.append(error)

    def _take_lookup(self, batch_ref: int) -> Future[list[Pooled]] | None:
        """The pending lookup ``batch_ref``, no longer pending (``None`` if it is not)."""
        with self._lock:
            return self._lookups.pop(batch_ref, None)

    def _fail_pending(
        self, cause: Callable[[], EmbeddingWorkerError], *more: dict[int, Future[Any]]
    ) -> bool:
        """Mark the stage dead (the first cause stays) and fail every pending lookup, and the
        futures of ``more``, with it; ``True`` when this call marked it."""
        with self._lock:
            first = self._dead is None
            if self._dead is None:
                self._dead = cause()
            pending: list[Future[Any]] = [*self._lookups.values()]
            for futures in more:
                pending.extend(futures.values())
                futures.clear()
            self._lookups.clear()
            dead = self._dead
        for future in pending:
            if not future.done():
                with contextlib.suppress(InvalidStateError):
                    future.set_exception(dead)
        return first
