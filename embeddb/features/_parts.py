"""The base of readers over several files or parts of files (CSV, Parquet, libSVM).

A :class:`PartsReader` reads its :class:`~embeddb.features.stream.Part` list in order,
a chunk at a time. A subclass says how a part becomes chunks (each parsed only when needed);
the base numbers the chunks, keeps every ``world``-th one for ``stripe=(rank, world)``, gives
each its row index in the whole input (when known), applies the row filter and builds the
blocks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from embeddb.errors import InvalidArgumentError
from embeddb.features._block import Block
from embeddb.features._reader import Reader
from embeddb.features.stream import FilterableChunk, Part, RowFilter, as_parts

Source = str | Path | Part | Sequence[str | Path | Part]


def pick_source(path: Source | None, parts: Source | None) -> Source:
    """The one of ``path`` and ``parts`` that is given.

    Raises:
        InvalidArgumentError: both or neither.
    """
    if (path is None) == (parts is None):
        raise InvalidArgumentError("give the input as path or as parts, exactly one of them")
    return path if path is not None else parts  # type: ignore[return-value]


class PartsReader(Reader):
    """A reader of parts of files, in order (see the module docstring).

    Args:
        source: a path, a :class:`Part`, or a list of them.
        batch_size: samples per batch (the last batch may be shorter).
        row_filter: keeps some rows of each chunk (a train/test split).
        stripe: ``(rank, world)``: keep chunks ``i`` with ``i % world == rank``.
        requires_grad: training batches (need labels).
        drop_last: drop a short last batch.

    Raises:
        NotFoundError: a file that does not exist.
        InvalidArgumentError: no file; a bad stripe or ``batch_size``.
    """

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        row_filter: RowFilter | None = None,
        stripe: tuple[int, int] = (0, 1),
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, requires_grad=requires_grad, drop_last=drop_last)
        self.parts = as_parts(source)
        self.path = self.parts[0].path
        self.row_filter = row_filter
        rank, world = stripe
        if world < 1 or not 0 <= rank < world:
            raise InvalidArgumentError(f"stripe: rank {rank} is not in [0, {world})")
        self.stripe = (rank, world)

    def files(self) -> list[Path]:
        """The distinct files of the parts, in order."""
        return list(dict.fromkeys(p.path for p in self.parts))

    def chunks(self, columns: Sequence[str] | None = None) -> Iterator[FilterableChunk]:
        """This reader's chunks (its stripe, filtered), before features are built.

        Args:
            columns: a hint: only these columns (and the filter's) are used (Parquet then
                reads only those); None: the spec's.
        """
        rank, world = self.stripe
        positional = self.row_filter is not None and self.row_filter.positional
        input_row: int | None = 0 if world == 1 or positional else None
        index = 0
        for part in self.parts:
            if not part.whole:
                input_row = None
            for parse in self._part_chunks(part, columns):
                mine = index % world == rank
                index += 1
                if not (mine or positional):
                    continue
                chunk = parse()
                chunk.input_row = input_row
                if input_row is not None:
                    input_row += chunk.size
                if not mine:
                    continue
                if self.row_filter is not None:
                    keep = self.row_filter.keep(chunk)
                    if not keep.all():
                        chunk = chunk.select(keep)
                yield chunk

    def _blocks(self) -> Iterator[Block]:
        for chunk in self.chunks():
            if chunk.size:
                yield self._build(chunk)

    @abc.abstractmethod
    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        """The chunks of one part, in order, each as a function that parses it."""

    @abc.abstractmethod
    def _build(self, chunk: FilterableChunk) -> Block:
        """The block of a chunk's rows."""
