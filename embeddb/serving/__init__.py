"""Online inference, installed as ``embeddb.serving``: serve a trained model directory.

A *model directory* (written by :func:`embeddb.trainer.export.export_model` at the end of
training, re-exported here as :func:`export_model`; read by :class:`InferCtx`, by
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

The directory's format is :mod:`embeddb.trainer.model_spec` (model.json) and
:mod:`embeddb.trainer.export` writes it: training owns what it produces, serving reads it.

Modules: :mod:`.infer` (:class:`InferCtx`: records → batch → lookups → pooled → dense → scores),
:mod:`.records` (pre-hashed records), :mod:`.body` (JSON request bodies, bounded before they
are parsed), :mod:`.local_shards` (a checkpoint's shards opened in-process, read-only),
:mod:`.torchserve` (a TorchServe handler), :mod:`.server`/:mod:`.http` (``embeddb serve-model``).

May import: :mod:`embeddb.trainer` (what it exported), :mod:`embeddb.features`,
:mod:`embeddb.client`, :mod:`embeddb.engine` (a checkpoint's shards opened in-process),
:mod:`embeddb.transport`; never :mod:`embeddb.server` (the ``layers`` contract).
"""

from __future__ import annotations

from embeddb.serving.infer import InferCtx, LookupBackend
from embeddb.trainer.export import export_model
from embeddb.trainer.model_spec import ModelSpec, NonIdSpec, load_model_spec

__all__ = ["InferCtx", "LookupBackend", "ModelSpec", "NonIdSpec", "export_model", "load_model_spec"]
