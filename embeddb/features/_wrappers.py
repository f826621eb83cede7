"""Readers that wrap other readers for :class:`~embeddb.features.dataset.DatasetSpec`
(striped, shuffled, empty, head-of-input), and the streamed moments of its standardize fit
and the distinct ids of its ID features."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F64
from embeddb.features import stream
from embeddb.features._block import Block
from embeddb.features._parts import PartsReader
from embeddb.features._reader import Reader

__all__ = ["DistinctIds", "Empty", "Head", "Moments", "Shuffled", "Striped"]


class Moments:
    """Mean and standard deviation per column of some numeric features, merged block by
    block (Chan et al.'s parallel update: stable for any number of rows)."""

    def __init__(self, names: dict[str, None]) -> None:
        self.state: dict[str, tuple[int, F64, F64]] = {}
        self.names = tuple(names)

    def add(self, block: Block) -> None:
        for name in self.names:
            x = block.dense[name].astype(np.float64)
            n_b = x.shape[0]
            if not n_b:
                continue
            mean_b = x.mean(axis=0)
            m2_b = ((x - mean_b) ** 2).sum(axis=0)
            if name not in self.state:
                self.state[name] = (n_b, mean_b, m2_b)
                continue
            n_a, mean_a, m2_a = self.state[name]
            n = n_a + n_b
            delta = mean_b - mean_a
            self.state[name] = (n, mean_a + delta * n_b / n, m2_a + m2_b + delta**2 * n_a * n_b / n)

    def result(self, name: str) -> tuple[tuple[float, float], ...] | None:
        if name not in self.state:
            return None
        n, mean, m2 = self.state[name]
        std = np.sqrt(m2 / n)
        std = np.where((std > 0) & np.isfinite(std), std, 1.0)
        mean = np.where(np.isfinite(mean), mean, 0.0)
        return tuple((float(m), float(s)) for m, s in zip(mean, std, strict=True))


class Striped(Reader):
    """Every ``world``-th block of another reader, from block ``rank`` (chunk striping)."""

    def __init__(self, source: Reader, rank: int, world: int) -> None:
        super().__init__(source.batch_size, requires_grad=source.requires_grad)
        self.source, self.rank, self.world = source, rank, world

    def _blocks(self) -> Iterator[Block]:
        for k, block in enumerate(self.source._blocks()):
            if k % self.world == self.rank:
                yield block


class Shuffled(Reader):
    """Another reader's rows mixed in a bounded buffer (``stream.shuffled``)."""

    def __init__(self, source: Reader, buffer_rows: int, rng: np.random.Generator) -> None:
        super().__init__(source.batch_size, requires_grad=source.requires_grad)
        self.source, self.buffer_rows, self.rng = source, buffer_rows, rng

    def _blocks(self) -> Iterator[Block]:
        return stream.shuffled(self.source._blocks(), self.buffer_rows, self.rng)


class Empty(Reader):
    """No rows (a rank without any part of the input)."""

    def _blocks(self) -> Iterator[Block]:
        return iter(())


class Head(Reader):
    """The train rows of a head-rows split: a reader filtered by ``stream.HeadRows`` (and
    striped), stopped once its input is past the head, so the test rows after it are not
    parsed for training."""

    def __init__(self, source: PartsReader, head_rows: int) -> None:
        super().__init__(source.batch_size, requires_grad=source.requires_grad)
        self.source, self.head_rows = source, head_rows

    def _blocks(self) -> Iterator[Block]:
        for chunk in self.source.chunks():
            if chunk.size:
                yield self.source._build(chunk)
            # a chunk the filter cut (its input_row dropped), or one that reaches the end
            # of the head: every later row is a test row
            if chunk.input_row is None or chunk.input_row + chunk.size >= self.head_rows:
                return


class DistinctIds:
    """The distinct ids of each ID feature over the fitting sample, and whether the count is
    the feature's whole cardinality (:meth:`result`).

    Args:
        names: the ID features.
        sample_rows: the most rows the sample reads.
    """

    def __init__(self, names: tuple[str, ...], sample_rows: int) -> None:
        self.names = names
        self.sample_rows = sample_rows
        self.seen: dict[str, npt.NDArray[np.uint64]] = {n: np.empty(0, np.uint64) for n in names}
        self.rows = 0
        self.at_half: dict[str, int] | None = None

    def add(self, block: Block) -> None:
        half = self.sample_rows // 2
        split = half - self.rows if self.rows < half <= self.rows + block.size else None
        for name in self.names:
            if name not in block.ids:
                continue
            ids = block.ids[name]
            if split is not None:  # the first half ends inside this block
                end = split if ids.offsets is None else int(ids.offsets[split])
                self._merge(name, ids.values[:end])
                self._merge(name, ids.values[end:], at_half=True)
            else:
                self._merge(name, ids.values)
        if split is not None and self.at_half is None:
            self.at_half = {}
        self.rows += block.size

    def _merge(self, name: str, values: npt.NDArray[np.uint64], at_half: bool = False) -> None:
        if at_half:
            if self.at_half is None:
                self.at_half = {}
            self.at_half[name] = self.seen[name].size
        self.seen[name] = np.union1d(self.seen[name], values).astype(np.uint64)

    def result(self) -> dict[str, int]:
        """Feature -> distinct ids, for the features whose count is their cardinality: all
        when the sample read every training row (fewer than ``sample_rows``), else those
        that met no new id in the second half of the sample (saturated); the others (their
        count still growing) are left out."""
        counts = {n: int(ids.size) for n, ids in self.seen.items()}
        if self.rows < self.sample_rows:
            return counts
        half = self.at_half or {}
        return {n: c for n, c in counts.items() if half.get(n) == c}
