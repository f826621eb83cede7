"""Raw JSON-shaped records as a :class:`~embeddb.trainer.data._reader.Chunk`.

A model server receives records such as::

    {"user": "u17", "tags": "a|b", "price": 12.5, "age": 31}
    {"user": 42,    "tags": ["a", "b"], "price": null}

:class:`RecordsChunk` turns them into what a text file with the same values would give the
training reader: every value becomes the text a CSV field would hold, all of them in one byte
buffer (``Fields``), so that :func:`~embeddb.trainer.data._reader.build_block` (the very code
that builds training batches) hashes, parses, fills and transforms them. A record holding
``"price": 12.5`` and a CSV line holding ``12.5`` give bit-identical batches.

Values and their text:

============================  =====================================================
JSON value                    as a CSV field
============================  =====================================================
string                        the string (UTF-8)
integer                       its decimal digits (``42`` -> ``"42"``)
float                         Python's shortest round-trip text (``12.5``); numeric
                              columns take the float itself (``float("12.5")`` is it)
true / false                  ``"1"`` / ``"0"``
null, or a missing key        an empty field (missing)
list (ID columns only)        the items joined by the column's separator, or, for a
                              column without one, one id per item
============================  =====================================================

Records are trusted to be a list of bounded size (the server checks the request's size); the
type of every value is checked here, and a bad one is an
:class:`~embeddb.errors.InvalidArgumentError` naming the record index and the column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from embeddb.arrays import F64, I64, U64, Bool
from embeddb.errors import InvalidArgumentError

from ._fields import Fields
from ._reader import Chunk
from .spec import ColumnSpec, IDColumn

__all__ = ["RecordsChunk"]

_Scalar = str | int | float | bool


class RecordsChunk(Chunk):
    """Rows of raw records (mappings of column name to value), as text fields.

    Args:
        records: the rows; each a mapping (a JSON object).
        spec: the columns to take from each record (others are ignored).
        na_values: strings that mean missing (also dropped from lists).
        strip: strip spaces and tabs around every field (as the training dialect did).

    Raises:
        InvalidArgumentError: a record that is not a mapping, or a value of a type the column
            cannot take, naming the record index and the column.
    """

    def __init__(
        self,
        records: Sequence[Mapping[str, object]],
        spec: ColumnSpec,
        *,
        na_values: Sequence[str] = (),
        strip: bool = False,
    ) -> None:
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise InvalidArgumentError(
                    f"record {i}: must be an object of column -> value, got {type(record).__name__}"
                )
        self.size = len(records)
        self.strip = strip
        self._na = frozenset(na_values)
        separators = {c.column: c.separator for c in spec.ids}
        listed = {c.column for c in spec.ids}
        self.columns = spec.columns()
        self.index = {c: k for k, c in enumerate(self.columns)}
        texts: list[bytes] = []
        valid = np.ones((len(self.columns), self.size), dtype=bool)
        self._lists: dict[str, list[list[bytes]]] = {}
        self._numbers: dict[str, tuple[F64, Bool]] = {}
        for k, column in enumerate(self.columns):
            values = [r.get(column) for r in records]
            may_list = column in listed
            lists = may_list and separators[column] is None and _any_list(values)
            if lists:
                self._lists[column] = [
                    self._items(v, i, column)
                    if isinstance(v, list)
                    else self._items([v], i, column)
                    for i, v in enumerate(values)
                ]
            numbers = _numbers(values)
            if numbers is not None:
                self._numbers[column] = numbers
            for i, value in enumerate(values):
                if value is None:
                    valid[k, i] = False
                    texts.append(b"")
                elif isinstance(value, list):
                    if not may_list:
                        raise InvalidArgumentError(
                            f"record {i}: column {column!r}: a list is only allowed for an ID "
                            "column"
                        )
                    sep = (separators[column] or "|").encode("utf-8")
                    texts.append(sep.join(self._items(value, i, column)))
                else:
                    texts.append(_text(value, i, column))
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        ends = np.cumsum(lengths)
        self._buf = np.frombuffer(b"".join(texts) + bytes(8), dtype=np.uint8)
        shape = (len(self.columns), self.size)
        self._starts = (ends - lengths).reshape(shape)
        self._ends = ends.reshape(shape)
        self._valid = valid

    def _items(self, items: list[object], row: int, column: str) -> list[bytes]:
        """The texts of a list's items; null and missing-value items are dropped."""
        out = []
        for item in items:
            if item is None:
                continue
            if isinstance(item, list):
                raise InvalidArgumentError(
                    f"record {row}: column {column!r}: lists of lists are not ids"
                )
            text = _text(item, row, column)
            if text.decode("utf-8") not in self._na:
                out.append(text)
        return out

    def text(self, columns: Sequence[str]) -> Fields:
        cols = [self.index[c] for c in columns]
        if len(cols) == 1:
            k = cols[0]
            fields = Fields(self._buf, self._starts[k], self._ends[k], self._valid[k])
        else:
            fields = Fields(
                self._buf, self._starts[cols].T, self._ends[cols].T, self._valid[cols].T
            )
        return fields.strip() if self.strip else fields

    def where(self, row: int) -> str:
        return f"record {row}"

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        return self._numbers.get(column)

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        lists = self._lists.get(spec.column)
        if lists is None:
            return None
        counts = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        tokens = [t for items in lists for t in items]
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        ends = np.cumsum(lengths)
        buf = np.frombuffer(b"".join(tokens) + bytes(8), dtype=np.uint8)
        fields = Fields(buf, ends - lengths, ends)
        if self.strip:
            fields = fields.strip()
        values, present = self.parse_ids(fields, [spec.column], spec.kind, seed)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if not present.all():  # empty tokens: dropped, as a separator split drops them
            kept = np.zeros(present.size + 1, dtype=np.int64)
            np.cumsum(present, out=kept[1:])
            values, offsets = values[present], kept[offsets]
        return values, offsets


def _any_list(values: list[object]) -> bool:
    return any(isinstance(v, list) for v in values)


def _numbers(values: list[object]) -> tuple[F64, Bool] | None:
    """The values as floats when every one is a JSON number, boolean or null, else None."""
    if not all(v is None or isinstance(v, (int, float)) for v in values):
        return None
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    floats = np.fromiter((_float(v) for v in values), dtype=np.float64, count=len(values))
    return floats, present


def _float(value: object) -> float:
    """A JSON number as the float its CSV text parses to (null: NaN)."""
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)  # correctly rounded, as parsing its digits is
        except OverflowError:
            return float("inf") if value > 0 else float("-inf")
    return float("nan")


def _text(value: object, row: int, column: str) -> bytes:
    """The CSV text of one scalar JSON value (see the module docstring)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, float):
        return repr(value).encode("ascii")
    raise InvalidArgumentError(
        f"record {row}: column {column!r}: {type(value).__name__} is not a string, number, "
        "boolean, null or list"
    )
