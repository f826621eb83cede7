"""Deduplicate an id batch, split it by shard and merge the answers. Pure numpy, no I/O.

A batch is deduplicated once (ARCHITECTURE.md §4), so every shard sees each id at most once per
request. Worked example with 2 shards, where ``shard_of`` puts 9 on shard 0 and 5, 7 on shard 1::

    ids       = [ 7,  5,  7,  9]      the caller's batch, duplicates allowed
    unique    = [ 5,  7,  9]          sorted; ids == unique[inverse]
    inverse   = [ 1,  0,  1,  2]
    counts    = [ 1,  2,  1]
    parts     = shard 0: rows [2]      → sends ids [9]
                shard 1: rows [0, 1]   → sends ids [5, 7]

``rows`` index ``unique``. Answers are written to ``out[rows]`` of a ``(len(unique), dim)``
array and expanded to the caller's order with ``out[inverse]``. Gradients go the other way:
rows of duplicate ids are summed (:meth:`IdBatch.sum_rows`), so shard 1 gets one gradient for
id 7, ``grads[0] + grads[2]``; assignments keep the last row of each id (:meth:`last_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.errors import InvalidArgumentError
from embeddb.routing import as_ids, split_by_shard

__all__ = ["IdBatch", "Part", "as_matrix"]

Rows = npt.NDArray[np.intp]
_SMALL_GROUP = 8  # see IdBatch.sum_rows


@dataclass(frozen=True)
class Part:
    """The ids of one request: ``rows`` index :attr:`IdBatch.unique`."""

    shard: int
    rows: Rows


@dataclass(frozen=True)
class IdBatch:
    """A deduplicated id batch (see the module docstring for the layout).

    Attributes:
        unique: the distinct ids, ascending.
        inverse: ``ids == unique[inverse]``.
        counts: occurrences of each unique id.
        perm: a stable sort of the input positions by id: the occurrences of ``unique[k]`` are
            ``perm[starts[k]:starts[k] + counts[k]]``, in input order.
    """

    unique: npt.NDArray[np.uint64]
    inverse: Rows
    counts: Rows
    perm: Rows

    @classmethod
    def of(cls, ids: object) -> IdBatch:
        """Deduplicate ``ids`` (validated with :func:`embeddb.routing.as_ids`) with one sort.

        Raises:
            InvalidArgumentError: ids that are not a 1-D array of non-negative integers.
        """
        arr = as_ids(ids)
        perm = np.argsort(arr, kind="stable").astype(np.intp, copy=False)
        ordered = arr[perm]
        new = np.empty(arr.size, dtype=bool)
        new[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        inverse = np.empty(arr.size, dtype=np.intp)
        inverse[perm] = np.cumsum(new) - 1
        counts = np.diff(np.append(starts, arr.size)).astype(np.intp, copy=False)
        return cls(unique=ordered[starts], inverse=inverse, counts=counts, perm=perm)

    @property
    def size(self) -> int:
        """Ids in the caller's batch, duplicates included."""
        return int(self.inverse.size)

    @property
    def has_duplicates(self) -> bool:
        return bool(self.unique.size != self.inverse.size)

    def parts(self, num_shards: int, max_ids: int) -> list[Part]:
        """Split the unique ids by shard in chunks of at most ``max_ids``; idle shards get none."""
        order, bounds = split_by_shard(self.unique, num_shards)
        parts: list[Part] = []
        for shard in range(num_shards):
            rows = order[bounds[shard] : bounds[shard + 1]].astype(np.intp, copy=False)
            parts.extend(
                Part(shard, rows[start : start + max_ids]) for start in range(0, rows.size, max_ids)
            )
        return parts

    def _grouped(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        grouped: npt.NDArray[np.float32] = values[self.perm]
        return grouped

    def sum_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows of ``values`` (one per input id) summed per unique id: ``(len(unique), dim)``.

        A NaN or Inf in any occurrence makes the sum non-finite, as the shard's own sum would.
        """
        grouped = self._grouped(values)
        if not self.has_duplicates:
            return grouped
        # np.add.reduceat pays a fixed cost per group, too much for many small groups (1M ids
        # in 300k groups take seconds). Small groups are summed one occurrence rank at a time
        # (at most _SMALL_GROUP - 1 whole-array steps); only large groups use reduceat.
        counts = self.counts
        starts = np.cumsum(counts) - counts
        summed: npt.NDArray[np.float32] = grouped[starts]  # a copy: the first occurrences
        small = counts <= _SMALL_GROUP
        with np.errstate(over="ignore", invalid="ignore"):
            for rank in range(1, int(counts[small].max(initial=1))):
                sel = np.flatnonzero(small & (counts > rank))
                summed[sel] += grouped[starts[sel] + rank]
            large = np.flatnonzero(~small)
            if large.size:
                rows = grouped[np.repeat(~small, counts)]
                offsets = np.cumsum(counts[large]) - counts[large]
                summed[large] = np.add.reduceat(rows, offsets, axis=0)
        return summed

    def last_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The row of the last occurrence of each unique id: ``(len(unique), dim)``."""
        if not self.has_duplicates:
            return self._grouped(values)
        last = self.perm[np.cumsum(self.counts) - 1]
        picked: npt.NDArray[np.float32] = values[last]
        return picked

    def expand(self, per_unique: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows per unique id → rows in the caller's order, duplicates repeated."""
        expanded: npt.NDArray[np.float32] = per_unique[self.inverse]
        return expanded


def as_matrix(values: object, rows: int, name: str) -> npt.NDArray[np.float32]:
    """``values`` as a C-contiguous float32 matrix with ``rows`` rows (the width is the shard's).

    Raises:
        InvalidArgumentError: not numeric, not 2-D, or a row count other than ``rows``.
    """
    try:
        arr = np.ascontiguousarray(values, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{name} must be a float32 matrix: {exc}") from exc
    if arr.ndim != 2 or arr.shape[0] != rows:
        raise InvalidArgumentError(
            f"{name} must have shape ({rows}, dim), one row per id, got {arr.shape}"
        )
    return arr
