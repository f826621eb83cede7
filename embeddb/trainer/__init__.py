"""embeddb hybrid trainer, installed as ``embeddb.trainer``: PERSIA-style hybrid training.

Embeddings live in embeddb shards and are updated asynchronously by the shards' optimizers; the
dense model trains synchronously with torch DDP. The only part of embeddb that imports torch.

Owns (inner first, the ``trainer-layers`` contract): :mod:`.errors`; :mod:`.pooling` (pooling
and its adjoint, numpy) and :mod:`.cores` (the job's core budget); :mod:`.embedding` (the
embedding stage: the worker's transport-free core, its process, protocol, shared-memory
channel, metrics); :mod:`.config` (:class:`TrainerConfig`, :class:`Mode`); :mod:`.dense`
(synchronous and delayed dense updates), :mod:`.dist` (torchrun's environment, the process
group), :mod:`.models` (the built-in models ``dnn``, ``fm``, ``deepfm``, ``dlrm``),
:mod:`.model_spec` (a model directory's model.json); :mod:`.embedding_ctx`,
:mod:`.checkpoints` (job checkpoints) and :mod:`.export` (writing a model directory);
:mod:`.ctx` (:class:`TrainCtx`, :class:`EvalCtx`); :mod:`.launcher` (``embeddb train``: the
job YAML, validation, local shards + torchrun, each rank's loop, its data loader, resume).
Batches are :mod:`embeddb.features.batch`'s (re-exported here).

May import: :mod:`embeddb.client`, :mod:`embeddb.features`, :mod:`embeddb.config`,
:mod:`embeddb.transport.rpc` (metrics endpoints), :mod:`embeddb.common`; never the engine or
a server (the ``trainer`` contract): training reaches shards only through the client.
Metrics: :func:`auc` and :func:`logloss` (from :mod:`embeddb.common.evaluation`).

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
    from embeddb.common.evaluation import auc, logloss
    from embeddb.features.batch import (
        Batch,
        IDTypeFeature,
        IDTypeFeatureWithSingleID,
        Label,
        NonIDTypeFeature,
        PersiaBatch,
    )
    from embeddb.trainer.checkpoints.files import CheckpointInfo
    from embeddb.trainer.config import Mode, TrainerConfig
    from embeddb.trainer.ctx import EvalCtx, TrainCtx
    from embeddb.trainer.dist import DistEnv
    from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
    from embeddb.trainer.embedding_ctx import PreparedBatch
    from embeddb.trainer.errors import (
        EmbeddingWorkerError,
        GradientPushFailedError,
        LookupFailedError,
        TrainerError,
    )
    from embeddb.trainer.models import BUILTIN_MODELS, build_model
    from embeddb.trainer.pooling import Pooling

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
    "Batch": "embeddb.features.batch",
    "CheckpointInfo": ".checkpoints.files",
    "IDTypeFeature": "embeddb.features.batch",
    "IDTypeFeatureWithSingleID": "embeddb.features.batch",
    "Label": "embeddb.features.batch",
    "NonIDTypeFeature": "embeddb.features.batch",
    "PersiaBatch": "embeddb.features.batch",
    "Pooling": ".pooling",
    "EmbeddingWorkerConfig": ".embedding.worker",
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
    "auc": "embeddb.common.evaluation",
    "logloss": "embeddb.common.evaluation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
