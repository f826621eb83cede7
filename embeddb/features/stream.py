"""Streaming a dataset larger than memory: disjoint parts per rank, row filters (train/test
splits), a threshold for a split by order, and a bounded shuffle buffer.

* :func:`partition` gives each of ``world`` ranks its :class:`Part` of the input files. Plain
  text files are cut into ``world`` equal byte ranges of their concatenation (many small
  files and one big file balance alike); a line belongs to the range that holds its first
  byte, so every line is read by exactly one rank. gzip files cannot be entered mid-way and
  go whole, Parquet files by row groups, to the least loaded rank (largest first)::

      files a.csv (60 B), b.csv (40 B), world 4: ranks get bytes [0, 25) [25, 50) [50, 75)
      [75, 100) of a+b: rank 2 reads a.csv[50:60) and b.csv[0:15), each through the end of
      the line it starts in (the lines that start in a range are that range's lines).

* A :class:`RowFilter` keeps some rows of each chunk before its features are built:
  :class:`HashSplit` (a seeded hash of the row's text, or of (file name, row index) for
  Parquet: the same rows in every rank, run and partitioning), :class:`OrderSplit` (a
  column's value against a threshold from :func:`order_threshold`), :class:`HeadRows` (the
  first ``n`` rows of the whole input; it needs the input read in order, so ranks stripe
  chunks instead of reading byte ranges).
* :func:`shuffled` reorders a stream of blocks within a buffer of a bounded number of rows.
"""

from __future__ import annotations

import abc
import importlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from embeddb.common.arrays import I64, U8, U64, Bool
from embeddb.errors import ConfigError, InvalidArgumentError
from embeddb.features._block import Block
from embeddb.features._fields import Fields, ParseError
from embeddb.features._io import FileKind, existing_file, file_kind
from embeddb.features._reader import Chunk
from embeddb.features.hashing import namespace_seed

__all__ = [
    "AllOf",
    "ChunkSource",
    "FilterableChunk",
    "HashSplit",
    "HeadRows",
    "OrderSplit",
    "Part",
    "RowFilter",
    "RowStripe",
    "order_threshold",
    "partition",
    "shuffled",
]

logger = logging.getLogger(__name__)

_MAX_KEY_BYTES = 256  # string order keys are compared on at most this many leading bytes
_EMIT_ROWS = 65536  # rows per block that shuffled() emits


# ------------------------------------------------------------------------------------------
# Parts
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """A part of one input file.

    Attributes:
        path: the file.
        start: first byte of a plain text file's range (the range holds the lines starting
            in ``[start, stop)``).
        stop: end of the range (None: the end of the file).
        row_groups: the Parquet row groups to read (None: all).
    """

    path: Path
    start: int = 0
    stop: int | None = None
    row_groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if self.start < 0 or (self.stop is not None and self.stop < self.start):
            raise InvalidArgumentError(f"{self.path}: bad byte range [{self.start}, {self.stop})")

    @property
    def whole(self) -> bool:
        """The part is the whole file."""
        return self.start == 0 and self.stop is None and self.row_groups is None


def as_parts(source: str | Path | Part | Sequence[str | Path | Part]) -> tuple[Part, ...]:
    """``source`` (a path, a part, or a list of them) as parts of existing files.

    Raises:
        InvalidArgumentError: an empty list.
        NotFoundError: a file that does not exist.
    """
    items = [source] if isinstance(source, (str, Path, Part)) else list(source)
    if not items:
        raise InvalidArgumentError("no input files")
    parts = tuple(p if isinstance(p, Part) else Part(Path(p)) for p in items)
    for part in parts:
        existing_file(part.path)
    return parts


def partition(files: Sequence[str | Path], rank: int, world: int) -> list[Part]:
    """The parts of ``files`` that rank ``rank`` of ``world`` reads (see the module docstring).

    Every rank computes the same split from the file sizes alone. Parts come in the order of
    ``files``.

    Raises:
        InvalidArgumentError: ``rank`` not in ``[0, world)``.
        NotFoundError: a file that does not exist.
    """
    if world < 1 or not 0 <= rank < world:
        raise InvalidArgumentError(f"rank {rank} is not in [0, {world})")
    paths = [existing_file(f) for f in files]
    if world == 1:
        return [Part(p) for p in paths]
    kinds = [file_kind(p) for p in paths]
    sizes = [p.stat().st_size for p in paths]
    mine: list[tuple[int, Part]] = []
    total = sum(s for s, k in zip(sizes, kinds, strict=True) if k is FileKind.TEXT)
    lo, hi = total * rank // world, total * (rank + 1) // world
    offset = 0
    for i, (path, kind, size) in enumerate(zip(paths, kinds, sizes, strict=True)):
        if kind is not FileKind.TEXT:
            continue
        start, stop = max(lo - offset, 0), min(hi - offset, size)
        if start < stop:
            mine.append((i, Part(path, start, None if stop == size else stop)))
        offset += size
    # (size, file index, row group or -1) of every unit that cannot be cut
    units = [
        unit
        for i, (path, kind, size) in enumerate(zip(paths, kinds, sizes, strict=True))
        if kind is not FileKind.TEXT
        for unit in (_row_groups(path, i) if kind is FileKind.PARQUET else [(size, i, -1)])
    ]
    if units and len(units) < world:
        logger.warning(
            "partition: %d gzip files or Parquet row groups for %d ranks: some ranks get none "
            "of them (decompress the files or split them to balance)",
            len(units),
            world,
        )
    loads = [0] * world
    groups: dict[int, list[int]] = {}
    for size, i, group in sorted(units, key=lambda u: (-u[0], u[1], u[2])):
        owner = loads.index(min(loads))
        loads[owner] += size
        if owner == rank:
            groups.setdefault(i, []).append(group)
    for i, found in groups.items():
        row_groups = None if found == [-1] else tuple(sorted(found))
        mine.append((i, Part(paths[i], row_groups=row_groups)))
    return [part for _, part in sorted(mine, key=lambda x: (x[0], x[1].start))]


def _row_groups(path: Path, index: int) -> list[tuple[int, int, int]]:
    """``(bytes, file index, row group)`` of a Parquet file, or the whole file without pyarrow."""
    try:
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError:
        return [(path.stat().st_size, index, -1)]
    meta = pq.ParquetFile(path).metadata
    return [(meta.row_group(g).total_byte_size, index, g) for g in range(meta.num_row_groups)]


# ------------------------------------------------------------------------------------------
# Row filters
# ------------------------------------------------------------------------------------------


class FilterableChunk(Chunk):
    """A chunk that row filters can work on (text, Parquet and libSVM chunks are).

    Attributes:
        input_row: the index of the chunk's first row in the reader's whole input (rows of
            every part, in order), None when unknown (a part that starts mid-file).
    """

    input_row: int | None = None

    @abc.abstractmethod
    def row_hashes(self, seed: np.uint64) -> U64:
        """A seeded 64-bit hash per row of the row's identity (its text, or file and index)."""

    @abc.abstractmethod
    def select(self, keep: Bool) -> FilterableChunk:
        """The rows where ``keep``; ``where`` still names each row's true file and line."""


class RowFilter(abc.ABC):
    """Which rows of a chunk a reader keeps (applied before features are built)."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the filter reads (readers check that they exist)."""
        return ()

    @property
    def positional(self) -> bool:
        """The filter needs every chunk's ``input_row`` (the whole input read in order)."""
        return False

    @abc.abstractmethod
    def keep(self, chunk: Chunk) -> Bool:
        """A mask over the rows of ``chunk``: true for the rows to keep."""


def _fraction(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError("fraction", f"must be a number between 0 and 1, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class HashSplit(RowFilter):
    """A random split by a seeded hash of each row: about ``fraction`` of the rows are test.

    The hash is of the row's line (text and libSVM; without its line end) or of its file name
    and row index (Parquet), so a row falls on the same side in every rank, run and
    partitioning. Identical lines fall on the same side.

    Attributes:
        fraction: the share of test rows, in (0, 1).
        seed: picks another split.
        test: keep the test rows (else the train rows).
    """

    fraction: float
    seed: int = 0
    test: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fraction", _fraction(self.fraction))

    def keep(self, chunk: Chunk) -> Bool:
        if not isinstance(chunk, FilterableChunk):
            raise InvalidArgumentError(f"HashSplit cannot hash the rows of a {type(chunk)}")
        hashes = chunk.row_hashes(namespace_seed(f"embeddb.split/{self.seed}"))
        unit = (hashes >> np.uint64(11)).astype(np.float64) * 2.0**-53
        is_test: Bool = unit < self.fraction
        return is_test if self.test else ~is_test


@dataclass(frozen=True)
class OrderSplit(RowFilter):
    """A split by order: rows whose ``column`` is ``>= threshold`` are test.

    A float threshold compares numbers (the column must parse as numbers); a string threshold
    compares bytes, which orders ISO timestamps (``"2017-11-07 09:30:38"``) by time. Rows with
    an empty field are train.

    Attributes:
        column: the column that orders the rows.
        threshold: from :func:`order_threshold`.
        test: keep the test rows (else the train rows).
    """

    column: str
    threshold: float | str
    test: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float, str)):
            raise ConfigError("threshold", f"must be a number or a string: {self.threshold!r}")
        if isinstance(self.threshold, int):
            object.__setattr__(self, "threshold", float(self.threshold))

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column,)

    def keep(self, chunk: Chunk) -> Bool:
        if isinstance(self.threshold, float):
            values, present = chunk.floats([self.column])
            is_test: Bool = present.ravel() & (values.ravel() >= self.threshold)
        else:
            fields = chunk.text([self.column]).flat()
            is_test = fields.present() & _at_least(fields, self.threshold.encode("utf-8"))
        return is_test if self.test else ~is_test


def _at_least(fields: Fields, bound: bytes) -> Bool:
    """Fields whose bytes are ``>= bound`` in lexicographic order."""
    width = len(bound) + 1  # the first len(bound) + 1 bytes decide the order against bound
    ref = np.frombuffer(bound + b"\0", dtype=np.uint8)
    mat = _byte_matrix(fields, width)
    differ = mat != ref
    first = np.argmax(differ, axis=1)
    rows = np.arange(mat.shape[0])
    out: Bool = ~differ.any(axis=1) | (mat[rows, first] > ref[first])
    return out


def _byte_matrix(fields: Fields, width: int) -> U8:
    """The first ``width`` bytes of every field, zero-padded, ``(n, width)`` uint8."""
    starts, ends = fields.starts.ravel(), fields.ends.ravel()
    idx = starts[:, None] + np.arange(width, dtype=np.int64)
    mask = idx < ends[:, None]
    if fields.buf.size == 0:
        return np.zeros(idx.shape, np.uint8)
    mat: U8 = fields.buf[np.clip(idx, 0, fields.buf.size - 1)]
    mat[~mask] = 0
    return mat


@dataclass(frozen=True)
class HeadRows(RowFilter):
    """A split by position: the first ``n`` rows of the whole input are train, the rest test.

    It needs the row index of every chunk in the whole input, so every rank reads the whole
    input in order and keeps every ``world``-th chunk (``stripe=(rank, world)``), rather than
    reading byte ranges.

    Attributes:
        n: train rows.
        test: keep the test rows (else the train rows).
    """

    n: int
    test: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 0:
            raise ConfigError("rows", f"must be an int >= 0, got {self.n!r}")

    @property
    def positional(self) -> bool:
        return True

    def keep(self, chunk: Chunk) -> Bool:
        rows = _input_rows(
            chunk,
            "HeadRows needs the whole input read in order: give the reader whole files "
            "(stripe chunks across ranks instead of reading byte ranges)",
        )
        is_train: Bool = rows < self.n
        return ~is_train if self.test else is_train


@dataclass(frozen=True)
class RowStripe(RowFilter):
    """Every ``world``-th row of the whole input, from row ``rank``: how ranks share input
    that has fewer whole-file parts (``.gz`` files, Parquet row groups) than ranks, e.g. one
    small ``.gz`` file. Every rank parses all of it and keeps its rows.

    Attributes:
        rank: this rank, in ``[0, world)``.
        world: the number of ranks.
    """

    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise InvalidArgumentError(f"stripe: rank {self.rank} is not in [0, {self.world})")

    @property
    def positional(self) -> bool:
        return True

    def keep(self, chunk: Chunk) -> Bool:
        rows = _input_rows(chunk, "RowStripe needs the whole input read in order")
        mine: Bool = rows % self.world == self.rank
        return mine


def _input_rows(chunk: Chunk, unknown: str) -> I64:
    """The input row number of each row of ``chunk`` (positional filters need them).

    Raises:
        InvalidArgumentError: ``unknown``, when the chunk does not know where it starts (a
            byte range of a file).
    """
    first = chunk.input_row if isinstance(chunk, FilterableChunk) else None
    if first is None:
        raise InvalidArgumentError(unknown)
    return np.arange(first, first + chunk.size, dtype=np.int64)


@dataclass(frozen=True)
class AllOf(RowFilter):
    """The rows every one of ``filters`` keeps."""

    filters: tuple[RowFilter, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for f in self.filters for c in f.columns))

    @property
    def positional(self) -> bool:
        return any(f.positional for f in self.filters)

    def keep(self, chunk: Chunk) -> Bool:
        keep: Bool = np.ones(chunk.size, dtype=bool)
        for f in self.filters:
            keep &= f.keep(chunk)
        return keep


# ------------------------------------------------------------------------------------------
# The threshold of an order split
# ------------------------------------------------------------------------------------------


class ChunkSource(Protocol):
    """What :func:`order_threshold` reads: a reader's chunks (CsvReader, ParquetReader, ...)."""

    def chunks(self, columns: Sequence[str] | None = None) -> Iterator[FilterableChunk]:
        """The reader's chunks before features are built; ``columns`` a hint of those used."""
        ...


def order_threshold(
    source: ChunkSource, column: str, fraction: float, *, max_sample: int = 100_000, seed: int = 0
) -> float | str:
    """The ``1 - fraction`` quantile of ``column``: with :class:`OrderSplit`, about ``fraction``
    of the rows (the last ones in that order) are test.

    One streamed pass over ``source`` that reads only ``column``, keeping a uniform sample of
    at most ``max_sample`` values (bottom-k of random keys; memory bounded by ``max_sample``).
    The column is numeric if every sampled value parses as a number (the threshold is then a
    float), else its values are ordered as bytes (the first 256 bytes; a str threshold).

    Raises:
        ConfigError: a bad fraction, or a column without any value.
        CorruptDataError: from the source (a malformed line).
    """
    fraction = _fraction(fraction)
    if max_sample < 1:
        raise InvalidArgumentError(f"max_sample must be >= 1, got {max_sample}")
    rng = np.random.default_rng(seed)
    keys = np.zeros(0)
    numbers: np.ndarray | None = np.zeros(0)
    strings: np.ndarray | None = np.zeros(0, dtype="S1")
    for chunk in source.chunks([column]):
        native = chunk.native_floats(column)
        fields = None if native is not None else chunk.text([column]).flat()
        present = native[1] if native is not None else fields.present()  # type: ignore[union-attr]
        rows = np.flatnonzero(present)
        k = rng.random(rows.size)
        if keys.size >= max_sample:
            wanted = k < keys.max()
            rows, k = rows[wanted], k[wanted]
        if not rows.size:
            continue
        keys = np.concatenate([keys, k])
        if native is not None:
            strings = None
            numbers = np.concatenate([numbers, native[0][rows]])
        elif fields is not None:
            picked = Fields(fields.buf, fields.starts[rows], fields.ends[rows])
            width = max(1, min(int(picked.lengths.max()), _MAX_KEY_BYTES))
            text = _byte_matrix(picked, width).view(f"S{width}").ravel()
            strings = None if strings is None else np.concatenate([strings, text])
            if numbers is not None:
                try:
                    numbers = np.concatenate([numbers, picked.parse_float()[0]])
                except ParseError:
                    numbers = None
        if keys.size > max_sample:
            sample = np.argpartition(keys, max_sample - 1)[:max_sample]
            keys = keys[sample]
            numbers = None if numbers is None else numbers[sample]
            strings = None if strings is None else strings[sample]
    if not keys.size:
        raise ConfigError("order_by", f"column {column!r} has no values")
    at = min(int((1.0 - fraction) * keys.size), keys.size - 1)
    if numbers is not None:
        return float(np.sort(numbers)[at])
    sample = strings if strings is not None else np.zeros(keys.size, dtype="S1")
    return bytes(np.sort(sample)[at]).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------
# Shuffling
# ------------------------------------------------------------------------------------------


def shuffled(
    blocks: Iterator[Block], buffer_rows: int, rng: np.random.Generator
) -> Iterator[Block]:
    """The rows of ``blocks``, each exactly once, in an order shuffled within a bounded buffer.

    Incoming rows gather until the buffer holds ``buffer_rows``; then the buffer is permuted,
    half of it is emitted and half kept to mix with the next rows (a row stays for a
    geometric number of rounds, so rows travel beyond one buffer's span). At the end the rest
    is permuted and emitted. The buffer holds at most ``buffer_rows`` rows plus one incoming
    block; a merge briefly copies them once more. The order depends only on the rows and
    ``rng``: a seeded generator reproduces it.

    Args:
        blocks: the rows in reading order.
        buffer_rows: rows held at most; 0 passes ``blocks`` through unchanged.
        rng: the source of the permutations.

    Raises:
        InvalidArgumentError: a negative ``buffer_rows``.
    """
    if buffer_rows < 0:
        raise InvalidArgumentError(f"buffer_rows must be >= 0, got {buffer_rows}")
    if buffer_rows == 0:
        yield from blocks
        return
    held: list[Block] = []
    held_rows = 0
    for block in blocks:
        if block.size == 0:
            continue
        held.append(block)
        held_rows += block.size
        if held_rows < buffer_rows:
            continue
        merged = Block.concat(held)
        held = []
        order = rng.permutation(merged.size)
        emit = merged.size - buffer_rows // 2
        for lo in range(0, emit, _EMIT_ROWS):
            yield merged.take(order[lo : min(lo + _EMIT_ROWS, emit)])
        if emit < merged.size:
            held = [merged.take(order[emit:])]
        held_rows = merged.size - emit
    if held:
        merged = Block.concat(held)
        order = rng.permutation(merged.size)
        for lo in range(0, merged.size, _EMIT_ROWS):
            yield merged.take(order[lo : lo + _EMIT_ROWS])
