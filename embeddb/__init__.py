"""embeddb: a sharded embedding database and hybrid training system for recommender models.

The packages (docs/architecture.md §2; the contracts in pyproject.toml, checked by
``lint-imports``), from the top:

* :mod:`embeddb.cli`: the ``embeddb`` command; nothing imports it.
* :mod:`embeddb.server` (the embedding server: a shard over gRPC, followers, the cluster) and
  :mod:`embeddb.serving` (the model server, TorchServe): the two servers, never importing
  each other.
* :mod:`embeddb.trainer`: hybrid training (contexts, the embedding stage, checkpoints, the
  launcher, model export); with serving, the only importers of torch.
* :mod:`embeddb.client` (the SDK), :mod:`embeddb.features` (data readers and the feature
  pipeline shared by training and serving) and :mod:`embeddb.engine` (a shard and everything
  under it: storage, optimizers, durability; no network).
* :mod:`embeddb.transport` (wire format, the status table, the gRPC server layer; no engine),
  :mod:`embeddb.config` (the embedding and store configuration), :mod:`embeddb.datasets`.
* :mod:`embeddb.v1` (generated from ``embeddb/proto``), :mod:`embeddb.presets`.
* :mod:`embeddb.common` (routing, array aliases, hashing constants) and :mod:`embeddb.errors`.

The engine and the transport are independent stacks: the server joins them, the client uses
only the transport. The repository's top-level ``client/`` and ``trainer/`` are links to
``embeddb/client`` and ``embeddb/trainer``.

The names below load lazily, so ``import embeddb.errors`` (as the client does) does not pull
in the storage engine and its compiled dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embeddb.config import EmbeddingConfig, StoreConfig, TableConfig
    from embeddb.engine.shard import Shard
    from embeddb.errors import EmbeddbError

__version__ = "0.1.0"

__all__ = ["EmbeddbError", "EmbeddingConfig", "Shard", "StoreConfig", "TableConfig", "__version__"]

_LAZY = {
    "EmbeddbError": "embeddb.errors",
    "EmbeddingConfig": "embeddb.config",
    "StoreConfig": "embeddb.config",
    "TableConfig": "embeddb.config",
    "Shard": "embeddb.engine.shard",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'embeddb' has no attribute {name!r}")
