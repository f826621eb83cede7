"""Columnar blocks of samples and their re-cutting into batches of a fixed size.

A reader parses its source a chunk at a time into a :class:`Block` (whole columns: CSR ids,
numeric matrices, labels); :func:`rebatch` cuts the stream of blocks into blocks of exactly
``batch_size`` samples (the last one shorter) and :meth:`Block.to_batch` wraps one in the
validated :class:`~embeddb.features.batch.Batch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, I64, U64
from embeddb.features.batch import (
    Batch,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
)


@dataclass(frozen=True)
class Ids:
    """The ids of one feature over a block's samples.

    ``offsets`` is None when every sample has exactly one id (then ``values`` has one per
    sample). ``single`` marks a feature that has at most one id per sample by construction.
    """

    values: U64
    offsets: I64 | None
    single: bool

    @classmethod
    def from_present(cls, values: U64, present: npt.NDArray[np.bool_]) -> Ids:
        """One candidate id per sample, kept where ``present``."""
        if present.all():
            return cls(values, None, True)
        offsets = np.zeros(present.size + 1, dtype=np.int64)
        np.cumsum(present, out=offsets[1:])
        return cls(values[present], offsets, True)

    def full_offsets(self) -> I64:
        if self.offsets is not None:
            return self.offsets
        return np.arange(self.values.size + 1, dtype=np.int64)

    def slice(self, start: int, stop: int) -> Ids:
        if self.offsets is None:
            return Ids(self.values[start:stop], None, self.single)
        offs = self.offsets[start : stop + 1]
        return Ids(self.values[offs[0] : offs[-1]], offs - offs[0], self.single)

    def take(self, rows: npt.NDArray[np.intp]) -> Ids:
        """The samples ``rows``, in that order."""
        if self.offsets is None:
            return Ids(self.values[rows], None, self.single)
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        gather = np.repeat(self.offsets[rows] - offsets[:-1], counts) + np.arange(offsets[-1])
        return Ids(self.values[gather], offsets, self.single)

    @staticmethod
    def concat(parts: list[Ids]) -> Ids:
        values = np.concatenate([p.values for p in parts])
        if all(p.offsets is None for p in parts):
            return Ids(values, None, parts[0].single)
        offs = [parts[0].full_offsets()]
        for p in parts[1:]:
            offs.append(p.full_offsets()[1:] + offs[-1][-1])
        return Ids(values, np.concatenate(offs), parts[0].single)


@dataclass(frozen=True)
class Block:
    """``size`` samples as columns; dict order is the order of features in the batch."""

    size: int
    ids: dict[str, Ids]
    dense: dict[str, F32]
    labels: dict[str, F32]

    def slice(self, start: int, stop: int) -> Block:
        return Block(
            stop - start,
            {k: v.slice(start, stop) for k, v in self.ids.items()},
            {k: v[start:stop] for k, v in self.dense.items()},
            {k: v[start:stop] for k, v in self.labels.items()},
        )

    def take(self, rows: npt.NDArray[np.intp]) -> Block:
        return Block(
            rows.size,
            {k: v.take(rows) for k, v in self.ids.items()},
            {k: v[rows] for k, v in self.dense.items()},
            {k: v[rows] for k, v in self.labels.items()},
        )

    @staticmethod
    def concat(parts: list[Block]) -> Block:
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        return Block(
            sum(p.size for p in parts),
            {k: Ids.concat([p.ids[k] for p in parts]) for k in first.ids},
            {k: np.concatenate([p.dense[k] for p in parts]) for k in first.dense},
            {k: np.concatenate([p.labels[k] for p in parts]) for k in first.labels},
        )

    def to_batch(self, requires_grad: bool) -> Batch:
        features: list[IDTypeFeature] = []
        for name, ids in self.ids.items():
            if ids.offsets is None or (ids.single and ids.values.size == self.size):
                features.append(IDTypeFeatureWithSingleID(name, ids.values))
            else:
                features.append(IDTypeFeature.from_csr(name, ids.values, ids.offsets))
        return Batch(
            features,
            [NonIDTypeFeature(v, name=k) for k, v in self.dense.items()],
            [Label(v, name=k) for k, v in self.labels.items()],
            requires_grad=requires_grad,
        )


def rebatch(blocks: Iterator[Block], batch_size: int, drop_last: bool = False) -> Iterator[Block]:
    """Cut a stream of blocks into blocks of exactly ``batch_size`` samples.

    The last block holds the remaining samples (fewer) unless ``drop_last``.
    """
    pending: list[Block] = []
    pending_size = 0
    for block in blocks:
        if block.size == 0:
            continue
        pending.append(block)
        pending_size += block.size
        if pending_size < batch_size:
            continue
        merged = Block.concat(pending)
        full = merged.size - merged.size % batch_size
        for start in range(0, full, batch_size):
            yield merged.slice(start, start + batch_size)
        pending = [merged.slice(full, merged.size)] if full < merged.size else []
        pending_size = merged.size - full
    if pending and not drop_last:
        yield Block.concat(pending)
