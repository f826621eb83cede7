"""Embedding configuration: tables, features, feature groups and optimizers, read from YAML.

embeddb reads PERSIA's ``embedding_config.yaml`` as-is (``feature_index_prefix_bit``,
``slots_config``, ``feature_groups``) and adds optional keys of its own (``seed``, ``defaults``,
``tables``, ``store`` and a ``table`` key per slot). A worked example::

    feature_index_prefix_bit: 8      # top 8 bits of every table id hold the feature group index
    seed: 0                          # embeddb: initializer seed of every table unless overridden
    slots_config:                    # the features (PERSIA calls them slots)
      user_id: {dim: 16}
      user_city: {dim: 16}
      item_id:
        dim: 16
        hash_stack_config: {hash_stack_rounds: 2, embedding_size: 100000}
      item_tag: {dim: 16, table: item_tags}   # embeddb: read an explicitly named table
    feature_groups:
      user: [user_id, user_city]
    defaults:                        # embeddb: settings of every table ...
      optimizer: {type: adagrad, lr: 0.01}
      capacity: 1000000
    tables:                          # embeddb: ... overridden per table, plus standalone tables
      user: {capacity: 200000, optimizer: {type: adam, lr: 0.001}}
      item_tags: {initializer: {type: zeros}}
      bias: {dim: 1}                 # a table no feature reads needs its own dim
    store: {stripes: 4, eviction_chunk: 0.015625}

It yields these features and tables::

    feature    group     group_index  table      dim  FeatureConfig.encode(ids) of n ids
    user_id    user      0            user       16   shape (n,):   prefix 0 | low 56 bits of id
    user_city  user      0            user       16   shape (n,):   prefix 0 | low 56 bits of id
    item_id    item_id   1            item_id    16   shape (n, 2): prefix 1 | hash-stack bucket
    item_tag   item_tag  2            item_tags  16   shape (n,):   prefix 2 | low 56 bits of id
    -          -         -            bias        1

    table      optimizer                      capacity  initializer
    user       adam lr=0.001 (eps 1e-8)       200000    uniform [-0.01, 0.01]
    item_id    adagrad lr=0.01                1000000   uniform [-0.01, 0.01]
    item_tags  adagrad lr=0.01                1000000   zeros
    bias       adagrad lr=0.01                1000000   uniform [-0.01, 0.01]

How features map to groups and tables:

* **Groups.** Each ``feature_groups`` entry is a group; each feature not in any group forms its own
  group named after itself. Groups are numbered in file order: the ``feature_groups`` entries
  first, then the ungrouped features in ``slots_config`` order. With ``feature_index_prefix_bit``
  ``b > 0`` the group index goes into the top ``b`` bits of every id, so at most ``2**b`` groups
  fit; ``b == 0`` disables prefixing (all groups share one id space).
* **Tables.** All features of a group read one table named after the group (so they need equal
  ``dim``); an ungrouped feature reads a table named after itself; a slot's ``table:`` key
  overrides either. Features sharing a table need equal ``dim`` and equal hash-stack settings.
* **Table settings.** Every table starts from ``defaults`` and then applies its ``tables:`` entry.
  An ``optimizer:`` (or ``initializer:``) section is merged key by key over the default one when
  it keeps the same ``type`` (or gives none), and replaces it when it names another type; Adam's
  ``eps`` then defaults to 1e-8. A table's ``seed`` defaults to the top-level ``seed``.

Every invalid value raises :class:`~embeddb.errors.ConfigError` whose key is the dotted path of
the offending YAML key, e.g. ``slots_config.age.dim``; read from a file, the message ends with
the file and the key's line (``(in conf.yaml:3)``). The dataclasses validate themselves on
construction too, so configs built in code are checked by the same rules and get the same
messages (a ``store:`` setting is named by its YAML key in code too: ``log_segment_mb``).
"""

from __future__ import annotations

from embeddb.config.model import EmbeddingConfig
from embeddb.config.store import (
    DiskTierConfig,
    ExportConfig,
    FsyncPolicy,
    LogRecovery,
    ParallelConfig,
    RamTierConfig,
    SnapshotConfig,
    StoreConfig,
    UpdateLogConfig,
)
from embeddb.config.tables import (
    Eviction,
    FeatureConfig,
    InitializerConfig,
    InitializerKind,
    OptimizerConfig,
    OptimizerKind,
    TableConfig,
)

__all__ = [
    "DiskTierConfig",
    "EmbeddingConfig",
    "Eviction",
    "ExportConfig",
    "FeatureConfig",
    "FsyncPolicy",
    "InitializerConfig",
    "InitializerKind",
    "LogRecovery",
    "OptimizerConfig",
    "OptimizerKind",
    "ParallelConfig",
    "RamTierConfig",
    "SnapshotConfig",
    "StoreConfig",
    "TableConfig",
    "UpdateLogConfig",
]
