"""What the training and the evaluation context share (:mod:`embeddb.trainer.ctx`): their
embedding worker, the window of batches prepared ahead, and the conversion between the worker's
numpy arrays and torch tensors.

A context hands out :class:`PreparedBatch` objects from ``prepare``: each one's lookup is sent
when it enters the window, up to ``depth`` batches ahead of the one being forwarded::

    prepare(batches)   window [b3 b4 b5]  <- lookups sent, embeddings landing in the worker
    forward(b2)        b2's embeddings -> leaf tensors (requires_grad when training)
    backward           leaf gradients -> float32 numpy (:func:`embedding_gradients`)

A batch handed out but skipped (``forward`` called on a later one) or never handed out (the
loop stopped) is discarded in the embedding worker at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig
from embeddb.errors import InvalidArgumentError
from embeddb.features.batch import Batch
from embeddb.trainer.config import TrainerConfig
from embeddb.trainer.embedding.in_process import EmbeddingWorkerThread
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.embedding.process import EmbeddingWorkerProcess
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.errors import EmbeddingWorkerError, TrainerError
from embeddb.trainer.pooling import Pooled

__all__ = [
    "EmbeddingCtx",
    "EmbeddingStage",
    "EmbeddingTensor",
    "PreparedBatch",
    "embedding_gradients",
    "start_stage",
]

EmbeddingTensor = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
#: The embedding stage of a context: its own process, or a thread of this one.
EmbeddingStage = EmbeddingWorkerProcess | EmbeddingWorkerThread


def start_stage(
    embedding_config: EmbeddingConfig,
    addresses: Sequence[str],
    worker: EmbeddingWorkerConfig,
    config: TrainerConfig,
) -> EmbeddingStage:
    """Start the embedding stage ``config.embedding_stage`` names, ready to serve.

    Raises:
        ConfigError: the cluster does not serve the config's tables.
        EmbeddingWorkerError: the stage could not start or reach the shards in time.
    """
    stage = EmbeddingWorkerThread if config.embedding_stage == "thread" else EmbeddingWorkerProcess
    return stage(embedding_config, addresses, worker, start_timeout=config.start_timeout)


@dataclass(eq=False)
class PreparedBatch:
    """A batch whose embeddings are being looked up; pass it to ``forward``.

    Attributes:
        batch: the batch itself (non-ID features, labels, meta).
        batch_ref: joins it with its half in the embedding worker.
        train: its gradients will be pushed (a training context and ``requires_grad``).
    """

    batch: Batch
    batch_ref: int
    train: bool
    embeddings: Future[list[Pooled]] = field(repr=False)
    forwarded: bool = False


class EmbeddingCtx:
    """The base of :class:`~embeddb.trainer.ctx.TrainCtx` and :class:`~embeddb.trainer.ctx.EvalCtx`
    (see the module docstring)."""

    def __init__(
        self,
        embedding_config: EmbeddingConfig,
        config: TrainerConfig,
        device: torch.device,
        worker: EmbeddingStage,
        *,
        owns_worker: bool,
    ) -> None:
        self.embedding_config = embedding_config
        self.config = config
        self.device = device
        self._worker = worker
        self._owns_worker = owns_worker
        self._yielded: deque[PreparedBatch] = deque()
        self._closed = False
        self._amp = config.mixed_precision
        self._in_flight: set[Future[list[Pooled]]] = set()  # lookups not answered yet
        self._in_flight_lock = threading.Lock()

    # ------------------------------------------------------------------ prefetching
    def _prefetch(
        self, batches: Iterable[Batch], train: bool, depth: int
    ) -> Iterator[PreparedBatch]:
        window: deque[PreparedBatch] = deque()
        source = iter(batches)
        exhausted = False
        try:
            while True:
                while not exhausted and len(window) <= depth:
                    batch = next(source, None)
                    if batch is None:
                        exhausted = True
                    else:
                        window.append(self._submit(batch, train))
                if not window:
                    return
                prepared = window.popleft()
                self._yielded.append(prepared)
                yield prepared
        finally:
            if not self._closed:
                for prepared in window:  # looked up, never handed out
                    self._discard(prepared)

    def _submit(self, batch: Batch, train: bool) -> PreparedBatch:
        if not isinstance(batch, Batch):
            raise InvalidArgumentError(f"prepare() needs Batch objects, got {type(batch).__name__}")
        features: list[IdFeature] = []
        for f in batch.id_type_features:
            if f.name not in self.embedding_config.features:
                known = ", ".join(self.embedding_config.features)
                raise InvalidArgumentError(
                    f"the batch's ID feature {f.name!r} is not in the embedding config ({known})"
                )
            features.append((f.name, f.values, None if f.single_id else f.offsets))
        train = train and batch.requires_grad
        self._worker.raise_failure()
        batch_ref, future = self._worker.lookup(features, train)
        with self._in_flight_lock:
            self._in_flight.add(future)
        future.add_done_callback(self._landed)
        return PreparedBatch(batch, batch_ref, train, future)

    def _landed(self, future: Future[list[Pooled]]) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(future)

    def _await_lookups(self, timeout: float) -> None:
        """Wait until every lookup sent so far is answered (rows they create are in place)."""
        with self._in_flight_lock:
            pending = set(self._in_flight)
        _, not_done = wait_futures(pending, timeout)
        if not_done:
            raise EmbeddingWorkerError(
                f"{len(not_done)} lookups were not answered within {timeout:.0f} s"
            )

    def _discard(self, prepared: PreparedBatch) -> None:
        if prepared.train and not prepared.forwarded:
            prepared.forwarded = True
            with contextlib.suppress(EmbeddingWorkerError):
                self._worker.discard(prepared.batch_ref)

    def _take(self, prepared: PreparedBatch) -> None:
        """Mark ``prepared`` forwarded; release batches handed out before it and skipped."""
        if prepared.forwarded:
            raise InvalidArgumentError(f"batch {prepared.batch_ref} was already forwarded")
        if any(p is prepared for p in self._yielded):
            while self._yielded:
                earlier = self._yielded.popleft()
                if earlier is prepared:
                    break
                self._discard(earlier)
        prepared.forwarded = True

    # ------------------------------------------------------------------ tensors
    def _embedding_tensors(
        self, prepared: PreparedBatch, requires_grad: bool
    ) -> tuple[list[EmbeddingTensor], list[torch.Tensor]]:
        timeout = self.config.lookup_timeout
        try:
            pooled = prepared.embeddings.result(timeout)
        except FutureTimeout:
            raise EmbeddingWorkerError(
                f"no embeddings for batch {prepared.batch_ref} within {timeout:.0f} s (is "
                "backward() called for every training batch? the staleness bound is "
                f"{self.config.embedding_staleness})"
            ) from None
        tensors: list[EmbeddingTensor] = []
        leaves: list[torch.Tensor] = []
        for item in pooled:
            if isinstance(item, tuple):
                vectors = self._tensor(item[0]).requires_grad_(requires_grad)
                tensors.append((vectors, self._tensor(item[1])))
            else:
                vectors = self._tensor(item).requires_grad_(requires_grad)
                tensors.append(vectors)
            leaves.append(vectors)
        return tensors, leaves

    def _tensor(self, array: npt.NDArray[Any]) -> torch.Tensor:
        if not array.flags.writeable:
            array = array.copy()
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def _inputs(self, batch: Batch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        non_id = [self._tensor(f.data) for f in batch.non_id_type_features]
        labels = [self._tensor(label.data) for label in batch.labels]
        return non_id, labels

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._amp:
            return torch.autocast(device_type=self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ lifecycle
    def worker_stats(self) -> dict[str, float]:
        """The embedding worker's metrics (:mod:`embeddb.trainer.embedding.metrics`), e.g.
        ``stats["embeddb_trainer_staleness_peak"]``."""
        return self._worker.stats()

    def _check_open(self) -> None:
        if self._closed:
            raise TrainerError("the context is closed")

    def close(self) -> None:
        """Release the context (and its embedding worker, when it owns one). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_worker:
            self._worker.close(self.config.close_timeout)

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def embedding_gradients(
    leaves: Sequence[torch.Tensor], scale: float
) -> tuple[list[F32 | None], int]:
    """Each leaf's gradient as float32 numpy, unscaled; non-finite rows (one sample of a
    pooled feature, one position of a sequence) zeroed and counted."""
    grads: list[F32 | None] = []
    nonfinite = 0
    for leaf in leaves:
        grad = leaf.grad
        if grad is None:
            grads.append(None)
            continue
        grad = grad.detach()
        if scale != 1.0:
            grad = grad / scale
        array: F32 = grad.to("cpu", torch.float32).numpy()
        bad = ~np.isfinite(array).all(axis=-1)
        if bad.any():
            array = array.copy()
            array[bad] = 0.0
            nonfinite += int(bad.sum())
        grads.append(array)
    return grads, nonfinite
