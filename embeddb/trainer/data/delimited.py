"""The generic reader of delimited text (CSV, TSV; gzip or plain), driven by a column spec."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from embeddb.errors import ConfigError, CorruptDataError

from ._block import Block
from ._fields import Fields, Lines, split_lines
from ._io import existing_file, line_chunks, open_binary
from ._reader import Chunk, Reader, build_block
from .spec import ColumnSpec, CsvDialect

__all__ = ["CsvReader"]


class CsvReader(Reader):
    """Batches from a delimited text file, as a :class:`ColumnSpec` says.

    The file is read a chunk of lines at a time (``dialect.chunk_bytes``) and every chunk is
    parsed with whole-array numpy operations: no Python code runs per row.

    Args:
        path: the file (gzip-compressed or plain, told apart by its first bytes).
        spec: which columns are ID features, numeric features and labels.
        batch_size: samples per batch (the last batch may be shorter).
        dialect: delimiter, header, column names, comments, stripping.
        requires_grad: training batches (needs ``spec.labels``).
        drop_last: drop a short last batch.

    Raises:
        NotFoundError: no such file.
        ConfigError: the spec names a column the file does not have.
        InvalidArgumentError: bad ``batch_size``; ``requires_grad`` without labels.

    Iterating raises :class:`~embeddb.errors.CorruptDataError` (naming the file, line and
    column) at a line with the wrong number of fields or a field that does not parse.
    """

    def __init__(
        self,
        path: str | Path,
        spec: ColumnSpec,
        batch_size: int,
        dialect: CsvDialect | None = None,
        *,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, requires_grad=requires_grad, drop_last=drop_last)
        self.path = existing_file(path)
        self.spec = spec
        self.dialect = dialect or CsvDialect()
        self._check_labels(bool(spec.labels))
        self.names = self._column_names()
        missing = [c for c in spec.columns() if c not in self.names]
        if missing:
            raise ConfigError(
                "columns", f"{self.path} has no column(s) {missing}; it has {list(self.names)}"
            )

    def _column_names(self) -> tuple[str, ...]:
        d = self.dialect
        if d.header:
            header = self._header_line()
            if header is None:
                raise CorruptDataError(f"{self.path}: no header line")
            names = tuple(header.split(d.delimiter))
            if d.strip:
                names = tuple(n.strip() for n in names)
            if d.names is not None:
                if len(d.names) != len(names):
                    raise ConfigError(
                        "names", f"{len(d.names)} names for {len(names)} columns of {self.path}"
                    )
                return d.names
            return names
        return d.names or ()  # CsvDialect requires names without a header

    def _header_line(self) -> str | None:
        with open_binary(self.path) as fh:
            for raw in fh:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line and not (self.dialect.comment and line.startswith(self.dialect.comment)):
                    return line
        return None

    def _blocks(self) -> Iterator[Block]:
        d = self.dialect
        delimiter = ord(d.delimiter)
        comment = ord(d.comment) if d.comment else None
        index = {name: i for i, name in enumerate(self.names)}
        skip_header = d.header
        first_line = 1  # 1-based number of the chunk's first line
        for chunk in line_chunks(self.path, d.chunk_bytes):
            if skip_header:
                chunk, first_line, skip_header = self._drop_header(chunk, first_line)
            lines = split_lines(chunk, delimiter, len(self.names), comment)
            if lines.bad.size:
                line, fields = (int(x) for x in lines.bad[0])
                raise CorruptDataError(
                    f"{self.path}:{first_line + line}: {fields} fields, expected {len(self.names)}"
                )
            text = TextChunk(self.path, lines, first_line, index, d.strip)
            first_line += lines.line_count
            yield build_block(text, self.spec, strip=d.strip)

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


class TextChunk(Chunk):
    """Rows of a text file as field ranges of one buffer."""

    def __init__(
        self, path: Path, lines: Lines, first_line: int, index: dict[str, int], strip: bool
    ) -> None:
        self.path = path
        self.lines = lines
        self.first_line = first_line
        self.index = index
        self.strip = strip
        self.size = int(lines.rows.size)

    def text(self, columns: Sequence[str]) -> Fields:
        cols = [self.index[c] for c in columns]
        lines = self.lines
        if len(cols) == 1:
            fields = Fields(lines.buf, lines.starts[cols[0]], lines.ends[cols[0]])
        else:
            fields = Fields(lines.buf, lines.starts[cols].T, lines.ends[cols].T)
        return fields.strip() if self.strip else fields

    def where(self, row: int) -> str:
        return f"{self.path}:{self.first_line + int(self.lines.rows[row])}"


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
