"""The generic reader of Parquet files, driven by a column spec (needs the ``parquet`` extra).

pyarrow is imported when a :class:`ParquetReader` is made, not with this module, so the core
install stays lean: ``pip install 'embeddb[parquet]'`` adds it.

Column types: a string column is read as text, exactly like a CSV field (hashed, or parsed by
``kind``); an integer column of an ``int`` ID column gives its values as ids; a numeric column
of a numeric feature or label gives its values; a list column of an ID column is multi-valued
(no separator needed). Nulls are missing values, as empty CSV fields are.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.arrays import F64, I64, U64, Bool
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError

from ._block import Block
from ._fields import Fields
from ._io import existing_file
from ._reader import Chunk, Reader, build_block
from .spec import ColumnSpec, IDColumn, IdKind

__all__ = ["ParquetReader"]


def _pyarrow() -> tuple[Any, Any, Any]:
    try:
        pa = importlib.import_module("pyarrow")
        pc = importlib.import_module("pyarrow.compute")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise ImportError("reading Parquet needs pyarrow: pip install 'embeddb[parquet]'") from exc
    return pa, pc, pq


class ParquetReader(Reader):
    """Batches from a Parquet file, as a :class:`ColumnSpec` says.

    Args:
        path: the file.
        spec: which columns are ID features, numeric features and labels.
        batch_size: samples per batch (the last batch may be shorter).
        chunk_rows: rows converted at a time.
        requires_grad: training batches (needs ``spec.labels``).
        drop_last: drop a short last batch.

    Raises:
        ImportError: pyarrow is not installed.
        NotFoundError: no such file.
        ConfigError: the spec names a column the file does not have.
    """

    def __init__(
        self,
        path: str | Path,
        spec: ColumnSpec,
        batch_size: int,
        *,
        chunk_rows: int = 65536,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, requires_grad=requires_grad, drop_last=drop_last)
        self._pa, self._pc, self._pq = _pyarrow()
        self.path = existing_file(path)
        self.spec = spec
        self.chunk_rows = chunk_rows
        self._check_labels(bool(spec.labels))
        names = self._pq.ParquetFile(self.path).schema_arrow.names
        missing = [c for c in spec.columns() if c not in names]
        if missing:
            raise ConfigError("columns", f"{self.path} has no column(s) {missing}; it has {names}")

    def _blocks(self) -> Iterator[Block]:
        first_row = 0
        with self._pq.ParquetFile(self.path) as file:
            for batch in file.iter_batches(batch_size=self.chunk_rows, columns=self.spec.columns()):
                chunk = ArrowChunk(self._pa, self._pc, batch, f"{self.path}", first_row)
                first_row += chunk.size
                yield build_block(chunk, self.spec)


class ArrowChunk(Chunk):
    """Rows of an Arrow record batch."""

    def __init__(self, pa: Any, pc: Any, batch: Any, where: str, first_row: int) -> None:
        self.pa, self.pc = pa, pc
        self.batch = batch
        self.size = int(batch.num_rows)
        self._where = where
        self.first_row = first_row

    def where(self, row: int) -> str:
        return f"{self._where}: row {self.first_row + row}"

    def _column(self, name: str) -> Any:
        column = self.batch.column(name)
        if self.pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        return column

    def text(self, columns: Sequence[str]) -> Fields:
        parts = [self._strings(self._column(c)) for c in columns]
        if len(parts) == 1:
            return parts[0]
        buf = np.concatenate([p.buf for p in parts])
        shift = np.cumsum([0] + [p.buf.size for p in parts[:-1]])
        starts = np.stack([p.starts + s for p, s in zip(parts, shift, strict=True)], axis=1)
        ends = np.stack([p.ends + s for p, s in zip(parts, shift, strict=True)], axis=1)
        valid = np.stack(
            [np.ones(p.starts.size, bool) if p.valid is None else p.valid for p in parts], axis=1
        )
        return Fields(buf, starts, ends, valid)

    def _strings(self, column: Any) -> Fields:
        """A string-like Arrow array as fields of its own data buffer."""
        pa = self.pa
        if not pa.types.is_large_string(column.type):
            column = column.cast(pa.large_string())
        _, offsets_buf, data_buf = column.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64)[
            column.offset : column.offset + len(column) + 1
        ]
        buf = (
            np.frombuffer(data_buf, dtype=np.uint8)
            if data_buf is not None
            else np.zeros(0, np.uint8)
        )
        valid = None
        if column.null_count:
            valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        return Fields(buf, offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64), valid)

    def _nulls(self, column: Any) -> Bool:
        if not column.null_count:
            return np.ones(len(column), dtype=bool)
        present: Bool = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        return present

    def native_floats(self, column: str) -> tuple[F64, Bool] | None:
        arr = self._column(column)
        t = arr.type
        pa = self.pa
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            return None
        present = self._nulls(arr)
        values = self.pc.fill_null(arr, 0).cast(pa.float64()).to_numpy(zero_copy_only=False)
        return np.asarray(values, dtype=np.float64), present

    def native_uints(self, column: str) -> tuple[U64, Bool] | None:
        arr = self._column(column)
        if not self.pa.types.is_integer(arr.type):
            return None
        return self._uint_values(arr, column)

    def _uint_values(self, arr: Any, column: str) -> tuple[U64, Bool]:
        present = self._nulls(arr)
        values = np.asarray(self.pc.fill_null(arr, 0).to_numpy(zero_copy_only=False))
        if np.issubdtype(values.dtype, np.signedinteger) and values.size and values.min() < 0:
            row = int(np.argmax(values < 0))
            raise CorruptDataError(
                f"{self.where(row)}: column {column!r}: negative id {int(values[row])}"
            )
        return values.astype(np.uint64), present

    def native_lists(self, spec: IDColumn, seed: np.uint64) -> tuple[U64, I64] | None:
        pa, pc = self.pa, self.pc
        arr = self._column(spec.column)
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            return None
        counts = np.asarray(
            pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )
        child = pc.list_flatten(arr)
        if pa.types.is_dictionary(child.type):
            child = child.dictionary_decode()
        if spec.kind is IdKind.INT and pa.types.is_integer(child.type):
            values, present = self._uint_values(child, spec.column)
        elif (
            pa.types.is_string(child.type)
            or pa.types.is_large_string(child.type)
            or (spec.kind is IdKind.STRING)
        ):
            tokens = self._strings(child)
            values, present = self.parse_ids(tokens, [spec.column], spec.kind, seed)
        else:
            raise InvalidArgumentError(
                f"column {spec.column!r}: a list of {child.type} cannot give {spec.kind.value} ids"
            )
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if not present.all():  # null or empty items: drop them
            kept = np.zeros(present.size + 1, dtype=np.int64)
            np.cumsum(present, out=kept[1:])
            values, offsets = values[present], kept[offsets]
        return values, offsets
