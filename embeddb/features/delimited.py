"""The generic reader of delimited text (CSV, TSV; gzip or plain), driven by a column spec."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from embeddb.common.arrays import U64, Bool
from embeddb.errors import ConfigError, CorruptDataError
from embeddb.features._block import Block
from embeddb.features._fields import Fields
from embeddb.features._io import newlines_before, open_binary, range_chunks
from embeddb.features._lines import Lines, QuoteError, split_lines, split_record
from embeddb.features._parts import PartsReader, Source, pick_source
from embeddb.features._reader import build_block, equal_to_any
from embeddb.features.hashing import hash_fields
from embeddb.features.spec import ColumnSpec, CsvDialect
from embeddb.features.stream import FilterableChunk, Part, RowFilter

__all__ = ["UTF8_BOM", "CsvReader", "TextChunk", "header_names"]

UTF8_BOM = b"\xef\xbb\xbf"  # spreadsheets start "CSV UTF-8" files with it; dropped


class CsvReader(PartsReader):
    """Batches from delimited text files, as a :class:`ColumnSpec` says.

    The files are read a chunk of lines at a time (``dialect.chunk_bytes``; memory is bounded
    by it, whatever the file size) and every chunk is parsed with whole-array numpy
    operations: no Python code runs per row.

    Several files (or byte ranges of files, from :func:`~embeddb.features.partition`) are
    read in order as one table: they share one set of column names, from the first file's
    header (or ``dialect.names``). A byte range that starts mid-file has no header to skip.
    Fields may be quoted (RFC 4180, :mod:`._lines`); a UTF-8 byte order mark at the start of
    a file (spreadsheets write one) is dropped.

    Args:
        path: the file (gzip-compressed or plain, told apart by its first bytes), a
            :class:`~embeddb.features.Part`, or a list of them.
        spec: which columns are ID features, numeric features and labels.
        batch_size: samples per batch (the last batch may be shorter).
        dialect: delimiter, header, column names, comments, stripping.
        parts: the input as a keyword (instead of ``path``, which is then None).
        row_filter: keeps some rows (a train/test split), before features are built.
        stripe: ``(rank, world)``: keep every ``world``-th chunk, from chunk ``rank``.
        requires_grad: training batches (needs ``spec.labels``).
        drop_last: drop a short last batch.

    Raises:
        NotFoundError: no such file.
        ConfigError: the spec or the filter names a column the files do not have; a file
            whose header differs from the first file's.
        InvalidArgumentError: bad ``batch_size``; ``requires_grad`` without labels.

    Iterating raises :class:`~embeddb.errors.CorruptDataError` (naming the file, its true
    line number, and the column) at a line with the wrong number of fields or a field that
    does not parse. In a byte range that starts mid-file the line number is found, only then,
    by counting the newlines before the range (a streamed pass over those bytes).
    """

    def __init__(
        self,
        path: Source | None,
        spec: ColumnSpec,
        batch_size: int,
        dialect: CsvDialect | None = None,
        *,
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
        self.spec = spec
        self.dialect = dialect or CsvDialect()
        self._check_labels(bool(spec.labels))
        self.names = self._column_names()
        self._index = {name: i for i, name in enumerate(self.names)}
        self._na = tuple(v.encode("utf-8") for v in self.dialect.na_values if v)
        wanted = spec.columns() + list(row_filter.columns if row_filter else ())
        missing = [c for c in dict.fromkeys(wanted) if c not in self.names]
        if missing:
            raise ConfigError(
                "columns", f"{self.path} has no column(s) {missing}; it has {list(self.names)}"
            )

    def _column_names(self) -> tuple[str, ...]:
        d = self.dialect
        if not d.header:
            return d.names or ()  # CsvDialect requires names without a header
        files = self.files()
        names = self._header_names(files[0])
        for other in files[1:]:
            theirs = self._header_names(other)
            if theirs != names:
                raise ConfigError(
                    "header",
                    f"{other} has columns {list(theirs)}, unlike {files[0]}: {list(names)}",
                )
        if d.names is not None:
            if len(d.names) != len(names):
                raise ConfigError(
                    "names", f"{len(d.names)} names for {len(names)} columns of {self.path}"
                )
            return d.names
        return names

    def _header_names(self, path: Path) -> tuple[str, ...]:
        return header_names(path, self.dialect)

    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        d = self.dialect
        skip_header = d.header and part.start == 0
        first_line = 1  # of the chunk, counted from the part's first line
        at: int | None = None  # file offset of the part's first line
        for offset, chunk in range_chunks(part.path, d.chunk_bytes, part.start, part.stop):
            if at is None and offset == 0:  # the file's start: no byte order mark
                chunk = chunk.removeprefix(UTF8_BOM)
            at = offset if at is None else at
            if skip_header:
                chunk, first_line, skip_header = self._drop_header(chunk, first_line)
            yield functools.partial(self._parse, part.path, chunk, first_line, at)
            first_line += chunk.count(b"\n")

    def _parse(self, path: Path, chunk: bytes, first_line: int, at: int) -> TextChunk:
        d = self.dialect
        comment = ord(d.comment) if d.comment else None
        quote = ord(d.quote) if d.quote else None
        try:
            lines = split_lines(
                chunk, ord(d.delimiter), len(self.names), comment, quote, strip=d.strip
            )
        except QuoteError as exc:
            number = first_line + exc.line + newlines_before(path, at)
            raise CorruptDataError(f"{path}:{number}: {exc}") from None
        if lines.bad.size:
            line, fields = (int(x) for x in lines.bad[0])
            number = first_line + line + newlines_before(path, at)
            raise CorruptDataError(f"{path}:{number}: {fields} fields, expected {len(self.names)}")
        return TextChunk(
            path, lines, first_line, self._index, d.strip, line_offset=at, na_values=self._na
        )

    def _build(self, chunk: FilterableChunk) -> Block:
        return build_block(chunk, self.spec, strip=self.dialect.strip)  # na: in the chunk

    def _drop_header(self, chunk: bytes, first_line: int) -> tuple[bytes, int, bool]:
        """Remove the header (and comment or empty lines before it) from the first chunk."""
        comment = self.dialect.comment.encode() if self.dialect.comment else None
        pos = 0
        while pos < len(chunk):
            end = chunk.index(b"\n", pos) + 1
            line = chunk[pos:end].rstrip(b"\r\n")
            first_line += 1
            pos = end
            if line and not (comment and line.startswith(comment)):
                return chunk[pos:], first_line, False
        return b"", first_line, True


class TextChunk(FilterableChunk):
    """Rows of a text file as field ranges of one buffer.

    Args:
        path: the file.
        lines: the chunk's rows of fields.
        first_line: the line number of the chunk's first line, counted from the line at
            ``line_offset`` (which is line 1 when ``line_offset`` is 0).
        index: column name -> field position.
        strip: strip spaces and tabs around fields.
        line_offset: file offset of a part's first line (a part that starts mid-file): the
            newlines before it are counted when a row's line number is asked for.
        na_values: fields equal to one of these (after stripping) are missing (not valid),
            for row filters and order thresholds as for features.
    """

    def __init__(
        self,
        path: Path,
        lines: Lines,
        first_line: int,
        index: dict[str, int],
        strip: bool,
        *,
        line_offset: int = 0,
        na_values: tuple[bytes, ...] = (),
    ) -> None:
        self.path = path
        self.na_values = na_values
        self.lines = lines
        self.first_line = first_line
        self.index = index
        self.strip = strip
        self.line_offset = line_offset
        self.size = int(lines.rows.size)

    def text(self, columns: Sequence[str]) -> Fields:
        cols = [self.index[c] for c in columns]
        lines = self.lines
        if len(cols) == 1:
            fields = Fields(lines.buf, lines.starts[cols[0]], lines.ends[cols[0]])
        else:
            fields = Fields(lines.buf, lines.starts[cols].T, lines.ends[cols].T)
        fields = fields.strip() if self.strip else fields
        if self.na_values:
            hit = equal_to_any(fields, self.na_values)
            if hit.any():
                fields = Fields(fields.buf, fields.starts, fields.ends, ~hit)
        return fields

    def where(self, row: int) -> str:
        line = self.first_line + int(self.lines.rows[row])
        return f"{self.path}:{line + newlines_before(self.path, self.line_offset)}"

    def row_hashes(self, seed: np.uint64) -> U64:
        """Hashes of each row's line as read (without its line end; quotes included)."""
        lines = self.lines
        return hash_fields(Fields(lines.buf, lines.line_starts, lines.line_ends), seed)

    def select(self, keep: Bool) -> TextChunk:
        ln = self.lines
        lines = Lines(
            ln.buf,
            ln.starts[:, keep],
            ln.ends[:, keep],
            ln.rows[keep],
            ln.line_count,
            ln.bad,
            ln.line_starts[keep],
            ln.line_ends[keep],
        )
        return TextChunk(
            self.path,
            lines,
            self.first_line,
            self.index,
            self.strip,
            line_offset=self.line_offset,
            na_values=self.na_values,
        )


def header_names(path: Path, dialect: CsvDialect) -> tuple[str, ...]:
    """The column names in the header line of ``path`` (its first line that is neither empty
    nor a comment), unquoted, and stripped with ``dialect.strip``.

    Raises:
        CorruptDataError: no header line, or one with malformed quotes (naming file:line).
    """
    comment = dialect.comment.encode("utf-8") if dialect.comment else None
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.rstrip(b"\r\n").removeprefix(UTF8_BOM if number == 1 else b"")
            if not line or (comment is not None and line.startswith(comment)):
                continue
            quote = ord(dialect.quote) if dialect.quote else None
            try:
                names = split_record(line, ord(dialect.delimiter), quote, strip=dialect.strip)
            except QuoteError as exc:
                raise CorruptDataError(f"{path}:{number}: header: {exc}") from None
            return tuple(n.strip(" \t") for n in names) if dialect.strip else names
    raise CorruptDataError(f"{path}: no header line")


def read_text_table(path: Path, delimiter: str, names: Sequence[str]) -> TextChunk:
    """A whole (small) headerless delimited file as one chunk, e.g. a side table to join.

    Raises:
        CorruptDataError: a line with the wrong number of fields.
    """
    with open_binary(path) as fh:
        data = fh.read()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    lines = split_lines(data, ord(delimiter), len(names), None)
    if lines.bad.size:
        line, fields = (int(x) for x in lines.bad[0])
        raise CorruptDataError(f"{path}:{line + 1}: {fields} fields, expected {len(names)}")
    return TextChunk(path, lines, 1, {n: i for i, n in enumerate(names)}, strip=False)
