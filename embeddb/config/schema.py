"""The YAML schema: reading a config file, parsing it (PERSIA keys plus embeddb's), writing back.

The schema itself, with a worked example, is in the :mod:`embeddb.config` package docstring;
the key sets here are what the parser accepts (and what :mod:`embeddb.config.reference`
documents). :class:`~embeddb.config.model.EmbeddingConfig`'s ``from_yaml``, ``from_yaml_text``,
``from_dict`` and ``to_dict`` delegate to this module, which builds on the dataclasses of
:mod:`embeddb.config.tables` and :mod:`embeddb.config.store` and never imports
:mod:`embeddb.config.model` (``tests/test_architecture_cycles.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import re
import types
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from embeddb.config import ram_budget
from embeddb.config._checks import (
    MAX_PREFIX_BITS,
    KindT,
    as_int,
    as_kind,
    as_name,
    describe,
    detail,
    did_you_mean,
    group_indices,
    group_of,
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
from embeddb.errors import ConfigError

__all__ = [
    "ADAM_DEFAULT_EPS",
    "FEATURE_KEY_ALIASES",
    "HASH_STACK_KEYS",
    "SLOTS_KEYS",
    "SLOT_KEYS",
    "STORE_KEYS",
    "TABLE_KEYS",
    "TABLE_SETTINGS",
    "TOP_KEYS",
    "feature_to_dict",
    "key_line",
    "load_yaml",
    "naming_source",
    "parse",
    "read_yaml_file",
    "store_from_keys",
    "store_keys",
    "table_to_dict",
]

# PERSIA's docs and its versions spell the features section three ways; the first is canonical.
SLOTS_KEYS = ("slots_config", "slot_configs", "slot_config")
TOP_KEYS = frozenset(
    {
        *SLOTS_KEYS,
        "feature_index_prefix_bit",
        "feature_groups",
        "seed",
        "defaults",
        "tables",
        "store",
    }
)
SLOT_KEYS = frozenset(
    {
        "dim",
        "embedding_summation",
        "sqrt_scaling",
        "sample_fixed_size",
        "hash_stack_config",
        "table",
    }
)
_SLOT_SETTINGS = ("embedding_summation", "sqrt_scaling", "sample_fixed_size")
HASH_STACK_KEYS = frozenset({"hash_stack_rounds", "embedding_size"})
TABLE_SETTINGS = ("admit_probability", "weight_bound", "capacity", "eviction")
_DEFAULTS_KEYS = frozenset({"optimizer", "initializer", *TABLE_SETTINGS})
TABLE_KEYS = _DEFAULTS_KEYS | {"dim", "seed"}
# The flat ``store:`` keys of the YAML → (group, field) of StoreConfig, in the documented order.
STORE_KEYS: Mapping[str, tuple[str, str]] = types.MappingProxyType(
    {
        "stripes": ("ram", "stripes"),
        "eviction_chunk": ("ram", "eviction_chunk"),
        "min_stripe_rows": ("ram", "min_stripe_rows"),
        "ram_budget": ("ram", "budget"),
        "disk_cache_mb": ("disk", "cache_mb"),
        "threads": ("parallel", "threads"),
        "parallel_min_ids": ("parallel", "min_ids"),
        "update_log": ("log", "enabled"),
        "fsync": ("log", "fsync"),
        "fsync_interval_ms": ("log", "fsync_interval_ms"),
        "log_segment_mb": ("log", "segment_mb"),
        "log_lz4_min_bytes": ("log", "lz4_min_bytes"),
        "log_recovery": ("log", "recovery"),
        "snapshot_retention": ("snapshots", "retention"),
        "export_dir": ("export", "directory"),
        "export_interval_s": ("export", "interval_s"),
    }
)
FEATURE_KEY_ALIASES = types.MappingProxyType(
    {
        "hash_stack_rounds": "hash_stack_config.hash_stack_rounds",
        "hash_stack_size": "hash_stack_config.embedding_size",
    }
)
_KIND_KEY_ALIASES = types.MappingProxyType({"kind": "type"})

# Adam's ``eps`` when a section switches to adam without giving one (OptimizerConfig's is 1e-10).
ADAM_DEFAULT_EPS = 1e-8
_TEMPLATE_TABLE = "defaults"  # name of the placeholder table that holds the parsed `defaults:`


# --------------------------------------------------------------------------------------------
# YAML schema -> EmbeddingConfig fields
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _at(path: str, aliases: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-key ConfigErrors of a dataclass constructor from its field names to YAML paths."""
    try:
        yield
    except ConfigError as exc:
        head, dot, rest = exc.key.partition(".")
        key = (aliases or {}).get(head, head) + dot + rest
        full = ".".join(part for part in (path, key) if part)
        raise ConfigError(full, detail(exc)) from exc.__cause__


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _section(raw: object, path: str, known: Collection[str] | None = None) -> Mapping[str, Any]:
    """Return ``raw`` as a mapping (``None`` -> empty), checking its keys against ``known``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"must be a mapping, got {describe(raw)}")
    if known is not None:
        _check_keys(raw, path, known)
    return raw


def _check_keys(section: Mapping[Any, Any], path: str, known: Collection[str]) -> None:
    for key in section:
        if key not in known:
            hint = did_you_mean(str(key), known)
            choices = ", ".join(sorted(known))
            raise ConfigError(_join(path, key), f"unknown key{hint}; known keys: {choices}")


def parse(data: object) -> dict[str, Any]:
    """Parse YAML data (the schema in the package docstring) into ``EmbeddingConfig`` fields.

    Raises:
        ConfigError: the data is not a mapping or a key is invalid (named by its dotted path).
    """
    if data is None:
        raise ConfigError("", "the config is empty")
    if not isinstance(data, Mapping):
        raise ConfigError(
            "", f"the top level must be a mapping of config keys, got {describe(data)}"
        )
    top: Mapping[str, Any] = data
    _section(top, "", TOP_KEYS)
    bits = as_int(
        top.get("feature_index_prefix_bit", 8),
        "feature_index_prefix_bit",
        minimum=0,
        maximum=MAX_PREFIX_BITS,
    )
    seed = as_int(top.get("seed", 0), "seed", minimum=0)
    slots_key, slots = _slots_section(top)
    for name in slots:
        as_name(name, slots_key, "feature name")
    groups = _section(top.get("feature_groups"), "feature_groups")
    group_by_feature = group_of(groups, slots)
    index_of = group_indices(groups, group_by_feature, slots, bits)
    features: dict[str, FeatureConfig] = {}
    for name, raw in slots.items():
        group = group_by_feature.get(name, name)
        features[name] = _parse_feature(
            f"{slots_key}.{name}", name, raw, group, index_of[group], bits
        )
    _check_shared_tables(features, slots_key)
    template = _parse_defaults(top.get("defaults"), seed)
    entries = _section(top.get("tables"), "tables")
    tables = _parse_tables(entries, features, template)
    store = _parse_store(top.get("store"))
    if store.ram.budget is not None:
        tables = ram_budget.resolve_capacities(
            tables, _shared_tables(top, entries, tables), store.ram, "store.ram_budget"
        )
    return {
        "tables": tables,
        "features": features,
        "feature_groups": {group: tuple(members) for group, members in groups.items()},
        "feature_index_prefix_bit": bits,
        "store": store,
        "seed": seed,
    }


def _shared_tables(
    top: Mapping[str, Any], entries: Mapping[str, Any], tables: Mapping[str, TableConfig]
) -> frozenset[str]:
    """The tables whose ``capacity`` neither ``defaults`` nor their ``tables`` entry gives:
    they share the ``ram_budget`` (:func:`~embeddb.config.ram_budget.resolve_capacities`)."""
    defaults = top.get("defaults")
    if isinstance(defaults, Mapping) and "capacity" in defaults:
        return frozenset()
    return frozenset(
        name
        for name in tables
        if not (isinstance(entries.get(name), Mapping) and "capacity" in entries[name])
    )


def _slots_section(top: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    present = [key for key in SLOTS_KEYS if key in top]
    if len(present) > 1:
        raise ConfigError(present[1], f"duplicates {present[0]!r}: give the features once")
    key = present[0] if present else SLOTS_KEYS[0]
    return key, _section(top.get(key), key)


def _parse_feature(
    path: str, name: str, raw: object, group: str, group_index: int, prefix_bits: int
) -> FeatureConfig:
    slot = _section(raw, path, SLOT_KEYS)
    if "dim" not in slot:
        raise ConfigError(f"{path}.dim", "required key is missing")
    stack = _section(slot.get("hash_stack_config"), f"{path}.hash_stack_config", HASH_STACK_KEYS)
    rounds = stack.get("hash_stack_rounds", 0)
    disabled = rounds == 0 and not isinstance(rounds, bool)  # PERSIA ignores the size then
    settings = {key: slot[key] for key in _SLOT_SETTINGS if key in slot}
    with _at(path, FEATURE_KEY_ALIASES):
        return FeatureConfig(
            name=name,
            table=slot.get("table", group),
            dim=slot["dim"],
            group=group,
            group_index=group_index,
            hash_stack_rounds=rounds,
            hash_stack_size=0 if disabled else stack.get("embedding_size", 0),
            prefix_bits=prefix_bits,
            **settings,
        )


def _check_shared_tables(features: Mapping[str, FeatureConfig], slots_key: str) -> None:
    """Features reading one table need equal dim and equal hash-stack settings."""
    first_reader: dict[str, FeatureConfig] = {}
    for feature in features.values():
        other = first_reader.setdefault(feature.table, feature)
        path = f"{slots_key}.{feature.name}"
        shared = f"both read table {feature.table!r}"
        if feature.dim != other.dim:
            raise ConfigError(
                f"{path}.dim",
                f"{feature.dim} differs from dim {other.dim} of feature {other.name!r}; {shared}",
            )
        stack = (feature.hash_stack_rounds, feature.hash_stack_size)
        if stack != (other.hash_stack_rounds, other.hash_stack_size):
            raise ConfigError(
                f"{path}.hash_stack_config",
                f"(rounds, embedding_size) {stack} differs from "
                f"{(other.hash_stack_rounds, other.hash_stack_size)} of feature {other.name!r}; "
                f"{shared}",
            )


def _kind_and_params(
    section: Mapping[str, Any],
    path: str,
    kind_type: type[KindT],
    base_kind: KindT,
    params_of: Mapping[KindT, tuple[str, ...]],
) -> tuple[KindT, dict[str, Any]]:
    """Split an optimizer/initializer section into its kind and the parameters it sets."""
    what = f"{path.rpartition('.')[2]} type"
    kind = (
        as_kind(kind_type, section["type"], f"{path}.type", what)
        if "type" in section
        else base_kind
    )
    params = {key: value for key, value in section.items() if key != "type"}
    allowed = params_of[kind]
    for key in params:
        if key not in allowed:
            takes = f"it takes: {', '.join(allowed)}" if allowed else "it takes no parameters"
            raise ConfigError(f"{path}.{key}", f"does not apply to {what} {kind.value!r}; {takes}")
    return kind, params


def _parse_optimizer(raw: object, path: str, base: OptimizerConfig) -> OptimizerConfig:
    known = {"type", *(key for keys in OPTIMIZER_PARAMS.values() for key in keys)}
    section = _section(raw, path, known)
    kind, params = _kind_and_params(section, path, OptimizerKind, base.kind, OPTIMIZER_PARAMS)
    if kind is not base.kind:
        eps = ADAM_DEFAULT_EPS if kind is OptimizerKind.ADAM else OptimizerConfig.eps
        base = OptimizerConfig(kind=kind, eps=eps)
    with _at(path, _KIND_KEY_ALIASES):
        return dataclasses.replace(base, **params)


def _parse_initializer(raw: object, path: str, base: InitializerConfig) -> InitializerConfig:
    known = {"type", *(key for keys in INITIALIZER_PARAMS.values() for key in keys)}
    section = _section(raw, path, known)
    kind, params = _kind_and_params(section, path, InitializerKind, base.kind, INITIALIZER_PARAMS)
    if kind is not base.kind:
        base = InitializerConfig(kind=kind)
    with _at(path, _KIND_KEY_ALIASES):
        return dataclasses.replace(base, **params)


def _table_changes(section: Mapping[str, Any], path: str, base: TableConfig) -> dict[str, Any]:
    """The TableConfig fields a ``defaults`` or ``tables`` entry sets."""
    changes = {key: section[key] for key in (*TABLE_SETTINGS, "dim", "seed") if key in section}
    if "optimizer" in section:
        changes["optimizer"] = _parse_optimizer(
            section["optimizer"], f"{path}.optimizer", base.optimizer
        )
    if "initializer" in section:
        changes["initializer"] = _parse_initializer(
            section["initializer"], f"{path}.initializer", base.initializer
        )
    return changes


def _parse_defaults(raw: object, seed: int) -> TableConfig:
    """Parse ``defaults`` into a template table that every table starts from."""
    section = _section(raw, "defaults", _DEFAULTS_KEYS)
    base = TableConfig(name=_TEMPLATE_TABLE, dim=1, seed=seed)
    changes = _table_changes(section, "defaults", base)
    with _at("defaults"):
        return dataclasses.replace(base, **changes)


def _parse_tables(
    entries: Mapping[str, Any], features: Mapping[str, FeatureConfig], template: TableConfig
) -> dict[str, TableConfig]:
    for name in entries:
        as_name(name, "tables", "table name")
    first_reader: dict[str, FeatureConfig] = {}
    for feature in features.values():
        first_reader.setdefault(feature.table, feature)
    tables = {
        name: _parse_table(name, entries.get(name), template, reader)
        for name, reader in first_reader.items()
    }
    for name, raw in entries.items():
        if name not in tables:
            tables[name] = _parse_table(name, raw, template, None)
    return tables


def _parse_table(
    name: str, raw: object, template: TableConfig, reader: FeatureConfig | None
) -> TableConfig:
    path = f"tables.{name}"
    section = _section(raw, path, TABLE_KEYS)
    if reader is None and "dim" not in section:
        raise ConfigError(f"{path}.dim", "required for a table that no feature reads")
    changes: dict[str, Any] = {"name": name}
    if reader is not None:
        changes["dim"] = reader.dim
    changes.update(_table_changes(section, path, template))
    with _at(path):
        table = dataclasses.replace(template, **changes)
    if reader is not None and table.dim != reader.dim:
        raise ConfigError(
            f"{path}.dim",
            f"{table.dim} differs from dim {reader.dim} of feature {reader.name!r}, which reads "
            "this table",
        )
    return table


def _parse_store(raw: object) -> StoreConfig:
    section = _section(raw, "store", STORE_KEYS)
    with _at("store"):
        return store_from_keys(section)


def store_from_keys(keys: Mapping[str, Any], base: StoreConfig | None = None) -> StoreConfig:
    """``base`` (default: ``StoreConfig()``) with the flat YAML ``store:`` keys ``keys`` set in
    their groups (:data:`STORE_KEYS`), e.g. ``{"fsync": "always"}`` sets ``log.fsync``.

    Raises:
        ConfigError: an unknown key, or an invalid value (named by its YAML key).
    """
    _check_keys(keys, "", STORE_KEYS)
    store = base if base is not None else StoreConfig()
    changes: dict[str, dict[str, Any]] = {}
    for key, value in keys.items():
        group, name = STORE_KEYS[key]
        changes.setdefault(group, {})[name] = value
    groups = {g: dataclasses.replace(getattr(store, g), **c) for g, c in changes.items()}
    return dataclasses.replace(store, **groups)


def store_keys(store: StoreConfig) -> dict[str, Any]:
    """``store`` as the flat YAML ``store:`` mapping (enums as their values)."""
    return {key: _plain(getattr(getattr(store, g), name)) for key, (g, name) in STORE_KEYS.items()}


# --------------------------------------------------------------------------------------------
# Dataclasses -> YAML schema (EmbeddingConfig.to_dict puts the parts together)
# --------------------------------------------------------------------------------------------


def _plain(value: object) -> object:
    """``value`` as YAML-safe plain data (an enum as its value)."""
    return value.value if isinstance(value, enum.Enum) else value


def feature_to_dict(feature: FeatureConfig) -> dict[str, Any]:
    """``feature`` as its ``slots_config`` entry, with its explicit ``table``."""
    slot: dict[str, Any] = {
        "dim": feature.dim,
        "table": feature.table,
        "embedding_summation": feature.embedding_summation,
        "sqrt_scaling": feature.sqrt_scaling,
        "sample_fixed_size": feature.sample_fixed_size,
    }
    if feature.hash_stack_rounds:
        slot["hash_stack_config"] = {
            "hash_stack_rounds": feature.hash_stack_rounds,
            "embedding_size": feature.hash_stack_size,
        }
    return slot


def table_to_dict(table: TableConfig) -> dict[str, Any]:
    """``table`` as its full ``tables`` entry (every setting, optimizer and initializer)."""
    optimizer, initializer = table.optimizer, table.initializer
    return {
        "dim": table.dim,
        "optimizer": {
            "type": optimizer.kind.value,
            **{key: getattr(optimizer, key) for key in OPTIMIZER_PARAMS[optimizer.kind]},
        },
        "initializer": {
            "type": initializer.kind.value,
            **{key: getattr(initializer, key) for key in INITIALIZER_PARAMS[initializer.kind]},
        },
        "admit_probability": table.admit_probability,
        "weight_bound": table.weight_bound,
        "capacity": table.capacity,
        "eviction": table.eviction.value,
        "seed": table.seed,
    }


# --------------------------------------------------------------------------------------------
# Reading YAML
# --------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys and reads ``1e-10`` as a float."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            with contextlib.suppress(TypeError):  # unhashable keys: the base class reports them
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 floats need a dot and a signed exponent (`1.0e-10`); also accept `1e-10`, `1.5e3`.
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Read a config file.

    Returns:
        ``(text, source)``: the file's text and its path as a string, for error messages.

    Raises:
        ConfigError: the file is missing or unreadable.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError("", f"config file not found: {file}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read config file {file}: {exc}") from exc
    return text, str(file)


def load_yaml(text: str, source: str) -> Any:
    """Parse a YAML document with ``_YamlLoader`` (no config validation yet).

    Raises:
        ConfigError: the text is not valid YAML (the message names ``source``).
    """
    try:
        return yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{source}: invalid YAML: {exc}") from exc


def key_line(text: str, key: str) -> int | None:
    """The 1-based line of the YAML key path ``key`` (``tables.t.optimizer.lr``) in ``text``,
    or of its nearest enclosing key that the text holds (a missing ``dim`` is reported at its
    slot); None when there is none, or the text is not YAML.

    Called only when an error is reported: the text is composed again (node marks only).
    """
    try:
        node = yaml.compose(text, Loader=_YamlLoader)
    except yaml.YAMLError:
        return None
    lines: dict[str, int] = {}
    pending: list[tuple[str, Any]] = [("", node)]
    while pending:
        prefix, current = pending.pop()
        if not isinstance(current, yaml.MappingNode):
            continue
        for key_node, child in current.value:
            path = _join(prefix, key_node.value)
            lines.setdefault(path, key_node.start_mark.line + 1)
            pending.append((path, child))
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        line = lines.get(".".join(parts[:end]))
        if line is not None:
            return line
    return None


@contextlib.contextmanager
def naming_source(source: str, text: str | None = None) -> Iterator[None]:
    """Add `` (in SOURCE:LINE)`` to a ConfigError raised inside, the line being its key's in
    ``text`` (:func:`key_line`; `` (in SOURCE)`` without one), unless ``source`` is
    ``"<string>"``."""
    try:
        yield
    except ConfigError as exc:
        if source == "<string>":
            raise
        line = key_line(text, exc.key) if text is not None and exc.key else None
        where = source if line is None else f"{source}:{line}"
        raise ConfigError(exc.key, f"{detail(exc)} (in {where})") from exc.__cause__
