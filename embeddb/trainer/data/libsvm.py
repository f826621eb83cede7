"""The reader of libSVM / libFM text (``label idx:val idx:val ...``; gzip or plain).

Each line is a label and sparse features, separated by spaces or tabs::

    1 3:1 17:0.5 2041:1
    -1 3:1 9:1

A :class:`LibsvmReader` offers these columns to a :class:`~embeddb.trainer.data.ColumnSpec`:

* ``label``: 1 for a label of ``1`` or ``+1``; 0 for ``0`` or ``-1``; any other label is a
  :class:`~embeddb.errors.CorruptDataError`.
* ``features``: the ragged ID feature of every index present with a non-zero value. Only
  presence counts: the values are otherwise ignored (libFM's one-hot categorical data). With
  ``kind="int"`` (the default of :func:`libsvm_spec`) the ids are the indexes themselves;
  ``kind="string"`` hashes their text per feature namespace.
* ``"17"`` (any decimal index): the value of index 17 in each row, empty where the row lacks
  it; use it in a :class:`~embeddb.trainer.data.NumericColumn` (``fill`` when absent). An index
  read as its own column is left out of ``features``.

Parsing is vectorised over a chunk (tokens split at blanks, then at ``:``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

from embeddb.arrays import F64, I64, U8, U64, Bool
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError

from ._block import Block
from ._fields import Fields, ParseError
from ._io import newlines_before, range_chunks
from ._parts import PartsReader, Source, pick_source
from ._reader import build_block
from .hashing import hash_fields
from .spec import ColumnSpec, IDColumn, IdKind, LabelColumn, NumericColumn
from .stream import FilterableChunk, Part, RowFilter

__all__ = ["FEATURES", "LABEL", "LibsvmChunk", "LibsvmReader", "libsvm_spec"]

LABEL = "label"
FEATURES = "features"
_SPACE, _TAB, _NL, _CR, _COLON = 32, 9, 10, 13, 58


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
        path: the file (gzip or plain), a :class:`~embeddb.trainer.data.Part`, or a list.
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
        unknown = [c for c in columns if c not in (LABEL, FEATURES) and not _is_index(c)]
        if unknown:
            raise ConfigError(
                "columns",
                f"a libSVM file has the columns {LABEL!r}, {FEATURES!r} and decimal indexes "
                f"('17'), not {unknown}",
            )
        self._claimed = np.array(sorted({int(c) for c in columns if _is_index(c)}), np.uint64)

    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        first_line = 1
        at: int | None = None
        for offset, chunk in range_chunks(part.path, self.chunk_bytes, part.start, part.stop):
            at = offset if at is None else at
            yield functools.partial(
                LibsvmChunk.parse, part.path, chunk, first_line, at, self._claimed
            )
            first_line += chunk.count(b"\n")

    def _build(self, chunk: FilterableChunk) -> Block:
        return build_block(chunk, self.spec)


def _is_index(column: str) -> bool:
    return column.isascii() and column.isdigit()


class LibsvmChunk(FilterableChunk):
    """Rows of libSVM text: per row its line, label and feature tokens (``idx:val``).

    Tokens are kept in row order: token ``t`` belongs to row ``token_row[t]``; its index is
    ``buf[starts[t]:colons[t]]`` and its value ``buf[colons[t] + 1:ends[t]]``.
    """

    def __init__(
        self,
        path: Path,
        buf: U8,
        lines: tuple[I64, I64, I64],
        labels: tuple[I64, I64],
        tokens: tuple[I64, I64, I64, I64],
        parsed: tuple[U64, F64, Bool],
        where: tuple[int, int],
        claimed: U64,
    ) -> None:
        self.path = path
        self.buf = buf
        self.rows, self.line_starts, self.line_ends = lines
        self.label_starts, self.label_ends = labels
        self.starts, self.colons, self.ends, self.token_row = tokens
        self.index, self.value, self.value_present = parsed
        self.first_line, self.line_offset = where
        self.claimed = claimed
        self.size = int(self.rows.size)

    @classmethod
    def parse(
        cls, path: Path, chunk: bytes, first_line: int, line_offset: int, claimed: U64
    ) -> LibsvmChunk:
        """Split a chunk of whole lines into rows and tokens, and parse the tokens.

        Raises:
            CorruptDataError: a token that is not ``index:value``.
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
        owner = np.searchsorted(starts, colons, side="right") - 1
        inside = owner >= 0
        inside[inside] = colons[inside] < ends[owner[inside]]
        counts = np.bincount(owner[inside], minlength=starts.size)
        colon_at = np.zeros(starts.size, dtype=np.int64)
        colon_at[owner[inside]] = colons[inside]
        chunk_ = cls(
            path,
            buf,
            (rows, line_starts, line_ends),
            (tok_starts[first], tok_ends[first]),
            (starts, colon_at, ends, token_row),
            (np.zeros(0, np.uint64), np.zeros(0), np.zeros(0, bool)),
            (first_line, line_offset),
            claimed,
        )
        bad = np.flatnonzero(counts != 1)
        if bad.size:
            chunk_._bad_token(int(bad[0]), "index:value")
        try:
            index, _ = Fields(buf, starts, colon_at).parse_uint()
        except ParseError as exc:
            chunk_._bad_token(int(exc.rows[0]), "index:value with a decimal index")
        try:
            value, present = Fields(buf, colon_at + 1, ends).parse_float()
        except ParseError as exc:
            chunk_._bad_token(int(exc.rows[0]), "index:value with a numeric value")
        chunk_.index, chunk_.value, chunk_.value_present = index, value, present
        return chunk_

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
        if spec.column != FEATURES:
            return None
        keep = self.value_present & (self.value != 0)
        if self.claimed.size:
            keep &= ~np.isin(self.index, self.claimed)
        if spec.kind is IdKind.INT:
            ids = self.index[keep]
        else:
            names = Fields(self.buf, self.starts[keep], self.colons[keep])
            ids, _ = self.parse_ids(names, [FEATURES], spec.kind, seed)
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
            (self.starts[tok], self.colons[tok], self.ends[tok], new_row[self.token_row[tok]]),
            (self.index[tok], self.value[tok], self.value_present[tok]),
            (self.first_line, self.line_offset),
            self.claimed,
        )
