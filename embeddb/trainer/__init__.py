"""embeddb hybrid trainer, installed as ``embeddb.trainer``: PERSIA-style hybrid training.

Embeddings live in embeddb shards and are updated asynchronously by the shards' optimizers; the
dense model trains synchronously with torch DDP. The only part of embeddb that imports torch.

Modules: :mod:`.batch` (the batch data model), :mod:`.pooling` (pooling and its adjoint),
:mod:`.embedding_worker` (the embedding worker's transport-free core),
:mod:`.worker_process` (that worker in its own process, and the NN worker's handle on it),
:mod:`.protocol` (their messages), :mod:`.worker_metrics` (its Prometheus metrics),
:mod:`.config` (:class:`TrainerConfig`, :class:`Mode`), :mod:`.dist` (torchrun's environment,
the process group), :mod:`.dense` (synchronous and delayed dense updates), :mod:`.ctx`
(:class:`TrainCtx`, :class:`EvalCtx`), :mod:`.embedding_ctx` (what both share: batches
prepared ahead, tensors), :mod:`.checkpoint` (job checkpoints: dense file + one snapshot per
shard), :mod:`.checkpointing` (taking and restoring them), :mod:`.job` (the training job YAML),
:mod:`.launch` (``embeddb train``: local shards + torchrun), :mod:`.run` (the NN worker's
torchrun entry), :mod:`.models` (the built-in models ``dnn``, ``fm``, ``deepfm``, ``dlrm``),
:mod:`.spawn` (starting the embedding worker: the main-guard check, Ctrl-C), :mod:`.errors`.
Metrics: :func:`auc` and :func:`logloss` (from :mod:`embeddb.evaluation`).

The dense model's inputs (``TrainCtx.forward`` / ``EvalCtx.forward`` call
``model(non_id, embeddings)``)::

    non_id      one float32 tensor (n, width) per non-ID feature, in the batch's order
                (batch.non_id_type_features)
    embeddings  one entry per ID feature, in the batch's order (batch.id_type_features, not
                the embedding config's): pooled (n, dim) float32, or
                (vectors (n, L, dim), mask (n, L) bool) for a sequence feature
                (embedding_summation: false)

A script that builds a :class:`TrainCtx` at top level needs an ``if __name__ == "__main__":``
guard: the embedding worker is started with multiprocessing ``spawn``, which imports the script
again (without the guard the context raises at once, saying so).

Names that need torch (the contexts, ``DistEnv``) are imported on first use, so the embedding
worker process, which imports this package, never loads torch.
"""

from __future__ import annotations

if __name__ != "embeddb.trainer":  # the top-level folder is a link, not a second package
    raise ImportError(f"import embeddb.trainer, not {__name__}")

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees of the lazy names below
    from embeddb.evaluation import auc, logloss

    from .batch import (
        Batch,
        IDTypeFeature,
        IDTypeFeatureWithSingleID,
        Label,
        NonIDTypeFeature,
        PersiaBatch,
    )
    from .checkpoint import CheckpointInfo
    from .config import Mode, TrainerConfig
    from .ctx import EvalCtx, TrainCtx
    from .dist import DistEnv
    from .embedding_ctx import PreparedBatch
    from .embedding_worker import EmbeddingWorkerConfig
    from .errors import (
        EmbeddingWorkerError,
        GradientPushFailedError,
        LookupFailedError,
        TrainerError,
    )
    from .models import BUILTIN_MODELS, build_model
    from .pooling import Pooling

__all__ = [
    "BUILTIN_MODELS",
    "Batch",
    "CheckpointInfo",
    "DistEnv",
    "EmbeddingWorkerConfig",
    "EmbeddingWorkerError",
    "EvalCtx",
    "GradientPushFailedError",
    "IDTypeFeature",
    "IDTypeFeatureWithSingleID",
    "Label",
    "LookupFailedError",
    "Mode",
    "NonIDTypeFeature",
    "PersiaBatch",
    "Pooling",
    "PreparedBatch",
    "TrainCtx",
    "TrainerConfig",
    "TrainerError",
    "auc",
    "build_model",
    "logloss",
]

_LAZY = {
    "Batch": ".batch",
    "CheckpointInfo": ".checkpoint",
    "IDTypeFeature": ".batch",
    "IDTypeFeatureWithSingleID": ".batch",
    "Label": ".batch",
    "NonIDTypeFeature": ".batch",
    "PersiaBatch": ".batch",
    "Pooling": ".pooling",
    "EmbeddingWorkerConfig": ".embedding_worker",
    "Mode": ".config",
    "TrainerConfig": ".config",
    "EmbeddingWorkerError": ".errors",
    "GradientPushFailedError": ".errors",
    "LookupFailedError": ".errors",
    "TrainerError": ".errors",
    "DistEnv": ".dist",
    "EvalCtx": ".ctx",
    "PreparedBatch": ".embedding_ctx",
    "TrainCtx": ".ctx",
    "BUILTIN_MODELS": ".models",
    "build_model": ".models",
    "auc": "embeddb.evaluation",
    "logloss": "embeddb.evaluation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
