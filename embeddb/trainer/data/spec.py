"""Which columns of a table become ID features, numeric features and labels.

A :class:`ColumnSpec` drives the generic readers (:class:`~embeddb.trainer.data.CsvReader`,
:class:`~embeddb.trainer.data.ParquetReader`); the dataset readers build one of their own.
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
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from embeddb.errors import ConfigError

__all__ = [
    "ColumnSpec",
    "CsvDialect",
    "IDColumn",
    "IdKind",
    "LabelColumn",
    "NumericColumn",
    "check_na_values",
]


class IdKind(str, enum.Enum):
    """How the text (or value) of an ID column becomes ``uint64`` ids."""

    STRING = "string"  # hash the bytes (embeddb.trainer.data.hashing), in the column's namespace
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


@dataclass(frozen=True)
class ColumnSpec:
    """The features and labels a reader makes of a table's columns (see the module docstring).

    Raises:
        ConfigError: no feature, or two features (or two labels) with one name.
    """

    ids: tuple[IDColumn, ...] = ()
    numeric: tuple[NumericColumn, ...] = ()
    labels: tuple[LabelColumn, ...] = ()

    def __post_init__(self) -> None:
        for key in ("ids", "numeric", "labels"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
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
        """Every column the spec reads, in first-use order."""
        cols = [c.column for c in self.ids]
        cols += [c for n in self.numeric for c in n.columns]
        cols += [c.column for c in self.labels]
        return list(dict.fromkeys(cols))


@dataclass(frozen=True)
class CsvDialect:
    """The layout of a delimited text file (gzip-compressed or plain).

    Quoted fields are not supported: a field never contains the delimiter or a newline.

    Attributes:
        delimiter: one character between fields (``"\\t"`` for TSV).
        header: whether the first (non-comment) line names the columns.
        names: the column names of a file without a header (or overriding its header).
        comment: lines starting with this character are skipped (empty lines always are).
        strip: remove spaces and tabs around every field (``"a, b"`` -> ``"a"``, ``"b"``).
        na_values: fields equal to one of these (after ``strip``) are missing, like empty
            ones: no id, ``fill``, an error for a label.
        chunk_bytes: bytes of text parsed at a time (memory vs per-chunk overhead).
    """

    delimiter: str = ","
    header: bool = True
    names: tuple[str, ...] | None = None
    comment: str | None = None
    strip: bool = False
    chunk_bytes: int = 1 << 20
    na_values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _single_char(self.delimiter, "delimiter")
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
