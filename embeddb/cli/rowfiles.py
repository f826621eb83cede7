"""Read the row files ``embeddb populate`` loads, each validated against the table's dim.

Formats, exactly what ``embeddb scan`` writes (:mod:`embeddb.cli.inspect`) plus numpy's:

- ``csv``: one row per line, ``id,v0,v1,...,v{dim-1}`` (an optional first line starting with
  ``id`` is a header and skipped; blank lines are skipped). Parsed a block of lines at a time
  by :func:`numpy.loadtxt` into a structured array; never a Python loop per value.
- ``jsonl``: one ``{"id": 7, "vector": [...]}`` object per line (``json`` per line).
- ``npz``: arrays ``ids`` (integers, ``[n]``) and ``vectors`` (floats, ``[n, dim]``); positions
  are ``row k`` (``ids[k]``), not lines.

A row is valid when its id is an integer in ``[0, 2^64)``, its vector has ``dim`` finite
values. Every problem raises :class:`~embeddb.errors.InvalidArgumentError` naming the file and
the 1-based line (or the row) of the first bad row in the block. Ids repeated across blocks are
found by :func:`first_duplicate`.
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from embeddb.common.arrays import F32, I64, U64
from embeddb.errors import InvalidArgumentError

__all__ = ["FORMATS", "Block", "first_duplicate", "read_blocks"]

FORMATS = ("csv", "jsonl", "npz")
_NEWLINE, _COMMA, _CR = ord("\n"), ord(","), ord("\r")
_MAX_ID = (1 << 64) - 1
_NUMPY_ROW = re.compile(r" at row \d+, column (\d+)\.?$")


@dataclass(frozen=True)
class Block:
    """Rows read from one stretch of a file, all valid.

    Attributes:
        ids: ``[n]`` uint64.
        vectors: ``[n, dim]`` float32, finite.
        lines: ``[n]`` the 1-based line of each row (npz: its 0-based row index).
    """

    ids: U64
    vectors: F32
    lines: I64


def read_blocks(
    stream: IO[bytes], fmt: str, dim: int, block_rows: int, name: str
) -> Iterator[Block]:
    """The valid rows of ``stream`` in blocks of at most ``block_rows`` lines (rows).

    Args:
        stream: the file, binary (seekable for ``npz``).
        fmt: ``csv``, ``jsonl`` or ``npz``.
        dim: the values each row must have.
        block_rows: lines (rows) read per block.
        name: the file's name in messages.

    Raises:
        InvalidArgumentError: naming ``name`` and the line (row) of the first bad row.
    """
    if fmt == "npz":
        yield from _npz_blocks(stream, dim, block_rows, name)
        return
    parse = _parse_csv if fmt == "csv" else _parse_jsonl
    line = 1  # the file line of lines[0]
    while lines := list(itertools.islice(stream, block_rows)):
        next_line = line + len(lines)
        if line == 1 and fmt == "csv" and lines[0][:2].lower() == b"id":
            lines, line = lines[1:], 2  # the header line
        block = parse(lines, line, dim, name)
        if block.ids.size:
            yield block
        line = next_line


def first_duplicate(ids: U64, lines: I64) -> tuple[int, int, int] | None:
    """The id that comes twice, earliest by its second line: ``(id, first line, second line)``;
    None when the ids are distinct."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
    if repeats.size == 0:
        return None
    second = lines[order[repeats + 1]]
    k = int(np.argmin(second))
    return int(ordered[repeats[k]]), int(lines[order[repeats[k]]]), int(second[k])


def _error(name: str, where: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} {where}: {message}")


def _check_finite(ids: U64, vectors: F32, lines: I64, name: str, where: str) -> Block:
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        k = int(np.argmin(finite))
        raise _error(name, f"{where} {lines[k]}", "a value is NaN, infinite or beyond float32")
    return Block(ids, vectors, lines)


# ------------------------------------------------------------------------- csv
def _parse_csv(lines: list[bytes], first_line: int, dim: int, name: str) -> Block:
    """One block of csv lines: field counts checked on the raw bytes, then one ``loadtxt``."""
    block = b"".join(lines)
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NEWLINE)
    if buf.size and buf[-1] != _NEWLINE:
        ends = np.append(ends, buf.size)  # the last line has no newline
    starts = np.concatenate(([0], ends[:-1] + 1))
    commas = np.flatnonzero(buf == _COMMA)
    fields = np.searchsorted(commas, ends) - np.searchsorted(commas, starts) + 1
    length = ends - starts
    blank = (length == 0) | ((length == 1) & (buf[np.minimum(starts, buf.size - 1)] == _CR))
    kept = np.flatnonzero(~blank)
    line_of: I64 = (first_line + kept).astype(np.int64)
    wrong = fields[kept] != dim + 1
    if wrong.any():
        k = int(np.argmax(wrong))
        got = int(fields[kept[k]])
        raise _error(
            name,
            f"line {line_of[k]}",
            f"expected an id and {dim} values ({dim + 1} fields), got {got} fields",
        )
    row = np.dtype([("id", np.uint64), ("vector", np.float32, (dim,))])

    def load(text: bytes) -> Any:
        with np.errstate(over="ignore"):  # beyond float32: inf, reported as not finite
            return np.loadtxt(
                io.StringIO(text.decode("utf-8")),
                delimiter=",",
                dtype=row,
                ndmin=1,
                comments=None,
            )

    try:
        parsed = load(block)
    except (ValueError, UnicodeDecodeError):
        rows = [lines[int(i)] for i in kept]
        k = _first_failure(rows, lambda part: load(b"".join(part)))
        raise _error(name, f"line {line_of[k]}", _reason(rows[k], load)) from None
    ids: U64 = np.ascontiguousarray(parsed["id"])
    vectors: F32 = np.ascontiguousarray(parsed["vector"]).reshape(-1, dim)
    return _check_finite(ids, vectors, line_of, name, "line")


def _first_failure(rows: list[bytes], parse: Callable[[list[bytes]], Any]) -> int:
    """The index of the first row ``parse`` rejects (bisection; the block failed as a whole)."""
    lo, hi = 0, len(rows)  # the first failure lies in rows[lo:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            parse(rows[lo:mid])
        except (ValueError, UnicodeDecodeError):
            hi = mid
        else:
            lo = mid
    return lo


def _reason(line: bytes, load: Callable[[bytes], Any]) -> str:
    try:
        load(line)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError as exc:
        return _NUMPY_ROW.sub(r" (field \1)", str(exc))
    return "unreadable"


# ------------------------------------------------------------------------- jsonl
def _parse_jsonl(lines: list[bytes], first_line: int, dim: int, name: str) -> Block:
    """One block of JSON lines (``json.loads`` per line, one array conversion per block)."""
    ids: list[int] = []
    vectors: list[Any] = []
    line_of: list[int] = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"line {first_line + k}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise _error(name, where, f"not JSON: {exc}") from None
        if not isinstance(record, dict) or "id" not in record or "vector" not in record:
            raise _error(name, where, 'expected {"id": ID, "vector": [...]}')
        id_, vector = record["id"], record["vector"]
        if isinstance(id_, bool) or not isinstance(id_, int) or not 0 <= id_ <= _MAX_ID:
            raise _error(name, where, f"id {id_!r} is not an integer in [0, 2^64)")
        if not isinstance(vector, list) or len(vector) != dim:
            got = len(vector) if isinstance(vector, list) else type(vector).__name__
            raise _error(name, where, f"expected a vector of {dim} values, got {got}")
        ids.append(id_)
        vectors.append(vector)
        line_of.append(first_line + k)
    lines_arr: I64 = np.array(line_of, dtype=np.int64)
    try:
        values = np.array(vectors, dtype=np.float64).reshape(-1, dim)
    except (TypeError, ValueError):
        k = next(i for i, v in enumerate(vectors) if not _numbers(v))
        raise _error(name, f"line {line_of[k]}", "a value is not a number") from None
    with np.errstate(over="ignore"):
        vectors32: F32 = values.astype(np.float32)
    return _check_finite(np.array(ids, dtype=np.uint64), vectors32, lines_arr, name, "line")


def _numbers(vector: list[Any]) -> bool:
    try:
        np.array(vector, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return all(not isinstance(v, bool | str) for v in vector)


# ------------------------------------------------------------------------- npz
def _npz_blocks(stream: IO[bytes], dim: int, block_rows: int, name: str) -> Iterator[Block]:
    try:
        archive = np.load(stream, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InvalidArgumentError(f"{name}: not an .npz archive: {exc}") from None
    with archive:
        missing = {"ids", "vectors"} - set(archive.files)
        if missing:
            raise InvalidArgumentError(f"{name}: no array {' or '.join(sorted(missing))}")
        ids, vectors = archive["ids"], archive["vectors"]
    if ids.ndim != 1 or ids.dtype.kind not in "ui":
        raise InvalidArgumentError(f"{name}: ids must be 1-D integers, got {ids.dtype}{ids.shape}")
    if vectors.dtype.kind != "f" or vectors.shape != (ids.size, dim):
        raise InvalidArgumentError(
            f"{name}: vectors must be floats of shape ({ids.size}, {dim}), "
            f"got {vectors.dtype}{vectors.shape}"
        )
    if ids.dtype.kind == "i" and ids.size and ids.min() < 0:
        k = int(np.argmax(ids < 0))
        raise _error(name, f"row {k}", f"id {ids[k]} is negative")
    ids64: U64 = ids.astype(np.uint64)
    for start in range(0, ids.size, block_rows):
        part = slice(start, start + block_rows)
        with np.errstate(over="ignore"):
            block: F32 = vectors[part].astype(np.float32)
        rows: I64 = np.arange(start, start + block.shape[0], dtype=np.int64)
        yield _check_finite(ids64[part], block, rows, name, "row")
