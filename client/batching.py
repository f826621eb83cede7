"""Deduplicate an id batch, split it by shard and merge the answers. No I/O.

A batch is deduplicated once (ARCHITECTURE.md §4), so every shard sees each id at most once per
request. Worked example with 2 shards, where ``shard_of`` puts 9 on shard 0 and 5, 7 on shard 1::

    ids       = [ 7,  5,  7,  9]      the caller's batch, duplicates allowed
    unique    = [ 7,  5,  9]          first-occurrence order; ids == unique[inverse]
    inverse   = [ 0,  1,  0,  2]
    counts    = [ 2,  1,  1]
    parts     = shard 0: rows [2]      → sends ids [9]
                shard 1: rows [0, 1]   → sends ids [7, 5]

``rows`` index ``unique``. Answers are written to ``out[rows]`` of a ``(len(unique), dim)``
array and expanded to the caller's order with ``out[inverse]``. Gradients go the other way:
rows of duplicate ids are summed (:meth:`IdBatch.sum_rows`), so shard 1 gets one gradient for
id 7, ``grads[0] + grads[2]``; assignments keep the last row of each id (:meth:`last_rows`).

A batch without duplicates is its own ``unique`` list (same order), so its rows pass through
unchanged; with one shard, a part covers the whole batch and its answer needs no scatter.
Deduplication is a compiled hash pass (:mod:`._kernels`), linear in the batch size.

Several tables' batches travel together (``LookupMany``, ``ApplyGradientsMany``): each shard
gets one request with every table's part for it (:func:`split_many`), cut into several requests
only when the parts together exceed ``max_ids``. With ``max_ids = 4``, one shard, tables ``a``
(3 unique ids) and ``b`` (3)::

    request 0   a rows [0, 1, 2] (whole), b rows [0]
    request 1   b rows [1, 2]

A table appears at most once per request (a shard refuses a request naming a table twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.errors import InvalidArgumentError
from embeddb.routing import as_ids, split_by_shard

from . import _kernels

__all__ = ["IdBatch", "Part", "as_matrix", "split_many"]

Rows = npt.NDArray[np.intp]


@dataclass(frozen=True)
class Part:
    """The ids of one request: ``rows`` index :attr:`IdBatch.unique`.

    ``whole`` is true when ``rows`` is ``0, 1, ..., len(unique) - 1``: the request carries the
    batch's unique ids as they are and its answer is already in ``unique`` order.
    """

    shard: int
    rows: Rows
    whole: bool = False


@dataclass(frozen=True)
class IdBatch:
    """A deduplicated id batch (see the module docstring for the layout).

    Attributes:
        unique: the distinct ids, in order of first occurrence.
        inverse: ``ids == unique[inverse]``.
        counts: occurrences of each unique id.
    """

    unique: npt.NDArray[np.uint64]
    inverse: Rows
    counts: Rows

    @classmethod
    def of(cls, ids: object) -> IdBatch:
        """Deduplicate ``ids`` (validated with :func:`embeddb.routing.as_ids`).

        Raises:
            InvalidArgumentError: ids that are not a 1-D array of non-negative integers.
        """
        arr = np.ascontiguousarray(as_ids(ids))
        unique = np.empty(arr.size, dtype=np.uint64)
        inverse = np.empty(arr.size, dtype=np.intp)
        counts = np.empty(arr.size, dtype=np.intp)
        k = int(_kernels.dedup(arr, unique, inverse, counts)) if arr.size else 0
        return cls(unique=unique[:k], inverse=inverse, counts=counts[:k])

    @property
    def size(self) -> int:
        """Ids in the caller's batch, duplicates included."""
        return int(self.inverse.size)

    @property
    def has_duplicates(self) -> bool:
        return bool(self.unique.size != self.inverse.size)

    def parts(self, num_shards: int, max_ids: int) -> list[Part]:
        """Split the unique ids by shard in chunks of at most ``max_ids``; idle shards get none."""
        n = self.unique.size
        if n == 0:
            return []
        if num_shards == 1:
            rows = np.arange(n, dtype=np.intp)
            if n <= max_ids:
                return [Part(0, rows, whole=True)]
            return [Part(0, rows[start : start + max_ids]) for start in range(0, n, max_ids)]
        order, bounds = split_by_shard(self.unique, num_shards)
        parts: list[Part] = []
        for shard in range(num_shards):
            rows = order[bounds[shard] : bounds[shard + 1]].astype(np.intp, copy=False)
            parts.extend(
                Part(shard, rows[start : start + max_ids]) for start in range(0, rows.size, max_ids)
            )
        return parts

    def sum_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows of ``values`` (one per input id) summed per unique id: ``(len(unique), dim)``.

        Without duplicates that is ``values`` itself. A NaN or Inf in any occurrence makes the
        sum non-finite, as the shard's own sum would.
        """
        if not self.has_duplicates:
            return values
        summed = np.zeros((self.unique.size, values.shape[1]), dtype=np.float32)
        _kernels.sum_rows(values, self.inverse, summed)
        return summed

    def last_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The row of the last occurrence of each unique id: ``(len(unique), dim)``."""
        if not self.has_duplicates:
            return values
        picked = np.empty((self.unique.size, values.shape[1]), dtype=np.float32)
        _kernels.last_rows(values, self.inverse, picked)
        return picked

    def expand(self, per_unique: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows per unique id → rows in the caller's order, duplicates repeated.

        Without duplicates the caller's order is ``unique`` order: ``per_unique`` is returned.
        """
        if not self.has_duplicates:
            return per_unique
        expanded: npt.NDArray[np.float32] = per_unique[self.inverse]
        return expanded


def split_many(
    batches: Mapping[str, IdBatch], num_shards: int, max_ids: int
) -> list[list[tuple[str, Part]]]:
    """Requests for several tables' batches: each is ``(table, part)`` pairs for one shard, at
    most ``max_ids`` ids in all, each table at most once (see the module docstring).

    Shards come in order, and within one shard the tables in ``batches`` order; shards without
    ids get no request, tables without ids no part.
    """
    by_shard: list[list[tuple[str, Part]]] = [[] for _ in range(num_shards)]
    for table, batch in batches.items():
        for part in batch.parts(num_shards, max(batch.unique.size, 1)):  # one part per shard
            by_shard[part.shard].append((table, part))
    requests: list[list[tuple[str, Part]]] = []
    for shard, parts in enumerate(by_shard):
        current: list[tuple[str, Part]] = []
        room = max_ids
        for table, part in parts:
            n = part.rows.size
            start = 0
            while start < n:
                if room == 0:
                    requests.append(current)
                    current, room = [], max_ids
                take = min(room, n - start)
                current.append(
                    (table, part if take == n else Part(shard, part.rows[start : start + take]))
                )
                start += take
                room -= take
        if current:
            requests.append(current)
    return requests


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
