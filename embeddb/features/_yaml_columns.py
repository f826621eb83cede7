"""The column entries of a ``dataset:`` node: ``ids``, ``numeric``, ``label``, libSVM's
``slots`` and the ``derived`` columns (each checked, errors at their key path and line).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from embeddb.errors import ConfigError
from embeddb.features._yaml_keys import Keys, as_int, as_list, as_string, message_of
from embeddb.features.libsvm import FEATURES, LABEL, field_column, libsvm_spec, range_column
from embeddb.features.spec import (
    DerivedColumn,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
    TimePart,
    TimeUnit,
)

__all__ = [
    "TRANSFORMS",
    "check_libsvm",
    "derived_columns",
    "id_column",
    "label_column",
    "libsvm_index",
    "libsvm_node",
    "libsvm_slots",
    "numeric_column",
]

TRANSFORMS = ("none", "log1p", "standardize")


def id_column(entry: object, key: str, keys: Keys, column_keys: dict[str, str]) -> IDColumn:
    """An ``ids`` entry: a column name or ``{column, name, kind, separator, namespace,
    missing_id}``."""
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error(key, f"must be a column name or a mapping, got {entry!r}")
    allowed = {"column", "name", "kind", "separator", "namespace", "missing_id"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"{key}.{unknown[0]}", f"is not an id setting ({', '.join(sorted(allowed))})"
        )
    if "column" not in entry:
        raise keys.error(f"{key}.column", "is required")
    kind = entry.get("kind", "string")
    if kind not in [k.value for k in IdKind]:
        raise keys.error(f"{key}.kind", f"must be string, int or hex, got {kind!r}")
    try:
        column = IDColumn(
            entry["column"],
            name=entry.get("name"),
            kind=IdKind(kind),
            separator=entry.get("separator"),
            namespace=entry.get("namespace"),
            missing_id=entry.get("missing_id"),
        )
    except ConfigError as exc:
        raise keys.error(f"{key}.{exc.key}", message_of(exc)) from None
    column_keys.setdefault(column.column, key)
    return column


def numeric_column(
    entry: object, key: str, keys: Keys, column_keys: dict[str, str]
) -> tuple[NumericColumn, bool]:
    """A ``numeric`` entry, and whether it asks for ``standardize``."""
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error(key, f"must be a column name or a mapping, got {entry!r}")
    allowed = {"column", "columns", "name", "transform", "fill"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"{key}.{unknown[0]}", f"is not a numeric setting ({', '.join(sorted(allowed))})"
        )
    if ("column" in entry) == ("columns" in entry):
        raise keys.error(key, "needs column: NAME or columns: [NAME, ...] (one of them)")
    columns: tuple[str, ...]
    if "column" in entry:
        columns = (as_string(entry["column"], f"{key}.column", keys),)
        name = entry.get("name", columns[0])
    else:
        cols = as_list(entry["columns"], f"{key}.columns", keys)
        columns = tuple(as_string(c, f"{key}.columns[{i}]", keys) for i, c in enumerate(cols))
        if "name" not in entry:
            raise keys.error(f"{key}.name", "is required with columns: [...]")
        name = entry["name"]
    transform = entry.get("transform", "none")
    if transform not in TRANSFORMS:
        raise keys.error(
            f"{key}.transform", f"must be one of {', '.join(TRANSFORMS)}, got {transform!r}"
        )
    fill = entry.get("fill", 0.0)
    if isinstance(fill, bool) or not isinstance(fill, (int, float)):
        raise keys.error(f"{key}.fill", f"must be a number, got {fill!r}")
    try:
        column = NumericColumn(columns, name=name, log1p=transform == "log1p", fill=float(fill))
    except ConfigError as exc:
        raise keys.error(f"{key}.{exc.key}", message_of(exc)) from None
    for c in columns:
        column_keys.setdefault(c, key)
    return column, transform == "standardize"


def label_column(entry: object, keys: Keys, column_keys: dict[str, str]) -> LabelColumn:
    """The ``label`` entry: a column name or ``{column, name, positive, threshold}``."""
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error("label", f"must be {{column: NAME}} or a column name, got {entry!r}")
    allowed = {"column", "name", "positive", "threshold"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"label.{unknown[0]}", f"is not a label setting ({', '.join(sorted(allowed))})"
        )
    if "column" not in entry:
        raise keys.error("label.column", "is required")
    positive = entry.get("positive", ())
    if isinstance(positive, (str, int, float)) and not isinstance(positive, bool):
        positive = [positive]
    positive = as_list(positive, "label.positive", keys)
    threshold = entry.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float))
    ):
        raise keys.error("label.threshold", f"must be a number, got {threshold!r}")
    try:
        label = LabelColumn(
            entry["column"],
            name=entry.get("name"),
            positive=tuple(str(p) for p in positive),
            threshold=None if threshold is None else float(threshold),
        )
    except ConfigError as exc:
        raise keys.error(f"label.{exc.key}", message_of(exc)) from None
    column_keys.setdefault(label.column, "label")
    return label


def libsvm_node(node: dict[str, Any], keys: Keys) -> dict[str, Any]:
    """A libSVM ``dataset:`` node with its defaults: ``label`` is the label column,
    ``ids: [features]`` without ``slots`` (every index present, as int ids; none with slots),
    and ``numeric:`` index numbers (``17``) as the column names ``"17"`` (see :mod:`.libsvm`).
    """
    base = libsvm_spec()
    out = dict(node)
    out.setdefault("label", {"column": LABEL})
    ids = []
    default = [] if "slots" in node else [FEATURES]
    for i, entry in enumerate(as_list(node.get("ids", default), "ids", keys)):
        if isinstance(entry, Mapping):
            if "separator" in entry:
                raise keys.error(f"ids[{i}].separator", "does not apply to a libsvm file")
            entry = {"kind": base.ids[0].kind.value, **entry}
        elif entry == FEATURES:
            entry = {"column": FEATURES, "kind": base.ids[0].kind.value}
        ids.append(entry)
    out["ids"] = ids
    numeric = []
    for i, entry in enumerate(as_list(node.get("numeric", []), "numeric", keys)):
        key = f"numeric[{i}]"
        if isinstance(entry, Mapping):
            entry = dict(entry)
            if "column" in entry:
                entry["column"] = libsvm_index(entry["column"], f"{key}.column", keys)
            if "columns" in entry:
                cols = as_list(entry["columns"], f"{key}.columns", keys)
                entry["columns"] = [
                    libsvm_index(c, f"{key}.columns[{j}]", keys) for j, c in enumerate(cols)
                ]
        else:
            entry = libsvm_index(entry, key, keys)
        numeric.append(entry)
    out["numeric"] = numeric
    return out


def libsvm_index(value: object, key: str, keys: Keys) -> str:
    """A libSVM feature index (``17`` or ``"17"``) as its column name ``"17"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return str(int(value))
    raise keys.error(key, f"must be a libsvm feature index (an integer >= 0), got {value!r}")


def check_libsvm(ids: Sequence[IDColumn], label: LabelColumn, keys: Keys) -> None:
    """The columns a libSVM file has: ``features`` for ids, ``label`` as is."""
    for i, column in enumerate(ids):
        if column.column != FEATURES:
            raise keys.error(
                f"ids[{i}]",
                f"a libsvm file has one id column, {FEATURES!r} (every index no slot takes), "
                f"not {column.column!r} (an ID feature per field or index range: slots:)",
            )
    if label.column != LABEL:
        message = f"a libsvm file's label column is {LABEL!r}, not {label.column!r}"
        raise keys.error("label.column", message)
    if label.positive or label.threshold is not None:
        message = "a libsvm label is 1/+1 (positive) or 0/-1: no positive or threshold"
        raise keys.error("label", message)


def libsvm_slots(value: object, keys: Keys) -> list[IDColumn]:
    """``slots:``: feature name -> ``{field: N}`` (the ``N:index:value`` tokens; ``N`` alone
    is short for it) or ``{indexes: [FIRST, LAST]}`` (an inclusive index range), each with
    optional ``kind`` (int, the default, or string) and ``missing_id``."""
    if not isinstance(value, Mapping) or not value:
        raise keys.error(
            "slots",
            f"must map feature names to {{field: N}} or {{indexes: [FIRST, LAST]}}, got {value!r}",
        )
    out: list[IDColumn] = []
    fields: dict[int, str] = {}
    ranges: dict[str, tuple[int, int]] = {}
    for name, entry in value.items():
        key = f"slots.{name}"
        if isinstance(entry, int) and not isinstance(entry, bool):
            entry = {"field": entry}
        if not isinstance(entry, Mapping):
            raise keys.error(
                key, f"must be {{field: N}} or {{indexes: [FIRST, LAST]}}, got {entry!r}"
            )
        allowed = {"field", "indexes", "kind", "missing_id"}
        unknown = sorted(set(entry) - allowed)
        if unknown:
            raise keys.error(
                f"{key}.{unknown[0]}", f"is not a slot setting ({', '.join(sorted(allowed))})"
            )
        if ("field" in entry) == ("indexes" in entry):
            raise keys.error(key, "needs field: N or indexes: [FIRST, LAST] (one of them)")
        if "field" in entry:
            field = as_int(entry["field"], f"{key}.field", keys, minimum=0)
            if field in fields:
                raise keys.error(f"{key}.field", f"field {field} is slot {fields[field]!r} too")
            fields[field] = str(name)
            column = field_column(field)
        else:
            first, last = _index_range(entry["indexes"], f"{key}.indexes", keys)
            for other, (a, b) in ranges.items():
                if first <= b and a <= last:
                    raise keys.error(
                        f"{key}.indexes",
                        f"[{first}, {last}] overlaps slot {other!r} [{a}, {b}]",
                    )
            ranges[str(name)] = (first, last)
            column = range_column(first, last)
        kind = entry.get("kind", IdKind.INT.value)
        if kind not in (IdKind.INT.value, IdKind.STRING.value):
            raise keys.error(f"{key}.kind", f"must be int or string, got {kind!r}")
        try:
            out.append(
                IDColumn(column, name=name, kind=IdKind(kind), missing_id=entry.get("missing_id"))
            )
        except ConfigError as exc:
            at = key if exc.key in ("column", "name") else f"{key}.{exc.key}"
            raise keys.error(at, message_of(exc)) from None
    if fields and ranges:
        raise keys.error("slots", "give every slot a field or every slot an index range, not both")
    return out


def _index_range(value: object, key: str, keys: Keys) -> tuple[int, int]:
    pair = as_list(value, key, keys)
    if len(pair) != 2:
        raise keys.error(key, f"must be [FIRST, LAST] (inclusive), got {value!r}")
    first = as_int(pair[0], f"{key}[0]", keys, minimum=0)
    return first, as_int(pair[1], f"{key}[1]", keys, minimum=first)


def derived_columns(value: object, keys: Keys) -> tuple[DerivedColumn, ...]:
    """``derived:``: column name -> ``{from: COLUMN, extract: hour | weekday | day | month |
    year, unit: seconds | milliseconds, utc_offset: HOURS}``."""
    if not isinstance(value, Mapping) or not value:
        raise keys.error(
            "derived",
            f"must map new column names to {{from: COLUMN, extract: PART}}, got {value!r}",
        )
    out = []
    for name, entry in value.items():
        key = f"derived.{name}"
        if not isinstance(entry, Mapping):
            raise keys.error(key, f"must be {{from: COLUMN, extract: PART}}, got {entry!r}")
        allowed = {"from", "extract", "unit", "utc_offset"}
        unknown = sorted(set(entry) - allowed)
        if unknown:
            raise keys.error(
                f"{key}.{unknown[0]}",
                f"is not a derived-column setting ({', '.join(sorted(allowed))})",
            )
        for required in ("from", "extract"):
            if required not in entry:
                parts = ", ".join(p.value for p in TimePart)
                hint = "the timestamp column" if required == "from" else f"one of {parts}"
                raise keys.error(f"{key}.{required}", f"is required: {hint}")
        try:
            out.append(
                DerivedColumn(
                    name,
                    source=entry["from"],
                    extract=entry["extract"],
                    unit=entry.get("unit", TimeUnit.SECONDS.value),
                    utc_offset=entry.get("utc_offset", 0.0),
                )
            )
        except ConfigError as exc:
            at = key if exc.key == "name" else f"{key}.{exc.key}"
            raise keys.error(at, message_of(exc)) from None
    return tuple(out)
