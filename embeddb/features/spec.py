"""Which columns of a table become ID features, numeric features and labels.

A :class:`ColumnSpec` drives the generic readers (:class:`~embeddb.features.CsvReader`,
:class:`~embeddb.features.ParquetReader`); the dataset readers build one of their own.
Example: a click log with a user column, comma-separated tags, two counts and a label::

    ColumnSpec(
        ids=(IDColumn("user"), IDColumn("tags", separator=","), IDColumn("ad", kind="hex")),
        numeric=(NumericColumn(("views", "clicks"), name="counts", log1p=True),),
        labels=(LabelColumn("clicked"),),
    )

yields batches with ID features ``user`` (one id per sample), ``tags`` (ragged), ``ad``, one
non-ID feature ``counts`` of shape ``(n, 2)`` and a label ``clicked`` of shape ``(n, 1)``.

Missing values: an empty (or null) field of an ID column gives that sample no id (an empty
sample: its pooled embedding is zero) unless ``missing_id`` names an id to use instead (a
learned "missing" embedding). Empty numeric fields become ``fill``. A missing label is an error.
A field equal to one of :attr:`CsvDialect.na_values` (``"NA"``, ``"null"`` ...) is missing too.

Numeric transforms, in this order: missing -> ``fill``, ``log1p``, then ``standardize``
(``(x - mean) / std`` with the per-column statistics a dataset's ``fit`` measured).

Derived columns (:class:`DerivedColumn`) are computed from another column of the same row,
e.g. the hour of a timestamp, and used by name like any column::

    ColumnSpec(
        ids=(IDColumn("user"), IDColumn("hour", kind="int")),
        derived=(DerivedColumn("hour", source="click_time", extract="hour"),),
    )

They are part of the spec, so the saved feature pipeline computes them from a raw record at
serving time exactly as training computed them from the file.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from embeddb.errors import ConfigError

__all__ = [
    "ColumnSpec",
    "CsvDialect",
    "DerivedColumn",
    "IDColumn",
    "IdKind",
    "LabelColumn",
    "NumericColumn",
    "TimePart",
    "TimeUnit",
    "check_na_values",
    "derived_from_json",
    "derived_to_json",
]


class IdKind(str, enum.Enum):
    """How the text (or value) of an ID column becomes ``uint64`` ids."""

    STRING = "string"  # hash the bytes (embeddb.features.hashing), in the column's namespace
    INT = "int"  # a decimal integer in [0, 2**64), used as is (Parquet: any integer column)
    HEX = "hex"  # at most 16 hex digits (Criteo's categorical columns), used as is


def _single_char(value: object, key: str, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or len(value.encode("utf-8")) != 1 or value == "\n":
        raise ConfigError(key, f"must be one ASCII character other than newline, got {value!r}")
    return value


def _name(value: object, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class IDColumn:
    """A column read as an ID feature.

    Attributes:
        column: the column's name in the file.
        name: the feature's name (default: ``column``).
        kind: string (hashed), int or hex; see :class:`IdKind`.
        separator: one character splitting a multi-valued field into ids (empty tokens are
            dropped); Parquet list columns are multi-valued without one.
        namespace: hash namespace of ``kind="string"`` (default: the feature's name); give two
            columns one namespace to share ids.
        missing_id: the id of a sample with no id (default: none, an empty sample).
    """

    column: str
    name: str | None = None
    kind: IdKind = IdKind.STRING
    separator: str | None = None
    namespace: str | None = None
    missing_id: int | None = None

    def __post_init__(self) -> None:
        _name(self.column, "column")
        if self.name is not None:
            _name(self.name, "name")
        try:
            object.__setattr__(self, "kind", IdKind(self.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in IdKind)
            raise ConfigError("kind", f"must be one of {kinds}, got {self.kind!r}") from None
        _single_char(self.separator, "separator", allow_none=True)
        if self.missing_id is not None and (
            isinstance(self.missing_id, bool)
            or not isinstance(self.missing_id, int)
            or not 0 <= self.missing_id < 1 << 64
        ):
            raise ConfigError(
                "missing_id", f"must be an int in [0, 2**64), got {self.missing_id!r}"
            )

    @property
    def feature(self) -> str:
        return self.name or self.column

    @property
    def hash_namespace(self) -> str:
        return self.namespace if self.namespace is not None else self.feature


@dataclass(frozen=True)
class NumericColumn:
    """Columns read together as one float32 non-ID feature of shape ``(n, len(columns))``.

    Attributes:
        columns: the columns, in order.
        name: the feature's name.
        log1p: apply ``log(1 + max(x, 0))`` (counts; negatives clamp to 0, as DLRM does).
        fill: the value of an empty or null field (before ``log1p``).
        standardize: ``(mean, std)`` per column, applied last: ``(x - mean) / std``
            (computed in float64, then rounded to float32 like every numeric feature).
    """

    columns: tuple[str, ...]
    name: str = "dense"
    log1p: bool = False
    fill: float = 0.0
    standardize: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.columns, str):
            object.__setattr__(self, "columns", (self.columns,))
        object.__setattr__(self, "columns", tuple(self.columns))
        if not self.columns:
            raise ConfigError("columns", "a numeric feature needs at least one column")
        for i, c in enumerate(self.columns):
            _name(c, f"columns[{i}]")
        _name(self.name, "name")
        if isinstance(self.fill, bool) or not isinstance(self.fill, (int, float)):
            raise ConfigError("fill", f"must be a number, got {self.fill!r}")
        if self.standardize is not None:
            stats = tuple(tuple(pair) for pair in self.standardize)
            if len(stats) != len(self.columns) or any(
                len(pair) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
                or not math.isfinite(pair[0])
                or not (math.isfinite(pair[1]) and pair[1] > 0)
                for pair in stats
            ):
                raise ConfigError(
                    "standardize",
                    f"must be one (mean, std > 0) pair of finite numbers per column "
                    f"({len(self.columns)}), got {self.standardize!r}",
                )
            object.__setattr__(self, "standardize", tuple((float(m), float(sd)) for m, sd in stats))


@dataclass(frozen=True)
class LabelColumn:
    """A column read as a float32 label of shape ``(n, 1)``.

    Attributes:
        column: the column's name in the file.
        name: the label's name (default: ``column``).
        positive: label 1 where the field is one of these strings, else 0.
        threshold: label 1 where the field's number is ``>= threshold``, else 0.
            Without ``positive`` or ``threshold`` the field must be ``1``, ``0``, ``-1``
            (or ``+1``): label 1 where it is positive, else 0; any other number is an error.
    """

    column: str
    name: str | None = None
    positive: tuple[str, ...] = ()
    threshold: float | None = None

    def __post_init__(self) -> None:
        _name(self.column, "column")
        if isinstance(self.positive, str):
            object.__setattr__(self, "positive", (self.positive,))
        object.__setattr__(self, "positive", tuple(self.positive))
        if self.positive and self.threshold is not None:
            raise ConfigError("positive", "give positive strings or a threshold, not both")

    @property
    def label(self) -> str:
        return self.name or self.column


class TimePart(str, enum.Enum):
    """What a :class:`DerivedColumn` takes of a timestamp (after its ``utc_offset``)."""

    HOUR = "hour"  # 0 .. 23
    WEEKDAY = "weekday"  # 0 = Monday .. 6 = Sunday
    DAY = "day"  # day of the month, 1 .. 31
    MONTH = "month"  # 1 .. 12
    YEAR = "year"


class TimeUnit(str, enum.Enum):
    """The unit of a numeric timestamp (ISO-8601 text carries its own)."""

    SECONDS = "seconds"
    MILLISECONDS = "milliseconds"


@dataclass(frozen=True)
class DerivedColumn:
    """A column computed from a timestamp column of the same row.

    The source holds unix time (a number, in ``unit``; fractions are floored) or ISO-8601
    text (``2017-11-07``, ``2017-11-07 09:30``, ``2017-11-07T09:30:38.25Z``,
    ``...+02:00``; ``T`` or a space; text without an offset is UTC). The instant is shifted
    by ``utc_offset`` hours, then ``extract`` is taken as a small integer (its decimal text
    for a string ID column, the number itself for an int ID or a numeric column). An empty
    source gives an empty value; text that is neither form is an error naming the row.

    Attributes:
        name: the derived column's name (used in ids and numeric like a file column; it must
            not be a column of the file).
        source: the timestamp column.
        extract: hour, weekday, day, month or year (:class:`TimePart`).
        unit: seconds or milliseconds, for numeric timestamps.
        utc_offset: hours added to UTC before extracting (``1`` for CET, ``-5`` for EST;
            fractions allowed: ``5.5``), between -24 and 24.
    """

    name: str
    source: str
    extract: TimePart
    unit: TimeUnit = TimeUnit.SECONDS
    utc_offset: float = 0.0

    def __post_init__(self) -> None:
        _name(self.name, "name")
        _name(self.source, "from")
        for key, kind in (("extract", TimePart), ("unit", TimeUnit)):
            try:
                object.__setattr__(self, key, kind(getattr(self, key)))
            except ValueError:
                allowed = ", ".join(k.value for k in kind)
                raise ConfigError(
                    key, f"must be one of {allowed}, got {getattr(self, key)!r}"
                ) from None
        offset = self.utc_offset
        if (
            isinstance(offset, bool)
            or not isinstance(offset, (int, float))
            or not -24 <= offset <= 24
        ):
            raise ConfigError("utc_offset", f"must be hours in [-24, 24], got {offset!r}")
        object.__setattr__(self, "utc_offset", float(offset))
        if self.name == self.source:
            raise ConfigError("name", f"a derived column cannot replace its source {self.source!r}")


@dataclass(frozen=True)
class ColumnSpec:
    """The features and labels a reader makes of a table's columns (see the module docstring).

    Raises:
        ConfigError: no feature, or two features (or two labels) with one name.
    """

    ids: tuple[IDColumn, ...] = ()
    numeric: tuple[NumericColumn, ...] = ()
    labels: tuple[LabelColumn, ...] = ()
    derived: tuple[DerivedColumn, ...] = ()

    def __post_init__(self) -> None:
        for key in ("ids", "numeric", "labels", "derived"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        derived = [d.name for d in self.derived]
        dup = sorted({n for n in derived if derived.count(n) > 1})
        if dup:
            raise ConfigError("derived", f"duplicate names {dup}")
        chained = [d.name for d in self.derived if d.source in derived]
        if chained:
            raise ConfigError("derived", f"{chained[0]!r}: the source must be a file column")
        if not self.ids and not self.numeric:
            raise ConfigError("ids", "a column spec needs at least one ID or numeric feature")
        for key, names in (
            ("ids", [c.feature for c in self.ids]),
            ("numeric", [c.name for c in self.numeric]),
            ("labels", [c.label for c in self.labels]),
        ):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ConfigError(key, f"duplicate names {dup}")

    def columns(self) -> list[str]:
        """Every column the spec reads from the source, in first-use order (a derived
        column's source in its place)."""
        sources = {d.name: d.source for d in self.derived}
        cols = [c.column for c in self.ids]
        cols += [c for n in self.numeric for c in n.columns]
        cols += [c.column for c in self.labels]
        return list(dict.fromkeys(sources.get(c, c) for c in cols))


@dataclass(frozen=True)
class CsvDialect:
    """The layout of a delimited text file (gzip-compressed or plain).

    Quoted fields follow RFC 4180 (what pandas, R and spreadsheets write): a field that starts
    with ``quote`` may hold the delimiter, and a doubled quote inside it is one quote; quoted
    header names are unquoted too. A line break inside a quoted field is not supported (an
    error naming the file and line), so every newline ends a row.

    Attributes:
        delimiter: one character between fields (``"\\t"`` for TSV).
        quote: the quote character of quoted fields; None: quotes are ordinary text.
        header: whether the first (non-comment) line names the columns.
        names: the column names of a file without a header (or overriding its header).
        comment: lines starting with this character are skipped (empty lines always are).
        strip: remove spaces and tabs around every field (``"a, b"`` -> ``"a"``, ``"b"``);
            blanks may stand around a quoted field, and the ends of its value are stripped too.
        na_values: fields equal to one of these (after ``strip``) are missing, like empty
            ones: no id, ``fill``, an error for a label.
        chunk_bytes: bytes of text parsed at a time (memory vs per-chunk overhead).
    """

    delimiter: str = ","
    quote: str | None = '"'
    header: bool = True
    names: tuple[str, ...] | None = None
    comment: str | None = None
    strip: bool = False
    chunk_bytes: int = 1 << 20
    na_values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _single_char(self.delimiter, "delimiter")
        _single_char(self.quote, "quote", allow_none=True)
        if self.quote is not None and self.quote == self.delimiter:
            raise ConfigError("quote", f"must differ from the delimiter {self.delimiter!r}")
        object.__setattr__(self, "na_values", check_na_values(self.na_values))
        _single_char(self.comment, "comment", allow_none=True)
        if self.names is not None:
            object.__setattr__(self, "names", tuple(self.names))
            for i, c in enumerate(self.names or ()):
                _name(c, f"names[{i}]")
        if not self.header and self.names is None:
            raise ConfigError("names", "a file without a header needs its column names")
        if (
            isinstance(self.chunk_bytes, bool)
            or not isinstance(self.chunk_bytes, int)
            or self.chunk_bytes < 1
        ):
            raise ConfigError("chunk_bytes", f"must be a positive int, got {self.chunk_bytes!r}")


def check_na_values(values: object, key: str = "na_values") -> tuple[str, ...]:
    """``values`` as a tuple of strings (a single string is one value).

    Raises:
        ConfigError: naming ``key``: not a list of strings, or a string with a newline.
    """
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise ConfigError(key, f"must be a list of strings, got {values!r}")
    if any("\n" in v for v in values):
        raise ConfigError(key, f"a missing-value marker cannot hold a newline: {values!r}")
    return tuple(dict.fromkeys(values))


def derived_to_json(column: DerivedColumn) -> dict[str, object]:
    """A derived column as the JSON object of a saved feature pipeline."""
    return {
        "name": column.name,
        "from": column.source,
        "extract": column.extract.value,
        "unit": column.unit.value,
        "utc_offset": column.utc_offset,
    }


def derived_from_json(doc: object) -> DerivedColumn:
    """The derived column of a :func:`derived_to_json` object.

    Raises:
        TypeError, KeyError, ConfigError: not such an object (the pipeline loader names its
            file).
    """
    if not isinstance(doc, dict):
        raise TypeError(f"a derived column must be an object, got {doc!r}")
    return DerivedColumn(
        doc["name"],
        source=doc["from"],
        extract=doc["extract"],
        unit=doc["unit"],
        utc_offset=doc["utc_offset"],
    )
