"""embeddb: a sharded embedding database and hybrid training system for recommender models.

Layers (inner first; the contracts in pyproject.toml, checked by ``lint-imports``):
:mod:`embeddb.arrays` and :mod:`embeddb.splitmix` (leaves), :mod:`embeddb.errors`,
:mod:`embeddb.routing`, :mod:`embeddb.config`, :mod:`embeddb.initializers`, :mod:`embeddb.optim`,
:mod:`embeddb.storage`, :mod:`embeddb.durability`, :mod:`embeddb.shard` (one shard, no
transport), :mod:`embeddb.wire`, :mod:`embeddb.client` (the SDK), :mod:`embeddb.rpc` (what every
gRPC server is built on), then :mod:`embeddb.server` (the shard server) beside
:mod:`embeddb.trainer` (hybrid training and the model server; the only importer of torch), and
:mod:`embeddb.cli` on top. The repository's top-level ``client/`` and ``trainer/`` are links to
``embeddb/client`` and ``embeddb/trainer``.

The names below load lazily, so ``import embeddb.errors`` (as the client does) does not pull
in the storage engine and its compiled dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embeddb.config import EmbeddingConfig, StoreConfig, TableConfig
    from embeddb.errors import EmbeddbError
    from embeddb.shard import Shard

__version__ = "0.1.0"

__all__ = ["EmbeddbError", "EmbeddingConfig", "Shard", "StoreConfig", "TableConfig", "__version__"]

_LAZY = {
    "EmbeddbError": "embeddb.errors",
    "EmbeddingConfig": "embeddb.config",
    "StoreConfig": "embeddb.config",
    "TableConfig": "embeddb.config",
    "Shard": "embeddb.shard",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'embeddb' has no attribute {name!r}")
