"""The embedding configuration's reference, rendered from the dataclasses and the YAML schema.

``docs/configuration.md`` is generated, never edited by hand, so that it cannot drift from the
code: every YAML key comes from the parser's key sets (:mod:`embeddb.config.schema`), and each
key's type, default and description from the dataclass field it sets (its annotation, its
default, its entry in the class docstring's ``Attributes:`` section). A key the parser accepts
but no table here maps, or a field without an ``Attributes:`` entry, is an error, not a gap.

Regenerate the whole document (this part plus the training job's keys) with::

    python docs/generate.py

This module renders the embedding part only (:func:`render_reference`); it imports nothing
outside :mod:`embeddb.config` (the job's keys are rendered by ``docs/generate.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from embeddb.config import schema
from embeddb.config.model import EmbeddingConfig
from embeddb.config.store import FsyncPolicy, LogRecovery, StoreConfig
from embeddb.config.tables import (
    INITIALIZER_PARAMS,
    OPTIMIZER_PARAMS,
    Eviction,
    FeatureConfig,
    InitializerConfig,
    InitializerKind,
    OptimizerConfig,
    OptimizerKind,
    TableConfig,
)

__all__ = ["Row", "attribute_docs", "markdown_table", "render_reference"]

_HEADER_RE = re.compile(r"^(\w[\w ]*):\s*$")
_ENTRY_RE = re.compile(r"^(\w+)(?: \([^)]*\))?:\s*(.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """Parse the ``Attributes:`` section of a Google-style class docstring.

    Args:
        cls: a class whose docstring has an ``Attributes:`` section.

    Returns:
        ``{attribute name: its description}``, continuation lines joined with single spaces,
        in docstring order (empty when the class documents no attributes).
    """
    doc = inspect.getdoc(cls) or ""
    docs: dict[str, str] = {}
    inside = False
    entry_indent = -1
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not inside:
            inside = stripped == "Attributes:" and indent == 0
            continue
        if not stripped:
            continue
        if indent == 0:  # the next section (Raises:, Example:, ...) or prose: done
            break
        if entry_indent < 0:
            entry_indent = indent
        match = _ENTRY_RE.match(stripped)
        if indent == entry_indent and match:
            current = match.group(1)
            docs[current] = match.group(2).strip()
        elif current is not None:
            docs[current] = f"{docs[current]} {stripped}".strip()
    return docs


@dataclasses.dataclass(frozen=True)
class Row:
    """One documented key: ``key`` (YAML path), ``type``, ``default`` and ``meaning``."""

    key: str
    type: str
    default: str
    meaning: str


def markdown_table(rows: Iterable[Row]) -> str:
    """A Markdown table of ``rows``: key, type, default, meaning."""
    header = ["key", "type", "default", "meaning"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [f"`{row.key}`", row.type, row.default, row.meaning]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise LookupError(f"{cls.__name__} has no field {name!r}")


def _type_text(annotation: object) -> str:
    """The YAML-facing type of an annotation (dataclass annotations are strings here)."""
    text = str(annotation)
    enums: Mapping[str, type[enum.Enum]] = {
        "OptimizerKind": OptimizerKind,
        "InitializerKind": InitializerKind,
        "LogRecovery": LogRecovery,
        "FsyncPolicy": FsyncPolicy,
        "Eviction": Eviction,
    }
    if text in enums:
        return " \\| ".join(f"`{member.value}`" for member in enums[text])
    text = text.replace("str | None", "string or null").replace("float | None", "float or null")
    text = text.replace("int | None", "int, size string or null")
    return {"str": "string", "bool": "bool", "int": "int", "float": "float"}.get(text, text)


def _default_text(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return f"{value:_}".replace("_", ",") if abs(value) >= 10_000 else str(value)
    return f"`{value}`"


def _field_default(cls: type, name: str) -> object:
    f = _field(cls, name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _field_row(
    cls: type,
    key: str,
    name: str,
    *,
    default: str | None = None,
    type_text: str | None = None,
    note: str = "",
) -> Row:
    """A row for YAML ``key`` that sets field ``name`` of ``cls``."""
    docs = attribute_docs(cls)
    if name not in docs:
        raise LookupError(
            f"{cls.__name__}.{name} has no entry in the Attributes: section of its docstring"
        )
    f = _field(cls, name)
    if default is None:
        value = _field_default(cls, name)
        default = "required" if value is dataclasses.MISSING else _default_text(value)
    meaning = docs[name] + (f" {note}" if note else "")
    return Row(key, type_text or _type_text(f.type), default, meaning)


def _check_covered(what: str, accepted: Iterable[str], documented: Iterable[str]) -> None:
    missing = sorted(set(accepted) - set(documented))
    if missing:
        raise LookupError(f"{what}: the parser accepts {missing} but the reference omits them")


def _top_rows() -> list[Row]:
    rows = [
        _field_row(EmbeddingConfig, "feature_index_prefix_bit", "feature_index_prefix_bit"),
        _field_row(EmbeddingConfig, "seed", "seed"),
        _field_row(
            EmbeddingConfig,
            "slots_config",
            "features",
            type_text="mapping: feature name -> slot",
            default="{}",
            note="PERSIA's name; `slot_configs` and `slot_config` are accepted too (one of "
            "the three). Keys of a slot: see *Features*.",
        ),
        _field_row(
            EmbeddingConfig,
            "feature_groups",
            "feature_groups",
            type_text="mapping: group name -> list of feature names",
            default="{}",
            note="All features of a group read one table named after the group.",
        ),
        Row(
            "defaults",
            "mapping",
            "{}",
            "Table settings every table starts from (the *Tables* keys except `dim` and `seed`).",
        ),
        _field_row(
            EmbeddingConfig,
            "tables",
            "tables",
            type_text="mapping: table name -> table",
            default="{}",
            note="Per-table overrides of `defaults`, and standalone tables (which need `dim`).",
        ),
        _field_row(
            EmbeddingConfig,
            "store",
            "store",
            type_text="mapping",
            default="{}",
            note="Keys: see *Store*.",
        ),
    ]
    _check_covered("top level", schema.TOP_KEYS, [*schema.SLOTS_KEYS, *(r.key for r in rows)])
    return rows


def _feature_rows() -> list[Row]:
    yaml_to_field = {key: key for key in schema.SLOT_KEYS if key != "hash_stack_config"}
    for name, yaml_key in schema.FEATURE_KEY_ALIASES.items():
        yaml_to_field[yaml_key] = name
    rows = []
    for key, name in yaml_to_field.items():
        note = ""
        default = None
        if key == "table":
            default = "the feature's group"
            note = "(embeddb) An ungrouped feature's group is named after the feature."
        rows.append(_field_row(FeatureConfig, key, name, default=default, note=note))
    rows.sort(key=lambda r: (r.key.startswith("hash_stack_config"), r.key != "dim", r.key))
    documented = {r.key.partition(".")[0] for r in rows}
    _check_covered("slots_config.<feature>", schema.SLOT_KEYS, documented)
    stack_keys = {r.key.partition(".")[2] for r in rows if r.key.startswith("hash_stack_config.")}
    _check_covered("hash_stack_config", schema.HASH_STACK_KEYS, stack_keys)
    return rows


def _table_rows() -> list[Row]:
    rows = [
        _field_row(
            TableConfig, "dim", "dim", default="the reading features' `dim`", type_text="int"
        ),
        *(_field_row(TableConfig, key, key) for key in schema.TABLE_SETTINGS),
        _field_row(
            TableConfig,
            "optimizer",
            "optimizer",
            type_text="mapping",
            default="`{type: adagrad}`",
            note="Keys: see *Optimizer*.",
        ),
        _field_row(
            TableConfig,
            "initializer",
            "initializer",
            type_text="mapping",
            default="`{type: uniform}`",
            note="Keys: see *Initializer*.",
        ),
        _field_row(TableConfig, "seed", "seed", default="the top-level `seed`"),
    ]
    _check_covered("tables.<table>", schema.TABLE_KEYS, (r.key for r in rows))
    return rows


def _kinds_rows(
    cls: type,
    params_of: Mapping[Any, tuple[str, ...]],
    defaults: Callable[[str], str | None],
) -> list[Row]:
    rows = [_field_row(cls, "type", "kind")]
    seen: list[str] = []
    for params in params_of.values():
        seen.extend(p for p in params if p not in seen)
    for name in seen:
        kinds = [kind.value for kind, params in params_of.items() if name in params]
        rows.append(
            _field_row(cls, name, name, default=defaults(name), note=f"(`{'`, `'.join(kinds)}`)")
        )
    return rows


def _optimizer_default(name: str) -> str | None:
    if name == "eps":
        return f"{OptimizerConfig.eps!r} (`adam`: {schema.ADAM_DEFAULT_EPS!r})"
    return None


def _store_rows() -> list[Row]:
    store = StoreConfig()
    rows = [
        _field_row(type(getattr(store, group)), key, name)
        for key, (group, name) in schema.STORE_KEYS.items()
    ]
    fields = {
        (g.name, f.name)
        for g in dataclasses.fields(StoreConfig)
        for f in dataclasses.fields(getattr(store, g.name))
    }
    unmapped = sorted(fields - set(schema.STORE_KEYS.values()))
    if unmapped:
        raise LookupError(f"StoreConfig fields without a YAML key in STORE_KEYS: {unmapped}")
    return rows


def render_reference() -> str:
    """The embedding configuration reference as Markdown (``docs/configuration.md``, part 1).

    Raises:
        LookupError: a key the parser accepts is missing here, or a field has no
            ``Attributes:`` entry (fix the docstring or this module).
    """
    sections = [
        (
            "Top level",
            "Keys of the embedding config YAML file (`embeddb serve --config FILE`, a job's "
            "`embedding_config`). PERSIA's `embedding_config.yaml` is read as-is; "
            "`seed`, `defaults`, `tables` and `store` are embeddb's. A misspelt key is an "
            "error naming its path, with a suggestion.",
            _top_rows(),
        ),
        (
            "Features: `slots_config.<feature>`",
            "One entry per feature (PERSIA: slot). From `FeatureConfig`.",
            _feature_rows(),
        ),
        (
            "Tables: `defaults` and `tables.<table>`",
            "From `TableConfig`. A table starts from `defaults`, then applies its own entry.",
            _table_rows(),
        ),
        (
            "Optimizer: `<table>.optimizer`",
            "From `OptimizerConfig`. A section naming the same `type` as the default is merged "
            "over it key by key; another `type` starts from that type's defaults. A key "
            "another type uses is an error. State per row: "
            + "; ".join(
                f"`{kind.value}` {_state_text(kind)}"
                for kind in (OptimizerKind.SGD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM)
            )
            + " float32 values (see `docs/operations.md`, *Sizing*).",
            _kinds_rows(OptimizerConfig, OPTIMIZER_PARAMS, _optimizer_default),
        ),
        (
            "Initializer: `<table>.initializer`",
            "From `InitializerConfig`; merged like the optimizer.",
            _kinds_rows(InitializerConfig, INITIALIZER_PARAMS, lambda name: None),
        ),
        (
            "Store: `store`",
            "From `StoreConfig`: settings of every table's store on a shard, and durability. "
            "Flat in YAML; in code each key is a field of one of `StoreConfig`'s groups (`ram`, "
            "`disk`, `parallel`, `log`, `snapshots`, `export`), and every error names the key "
            "as written here. A key given on the command line is `--` + the key with dashes "
            "(today `--threads` of `embeddb serve` and `embeddb cluster`, and its variable "
            "`EMBEDDB_SERVE_THREADS` / `EMBEDDB_CLUSTER_THREADS`, and `--ram-budget` of "
            "`embeddb serve`): its value is read as YAML "
            "and checked by the same rule as in the file, with the same message.",
            _store_rows(),
        ),
    ]
    parts = []
    for title, intro, rows in sections:
        parts.append(f"### {title}\n\n{intro}\n\n{markdown_table(rows)}\n")
    parts.append(f"### Why the schema is hand-written\n\n{_HAND_WRITTEN}\n")
    return "\n".join(parts)


# Measured for issue 24 (pydantic 2.13.4 and msgspec 0.22.0, Python 3.11, one shared x86 core;
# the prototype declared the store: keys and a table entry with each library).
_HAND_WRITTEN = (
    "The validation above is plain dataclasses and a few checks (`embeddb/config/_checks.py`) "
    "rather than a schema library, because the libraries do not keep its messages. Declared "
    "with pydantic v2 or msgspec, none of the 15 `store:` keys' errors matched: they name the "
    "key but neither the value given nor the allowed range in the form above, suggest no "
    "spelling (`did you mean 'always'?`), and, like any library, know nothing of the YAML "
    "file. A pydantic wrapper that restores the messages of the `store:` keys alone took 75 "
    "lines of code, as many as the checks it would replace for every class, and the rules "
    "between keys (feature groups, shared tables, `defaults` merging, each optimizer's own "
    "keys) stay hand-written either way. Speed is no reason either: validation is a quarter "
    "or less of a load (0.2 to 4 ms of 3 to 21 ms for the presets and a 26-table file on a "
    "shared machine; reading the YAML is most of the rest), so the libraries would save a "
    "few ms at most, once per process, while importing pydantic and "
    "the prototype's classes adds about 170 ms to a command's start (msgspec: 8 ms) and its "
    "wheels weigh 2.6 MB (msgspec: 0.2 MB) against no new dependency today."
)


def _state_text(kind: OptimizerKind) -> str:
    """``state_dim`` as a formula in ``dim`` (it is affine in ``dim`` for every kind)."""
    config = OptimizerConfig(kind=kind)
    slope = config.state_dim(2) - config.state_dim(1)
    intercept = config.state_dim(1) - slope
    terms = [f"{slope} x dim" if slope != 1 else "dim"] if slope else []
    if intercept or not terms:
        terms.append(str(intercept))
    text = " + ".join(terms)
    if kind is OptimizerKind.ADAGRAD:
        shared = dataclasses.replace(config, vectorwise_shared=True)
        text += f" (`vectorwise_shared`: {shared.state_dim(2)})"
    return text
