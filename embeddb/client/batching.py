"""Deduplicate an id batch, split it by shard and merge the answers. No I/O.

A batch is deduplicated once (docs/architecture.md §4), so every shard sees each id at most once per
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

Every request fits a :class:`Budget`, one per shard, made from that shard's limits (see
:mod:`.topology`): at most so many ids, and at most so many bytes, where an id of a table costs
that table's bytes per row (``dim * 4`` for float32 rows). :meth:`IdBatch.parts` cuts one table's
ids into chunks of the most ids that fit.

Several tables' batches travel together (``LookupMany``, ``ApplyGradientsMany``): each shard
gets one request with every table's part for it (:func:`split_many`), cut into several requests
only when the parts together exceed the budget. With a budget of 4 ids, one shard, tables ``a``
(3 unique ids) and ``b`` (3)::

    request 0   a rows [0, 1, 2] (whole), b rows [0]
    request 1   b rows [1, 2]

and with a budget of 4 ids and 64 bytes, ``a`` of 16 bytes per id and ``b`` of 32::

    request 0   a rows [0, 1, 2] (whole)     3 ids, 48 bytes: b's 32 no longer fit
    request 1   b rows [0, 1]                2 ids, 64 bytes
    request 2   b rows [2]

A table appears at most once per request (a shard refuses a request naming a table twice).
Requests are cut in whole chunks (numpy slices), never id by id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.client import _kernels
from embeddb.common.arrays import I64, IntP
from embeddb.common.routing import as_ids, split_by_shard
from embeddb.errors import InvalidArgumentError

__all__ = ["Budget", "IdBatch", "Part", "TableBatches", "as_matrix", "split_many"]


@dataclass(frozen=True)
class Budget:
    """What one request to one shard may carry.

    At most ``ids`` ids (every part of the request together), and for each ``i`` at most
    ``bytes[i]`` bytes, where an id of a table with per-id ``cost`` takes ``cost[i]`` of them
    (a cost is a tuple as long as ``bytes``; see :func:`~embeddb.client.topology.budget`).

    Attributes:
        ids: ids per request.
        bytes: byte capacities per request, one per kind of bytes counted.
    """

    ids: int
    bytes: tuple[int, ...] = ()

    def max_ids(self, cost: Sequence[int] = ()) -> int:
        """The most ids of one table, ``cost`` bytes each, that fit in an empty request.

        At least 1: an id whose row alone exceeds the budget travels alone, and the shard
        refuses it, naming its limit.
        """
        return max(1, _fit(self.ids, self.bytes, cost))


def _fit(ids: int, room: Sequence[int], cost: Sequence[int]) -> int:
    """How many ids of per-id ``cost`` fit in ``ids`` ids and ``room`` bytes (may be 0)."""
    n = ids
    for capacity, c in zip(room, cost, strict=True):
        if c > 0:
            n = min(n, capacity // c)
    return max(n, 0)


@dataclass(frozen=True)
class Part:
    """The ids of one request: ``rows`` index :attr:`IdBatch.unique`.

    ``whole`` is true when ``rows`` is ``0, 1, ..., len(unique) - 1``: the request carries the
    batch's unique ids as they are and its answer is already in ``unique`` order.
    """

    shard: int
    rows: IntP
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
    inverse: IntP
    counts: IntP

    @classmethod
    def of(cls, ids: object) -> IdBatch:
        """Deduplicate ``ids`` (validated with :func:`embeddb.common.routing.as_ids`).

        An ``IdBatch`` is returned as it is: a batch deduplicated once (e.g. by
        :meth:`distinct`, or an earlier ``of``) is not deduplicated again.

        Raises:
            InvalidArgumentError: ids that are not a 1-D array of non-negative integers.
        """
        if isinstance(ids, IdBatch):
            return ids
        arr = np.ascontiguousarray(as_ids(ids))
        unique = np.empty(arr.size, dtype=np.uint64)
        inverse = np.empty(arr.size, dtype=np.intp)
        counts = np.empty(arr.size, dtype=np.intp)
        k = int(_kernels.dedup(arr, unique, inverse, counts)) if arr.size else 0
        return cls(unique=unique[:k], inverse=inverse, counts=counts[:k])

    @classmethod
    def distinct(cls, ids: object) -> IdBatch:
        """A batch of ids the caller knows to be distinct (e.g. the ``unique`` of another
        batch), validated but not deduplicated: no hash pass over them.

        A duplicate passed here anyway reaches the shard as it is, and the shard handles
        duplicates itself (the same answers, with duplicate work).

        Raises:
            InvalidArgumentError: ids that are not a 1-D array of non-negative integers.
        """
        arr = np.ascontiguousarray(as_ids(ids))
        return cls(
            unique=arr,
            inverse=np.arange(arr.size, dtype=np.intp),
            counts=np.ones(arr.size, dtype=np.intp),
        )

    @property
    def size(self) -> int:
        """Ids in the caller's batch, duplicates included."""
        return int(self.inverse.size)

    @property
    def has_duplicates(self) -> bool:
        return bool(self.unique.size != self.inverse.size)

    def parts(self, num_shards: int, max_ids: int | Sequence[int]) -> list[Part]:
        """Split the unique ids by shard in chunks of at most ``max_ids`` (one bound for every
        shard, or one per shard); idle shards get none."""
        n = self.unique.size
        if n == 0:
            return []
        limit = [max_ids] * num_shards if isinstance(max_ids, int) else list(max_ids)
        if num_shards == 1:
            rows = np.arange(n, dtype=np.intp)
            if n <= limit[0]:
                return [Part(0, rows, whole=True)]
            return [Part(0, rows[start : start + limit[0]]) for start in range(0, n, limit[0])]
        order, bounds = split_by_shard(self.unique, num_shards)
        parts: list[Part] = []
        for shard, step in enumerate(limit):
            rows = order[bounds[shard] : bounds[shard + 1]].astype(np.intp, copy=False)
            parts.extend(
                Part(shard, rows[start : start + step]) for start in range(0, rows.size, step)
            )
        return parts

    def sum_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """IntP of ``values`` (one per input id) summed per unique id: ``(len(unique), dim)``.

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
        """IntP per unique id → rows in the caller's order, duplicates repeated.

        Without duplicates the caller's order is ``unique`` order: ``per_unique`` is returned.
        """
        if not self.has_duplicates:
            return per_unique
        expanded: npt.NDArray[np.float32] = per_unique[self.inverse]
        return expanded


class TableBatches(Mapping[str, IdBatch]):
    """Several tables' id batches deduplicated together: every table's ids concatenated (table
    after table), each table deduplicated on its own in one compiled pass, the answers of all
    tables gathered (:meth:`expand`) and their gradients summed (:meth:`sum_rows`) in one
    operation each. A mapping table → :class:`IdBatch` (views into the concatenated arrays,
    made on first access), so it goes wherever a ``Mapping[str, IdBatch]`` does.

    Example, tables ``a`` then ``b``::

        ids           = [7, 5, 7 | 5, 9]            id_bounds     = [0, 3, 5]
        unique        = [7, 5 | 5, 9]               unique_bounds = [0, 2, 4]
        inverse       = [0, 1, 0 | 2, 3]            (indexes the whole ``unique``)
        self["b"]     = IdBatch(unique [5, 9], inverse [0, 1], counts [1, 1])

    Attributes:
        names: the tables, in order.
        unique: every table's distinct ids, table after table, each in first-occurrence order.
        inverse: ``ids == unique[inverse]`` for the concatenated ids.
        counts: occurrences of each unique id in its table.
        unique_bounds: table ``t``'s distinct ids are ``unique[unique_bounds[t]:unique_bounds[t
            + 1]]``.
        id_bounds: table ``t``'s ids are ``ids[id_bounds[t]:id_bounds[t + 1]]``.
    """

    __slots__ = ("_views", "counts", "id_bounds", "inverse", "names", "unique", "unique_bounds")

    def __init__(
        self,
        names: Sequence[str],
        unique: npt.NDArray[np.uint64],
        inverse: IntP,
        counts: IntP,
        unique_bounds: I64,
        id_bounds: I64,
    ) -> None:
        self.names = tuple(names)
        self.unique = unique
        self.inverse = inverse
        self.counts = counts
        self.unique_bounds = unique_bounds
        self.id_bounds = id_bounds
        self._views: dict[str, IdBatch] = {}

    @classmethod
    def of(cls, names: Sequence[str], ids: object, id_bounds: object) -> TableBatches:
        """Deduplicate each table's slice of ``ids`` (table ``names[t]`` owns
        ``ids[id_bounds[t]:id_bounds[t + 1]]``).

        Raises:
            InvalidArgumentError: ids that are not a 1-D array of non-negative integers, bounds
                that do not cut them into ``len(names)`` slices, or a table named twice.
        """
        arr = np.ascontiguousarray(as_ids(ids))
        bounds = np.ascontiguousarray(id_bounds, dtype=np.int64)
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"a table is named twice: {list(names)}")
        if (
            bounds.ndim != 1
            or bounds.size != len(names) + 1
            or bounds[0] != 0
            or bounds[-1] != arr.size
            or (np.diff(bounds) < 0).any()
        ):
            raise InvalidArgumentError(
                f"id_bounds must cut {arr.size} ids into {len(names)} slices, got {bounds.tolist()}"
            )
        unique = np.empty(arr.size, dtype=np.uint64)
        inverse = np.empty(arr.size, dtype=np.intp)
        counts = np.empty(arr.size, dtype=np.intp)
        unique_bounds = np.zeros(len(names) + 1, dtype=np.int64)
        k = 0
        if arr.size:
            k = int(_kernels.dedup_segments(arr, bounds, unique, inverse, counts, unique_bounds))
        return cls(names, unique[:k], inverse, counts[:k], unique_bounds, bounds)

    def __getitem__(self, table: str) -> IdBatch:
        view = self._views.get(table)
        if view is None:
            if table not in self.names:
                raise KeyError(table)
            t = self.names.index(table)
            u0, u1 = int(self.unique_bounds[t]), int(self.unique_bounds[t + 1])
            i0, i1 = int(self.id_bounds[t]), int(self.id_bounds[t + 1])
            view = IdBatch(
                unique=self.unique[u0:u1],
                inverse=self.inverse[i0:i1] - u0,
                counts=self.counts[u0:u1],
            )
            self._views[table] = view
        return view

    def __contains__(self, table: object) -> bool:
        return table in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def size(self) -> int:
        """Ids of every table together, duplicates included."""
        return int(self.inverse.size)

    @property
    def has_duplicates(self) -> bool:
        return bool(self.unique.size != self.inverse.size)

    def expand(self, per_unique: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows per unique id (``(len(unique), dim)``, every table's) → rows of the
        concatenated ids, in one gather; without duplicates, ``per_unique`` itself."""
        if not self.has_duplicates:
            return per_unique
        expanded: npt.NDArray[np.float32] = per_unique[self.inverse]
        return expanded

    def sum_rows(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rows of the concatenated ids summed per unique id of each table, in one pass:
        ``(len(unique), dim)``; without duplicates, ``values`` itself."""
        if not self.has_duplicates:
            return values
        summed = np.zeros((self.unique.size, values.shape[1]), dtype=np.float32)
        _kernels.sum_rows(values, self.inverse, summed)
        return summed


def split_many(
    batches: Mapping[str, IdBatch],
    budgets: Sequence[Budget],
    costs: Mapping[str, Sequence[int]] | None = None,
) -> list[list[tuple[str, Part]]]:
    """Requests for several tables' batches: each is ``(table, part)`` pairs for one shard that
    fit its budget together, each table at most once (see the module docstring).

    Args:
        batches: table → its ids.
        budgets: one per shard (``len(budgets)`` is the shard count).
        costs: table → the bytes one of its ids takes, per entry of ``Budget.bytes``; a table
            without one costs nothing but its id count.

    Returns:
        The requests, shards in order and within one shard the tables in ``batches`` order;
        shards without ids get no request, tables without ids no part.
    """
    num_shards = len(budgets)
    by_shard: list[list[tuple[str, Part]]] = [[] for _ in range(num_shards)]
    for table, batch in batches.items():
        for part in batch.parts(num_shards, max(batch.unique.size, 1)):  # one part per shard
            by_shard[part.shard].append((table, part))
    requests: list[list[tuple[str, Part]]] = []
    for shard, parts in enumerate(by_shard):
        budget = budgets[shard]
        current: list[tuple[str, Part]] = []
        ids, room = budget.ids, list(budget.bytes)
        for table, part in parts:
            cost = tuple(costs[table]) if costs and table in costs else (0,) * len(room)
            n = part.rows.size
            start = 0
            while start < n:
                take = min(n - start, _fit(ids, room, cost))
                if take == 0 and current:  # full: start the next request
                    requests.append(current)
                    current, ids, room = [], budget.ids, list(budget.bytes)
                    continue
                take = max(take, 1)  # one id above the whole budget travels alone
                piece = part if take == n else Part(shard, part.rows[start : start + take])
                current.append((table, piece))
                start += take
                ids -= take
                room = [r - take * c for r, c in zip(room, cost, strict=True)]
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
