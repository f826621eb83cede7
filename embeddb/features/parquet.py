"""The generic reader of Parquet files, driven by a column spec (needs the ``parquet`` extra).

pyarrow is imported when a :class:`ParquetReader` is made, not with this module, so the core
install stays lean: ``pip install 'embeddb[parquet]'`` adds it.

Column types: a string column is read as text, exactly like a CSV field (hashed, or parsed by
``kind``); an integer column of an ``int`` ID column gives its values as ids; a numeric column
of a numeric feature or label gives its values; a list column of an ID column is multi-valued
(no separator needed). Nulls are missing values, as empty CSV fields are.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.common.arrays import F64, I64, U64, Bool
from embeddb.common.routing import mix64
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from embeddb.features._block import Block
from embeddb.features._fields import Fields
from embeddb.features._parts import PartsReader, Source, pick_source
from embeddb.features._reader import build_block
from embeddb.features.hashing import hash_strings
from embeddb.features.spec import ColumnSpec, IDColumn, IdKind
from embeddb.features.stream import FilterableChunk, Part, RowFilter

__all__ = ["ArrowChunk", "ParquetReader"]


def _pyarrow() -> tuple[Any, Any, Any]:
    try:
        pa = importlib.import_module("pyarrow")
        pc = importlib.import_module("pyarrow.compute")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise ImportError("reading Parquet needs pyarrow: pip install 'embeddb[parquet]'") from exc
    return pa, pc, pq


class ParquetReader(PartsReader):
    """Batches from Parquet files, as a :class:`ColumnSpec` says.

    Several files (or row groups of files, from :func:`~embeddb.features.partition`) are
    read in order as one table.

    Args:
        path: the file, a :class:`~embeddb.features.Part` (its ``row_groups``), or a list.
        spec: which columns are ID features, numeric features and labels.
        batch_size: samples per batch (the last batch may be shorter).
        chunk_rows: rows converted at a time.
        parts: the input as a keyword (instead of ``path``, which is then None).
        row_filter: keeps some rows (a train/test split), before features are built.
        stripe: ``(rank, world)``: keep every ``world``-th chunk, from chunk ``rank``.
        requires_grad: training batches (needs ``spec.labels``).
        drop_last: drop a short last batch.

    Raises:
        ImportError: pyarrow is not installed.
        NotFoundError: no such file.
        ConfigError: the spec or the filter names a column a file does not have.
    """

    def __init__(
        self,
        path: Source | None,
        spec: ColumnSpec,
        batch_size: int,
        *,
        chunk_rows: int = 65536,
        parts: Source | None = None,
        row_filter: RowFilter | None = None,
        stripe: tuple[int, int] = (0, 1),
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
        self._pa, self._pc, self._pq = _pyarrow()
        self.spec = spec
        self.chunk_rows = chunk_rows
        self._check_labels(bool(spec.labels))
        self._filter_columns = list(row_filter.columns) if row_filter else []
        for file in self.files():
            names = self._pq.ParquetFile(file).schema_arrow.names
            wanted = dict.fromkeys(spec.columns() + self._filter_columns)
            missing = [c for c in wanted if c not in names]
            if missing:
                raise ConfigError("columns", f"{file} has no column(s) {missing}; it has {names}")

    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        wanted = list(self.spec.columns() if columns is None else columns)
        cols = list(dict.fromkeys(wanted + self._filter_columns))
        with self._pq.ParquetFile(part.path) as file:
            meta = file.metadata
            first_rows = np.zeros(meta.num_row_groups + 1, dtype=np.int64)
            np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                      out=first_rows[1:])  # fmt: skip
            spans = [(None, 0)] if part.row_groups is None else [
                ([g], int(first_rows[g])) for g in part.row_groups
            ]  # fmt: skip
            for groups, first_row in spans:
                batches = file.iter_batches(
                    batch_size=self.chunk_rows, row_groups=groups, columns=cols
                )
                for batch in batches:
                    yield functools.partial(
                        ArrowChunk, self._pa, self._pc, batch, part.path, first_row
                    )
                    first_row += batch.num_rows

    def _build(self, chunk: FilterableChunk) -> Block:
        return build_block(chunk, self.spec)


class ArrowChunk(FilterableChunk):
    """Rows of an Arrow record batch.

    Args:
        pa, pc: the pyarrow and pyarrow.compute modules.
        batch: the record batch.
        path: the file.
        first_row: the file's row index of the batch's first row.
        file_rows: the file's row index of every row (after a filter), else consecutive.
    """

    def __init__(
        self,
        pa: Any,
        pc: Any,
        batch: Any,
        path: Path | str,
        first_row: int,
        file_rows: I64 | None = None,
    ) -> None:
        self.pa, self.pc = pa, pc
        self.batch = batch
        self.size = int(batch.num_rows)
        self.path = Path(path)
        self.first_row = first_row
        self.file_rows = (
            np.arange(first_row, first_row + self.size, dtype=np.int64)
            if file_rows is None
            else file_rows
        )

    def row_hashes(self, seed: np.uint64) -> U64:
        """Hashes of (file name, row index in the file) of every row."""
        name = hash_strings([self.path.name], "embeddb.parquet-row")[0]
        return mix64(mix64(self.file_rows.astype(np.uint64) ^ name), seed)

    def select(self, keep: Bool) -> ArrowChunk:
        batch = self.batch.filter(self.pa.array(keep))
        return ArrowChunk(self.pa, self.pc, batch, self.path, self.first_row, self.file_rows[keep])

    def where(self, row: int) -> str:
        return f"{self.path}: row {int(self.file_rows[row])}"

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
