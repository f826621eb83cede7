"""The training and evaluation contexts of an NN worker (PERSIA's ``TrainCtx``/``EvalCtx``).

Usage (one process, or one per rank under torchrun)::

    config = TrainerConfig(mode="hybrid", worker=EmbeddingWorkerConfig(max_staleness=4))
    with TrainCtx(model, optimizer, embedding_config, "shards.txt", config) as ctx:
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
:mod:`embeddb.trainer.embedding.process`) share the work::

    prepare:  send the batch's ids (a ``Lookup``) up to ``max_staleness`` batches ahead
    forward:  wait for the pooled embeddings, make them leaf tensors, run the model
    backward: loss.backward() (DDP all-reduces dense gradients), send the embedding gradients
              (unscaled, non-finite rows zeroed and counted), step the dense optimizer

Threads: the context sets torch's intra-op threads to ``TrainerConfig.torch_threads``, or to
this machine's core budget (:mod:`embeddb.trainer.cores`) when unset and ``OMP_NUM_THREADS``
is not, and restores the previous count when it closes; the embedding worker gets the budget's
``worker_threads``.

A training batch that never gets its ``backward`` (the loop moved on, or stopped) is released
in the embedding worker at once (``discard``), so the staleness window never clogs. Errors of
the embedding worker (a shard down, the worker process dead) are raised by the next call.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from embeddb.client.options import check_addresses, read_address_file
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, InvalidArgumentError
from embeddb.features.batch import Batch
from embeddb.trainer.checkpoints import saving as checkpointing
from embeddb.trainer.checkpoints.files import CheckpointInfo
from embeddb.trainer.config import Mode, TrainerConfig
from embeddb.trainer.cores import CoreBudget, available_cpus, core_budget, local_addresses
from embeddb.trainer.dense import DelayedDense, DenseUpdater, SyncDense
from embeddb.trainer.dist import DistEnv, resolve_device
from embeddb.trainer.embedding.spawn import check_main_guard
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.embedding_ctx import (
    EmbeddingCtx,
    EmbeddingStage,
    PreparedBatch,
    embedding_gradients,
    start_stage,
)
from embeddb.trainer.errors import EmbeddingWorkerError, TrainerError

if TYPE_CHECKING:  # export_model's pipeline=
    from embeddb.features.pipeline import FeaturePipeline

__all__ = ["EvalCtx", "TrainCtx", "start_worker"]

Shards = Sequence[str] | str | os.PathLike[str]


@dataclass
class _Forwarded:
    batch_ref: int
    leaves: list[torch.Tensor]
    samples: int


class TrainCtx(EmbeddingCtx):
    """Train ``model`` with its embeddings in embeddb (see the module docstring).

    Args:
        model: the dense model: ``forward(non_id_tensors, embedding_tensors)``.
        optimizer: the dense model's optimizer (embeddings use their tables' optimizers).
        embedding_config: tables and features; every ID feature of a batch must be in it.
        shards: the shards' ``host:port`` in shard order, or the path of an address file.
        config: mode, staleness, device and the rest (:class:`TrainerConfig`).
        dist_env: this rank's place in the job; default: torchrun's environment variables.
        worker: the embedding worker, started already by :func:`start_worker` with the same
            arguments (its start overlaps the model's construction); the context owns it once
            built (the caller closes it if the context could not be built). Default: started
            here.

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
        worker: EmbeddingStage | None = None,
    ) -> None:
        check_main_guard()  # first: a spawn child importing an unguarded script stops here
        cfg = config if config is not None else TrainerConfig()
        _check_types(model, embedding_config, cfg)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)}")
        addresses = _addresses(shards)
        env = dist_env if dist_env is not None else DistEnv.from_environ(os.environ)
        device = _device(cfg, env.local_rank)
        budget = _budget(addresses)
        self._threads_before = _apply_threads(cfg, budget)
        self.dist_env = env
        self.addresses = addresses
        self.optimizer = optimizer
        self.step = 0  # backward() calls of this rank (restored by load_checkpoint)
        self.samples = 0  # training samples of this rank
        self.checkpoint_s = 0.0  # seconds this rank spent in save_checkpoint
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
            if worker is None:
                worker = start_stage(
                    embedding_config, addresses, _worker_config(cfg, env.local_rank, budget), cfg
                )
        except BaseException:
            self._destroy_group()
            self._restore_threads()
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

        The model is called as ``model(non_id, embeddings)``:

        * ``non_id``: one float32 tensor ``(n, width)`` per non-ID feature, in the batch's
          order (``batch.non_id_type_features``);
        * ``embeddings``: one entry per ID feature, in the batch's order
          (``batch.id_type_features``, not the embedding config's): a pooled ``(n, dim)``
          float32 tensor, or ``(vectors (n, L, dim), mask (n, L) bool)`` for a sequence
          feature (``embedding_summation: false``).

        For a batch with ID features ``[user, city]`` and non-ID ``[price (1), age (1)]``::

            non_id     = [price (n, 1), age (n, 1)]
            embeddings = [user (n, dim_user), city (n, dim_city)]

        ``labels`` are the batch's labels as tensors, in its order.

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
        grads, nonfinite = embedding_gradients(forwarded.leaves, self.dense.loss_scale())
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
    ) -> CheckpointInfo:
        """Checkpoint the job: dense parameters, optimizer state and counters in
        ``directory/ID/dense.pt``, and a snapshot of every shard under ``ID``, consistent
        across shards and ranks (:func:`embeddb.trainer.checkpoints.saving.save_checkpoint`). Every
        rank must call it at the same step.

        Args:
            directory: the checkpoint directory (shared by the ranks).
            checkpoint_id: default ``ckpt-<step, 9 digits>`` (or the first free
                ``ckpt-<step>.<k>``).

        Raises:
            InvalidArgumentError: a bad id, or one already taken (in ``directory`` or by a
                shard). FailedPreconditionError: a shard keeps no snapshots (no data
                directory). EmbeddingWorkerError, GradientPushFailedError: see :meth:`forward`.
        """
        self._check_open()
        began = time.perf_counter()
        try:
            info = checkpointing.save_checkpoint(self, directory, checkpoint_id, drain=self._drain)
        finally:
            self.checkpoint_s += time.perf_counter() - began
        self._last_checkpoint = info.checkpoint_id
        return info

    def load_checkpoint(
        self, directory: str | os.PathLike[str], checkpoint_id: str | None = None
    ) -> CheckpointInfo:
        """Restore the dense side of a checkpoint (parameters, optimizer state, counters); the
        shards restore the embedding side (:mod:`embeddb.trainer.checkpoints.saving`).

        Args:
            directory: the checkpoint directory.
            checkpoint_id: default: the latest complete checkpoint.

        Raises:
            NotFoundError: no such checkpoint (or none at all).
            ConfigError: the checkpoint was taken with a different number of shards.
        """
        self._check_open()
        info = checkpointing.load_checkpoint(self, directory, checkpoint_id)
        self.step, self.samples = info.step, info.samples
        self._last_checkpoint = info.checkpoint_id
        return info

    def _drain(self) -> None:
        """Wait until nothing of this rank is in flight: dense updates (``async`` mode),
        embedding gradients, lookups."""
        self.dense.flush()
        self.flush()
        self._await_lookups(self.config.lookup_timeout)
        self.flush()  # a lookup answered after the first flush pushes nothing, but be sure

    def export_model(
        self,
        directory: str | os.PathLike[str],
        *,
        example: Batch | None = None,
        positive: str | None = None,
        pipeline: FeaturePipeline | None = None,
        lenient_records: bool = False,
        overwrite: bool = False,
    ) -> Path:
        """Export the dense model for online inference
        (:func:`embeddb.serving.export_model`): TorchScript ``dense.pt``,
        ``embedding.yaml`` and ``model.json``, whose ``snapshot_id`` is the last checkpoint
        saved or loaded by this context (``None`` if none). The embeddings stay in the shards.

        Exports the current parameters; in ``async`` mode the dense updates still pending are
        not in them (every rank applies them at ``save_checkpoint`` or ``close``).

        Args:
            directory: the model directory to write.
            example: a batch fixing the inputs' order and shapes; default: the first batch
                this context forwarded.
            positive: a human label of the positive class, for ``model.json``; default: the
                pipeline's ``positive``, if any.
            pipeline: the feature pipeline that built the training batches
                (:class:`~embeddb.features.pipeline.FeaturePipeline`), written into the
                model directory: the served model then scores raw records through it.
            lenient_records: the served model ignores keys of raw records that no column
                reads (counted) instead of refusing the record.
            overwrite: replace an existing exported model.

        Raises:
            InvalidArgumentError: no example (nothing forwarded yet), an existing model without
                ``overwrite``, a model that can be neither scripted nor traced, or a pipeline
                whose features are not the example batch's.
        """
        from embeddb.trainer.export import export_model  # torch-heavy, needed by few jobs

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
            positive=positive if positive is not None or pipeline is None else pipeline.positive,
            pooling=self.config.worker.pooling,
            pipeline=pipeline,
            lenient_records=lenient_records,
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
            self._restore_threads()

    def _restore_threads(self) -> None:
        before = getattr(self, "_threads_before", None)
        if before is not None:
            torch.set_num_threads(before)
            self._threads_before = None

    def _destroy_group(self) -> None:
        if getattr(self, "_owns_group", False) and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def __enter__(self) -> TrainCtx:
        return self


class EvalCtx(EmbeddingCtx):
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
        check_main_guard()
        cfg = config if config is not None else TrainerConfig()
        _check_types(model, embedding_config, cfg)
        addresses = _addresses(shards)
        env = DistEnv.from_environ(os.environ)
        device = _device(cfg, env.local_rank)
        worker_config = _worker_config(cfg, env.local_rank, _budget(addresses))
        worker = start_stage(embedding_config, addresses, worker_config, cfg)
        super().__init__(embedding_config, cfg, device, worker, owns_worker=True)
        self.model = model.to(device)

    @classmethod
    def _sharing(cls, train: TrainCtx) -> EvalCtx:
        ctx = cls.__new__(cls)
        EmbeddingCtx.__init__(
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
        return self._prefetch(batches, False, max(2, self.config.worker.max_staleness))

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


def start_worker(
    embedding_config: EmbeddingConfig,
    shards: Shards,
    config: TrainerConfig | None = None,
    *,
    dist_env: DistEnv | None = None,
) -> EmbeddingStage:
    """The embedding worker a :class:`TrainCtx` of these arguments starts, started now and
    ready: hand it to ``TrainCtx(..., worker=)``. Thread-safe: it may start while the model
    is built (:mod:`embeddb.trainer.launcher.rank`).

    Raises:
        ConfigError: a missing address file, tables the shards do not serve.
        EmbeddingWorkerError: the embedding worker could not start.
    """
    cfg = config if config is not None else TrainerConfig()
    addresses = _addresses(shards)
    env = dist_env if dist_env is not None else DistEnv.from_environ(os.environ)
    return start_stage(
        embedding_config, addresses, _worker_config(cfg, env.local_rank, _budget(addresses)), cfg
    )


def _addresses(shards: Shards) -> tuple[str, ...]:
    addresses: tuple[str, ...] = (
        read_address_file(shards)
        if isinstance(shards, (str, os.PathLike))
        else check_addresses(list(shards))
    )
    return addresses


def _budget(addresses: Sequence[str]) -> CoreBudget:
    """This machine's core budget: torchrun's ranks on it, the shards among ``addresses`` that
    run on it, no loader processes (a context does not start them)."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return core_budget(available_cpus(), ranks, local_addresses(addresses), loaders=False)


def _apply_threads(config: TrainerConfig, budget: CoreBudget) -> int | None:
    """Set torch's intra-op threads: ``config.torch_threads``, else the budget's unless
    ``OMP_NUM_THREADS`` is set; returns the previous count to restore (``None``: unchanged).

    Inter-op threads are left alone: ``torch.set_num_interop_threads`` fails once any inter-op
    work ran in the process, and the training step uses none."""
    wanted = config.torch_threads
    if wanted is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return None
        wanted = budget.torch_threads
    before = torch.get_num_threads()
    if wanted == before:
        return None
    torch.set_num_threads(wanted)
    return before


def _worker_config(
    config: TrainerConfig, local_rank: int, budget: CoreBudget
) -> EmbeddingWorkerConfig:
    worker = config.embedding_worker(local_rank)
    if worker.threads is None:
        worker = replace(worker, threads=budget.worker_threads)
    return worker


def _device(config: TrainerConfig, local_rank: int) -> torch.device:
    device = resolve_device(config.device, local_rank)
    if config.mixed_precision and device.type != "cuda":
        raise ConfigError("mixed_precision", f"needs a CUDA device, the device is {device}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
