"""The training and evaluation contexts of an NN worker (PERSIA's ``TrainCtx``/``EvalCtx``).

Usage (one process, or one per rank under torchrun)::

    with TrainCtx(model, optimizer, embedding_config, "shards.txt",
                  TrainerConfig(mode="hybrid", max_staleness=4)) as ctx:
        for prepared in ctx.prepare(batches):          # lookups run ahead of training
            output, labels = ctx.forward(prepared)      # model(non_id_tensors, embedding_tensors)
            loss = F.binary_cross_entropy_with_logits(output, labels[0])
            ctx.backward(loss)                          # dense step + async embedding push
        with ctx.eval_ctx() as ev:                      # same worker; train=False lookups
            for prepared in ev.prepare(test_batches):
                output, labels = ev.forward(prepared)

The model's ``forward(non_id_tensors, embedding_tensors)`` gets the batch's non-ID features as
tensors, and one entry per ID feature in the batch's order: a ``(B, dim)`` float32 tensor for a
pooled feature, or ``(embeddings (B, L, dim), mask (B, L) bool)`` for a raw sequence feature
(``embedding_summation: false``). ``forward`` returns ``(output, labels)``, labels as tensors.

Per training batch the NN worker (this process) and its embedding worker (another process,
:mod:`embeddb.trainer.worker_process`) share the work::

    prepare:  send the batch's ids (LOOKUP) up to ``max_staleness`` batches ahead
    forward:  wait for the pooled embeddings, make them leaf tensors, run the model
    backward: loss.backward() (DDP all-reduces dense gradients), send the embedding gradients
              (unscaled, non-finite rows zeroed and counted), step the dense optimizer

A training batch that never gets its ``backward`` (the loop moved on, or stopped) is released
in the embedding worker at once (``discard``), so the staleness window never clogs. Errors of
the embedding worker (a shard down, the worker process dead) are raised by the next call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist
from torch import nn

from embeddb.client import Client
from embeddb.client.options import check_addresses, read_address_file
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, InvalidArgumentError, NotFoundError

from . import checkpoint as ckpt
from .batch import Batch
from .config import Mode, TrainerConfig
from .dense import DelayedDense, DenseUpdater, SyncDense
from .dist import DistEnv, resolve_device
from .embedding_worker import IdFeature
from .errors import EmbeddingWorkerError, TrainerError
from .pooling import Pooled
from .worker_process import EmbeddingWorkerProcess

__all__ = ["EmbeddingTensor", "EvalCtx", "PreparedBatch", "TrainCtx"]

logger = logging.getLogger(__name__)

EmbeddingTensor = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
Shards = Sequence[str] | str | os.PathLike[str]


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


@dataclass
class _Forwarded:
    batch_ref: int
    leaves: list[torch.Tensor]
    samples: int


class _EmbeddingCtx:
    """What both contexts share: the embedding worker, prefetching and tensor conversion."""

    def __init__(
        self,
        embedding_config: EmbeddingConfig,
        config: TrainerConfig,
        device: torch.device,
        worker: EmbeddingWorkerProcess,
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
        """The embedding worker's metrics (:mod:`embeddb.trainer.worker_metrics`), e.g.
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


class TrainCtx(_EmbeddingCtx):
    """Train ``model`` with its embeddings in embeddb (see the module docstring).

    Args:
        model: the dense model: ``forward(non_id_tensors, embedding_tensors)``.
        optimizer: the dense model's optimizer (embeddings use their tables' optimizers).
        embedding_config: tables and features; every ID feature of a batch must be in it.
        shards: the shards' ``host:port`` in shard order, or the path of an address file.
        config: mode, staleness, device and the rest (:class:`TrainerConfig`).
        dist_env: this rank's place in the job; default: torchrun's environment variables.

    Raises:
        ConfigError: an invalid setting, a missing address file, tables the shards do not serve.
        EmbeddingWorkerError: the embedding worker could not start.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        embedding_config: EmbeddingConfig,
        shards: Shards,
        config: TrainerConfig | None = None,
        *,
        dist_env: DistEnv | None = None,
    ) -> None:
        cfg = config if config is not None else TrainerConfig()
        _check_types(model, embedding_config, cfg)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)}")
        addresses = _addresses(shards)
        env = dist_env if dist_env is not None else DistEnv.from_environ(os.environ)
        device = _device(cfg, env.local_rank)
        self.dist_env = env
        self.addresses = addresses
        self.optimizer = optimizer
        self.step = 0  # backward() calls of this rank (restored by load_checkpoint)
        self.samples = 0  # training samples of this rank
        self.model = model.to(device)
        self._owns_group = env.init_process_group(device)
        try:
            # Dense first: DDP's construction is a collective every rank must reach.
            scaler = torch.amp.GradScaler(device.type) if cfg.mixed_precision else None
            self.dense: DenseUpdater
            if cfg.mode is Mode.ASYNC:
                self.dense = DelayedDense(
                    self.model,
                    optimizer,
                    scaler,
                    delay=cfg.dense_delay,
                    distributed=env.distributed,
                )
            else:
                self.dense = SyncDense(
                    self.model, optimizer, scaler, distributed=env.distributed, device=device
                )
            worker = EmbeddingWorkerProcess(
                embedding_config,
                addresses,
                cfg.embedding_worker(env.local_rank),
                start_timeout=cfg.start_timeout,
            )
        except BaseException:
            self._destroy_group()
            raise
        super().__init__(embedding_config, cfg, device, worker, owns_worker=True)
        self._awaiting: _Forwarded | None = None
        self._example: Batch | None = None  # the first batch forwarded: export's example
        self._last_checkpoint: str | None = None  # saved or loaded: export's snapshot id

    def prepare(self, batches: Iterable[Batch]) -> Iterator[PreparedBatch]:
        """Yield ``batches`` prepared in order, their lookups sent ``max_staleness`` batches
        ahead (the embedding worker admits them within the staleness bound).

        Raises:
            InvalidArgumentError: a batch with an ID feature the embedding config lacks.
        """
        self._check_open()
        return self._prefetch(batches, True, self.config.embedding_staleness)

    def forward(self, prepared: PreparedBatch) -> tuple[Any, list[torch.Tensor]]:
        """Run the model on a prepared batch; returns ``(output, labels)``.

        Raises:
            LookupFailedError: the batch's lookup failed (a shard down, after retries).
            GradientPushFailedError: an earlier batch's gradients could not be applied.
            EmbeddingWorkerError: the embedding worker died or did not answer in time.
        """
        self._check_open()
        self._worker.raise_failure()
        if self._awaiting is not None:  # the previous training batch got no backward()
            self._worker.discard(self._awaiting.batch_ref)
            self._awaiting = None
        self._take(prepared)
        if self._example is None:
            self._example = prepared.batch
        embeddings, leaves = self._embedding_tensors(prepared, prepared.train)
        non_id, labels = self._inputs(prepared.batch)
        grad = torch.enable_grad() if prepared.train else torch.no_grad()
        with grad, self._autocast():
            output = self.dense.module(non_id, embeddings)
        if self._amp and isinstance(output, torch.Tensor):
            output = output.float()
        if prepared.train:
            self._awaiting = _Forwarded(prepared.batch_ref, leaves, prepared.batch.batch_size)
        return output, labels

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` of the last forwarded training batch: dense gradients are
        all-reduced and applied (delayed in ``async`` mode), embedding gradients are sent to
        the embedding worker, which pushes them to the shards asynchronously.

        Raises:
            TrainerError: no training batch was forwarded since the last ``backward``.
            GradientPushFailedError, EmbeddingWorkerError: see :meth:`forward`.
        """
        self._check_open()
        forwarded = self._awaiting
        if forwarded is None:
            raise TrainerError("backward() needs a forward() of a training batch first")
        self._awaiting = None
        self.dense.backward(loss)
        grads, nonfinite = _embedding_gradients(forwarded.leaves, self.dense.loss_scale())
        self._worker.push_gradients(forwarded.batch_ref, grads, nonfinite)
        self.dense.step()
        self.step += 1
        self.samples += forwarded.samples

    def flush(self) -> None:
        """Wait until every embedding gradient sent so far is applied by the shards.

        Raises:
            GradientPushFailedError, EmbeddingWorkerError: see :meth:`forward`.
        """
        self._check_open()
        self._worker.flush(self.config.close_timeout)
        self._worker.raise_failure()

    def save_checkpoint(
        self, directory: str | os.PathLike[str], checkpoint_id: str | None = None
    ) -> ckpt.CheckpointInfo:
        """Checkpoint the job: dense parameters, optimizer state and counters in
        ``directory/ID/dense.pt``, and a snapshot of every shard under ``ID``
        (:mod:`embeddb.trainer.checkpoint`). Every rank must call it at the same step.

        Before the snapshot every rank applies its pending dense updates (``async`` mode),
        waits until its embedding gradients are applied and its lookups answered, and meets
        the others at a barrier: no push or lookup of this job is in flight while the shards
        snapshot, so the checkpoint is consistent across shards and with the dense side.
        (Batches already looked up ahead keep their embeddings: in ``hybrid`` mode a resumed
        run looks them up again, fresher.) Rank 0 takes the snapshot and writes the files;
        all ranks meet at a second barrier.

        Args:
            directory: the checkpoint directory (shared by the ranks).
            checkpoint_id: default ``ckpt-<step, 9 digits>``, or ``ckpt-<step>.<k>`` (the
                first ``k`` free) when a run killed between its snapshot and its manifest
                left that id taken on a shard, and the job has come back to the same step.

        Returns:
            The checkpoint's manifest.

        Raises:
            InvalidArgumentError: a bad id, or one already taken (in ``directory`` or by a
                shard). FailedPreconditionError: a shard keeps no snapshots (no data
                directory). EmbeddingWorkerError, GradientPushFailedError: see :meth:`forward`.
        """
        self._check_open()
        name = ckpt.check_id(checkpoint_id or ckpt.checkpoint_id_for(self.step))
        pick_free_id = checkpoint_id is None
        self.dense.flush()
        self.flush()
        self._await_lookups(self.config.lookup_timeout)
        self.flush()  # a lookup answered after the first flush pushes nothing, but be sure
        distributed = self.dist_env.distributed and dist.is_initialized()
        if distributed:
            dist.barrier()
        info: ckpt.CheckpointInfo | None = None
        failure: BaseException | None = None
        if self.dist_env.rank == 0:
            try:
                with Client(self.addresses, token=self.config.token) as client:
                    if pick_free_id:
                        name = ckpt.free_checkpoint_id(name, directory, client.list_snapshots())
                    client.snapshot(name)
                dense = {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scaler": None if self.dense.scaler is None else self.dense.scaler.state_dict(),
                }
                info = ckpt.write_checkpoint(
                    directory,
                    name,
                    dense,
                    step=self.step,
                    samples=self.samples,
                    num_shards=len(self.addresses),
                )
            except BaseException as exc:  # still meet the others at the barrier
                failure = exc
        if distributed:
            dist.barrier()
            chosen: list[str | None] = [name]  # rank 0 may have picked a free id
            dist.broadcast_object_list(chosen, src=0)
            name = str(chosen[0])
        if failure is not None:
            raise failure
        if info is None:
            info = ckpt.read_checkpoint(directory, name)
        self._last_checkpoint = info.checkpoint_id
        logger.info("checkpoint %s at step %d", name, self.step)
        return info

    def load_checkpoint(
        self, directory: str | os.PathLike[str], checkpoint_id: str | None = None
    ) -> ckpt.CheckpointInfo:
        """Restore the dense side of a checkpoint (parameters, optimizer state, counters).

        The embedding side is the shards' business: start them from the snapshot
        (``embeddb serve --restore ID``, :func:`~embeddb.trainer.checkpoint.restore_local_shards`)
        for an exact resume; shards left as they are keep their newer embeddings.

        Args:
            directory: the checkpoint directory.
            checkpoint_id: default: the latest complete checkpoint.

        Raises:
            NotFoundError: no such checkpoint (or none at all).
            ConfigError: the checkpoint was taken with a different number of shards.
        """
        self._check_open()
        info = (
            ckpt.read_checkpoint(directory, checkpoint_id)
            if checkpoint_id is not None
            else ckpt.latest_checkpoint(directory)
        )
        if info is None:
            raise NotFoundError(f"no checkpoint in {directory}")
        if info.num_shards != len(self.addresses):
            raise ConfigError(
                "shards",
                f"checkpoint {info.checkpoint_id} has {info.num_shards} shards, the job "
                f"{len(self.addresses)}",
            )
        state = torch.load(info.dense_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.dense.scaler is not None and state.get("scaler") is not None:
            self.dense.scaler.load_state_dict(state["scaler"])
        self.step, self.samples = info.step, info.samples
        self._last_checkpoint = info.checkpoint_id
        return info

    def export_model(
        self,
        directory: str | os.PathLike[str],
        *,
        example: Batch | None = None,
        positive: str | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Export the dense model for online inference
        (:func:`embeddb.trainer.serving.export_model`): TorchScript ``dense.pt``,
        ``embedding.yaml`` and ``model.json``, whose ``snapshot_id`` is the last checkpoint
        saved or loaded by this context (``None`` if none). The embeddings stay in the shards.

        Exports the current parameters; in ``async`` mode the dense updates still pending are
        not in them (every rank applies them at ``save_checkpoint`` or ``close``).

        Args:
            directory: the model directory to write.
            example: a batch fixing the inputs' order and shapes; default: the first batch
                this context forwarded.
            positive: a human label of the positive class, for ``model.json``.
            overwrite: replace an existing exported model.

        Raises:
            InvalidArgumentError: no example (nothing forwarded yet), an existing model without
                ``overwrite``, or a model that can be neither scripted nor traced.
        """
        from .serving import export_model  # torch-heavy, needed by few jobs

        self._check_open()
        chosen = example if example is not None else self._example
        if chosen is None:
            raise InvalidArgumentError(
                "export_model needs an example batch: pass example= or forward a batch first"
            )
        return export_model(
            self.model,
            directory,
            embedding_config=self.embedding_config,
            example=chosen,
            snapshot_id=self._last_checkpoint,
            positive=positive,
            pooling=self.config.pooling,
            overwrite=overwrite,
        )

    def eval_ctx(self) -> EvalCtx:
        """An evaluation context on the same model and embedding worker (flushed first: it
        sees every update sent so far). Closing it leaves this context open."""
        self.flush()
        return EvalCtx._sharing(self)

    def close(self) -> None:
        """Apply pending dense updates (``async`` mode), drain the embedding worker's pushes,
        stop it, and leave the process group if this context joined it. Idempotent."""
        if self._closed:
            return
        try:
            if self._awaiting is not None:
                with contextlib.suppress(EmbeddingWorkerError):
                    self._worker.discard(self._awaiting.batch_ref)
                self._awaiting = None
            self.dense.flush()
            super().close()
        finally:
            self._destroy_group()

    def _destroy_group(self) -> None:
        if getattr(self, "_owns_group", False) and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def __enter__(self) -> TrainCtx:
        return self


class EvalCtx(_EmbeddingCtx):
    """Evaluate ``model``: lookups with ``train=False`` (they never insert rows nor refresh
    recency; unknown ids read as zeros), no gradients.

    Args:
        model: the dense model.
        embedding_config: tables and features.
        shards: addresses or an address file, as for :class:`TrainCtx`.
        config: device, prefetch depth (``max_staleness``) and worker settings.

    Raises:
        ConfigError, EmbeddingWorkerError: as for :class:`TrainCtx`.
    """

    def __init__(
        self,
        model: nn.Module,
        embedding_config: EmbeddingConfig,
        shards: Shards,
        config: TrainerConfig | None = None,
    ) -> None:
        cfg = config if config is not None else TrainerConfig()
        _check_types(model, embedding_config, cfg)
        addresses = _addresses(shards)
        env = DistEnv.from_environ(os.environ)
        device = _device(cfg, env.local_rank)
        worker = EmbeddingWorkerProcess(
            embedding_config,
            addresses,
            cfg.embedding_worker(env.local_rank),
            start_timeout=cfg.start_timeout,
        )
        super().__init__(embedding_config, cfg, device, worker, owns_worker=True)
        self.model = model.to(device)

    @classmethod
    def _sharing(cls, train: TrainCtx) -> EvalCtx:
        ctx = cls.__new__(cls)
        _EmbeddingCtx.__init__(
            ctx,
            train.embedding_config,
            train.config,
            train.device,
            train._worker,
            owns_worker=False,
        )
        ctx.model = train.model
        return ctx

    def prepare(self, batches: Iterable[Batch]) -> Iterator[PreparedBatch]:
        """Yield ``batches`` prepared in order, lookups sent ahead (``max_staleness``, at
        least 2)."""
        self._check_open()
        return self._prefetch(batches, False, max(2, self.config.max_staleness))

    def forward(self, prepared: PreparedBatch) -> tuple[Any, list[torch.Tensor]]:
        """Run the model (in eval mode, without gradients); returns ``(output, labels)``.

        Raises:
            LookupFailedError, EmbeddingWorkerError: see :meth:`TrainCtx.forward`.
        """
        self._check_open()
        self._take(prepared)
        embeddings, _ = self._embedding_tensors(prepared, False)
        non_id, labels = self._inputs(prepared.batch)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                output = self.model(non_id, embeddings)
        finally:
            self.model.train(was_training)
        if self._amp and isinstance(output, torch.Tensor):
            output = output.float()
        return output, labels

    def __enter__(self) -> EvalCtx:
        return self


# ---------------------------------------------------------------------- helpers
def _check_types(model: object, embedding_config: object, config: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(embedding_config, EmbeddingConfig):
        raise TypeError(
            f"embedding_config must be an EmbeddingConfig, got {type(embedding_config).__name__}"
        )
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}")


def _addresses(shards: Shards) -> tuple[str, ...]:
    addresses: tuple[str, ...] = (
        read_address_file(shards)
        if isinstance(shards, (str, os.PathLike))
        else check_addresses(list(shards))
    )
    return addresses


def _device(config: TrainerConfig, local_rank: int) -> torch.device:
    device = resolve_device(config.device, local_rank)
    if config.mixed_precision and device.type != "cuda":
        raise ConfigError("mixed_precision", f"needs a CUDA device, the device is {device}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _embedding_gradients(
    leaves: Sequence[torch.Tensor], scale: float
) -> tuple[list[npt.NDArray[np.float32] | None], int]:
    """Each leaf's gradient as float32 numpy, unscaled; non-finite rows (one sample of a
    pooled feature, one position of a sequence) zeroed and counted."""
    grads: list[npt.NDArray[np.float32] | None] = []
    nonfinite = 0
    for leaf in leaves:
        grad = leaf.grad
        if grad is None:
            grads.append(None)
            continue
        grad = grad.detach()
        if scale != 1.0:
            grad = grad / scale
        array: npt.NDArray[np.float32] = grad.to("cpu", torch.float32).numpy()
        bad = ~np.isfinite(array).all(axis=-1)
        if bad.any():
            array = array.copy()
            array[bad] = 0.0
            nonfinite += int(bad.sum())
        grads.append(array)
    return grads, nonfinite
