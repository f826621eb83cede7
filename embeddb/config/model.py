"""The whole embedding configuration of a job, :class:`EmbeddingConfig`; it validates itself on
construction.

It gathers the tables, features and feature groups of a job (their dataclasses are in
:mod:`embeddb.config.tables`, re-exported here; its store settings are
:class:`~embeddb.config.store.StoreConfig`). Reading and writing the YAML schema is
:mod:`embeddb.config.schema`, which :meth:`EmbeddingConfig.from_yaml` and friends delegate to;
the imports run one way: ``tables`` <- ``schema`` <- ``model``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from embeddb.config import ram_budget, schema
from embeddb.config._checks import (
    MAX_PREFIX_BITS,
    as_int,
    describe,
    group_indices,
    group_of,
    set_field,
)
from embeddb.config.store import StoreConfig
from embeddb.config.tables import (
    INITIALIZER_PARAMS,
    OPTIMIZER_PARAMS,
    FeatureConfig,
    InitializerConfig,
    InitializerKind,
    OptimizerConfig,
    OptimizerKind,
    TableConfig,
)
from embeddb.errors import ConfigError, TableNotFoundError

__all__ = [
    "INITIALIZER_PARAMS",
    "OPTIMIZER_PARAMS",
    "EmbeddingConfig",
    "FeatureConfig",
    "InitializerConfig",
    "InitializerKind",
    "OptimizerConfig",
    "OptimizerKind",
    "TableConfig",
]

_BUDGET_KEY = "store.ram_budget"


@dataclass(frozen=True)
class EmbeddingConfig:
    """The whole embedding configuration of a job: tables, features and feature groups.

    Build one with :meth:`from_yaml` (the usual way), :meth:`from_dict` or :meth:`single_table`.
    The mappings are read-only views in insertion order: tables in the order features first read
    them, then standalone tables; features in file order.

    Attributes:
        tables: table name -> table.
        features: feature name -> feature.
        feature_groups: group name -> names of its features (ungrouped features are not listed).
        feature_index_prefix_bit: bits of every id that hold the group index, in [0, 32].
        store: settings of every table's store.
        seed: default initializer seed of the tables, >= 0.

    Raises:
        ConfigError: on construction, when the parts are inconsistent: a feature reads an unknown
            table or one of another ``dim``, group membership or group indices disagree with
            ``feature_groups``, or no table is defined.
    """

    tables: Mapping[str, TableConfig]
    features: Mapping[str, FeatureConfig] = field(default_factory=dict)
    feature_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    feature_index_prefix_bit: int = 8
    store: StoreConfig = field(default_factory=StoreConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        bits = as_int(
            self.feature_index_prefix_bit,
            "feature_index_prefix_bit",
            minimum=0,
            maximum=MAX_PREFIX_BITS,
        )
        set_field(self, "feature_index_prefix_bit", bits)
        set_field(self, "seed", as_int(self.seed, "seed", minimum=0))
        if not isinstance(self.store, StoreConfig):
            raise ConfigError("store", f"must be a StoreConfig, got {describe(self.store)}")
        set_field(self, "tables", _by_name(self.tables, TableConfig, "tables"))
        set_field(self, "features", _by_name(self.features, FeatureConfig, "features"))
        if not self.tables:
            raise ConfigError("tables", "no tables: define slots_config or tables")
        if not isinstance(self.feature_groups, Mapping):
            raise ConfigError(
                "feature_groups", f"must be a mapping, got {describe(self.feature_groups)}"
            )
        group_by_feature = group_of(self.feature_groups, self.features)
        groups = {group: tuple(members) for group, members in self.feature_groups.items()}
        set_field(self, "feature_groups", types.MappingProxyType(groups))
        index_of = group_indices(groups, group_by_feature, self.features, bits)
        for feature in self.features.values():
            group = group_by_feature.get(feature.name, feature.name)
            self._check_feature(feature, group, index_of)
        if self.store.ram.budget is not None:  # the capacities are all explicit by now
            ram_budget.resolve_capacities(self.tables, frozenset(), self.store.ram, _BUDGET_KEY)

    def ram_bytes(self) -> dict[str, int]:
        """Bytes of each table's RAM tier on a shard (:mod:`embeddb.config.ram_budget`)."""
        return {
            n: ram_budget.table_ram_bytes(
                t.capacity, t.row_width, self.store.ram, ram_budget.has_sketch(t)
            )
            for n, t in self.tables.items()
        }

    def _check_feature(
        self, feature: FeatureConfig, group: str, index_of: Mapping[str, int]
    ) -> None:
        path = f"features.{feature.name}"
        table = self.tables.get(feature.table)
        if table is None:
            raise ConfigError(f"{path}.table", f"unknown table {feature.table!r}")
        if feature.dim != table.dim:
            raise ConfigError(
                f"{path}.dim", f"{feature.dim} differs from dim {table.dim} of table {table.name!r}"
            )
        if feature.group != group:
            raise ConfigError(
                f"{path}.group", f"must be {group!r} (from feature_groups), got {feature.group!r}"
            )
        if feature.group_index != index_of[group]:
            raise ConfigError(
                f"{path}.group_index",
                f"must be {index_of[group]}: groups are numbered in feature_groups order, then "
                f"ungrouped features in features order; got {feature.group_index}",
            )
        if feature.prefix_bits != self.feature_index_prefix_bit:
            raise ConfigError(
                f"{path}.prefix_bits",
                f"must equal feature_index_prefix_bit ({self.feature_index_prefix_bit}), "
                f"got {feature.prefix_bits}",
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Read-only mapping views do not pickle; rebuild from plain dicts (multiprocessing, copy).
        return (
            type(self),
            (
                dict(self.tables),
                dict(self.features),
                dict(self.feature_groups),
                self.feature_index_prefix_bit,
                self.store,
                self.seed,
            ),
        )

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self.tables.items()),
                tuple(self.features.items()),
                tuple(self.feature_groups.items()),
                self.feature_index_prefix_bit,
                self.store,
                self.seed,
            )
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> EmbeddingConfig:
        """Load and validate a YAML config file.

        Args:
            path: the YAML file.

        Raises:
            ConfigError: the file is missing or unreadable, is not valid YAML, or the config is
                invalid (the message names the key path, and the file and the key's line:
                ``store.fsync: unknown fsync policy ... (in conf.yaml:7)``).
        """
        text, source = schema.read_yaml_file(path)
        return cls.from_yaml_text(text, source=source)

    @classmethod
    def from_yaml_text(cls, text: str, source: str = "<string>") -> EmbeddingConfig:
        """Parse and validate a YAML config document.

        Besides standard YAML, ``1e-10`` (an exponent without a dot) reads as a float, and a
        mapping with a duplicate key is an error instead of silently keeping the last value.

        Args:
            text: the YAML document.
            source: where the text came from, for error messages: an invalid config's message
                ends with `` (in SOURCE:LINE)``, the line of the offending key (or of the
                nearest key around it), unless ``source`` is ``"<string>"``.

        Raises:
            ConfigError: invalid YAML or an invalid config.
        """
        data = schema.load_yaml(text, source)
        with schema.naming_source(source, text):
            return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmbeddingConfig:
        """Build a config from parsed YAML data (the schema in the package docstring).

        Raises:
            ConfigError: the data is not a mapping or the config is invalid.
        """
        return cls(**schema.parse(data))

    @classmethod
    def single_table(cls, name: str, dim: int, **table_kwargs: Any) -> EmbeddingConfig:
        """Build a config of one table and no features (for tests and benchmarks).

        Args:
            name: the table name.
            dim: the table's vector width.
            **table_kwargs: further :class:`TableConfig` fields.

        Raises:
            ConfigError: an invalid table setting.
        """
        return cls(tables={name: TableConfig(name=name, dim=dim, **table_kwargs)})

    def table(self, name: str) -> TableConfig:
        """Return the table called ``name``.

        Raises:
            TableNotFoundError: no such table.
        """
        try:
            return self.tables[name]
        except KeyError:
            raise TableNotFoundError(name, tuple(self.tables)) from None

    def to_dict(self) -> dict[str, Any]:
        """Return plain data in the YAML schema; ``from_dict(c.to_dict()) == c``.

        Every table and feature is written out in full (each slot with its explicit ``table``),
        so the result needs no ``defaults`` section and can be dumped with ``yaml.safe_dump``.
        """
        return {
            "feature_index_prefix_bit": self.feature_index_prefix_bit,
            "seed": self.seed,
            "slots_config": {name: schema.feature_to_dict(f) for name, f in self.features.items()},
            "feature_groups": {
                name: list(members) for name, members in self.feature_groups.items()
            },
            "tables": {name: schema.table_to_dict(t) for name, t in self.tables.items()},
            "store": schema.store_keys(self.store),
        }


def _by_name(items: object, kind: type, key: str) -> Mapping[str, Any]:
    """``items`` as a read-only mapping, checking that each is a ``kind`` named by its key."""
    if not isinstance(items, Mapping):
        raise ConfigError(
            key, f"must be a mapping of name -> {kind.__name__}, got {describe(items)}"
        )
    for name, item in items.items():
        if not isinstance(item, kind) or getattr(item, "name", None) != name:
            raise ConfigError(
                f"{key}.{name}", f"must be a {kind.__name__} named {name!r}, got {item!r}"
            )
    return types.MappingProxyType(dict(items))
