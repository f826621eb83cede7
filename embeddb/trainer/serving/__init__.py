"""Online inference, installed as ``embeddb.trainer.serving``: export a trained model, serve it.

A *model directory* (written by :func:`export_model`, read by :class:`InferCtx`, by
``embeddb serve-model`` and by the TorchServe handler)::

    MODEL_DIR/
      dense.pt        TorchScript: forward(non_id: List[Tensor], embeddings: List[Tensor])
                      -> Tensor (n, 1) logits
      embedding.yaml  the embedding config (tables, features, pooling)
      features.json   the feature pipeline (optional; model.json's "pipeline" names it): raw
                      records → batch, by the code that built the training batches
      model.json      what the model reads (:class:`ModelSpec`); written last: a directory is a
                      model only once its model.json exists

The embeddings are not in the directory: they stay in the shards (read-only followers in
production) and are read with evaluation lookups, so predictions follow training.

Modules: :mod:`.spec` (model.json), :mod:`.export` (writing a model directory),
:mod:`.infer` (:class:`InferCtx`: records → batch → lookups → pooled → dense → scores),
:mod:`.records` (pre-hashed records), :mod:`.body` (JSON request bodies, bounded before they
are parsed), :mod:`.local_shards` (a checkpoint's shards opened in-process, read-only),
:mod:`.torchserve` (a TorchServe handler).
"""

from __future__ import annotations

from .export import export_model
from .infer import InferCtx, LookupBackend
from .spec import ModelSpec, NonIdSpec, load_model_spec

__all__ = ["InferCtx", "LookupBackend", "ModelSpec", "NonIdSpec", "export_model", "load_model_spec"]
