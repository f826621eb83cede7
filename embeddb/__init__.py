"""embeddb: a sharded embedding database and hybrid training system for recommender models.

Layers (inner first): :mod:`embeddb.errors` and :mod:`embeddb.routing` (leaf),
:mod:`embeddb.config`, :mod:`embeddb.initializers`, :mod:`embeddb.optim`,
:mod:`embeddb.storage`, :mod:`embeddb.shard` (one shard, no transport), :mod:`embeddb.cli`.
The client SDK installs as ``embeddb.client`` and the trainer as ``embeddb.trainer``.

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
