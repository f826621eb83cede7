"""The reader base class and the spec-driven conversion of a chunk of rows into a block.

Every reader is an iterable of :class:`~embeddb.features.batch.Batch`; each ``iter()`` reads its
source again from the start (one epoch). A reader parses its source a chunk at a time into a
:class:`Chunk` (text fields, or native Arrow columns), :func:`build_block` turns the chunk into
columns as a :class:`ColumnSpec` says, and the blocks are cut into batches.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, F64, I64, U64, Bool
from embeddb.errors import CorruptDataError, InvalidArgumentError
from embeddb.features._block import Block, Ids, rebatch
from embeddb.features._fields import Fields, ParseError
from embeddb.features._time import (
    calendar_part,
    decimal_fields,
    parse_timestamps,
    seconds_of_numbers,
)
from embeddb.features.batch import Batch
from embeddb.features.hashing import hash_fields, hash_strings, namespace_seed
from embeddb.features.spec import (
    ColumnSpec,
    DerivedColumn,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
)

_T = TypeVar("_T")


class Reader(abc.ABC):
    """An iterable of batches of ``batch_size`` samples (the last one may be shorter).

    Args:
        batch_size: samples per batch, >= 1.
        requires_grad: mark batches as training batches (they then need labels).
        drop_last: drop a last batch shorter than ``batch_size``.

    Raises:
        InvalidArgumentError: ``batch_size`` below 1.
    """

    def __init__(self, batch_size: int, *, requires_grad: bool = True, drop_last: bool = False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.requires_grad = requires_grad
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[Batch]:
        for block in rebatch(self._blocks(), self.batch_size, self.drop_last):
            yield block.to_batch(self.requires_grad)

    @abc.abstractmethod
    def _blocks(self) -> Iterator[Block]:
        """The source as a stream of blocks (any sizes)."""

    def _check_labels(self, has_labels: bool) -> None:
        if self.requires_grad and not has_labels:
            raise InvalidArgumentError(
                f"{type(self).__name__}: requires_grad=True needs labels; this source has none "
                "(pass requires_grad=False to read it for inference)"
            )


class RowRange(Reader):
    """Rows ``start`` (inclusive) to ``stop`` (exclusive; ``None``: the end) of another
    reader's source, in batches of ``batch_size``: a train/test split of one file by position
    (Criteo's logs are in time order, so the last rows make the honest test set).

    The rows before ``start`` are still parsed (a text file cannot be entered mid-way), a
    block at a time, and dropped; reading stops at ``stop``.

    Raises:
        InvalidArgumentError: a negative ``start`` or ``stop`` below ``start``.
    """

    def __init__(
        self,
        source: Reader,
        start: int,
        stop: int | None = None,
        *,
        batch_size: int | None = None,
        requires_grad: bool | None = None,
        drop_last: bool | None = None,
    ) -> None:
        super().__init__(
            source.batch_size if batch_size is None else batch_size,
            requires_grad=source.requires_grad if requires_grad is None else requires_grad,
            drop_last=source.drop_last if drop_last is None else drop_last,
        )
        if start < 0 or (stop is not None and stop < start):
            raise InvalidArgumentError(f"bad row range [{start}, {stop})")
        self.source = source
        self.start = start
        self.stop = stop

    def _blocks(self) -> Iterator[Block]:
        row = 0
        for block in self.source._blocks():
            first, row = row, row + block.size
            lo = max(self.start - first, 0)
            hi = block.size if self.stop is None else min(self.stop - first, block.size)
            if lo < hi:
                yield block if (lo, hi) == (0, block.size) else block.slice(lo, hi)
            if self.stop is not None and row >= self.stop:
                return


class Chunk(abc.ABC):
    """Rows of a source; subclasses give text fields and, optionally, native columns."""

    size: int

    @abc.abstractmethod
    def text(self, columns: Sequence[str]) -> Fields:
        """Text fields of ``columns``, shape ``(size, len(columns))``."""

    @abc.abstractmethod
    def where(self, row: int) -> str:
        """Where row ``row`` is, for error messages (``path:line``)."""

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        """``(values, present)`` of a natively numeric column, else None."""
        return None

    def native_uints(self, column: str) -> tuple[U64, Bool] | None:
        """``(ids, present)`` of a natively integer column, else None."""
        return None

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        """``(ids, offsets)`` of a natively list-valued column, else None."""
        return None

    # ---------------------------------------------------------------------------------------

    def checked(self, fields: Fields, columns: Sequence[str], parse: Callable[[Fields], _T]) -> _T:
        """``parse(fields)``, with a parse error reported at its row and column."""
        try:
            return parse(fields)
        except ParseError as exc:
            flat = int(exc.rows[0])
            row, col = divmod(flat, len(columns))
            raise CorruptDataError(
                f"{self.where(row)}: column {columns[col]!r}: {fields.text(flat)!r} is not "
                f"{exc.what}"
            ) from None

    def floats(self, columns: Sequence[str]) -> tuple[F64, Bool]:
        values = np.empty((self.size, len(columns)))
        present = np.empty((self.size, len(columns)), dtype=bool)
        natives = [self.native_floats(c) for c in columns]
        text_at = [i for i, n in enumerate(natives) if n is None]
        if text_at:
            cols = [columns[i] for i in text_at]
            v, p = self.checked(self.text(cols), cols, Fields.parse_float)
            shape = (self.size, len(cols))
            values[:, text_at], present[:, text_at] = v.reshape(shape), p.reshape(shape)
        for i, native in enumerate(natives):
            if native is not None:
                values[:, i], present[:, i] = native
        return values, present

    def ids(self, column: str, kind: IdKind, seed: np.uint64) -> tuple[U64, Bool]:
        if kind is IdKind.INT:
            native = self.native_uints(column)
            if native is not None:
                return native
        fields = self.text([column])
        return self.parse_ids(fields, [column], kind, seed)

    def parse_ids(
        self, fields: Fields, columns: Sequence[str], kind: IdKind, seed: np.uint64
    ) -> tuple[U64, Bool]:
        if kind is IdKind.STRING:
            return hash_fields(fields, seed).ravel(), fields.present().ravel()
        parse = Fields.parse_uint if kind is IdKind.INT else Fields.parse_hex
        values, present = self.checked(fields, columns, parse)
        return values.ravel(), present.ravel()


class MissingMarked(Chunk):
    """Another chunk whose text fields equal to one of ``markers`` are missing (not valid).

    Only text is marked: native numbers and lists of the inner chunk pass through.
    """

    def __init__(self, inner: Chunk, markers: tuple[bytes, ...]) -> None:
        self.inner = inner
        self.markers = markers
        self.size = inner.size

    def text(self, columns: Sequence[str]) -> Fields:
        fields = self.inner.text(columns)
        hit = equal_to_any(fields, self.markers)
        if not hit.any():
            return fields
        valid = ~hit if fields.valid is None else fields.valid & ~hit
        return Fields(fields.buf, fields.starts, fields.ends, valid)

    def where(self, row: int) -> str:
        return self.inner.where(row)

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        return self.inner.native_floats(column)

    def native_uints(self, column: str) -> tuple[U64, Bool] | None:
        return self.inner.native_uints(column)

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        return self.inner.native_lists(spec, seed)


class WithDerived(Chunk):
    """Another chunk plus derived columns (:class:`~.spec.DerivedColumn`), computed from their
    source columns' values when first asked for (the same code for a file and for records).
    """

    def __init__(self, inner: Chunk, derived: Sequence[DerivedColumn]) -> None:
        self.inner = inner
        self.derived = {d.name: d for d in derived}
        self.size = inner.size
        self._values: dict[str, tuple[I64, Bool]] = {}

    def _value(self, name: str) -> tuple[I64, Bool]:
        if name not in self._values:
            column = self.derived[name]
            native = self.inner.native_floats(column.source)
            if native is not None:
                seconds, ok = seconds_of_numbers(native[0], column.unit)
                present = native[1]
                bad = present & ~ok
                if bad.any():
                    row = int(np.argmax(bad))
                    raise CorruptDataError(
                        f"{self.where(row)}: column {column.source!r}: {float(native[0][row])!r} "
                        "is not a timestamp"
                    )
            else:
                fields = self.inner.text([column.source])
                parse = functools.partial(parse_timestamps, unit=column.unit)
                seconds, present = self.checked(fields, [column.source], parse)
            self._values[name] = (np.where(present, calendar_part(seconds, column), 0), present)
        return self._values[name]

    def text(self, columns: Sequence[str]) -> Fields:
        if not any(c in self.derived for c in columns):
            return self.inner.text(columns)
        parts = [
            decimal_fields(*self._value(c)) if c in self.derived else self.inner.text([c]).flat()
            for c in columns
        ]
        if len(parts) == 1:
            return parts[0]
        buf = np.concatenate([p.buf for p in parts])
        shift = np.cumsum([0] + [p.buf.size for p in parts[:-1]])
        valid = [np.ones(p.starts.size, bool) if p.valid is None else p.valid for p in parts]
        return Fields(
            buf,
            np.stack([p.starts + k for p, k in zip(parts, shift, strict=True)], axis=1),
            np.stack([p.ends + k for p, k in zip(parts, shift, strict=True)], axis=1),
            np.stack(valid, axis=1),
        )

    def where(self, row: int) -> str:
        return self.inner.where(row)

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        if column in self.derived:
            values, present = self._value(column)
            return values.astype(np.float64), present
        return self.inner.native_floats(column)

    def native_uints(self, column: str) -> tuple[U64, Bool] | None:
        if column in self.derived:
            values, present = self._value(column)
            return values.astype(np.uint64), present
        return self.inner.native_uints(column)

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        return None if spec.column in self.derived else self.inner.native_lists(spec, seed)


def equal_to_any(fields: Fields, markers: Sequence[bytes]) -> Bool:
    """Fields (any shape) whose bytes equal one of ``markers``; one vectorised pass each."""
    starts, lengths = fields.starts.ravel(), fields.lengths.ravel()
    hit = np.zeros(starts.size, dtype=bool)
    for marker in markers:
        width = len(marker)
        rows = np.flatnonzero(lengths == width)
        if not width or not rows.size:
            continue
        window = fields.buf[starts[rows, None] + np.arange(width)]
        same = (window == np.frombuffer(marker, dtype=np.uint8)).all(axis=1)
        hit[rows[same]] = True
    out: Bool = hit.reshape(fields.shape)
    return out


def build_block(
    chunk: Chunk, spec: ColumnSpec, *, strip: bool = False, na_values: Sequence[str] = ()
) -> Block:
    """The features and labels of ``spec`` over the rows of ``chunk``.

    Args:
        chunk: the rows.
        spec: which columns become ID features, numeric features and labels.
        strip: the text was stripped (tokens of multi-valued fields are stripped too).
        na_values: text fields equal to one of these are missing (as empty fields are).

    Raises:
        CorruptDataError: a field that does not parse or an empty label, naming
            ``chunk.where(row)`` and the column.
    """
    markers = tuple(v.encode("utf-8") for v in na_values if v)
    if markers:
        chunk = MissingMarked(chunk, markers)
    if spec.derived:
        chunk = WithDerived(chunk, spec.derived)
    ids = {c.feature: _id_column(chunk, c, strip) for c in spec.ids}
    dense = {n.name: _numeric(chunk, n) for n in spec.numeric}
    labels = {lb.label: _label(chunk, lb) for lb in spec.labels}
    return Block(chunk.size, ids, dense, labels)


def _id_column(chunk: Chunk, spec: IDColumn, strip: bool) -> Ids:
    seed = namespace_seed(spec.hash_namespace)
    if spec.separator is None:
        native = chunk.native_lists(spec, seed)
        if native is None:
            values, present = chunk.ids(spec.column, spec.kind, seed)
            if spec.missing_id is not None:
                values[~present] = np.uint64(spec.missing_id)
                present[:] = True
            return Ids.from_present(values, present)
        values, offsets = native
    else:
        fields = chunk.text([spec.column]).flat()
        tokens, offsets = fields.split(ord(spec.separator))
        if strip:
            tokens, offsets = _drop_empty(tokens.strip(), offsets)
        values, _ = _token_ids(chunk, spec, tokens, offsets, seed)
    if spec.missing_id is not None:
        values, offsets = _fill_empty(values, offsets, np.uint64(spec.missing_id))
    return Ids(values, offsets, False)


def _token_ids(
    chunk: Chunk, spec: IDColumn, tokens: Fields, offsets: I64, seed: np.uint64
) -> tuple[U64, Bool]:
    try:
        return chunk.parse_ids(tokens, [spec.column], spec.kind, seed)
    except CorruptDataError:
        # Report the row that holds the bad token, not the token's index.
        if spec.kind is IdKind.INT:
            parse: Callable[[Fields], tuple[U64, Bool]] = Fields.parse_uint
        else:
            parse = Fields.parse_hex
        try:
            parse(tokens)
        except ParseError as exc:
            tok = int(exc.rows[0])
            row = int(np.searchsorted(offsets, tok, side="right") - 1)
            raise CorruptDataError(
                f"{chunk.where(row)}: column {spec.column!r}: token {tokens.text(tok)!r} is not "
                f"{exc.what}"
            ) from None
        raise


def _drop_empty(tokens: Fields, offsets: I64) -> tuple[Fields, I64]:
    keep = tokens.ends > tokens.starts
    if keep.all():
        return tokens, offsets
    kept = np.zeros(keep.size + 1, dtype=np.int64)
    np.cumsum(keep, out=kept[1:])
    return Fields(tokens.buf, tokens.starts[keep], tokens.ends[keep]), kept[offsets]


def _fill_empty(values: U64, offsets: I64, missing: np.uint64) -> tuple[U64, I64]:
    counts = np.diff(offsets)
    empty = counts == 0
    if not empty.any():
        return values, offsets
    counts = np.maximum(counts, 1)
    new_offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    out = np.full(int(new_offsets[-1]), missing, dtype=np.uint64)
    out[~np.repeat(empty, counts)] = values
    return out, new_offsets


def _numeric(chunk: Chunk, spec: NumericColumn) -> F32:
    values, present = chunk.floats(spec.columns)
    values[~present] = spec.fill
    if spec.log1p:
        np.maximum(values, 0.0, out=values)
        np.log1p(values, out=values)
    if spec.standardize is not None:
        stats = np.array(spec.standardize, dtype=np.float64)
        values -= stats[:, 0]
        values /= stats[:, 1]
    return values.astype(np.float32)


def _label(chunk: Chunk, spec: LabelColumn) -> F32:
    if spec.positive:
        fields = chunk.text([spec.column])
        present = fields.present().ravel()
        wanted = hash_strings(list(spec.positive))
        label: npt.NDArray[np.generic] = np.isin(
            hash_fields(fields, namespace_seed("")).ravel(), wanted
        )
    else:
        values2, present2 = chunk.floats([spec.column])
        values, present = values2.ravel(), present2.ravel()
        if spec.threshold is not None:
            label = values >= spec.threshold
        else:
            label = values > 0
            bad = present & (values != 1) & (values != 0) & (values != -1)
            if bad.any():
                row = int(np.argmax(bad))
                raise CorruptDataError(
                    f"{chunk.where(row)}: label column {spec.column!r}: {float(values[row])!r} "
                    "is not 1, 0 or -1 (name the positive values with positive: or a "
                    "threshold for other labels)"
                )
    if not present.all():
        row = int(np.argmin(present))
        raise CorruptDataError(f"{chunk.where(row)}: label column {spec.column!r} is empty")
    out: F32 = np.asarray(label, dtype=np.float32).reshape(-1, 1)
    return out
