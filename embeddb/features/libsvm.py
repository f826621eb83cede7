"""The reader of libSVM / libFM text (``label idx:val ...`` or ``label field:idx:val ...``;
gzip or plain).

Each line is a label and sparse features, separated by spaces or tabs; a feature is
``index:value``, or ``field:index:value`` (libFM / libFFM files that group indexes into
fields)::

    1 3:1 17:0.5 2041:1
    -1 0:3:1 1:9:1

A :class:`LibsvmReader` offers these columns to a :class:`~embeddb.features.ColumnSpec`:

* ``label``: 1 for a label of ``1`` or ``+1``; 0 for ``0`` or ``-1``; any other label is a
  :class:`~embeddb.errors.CorruptDataError`.
* ``features``: the ragged ID feature of every index present with a non-zero value (the plain
  libSVM reading: one feature, fields ignored). Only presence counts: the values are otherwise
  ignored (libFM's one-hot categorical data). With ``kind="int"`` (the default of
  :func:`libsvm_spec`) the ids are the indexes themselves; ``kind="string"`` hashes their text
  per feature namespace.
* Slots, each its own ID feature (its own table with ``embedding_config: auto``):
  ``field:N`` (:func:`field_column`): the indexes of the ``N:index:value`` tokens;
  ``indexes:A-B`` (:func:`range_column`): the indexes ``A`` to ``B`` (inclusive) of any token,
  for libSVM files whose fields are ranges of one index space (Frappe, MovieLens in libFM
  form). ``features`` then holds only the tokens no slot takes; a spec with slots and without
  ``features`` must take every token (a token that no slot takes is an error naming its line,
  never silently dropped).
* ``"17"`` (any decimal index): the value of index 17 in each row, empty where the row lacks
  it; use it in a :class:`~embeddb.features.NumericColumn` (``fill`` when absent). An index
  read as its own column is left out of every ID feature.

Parsing is vectorised over a chunk (tokens split at blanks, then at ``:``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from embeddb.common.arrays import F64, I64, U8, U64, Bool
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from embeddb.features._block import Block
from embeddb.features._fields import Fields, ParseError
from embeddb.features._io import newlines_before, range_chunks
from embeddb.features._parts import PartsReader, Source, pick_source
from embeddb.features._reader import build_block
from embeddb.features.hashing import hash_fields
from embeddb.features.spec import ColumnSpec, IDColumn, IdKind, LabelColumn, NumericColumn
from embeddb.features.stream import FilterableChunk, Part, RowFilter

__all__ = [
    "FEATURES",
    "LABEL",
    "LibsvmChunk",
    "LibsvmReader",
    "field_column",
    "libsvm_spec",
    "range_column",
    "sample_fields",
    "slot_of",
]

LABEL = "label"
FEATURES = "features"
_SPACE, _TAB, _NL, _CR, _COLON = 32, 9, 10, 13, 58
NO_FIELD = np.uint64(2**64 - 1)  # the field of an index:value token
_FIELD, _RANGE = "field:", "indexes:"


def field_column(field: int) -> str:
    """The column of the slot of field ``field`` (``field:index:value`` tokens)."""
    return f"{_FIELD}{field}"


def range_column(first: int, last: int) -> str:
    """The column of the slot of indexes ``first`` to ``last`` (inclusive)."""
    return f"{_RANGE}{first}-{last}"


def slot_of(column: str) -> tuple[int, int, int] | None:
    """``(field, first, last)`` of a slot column (field -1 for an index range; first, last
    -1 for a field), None for any other column."""
    if column.startswith(_FIELD) and _is_index(column[len(_FIELD) :]):
        return int(column[len(_FIELD) :]), -1, -1
    if column.startswith(_RANGE):
        first, _, last = column[len(_RANGE) :].partition("-")
        if _is_index(first) and _is_index(last) and int(first) <= int(last):
            return -1, int(first), int(last)
    return None


@dataclass(frozen=True)
class Claims:
    """Which tokens the columns of a spec take away from ``features``.

    Attributes:
        numeric: indexes read as numeric columns (left out of every ID feature).
        fields: the fields of slot columns.
        ranges: ``(first, last)`` of index-range slot columns, shape ``(k, 2)``.
        complete: the spec has slots and no ``features``: every token must be taken.
    """

    numeric: U64
    fields: U64
    ranges: U64
    complete: bool

    @classmethod
    def of(cls, columns: Sequence[str]) -> Claims:
        slots = [s for s in map(slot_of, columns) if s is not None]
        return cls(
            numeric=np.array(sorted({int(c) for c in columns if _is_index(c)}), np.uint64),
            fields=np.array(sorted({f for f, _, _ in slots if f >= 0}), np.uint64),
            ranges=np.array([(a, b) for f, a, b in slots if f < 0], np.uint64).reshape(-1, 2),
            complete=bool(slots) and FEATURES not in columns,
        )

    def in_ranges(self, index: U64) -> Bool:
        """Tokens whose index lies in one of the ranges."""
        hit: Bool = np.zeros(index.size, dtype=bool)
        for first, last in self.ranges.tolist():
            hit |= (index >= np.uint64(first)) & (index <= np.uint64(last))
        return hit


def libsvm_spec(
    numeric: Sequence[int] = (),
    *,
    kind: IdKind | str = IdKind.INT,
    log1p: bool = False,
    fill: float = 0.0,
    labelled: bool = True,
) -> ColumnSpec:
    """The usual spec of a libSVM file: ``features`` (ids), the ``numeric`` indexes as one
    numeric feature ``dense`` (when any), and the label.

    Raises:
        ConfigError: a negative index.
    """
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in numeric):
        raise ConfigError("numeric", f"libSVM indexes are ints >= 0, got {list(numeric)}")
    dense = (
        (NumericColumn(tuple(str(i) for i in numeric), name="dense", log1p=log1p, fill=fill),)
        if numeric
        else ()
    )
    return ColumnSpec(
        ids=(IDColumn(FEATURES, kind=IdKind(kind)),),
        numeric=dense,
        labels=(LabelColumn(LABEL),) if labelled else (),
    )


class LibsvmReader(PartsReader):
    """Batches from libSVM / libFM files (see the module docstring).

    Args:
        path: the file (gzip or plain), a :class:`~embeddb.features.Part`, or a list.
        spec: features and label over the columns ``label``, ``features`` and decimal
            indexes; None: :func:`libsvm_spec` of ``numeric``.
        batch_size: samples per batch (the last batch may be shorter).
        numeric: with ``spec=None``, the indexes read as numeric columns.
        parts: the input as a keyword (instead of ``path``, which is then None).
        row_filter: keeps some rows (a train/test split), before features are built.
        stripe: ``(rank, world)``: keep every ``world``-th chunk, from chunk ``rank``.
        chunk_bytes: bytes of text parsed at a time.
        requires_grad: training batches (needs a label).
        drop_last: drop a short last batch.

    Raises:
        NotFoundError: no such file.
        ConfigError: a column other than ``label``, ``features`` or a decimal index.
        InvalidArgumentError: bad ``batch_size``; ``requires_grad`` without a label.

    Iterating raises :class:`~embeddb.errors.CorruptDataError` naming the file and line of a
    malformed label or token.
    """

    def __init__(
        self,
        path: Source | None,
        spec: ColumnSpec | None,
        batch_size: int,
        *,
        numeric: Sequence[int] = (),
        parts: Source | None = None,
        row_filter: RowFilter | None = None,
        stripe: tuple[int, int] = (0, 1),
        chunk_bytes: int = 1 << 20,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            pick_source(path, parts),
            batch_size,
            row_filter=row_filter,
            stripe=stripe,
            requires_grad=requires_grad,
            drop_last=drop_last,
        )
        self.spec = spec if spec is not None else libsvm_spec(numeric)
        self.chunk_bytes = chunk_bytes
        self._check_labels(bool(self.spec.labels))
        columns = self.spec.columns() + list(row_filter.columns if row_filter else ())
        unknown = [
            c
            for c in columns
            if c not in (LABEL, FEATURES) and not _is_index(c) and slot_of(c) is None
        ]
        if unknown:
            raise ConfigError(
                "columns",
                f"a libSVM file has the columns {LABEL!r}, {FEATURES!r}, slots ('field:3', "
                f"'indexes:0-957') and decimal indexes ('17'), not {unknown}",
            )
        self._claims = Claims.of(columns)

    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        first_line = 1
        at: int | None = None
        for offset, chunk in range_chunks(part.path, self.chunk_bytes, part.start, part.stop):
            at = offset if at is None else at
            yield functools.partial(
                LibsvmChunk.parse, part.path, chunk, first_line, at, self._claims
            )
            first_line += chunk.count(b"\n")

    def _build(self, chunk: FilterableChunk) -> Block:
        return build_block(chunk, self.spec)


def _is_index(column: str) -> bool:
    return column.isascii() and column.isdigit()


class LibsvmChunk(FilterableChunk):
    """Rows of libSVM text: per row its line, label and feature tokens.

    Tokens are kept in row order: token ``t`` belongs to row ``token_row[t]``; it is
    ``buf[starts[t]:ends[t]]``, its index ``buf[index_starts[t]:colons[t]]``, its value
    ``buf[colons[t] + 1:ends[t]]`` and its field ``fields[t]`` (``NO_FIELD`` for
    ``index:value``).
    """

    def __init__(
        self,
        path: Path,
        buf: U8,
        lines: tuple[I64, I64, I64],
        labels: tuple[I64, I64],
        tokens: tuple[I64, I64, I64, I64, I64],
        parsed: tuple[U64, U64, F64, Bool],
        where: tuple[int, int],
        claims: Claims,
    ) -> None:
        self.path = path
        self.buf = buf
        self.rows, self.line_starts, self.line_ends = lines
        self.label_starts, self.label_ends = labels
        self.starts, self.index_starts, self.colons, self.ends, self.token_row = tokens
        self.fields, self.index, self.value, self.value_present = parsed
        self.first_line, self.line_offset = where
        self.claims = claims
        self.size = int(self.rows.size)

    @classmethod
    def parse(
        cls, path: Path, chunk: bytes, first_line: int, line_offset: int, claims: Claims
    ) -> LibsvmChunk:
        """Split a chunk of whole lines into rows and tokens, and parse the tokens.

        Raises:
            CorruptDataError: a token that is not ``index:value`` or ``field:index:value``;
                with a spec that must take every token, a token no column takes.
        """
        buf = np.frombuffer(chunk + bytes(8), dtype=np.uint8)
        text = buf[:-8]
        newlines = np.flatnonzero(text == _NL)
        word = (text != _SPACE) & (text != _TAB) & (text != _NL) & (text != _CR)
        edges = np.diff(word.view(np.int8), prepend=np.int8(0), append=np.int8(0))
        tok_starts, tok_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        tok_line = np.searchsorted(newlines, tok_starts)
        first = np.ones(tok_starts.size, dtype=bool)
        first[1:] = tok_line[1:] != tok_line[:-1]
        rows = tok_line[first]
        line_starts = np.concatenate([[0], newlines[:-1] + 1])[rows]
        line_ends = newlines[rows]
        line_ends -= (line_ends > line_starts) & (buf[np.maximum(line_ends - 1, 0)] == _CR)
        token_row = (np.cumsum(first) - 1)[~first]
        starts, ends = tok_starts[~first], tok_ends[~first]
        colons = np.flatnonzero(text == _COLON)
        lo, hi = np.searchsorted(colons, starts), np.searchsorted(colons, ends)
        counts = hi - lo
        last = colons[np.clip(hi - 1, 0, max(colons.size - 1, 0))] if colons.size else starts
        firsts = colons[np.clip(lo, 0, max(colons.size - 1, 0))] if colons.size else starts
        has_field = counts == 2
        index_starts = np.where(has_field, firsts + 1, starts)
        chunk_ = cls(
            path,
            buf,
            (rows, line_starts, line_ends),
            (tok_starts[first], tok_ends[first]),
            (starts, index_starts, last, ends, token_row),
            (np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0), np.zeros(0, bool)),
            (first_line, line_offset),
            claims,
        )
        bad = np.flatnonzero((counts < 1) | (counts > 2))
        if bad.size:
            chunk_._bad_token(int(bad[0]), "index:value or field:index:value")
        fields = np.full(starts.size, NO_FIELD, dtype=np.uint64)
        if has_field.any():
            at = np.flatnonzero(has_field)
            try:
                fields[at], _ = Fields(buf, starts[at], firsts[at]).parse_uint()
            except ParseError as exc:
                chunk_._bad_token(int(at[exc.rows[0]]), "field:index:value with a decimal field")
        try:
            index, _ = Fields(buf, index_starts, last).parse_uint()
        except ParseError as exc:
            chunk_._bad_token(int(exc.rows[0]), "index:value with a decimal index")
        try:
            value, present = Fields(buf, last + 1, ends).parse_float()
        except ParseError as exc:
            chunk_._bad_token(int(exc.rows[0]), "index:value with a numeric value")
        chunk_.fields, chunk_.index = fields, index
        chunk_.value, chunk_.value_present = value, present
        if claims.complete:
            chunk_._check_taken()
        return chunk_

    def _check_taken(self) -> None:
        """Every token with a value is taken by a slot or a numeric column."""
        c = self.claims
        free = self.value_present & (self.value != 0)
        free &= ~np.isin(self.index, c.numeric) & ~np.isin(self.fields, c.fields)
        free &= ~c.in_ranges(self.index)
        if free.any():
            token = int(np.argmax(free))
            field = int(self.fields[token])
            what = "its index" if field == int(NO_FIELD) else f"its field {field}"
            self._bad_token(
                token,
                f"taken by any slot ({what} is in none of them; add a slot for it, or "
                f"{FEATURES!r} to the ids to take the rest)",
            )

    def _bad_token(self, token: int, what: str) -> NoReturn:
        text = Fields(self.buf, self.starts, self.ends).text(token)
        raise CorruptDataError(f"{self.where(int(self.token_row[token]))}: {text!r} is not {what}")

    def where(self, row: int) -> str:
        line = self.first_line + int(self.rows[row])
        return f"{self.path}:{line + newlines_before(self.path, self.line_offset)}"

    # ---------------------------------------------------------------------------------------

    def text(self, columns: Sequence[str]) -> Fields:
        parts = [self._column_text(c) for c in columns]
        if len(parts) == 1:
            return Fields(self.buf, parts[0][0], parts[0][1])
        starts = np.stack([p[0] for p in parts], axis=1)
        ends = np.stack([p[1] for p in parts], axis=1)
        return Fields(self.buf, starts, ends)

    def _column_text(self, column: str) -> tuple[I64, I64]:
        if column == LABEL:
            return self.label_starts, self.label_ends
        if not _is_index(column):
            raise InvalidArgumentError(f"column {column!r} of a libSVM file has no text")
        starts = np.zeros(self.size, dtype=np.int64)
        ends = np.zeros(self.size, dtype=np.int64)
        at = np.flatnonzero(self.index == np.uint64(int(column)))
        starts[self.token_row[at]] = self.colons[at] + 1
        ends[self.token_row[at]] = self.ends[at]
        return starts, ends

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        if column == LABEL:
            fields = Fields(self.buf, self.label_starts, self.label_ends)
            values, _ = self.checked(fields, [LABEL], Fields.parse_float)
            wrong = (values != 1.0) & (values != 0.0) & (values != -1.0)
            if wrong.any():
                row = int(np.argmax(wrong))
                raise CorruptDataError(
                    f"{self.where(row)}: label {fields.text(row)!r} is not 1, 0, +1 or -1"
                )
            return (values > 0).astype(np.float64), np.ones(self.size, dtype=bool)
        if not _is_index(column):
            return None
        values = np.zeros(self.size)
        present = np.zeros(self.size, dtype=bool)
        at = np.flatnonzero(self.index == np.uint64(int(column)))
        values[self.token_row[at]] = self.value[at]
        present[self.token_row[at]] = self.value_present[at]
        return values, present

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        slot = slot_of(spec.column)
        if spec.column != FEATURES and slot is None:
            return None
        c = self.claims
        keep = self.value_present & (self.value != 0)
        if c.numeric.size:
            keep &= ~np.isin(self.index, c.numeric)
        if slot is None:  # features: what no slot takes
            if c.fields.size:
                keep &= ~np.isin(self.fields, c.fields)
            if c.ranges.size:
                keep &= ~c.in_ranges(self.index)
        elif slot[0] >= 0:
            keep &= self.fields == np.uint64(slot[0])
        else:
            keep &= (self.index >= np.uint64(slot[1])) & (self.index <= np.uint64(slot[2]))
        if spec.kind is IdKind.INT:
            ids = self.index[keep]
        else:
            names = Fields(self.buf, self.index_starts[keep], self.colons[keep])
            ids, _ = self.parse_ids(names, [spec.column], spec.kind, seed)
        offsets = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.token_row[keep], minlength=self.size), out=offsets[1:])
        return ids, offsets

    # ---------------------------------------------------------------------------------------

    def row_hashes(self, seed: np.uint64) -> U64:
        """Hashes of each row's line (without its line end)."""
        return hash_fields(Fields(self.buf, self.line_starts, self.line_ends), seed)

    def select(self, keep: Bool) -> LibsvmChunk:
        new_row = np.cumsum(keep) - 1
        tok = keep[self.token_row]
        return LibsvmChunk(
            self.path,
            self.buf,
            (self.rows[keep], self.line_starts[keep], self.line_ends[keep]),
            (self.label_starts[keep], self.label_ends[keep]),
            (
                self.starts[tok],
                self.index_starts[tok],
                self.colons[tok],
                self.ends[tok],
                new_row[self.token_row[tok]],
            ),
            (self.fields[tok], self.index[tok], self.value[tok], self.value_present[tok]),
            (self.first_line, self.line_offset),
            self.claims,
        )


def sample_fields(files: Sequence[Path], max_rows: int) -> tuple[tuple[int, ...], bool]:
    """The fields of ``field:index:value`` tokens in the first ``max_rows`` rows of ``files``
    (streamed, a chunk at a time), sorted, and whether any ``index:value`` token was seen.

    Raises:
        CorruptDataError: a malformed token, naming file and line.
    """
    probe = ColumnSpec(ids=(IDColumn(FEATURES),))
    found: set[int] = set()
    plain = False
    left = max_rows
    for path in files:
        reader = LibsvmReader(path, probe, 1, requires_grad=False)
        for chunk in reader.chunks():
            if not isinstance(chunk, LibsvmChunk) or left <= 0:
                break
            rows = min(chunk.size, left)
            left -= rows
            tokens = chunk.token_row < rows
            fields = chunk.fields[tokens]
            plain |= bool((fields == NO_FIELD).any())
            found.update(np.unique(fields[fields != NO_FIELD]).tolist())
        if left <= 0:
            break
    return tuple(sorted(found)), plain
