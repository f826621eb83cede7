"""Raw JSON-shaped records as a :class:`~embeddb.features._reader.Chunk`.

A model server receives records such as::

    {"user": "u17", "tags": "a|b", "price": 12.5, "age": 31}
    {"user": 42,    "tags": ["a", "b"], "price": null}

:class:`RecordsChunk` turns them into what a text file with the same values would give the
training reader: every value becomes the text a CSV field would hold, all of them in one byte
buffer (``Fields``), so that :func:`~embeddb.features._reader.build_block` (the very code
that builds training batches) hashes, parses, fills and transforms them. A record holding
``"price": 12.5`` and a CSV line holding ``12.5`` give bit-identical batches.

Values and their text:

============================  =====================================================
JSON value                    as a CSV field
============================  =====================================================
string                        the string (UTF-8; a lone surrogate such as
                              ``"\\ud800"`` is not Unicode: refused)
integer                       its decimal digits (``42`` -> ``"42"``)
float                         Python's shortest round-trip text (``12.5``); numeric
                              columns take the float itself (``float("12.5")`` is it)
true / false                  ``"1"`` / ``"0"``
null, or a missing key        an empty field (missing)
list (ID columns only)        the items joined by the column's separator, or, for a
                              column without one, one id per item
============================  =====================================================

A number that is not finite (``1e999`` parses to infinity; an integer beyond the float
range) is refused, naming the record and the column: it would make the model's score NaN.

Missing numeric values (a missing key, null, an empty string or a missing-value marker) are
the reader's business: ``build_block`` gives them the column's ``fill``, as training did with
empty fields of the file. A server fills them with the training mean instead (``fills``: one
raw value per column, see :meth:`FeaturePipeline.batch_from_records
<embeddb.features.pipeline.FeaturePipeline.batch_from_records>`), counted in
:class:`RecordStats`. Keys that no column reads are refused, or ignored and counted
(:func:`check_keys`).

Records are trusted to be a list of bounded size (the server bounds the request's bytes, each
record's and each string's before it parses the JSON); the type of every value is checked
here, and a bad one is an :class:`~embeddb.errors.InvalidArgumentError` naming the record
index and the column.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from embeddb.common.arrays import F32, F64, I64, U64, Bool
from embeddb.errors import InvalidArgumentError
from embeddb.features._fields import Fields
from embeddb.features._reader import Chunk
from embeddb.features.spec import ColumnSpec, IDColumn

__all__ = ["RecordStats", "RecordsChunk", "check_finite", "check_keys"]

_BLANKS = " \t"


@dataclass
class RecordStats:
    """What building one batch of raw records found (the model server's metrics count it).

    Attributes:
        missing_filled: numeric values that were missing (a missing key, null, an empty
            string or a missing-value marker) and filled with the training mean.
        unknown_keys: keys of records that no column reads (refused, or ignored by a lenient
            model).
    """

    missing_filled: int = 0
    unknown_keys: int = 0


def check_keys(
    records: Sequence[object],
    known: Collection[str],
    *,
    lenient: bool = False,
    stats: RecordStats | None = None,
) -> None:
    """Count the keys of ``records`` that are not ``known`` columns; refuse them unless
    ``lenient``.

    Raises:
        InvalidArgumentError: a record that is not a mapping; without ``lenient``, a record
            with an unknown key (the first such record is named, with the keys and the
            closest known column, "did you mean"), after every record was counted.
    """
    wanted = frozenset(known)
    first: tuple[int, list[str]] | None = None
    count = 0
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise InvalidArgumentError(
                f"record {i}: must be an object of column -> value, got {type(record).__name__}"
            )
        if len(record) and not record.keys() <= wanted:
            extra = sorted(map(str, record.keys() - wanted))
            count += len(extra)
            if first is None:
                first = (i, extra)
    if stats is not None:
        stats.unknown_keys += count
    if first is None or lenient:
        return
    i, extra = first
    columns = sorted(wanted)
    hint = ""
    for key in extra[:5]:
        close = difflib.get_close_matches(key, columns, n=1)
        if close:
            which = f" for {key!r}" if len(extra) > 1 else ""
            hint = f" (did you mean {close[0]!r}{which}?)"
            break
    shown = ", ".join(repr(k) for k in extra[:5]) + (", ..." if len(extra) > 5 else "")
    listed = ", ".join(columns[:20]) + (
        f" and {len(columns) - 20} more" if len(columns) > 20 else ""
    )
    raise InvalidArgumentError(
        f"record {i}: unknown key{'s' if len(extra) > 1 else ''} {shown}{hint}; the model "
        f"reads the columns {listed} (a model exported with lenient_records ignores unknown "
        "keys)"
    )


def check_finite(
    dense: Mapping[str, F32], spec: ColumnSpec, records: Sequence[Mapping[str, object]]
) -> None:
    """Refuse a batch whose numeric inputs are not all finite (a value out of float32's range
    after the transforms, or text such as ``"inf"``), naming the record and the column.

    Raises:
        InvalidArgumentError: the first non-finite input.
    """
    for numeric in spec.numeric:
        values = dense[numeric.name]
        finite = np.isfinite(values)
        if bool(finite.all()):
            continue
        row, k = (int(x) for x in np.argwhere(~finite)[0])
        column = numeric.columns[k]
        raw = records[row].get(column) if row < len(records) else None
        raise InvalidArgumentError(
            f"record {row}: column {column!r}: {_preview(raw)} gives the model input "
            f"{float(values[row, k])}: numbers must be finite (and within float32's range "
            "after the feature's transform)"
        )


class RecordsChunk(Chunk):
    """Rows of raw records (mappings of column name to value), as text fields.

    Args:
        records: the rows; each a mapping (a JSON object).
        spec: the columns to take from each record (others are ignored).
        na_values: strings that mean missing (also dropped from lists).
        strip: strip spaces and tabs around every field (as the training dialect did).
        fills: column -> the raw value (before the transforms) that a missing value of that
            numeric column becomes; the column's values are then all present. Columns not
            named keep missing values missing (the reader gives them ``fill``).
        stats: where to count the filled values.

    Raises:
        InvalidArgumentError: a record that is not a mapping, a value of a type the column
            cannot take, a string that is not Unicode or a number that is not finite,
            naming the record index and the column.
    """

    def __init__(
        self,
        records: Sequence[Mapping[str, object]],
        spec: ColumnSpec,
        *,
        na_values: Sequence[str] = (),
        strip: bool = False,
        fills: Mapping[str, float] | None = None,
        stats: RecordStats | None = None,
    ) -> None:
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise InvalidArgumentError(
                    f"record {i}: must be an object of column -> value, got {type(record).__name__}"
                )
        self.size = len(records)
        self.strip = strip
        self._na = frozenset(na_values)
        self._fills = dict(fills or {})
        self._stats = stats
        separators = {c.column: c.separator for c in spec.ids}
        listed = {c.column for c in spec.ids}
        self.columns = spec.columns()
        self.index = {c: k for k, c in enumerate(self.columns)}
        texts: list[bytes] = []
        valid = np.ones((len(self.columns), self.size), dtype=bool)
        self._lists: dict[str, list[list[bytes]]] = {}
        self._numbers: dict[str, tuple[F64, Bool]] = {}
        self._values: dict[str, list[object]] = {}
        for k, column in enumerate(self.columns):
            values = [r.get(column) for r in records]
            may_list = column in listed
            separator = separators.get(column)
            lists = may_list and separator is None and _any_list(values)
            if lists:
                self._lists[column] = [
                    self._items(v, i, column)
                    if isinstance(v, list)
                    else self._items([v], i, column)
                    for i, v in enumerate(values)
                ]
            numbers = _numbers(values, column)
            if numbers is not None:
                self._numbers[column] = numbers
            if column in self._fills:
                self._values[column] = values
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
                    sep = (separator or "|").encode("utf-8")
                    texts.append(sep.join(self._items(value, i, column)))
                else:
                    texts.append(self._text(value, i, column, separator))
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        ends = np.cumsum(lengths)
        self._buf = np.frombuffer(b"".join(texts) + bytes(8), dtype=np.uint8)
        shape = (len(self.columns), self.size)
        self._starts = (ends - lengths).reshape(shape)
        self._ends = ends.reshape(shape)
        self._valid = valid

    def _text(self, value: object, row: int, column: str, separator: str | None) -> bytes:
        """The CSV text of one scalar value; stripped here already (by C-speed string
        methods) when the dialect strips, so the vectorised strip of the fields finds no
        blanks to remove one byte at a time."""
        if self.strip and isinstance(value, str):
            value = _stripped(value, separator)
        return _text(value, row, column)

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
            text = self._text(item, row, column, None)
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
        if column in self._fills:
            return self._filled(column)
        return self._numbers.get(column)

    def _filled(self, column: str) -> tuple[F64, Bool]:
        """The column's numbers (JSON numbers as such, strings parsed as the text reader
        parses them) with every missing value replaced by the column's fill."""
        values = self._values.pop(column, None)
        if values is None:  # asked before: the result was kept
            return self._numbers[column]
        missing = np.zeros(self.size, dtype=bool)
        texts = np.zeros(self.size, dtype=bool)
        out = np.full(self.size, np.nan)
        for i, value in enumerate(values):
            if value is None:
                missing[i] = True
            elif isinstance(value, str):
                text = value.strip(_BLANKS) if self.strip else value
                if not text or text in self._na:
                    missing[i] = True
                else:
                    texts[i] = True
            elif isinstance(value, list):  # an ID column's list, read as a number here
                raise InvalidArgumentError(f"record {i}: column {column!r}: a list is not a number")
            else:  # a number or boolean (anything else was refused by __init__)
                out[i] = _float(value)
                if not math.isfinite(out[i]):
                    raise _not_finite(value, i, column)
        if texts.any():
            k = self.index[column]
            fields = Fields(self._buf, self._starts[k], self._ends[k], texts)
            parsed, _ = self.checked(
                fields.strip() if self.strip else fields, [column], Fields.parse_float
            )
            out[texts] = parsed[texts]
            bad = texts & ~np.isfinite(out)
            if bad.any():  # "inf", "nan", "1e999": refused before any transform
                row = int(np.argmax(bad))
                raise _not_finite(values[row], row, column)
        filled = int(np.count_nonzero(missing))
        if filled:
            out[missing] = self._fills[column]
            if self._stats is not None:
                self._stats.missing_filled += filled
        result = (out, np.ones(self.size, dtype=bool))
        self._numbers[column] = result
        return result

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


def _numbers(values: list[object], column: str) -> tuple[F64, Bool] | None:
    """The values as floats when every one is a JSON number, boolean or null, else None.

    Raises:
        InvalidArgumentError: a number that is not finite (naming the record).
    """
    if not all(v is None or isinstance(v, (int, float)) for v in values):
        return None
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    floats = np.fromiter((_float(v) for v in values), dtype=np.float64, count=len(values))
    bad = present & ~np.isfinite(floats)
    if bad.any():
        row = int(np.argmax(bad))
        raise _not_finite(values[row], row, column)
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


def _not_finite(value: object, row: int, column: str) -> InvalidArgumentError:
    if isinstance(value, str):
        why = "the text of a number that is not finite"
    elif isinstance(value, float):
        why = "a JSON number beyond float64's range, such as 1e999, reads as infinity"
    else:
        why = f"an integer of {len(str(value))} digits, beyond float64's range"
    return InvalidArgumentError(
        f"record {row}: column {column!r}: {_preview(value)} is not a finite number ({why})"
    )


def _stripped(value: str, separator: str | None) -> str:
    """``value`` without blanks around it (and around each separator of an ID column)."""
    value = value.strip(_BLANKS)
    if separator is not None and separator in value:
        value = _separator_blanks(separator).sub(separator, value)
    return value


_SEPARATOR_BLANKS: dict[str, re.Pattern[str]] = {}


def _separator_blanks(separator: str) -> re.Pattern[str]:
    pattern = _SEPARATOR_BLANKS.get(separator)
    if pattern is None:
        pattern = re.compile(f"[ \\t]*{re.escape(separator)}[ \\t]*")
        _SEPARATOR_BLANKS[separator] = pattern
    return pattern


def _text(value: object, row: int, column: str) -> bytes:
    """The CSV text of one scalar JSON value (see the module docstring)."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"record {row}: column {column!r}: the string holds a lone surrogate "
                f"{value[exc.start]!r} at character {exc.start}: not valid Unicode (a "
                "surrogate must pair with another, as UTF-16 encodes one character)"
            ) from None
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _not_finite(value, row, column)
        return repr(value).encode("ascii")
    raise InvalidArgumentError(
        f"record {row}: column {column!r}: {type(value).__name__} is not a string, number, "
        "boolean, null or list"
    )


def _preview(value: object, limit: int = 60) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        digits = str(value)
        return f"{digits[:20]}...({len(digits)} digits)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
