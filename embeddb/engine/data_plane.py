"""The data plane of a shard: validated calls on its tables (lookups, updates, assignments,
deletions, reads that change nothing, statistics).

:class:`DataPlane` is the base of :class:`~embeddb.engine.shard.Shard`, which opens the tables,
the journal and the disk tier and sets the attributes declared here. Every call validates all
of its arguments first (:mod:`embeddb.engine.validation`), so a refused call changes nothing;
a mutating call then runs through the journal (:mod:`embeddb.engine.journal`): prepared under
the locks of every stripe it touches, logged as one record, made visible, and acknowledged
once as durable as the fsync policy promises.

An ID batch as the shard sees it (table ``user``, ``dim = 2``)::

    ids     = [ 7, 42,  7]                      uint64, any order, duplicates allowed
    lookup  → [[a0, a1], [b0, b1], [a0, a1]]    float32 (3, 2), row i is the vector of ids[i]
    grads   = [[g0, g1], [h0, h1], [k0, k1]]    float32 (3, 2); id 7 is updated once with g + k
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from embeddb.common.routing import Topology, as_ids
from embeddb.engine.journal import Journal
from embeddb.engine.storage import DiskTier, ShardStats, TieredTable, UpdateResult
from embeddb.engine.storage.scan import ScanPage, scan_table
from embeddb.engine.validation import distinct_tables, find_table, finite, matrix, owned_ids
from embeddb.errors import EmbeddbError, UnavailableError

__all__ = ["DataPlane"]

T = TypeVar("T")
# what the quick check of a call's parts raises: the per-part check then names the problem
_REFUSED = (EmbeddbError, LookupError, TypeError, ValueError)


class DataPlane:
    """The data calls of a shard (see the module docstring). Thread-safe: each table is split
    into lock stripes; calls on different stripes proceed in parallel."""

    topology: Topology
    _tables: dict[str, TieredTable]
    _journal: Journal
    _disk: DiskTier | None
    _closed: bool

    def _table_check_open(self) -> None:
        if self._closed:
            raise UnavailableError("shard is closed")

    def _table(self, name: str) -> TieredTable:
        self._table_check_open()
        return find_table(self._tables, name)

    def _owned(self, ids: object, field: str = "ids") -> npt.NDArray[np.uint64]:
        """``ids`` validated, if this shard owns every one (FailedPreconditionError naming
        the first foreign id otherwise)."""
        return owned_ids(self.topology, ids, field)

    def _quick(
        self, parts: Sequence[tuple[str, object, T]]
    ) -> list[tuple[TieredTable, npt.NDArray[np.uint64], tuple[str, object, T]]]:
        """Each part's table and ids, checked with one ownership pass over every part's ids.
        Raises one of ``_REFUSED`` without naming the part: the caller then checks part by
        part, in order, which names the first problem as a one-part call would."""
        if not parts:
            return []
        self._table_check_open()
        tables = self._tables
        checked = [(tables[p[0]], as_ids(p[1]), p) for p in parts]
        if self.topology.num_shards > 1:
            every = checked[0][1] if len(checked) == 1 else np.concatenate([c[1] for c in checked])
            self.topology.check_owned(every)
        return checked

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def lookup(self, table: str, ids: object, train: bool = True) -> npt.NDArray[np.float32]:
        """Return the ``(len(ids), dim)`` vectors of ``ids`` in input order.

        Args:
            table: table name.
            ids: 1-D non-negative integer ids; duplicates allowed.
            train: a training lookup creates admitted rows, promotes disk rows and refreshes
                recency. ``False`` (evaluation, inference) changes nothing: unknown ids read as
                zeros, disk rows are read in place.

        Raises:
            TableNotFoundError, InvalidArgumentError, StorageError; FailedPreconditionError:
            an id another shard owns (nothing is looked up), or a training lookup on a
            read-only shard.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        if not train:
            return t.lookup(id_arr, False)
        before = self._journal.mutating()
        vectors = t.lookup(id_arr, True)
        self._journal.acknowledge(before)
        return vectors

    def apply_gradients(self, table: str, ids: object, grads: object) -> UpdateResult:
        """Apply the table's optimizer to ``ids`` with ``grads`` (float32, ``(len(ids), dim)``).

        Gradients of duplicate ids are summed first. Ids whose summed gradient contains NaN or
        Inf are skipped and counted; ids stored in neither tier are ignored and counted as
        missing. ``weight_bound`` clamps vectors after the update. Every data call (this one,
        the lookups, :meth:`assign`, :meth:`delete`) refuses a batch holding an id another
        shard owns with :class:`FailedPreconditionError`, changing nothing.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        g = matrix(grads, id_arr.size, t.dim, "grads")
        before = self._journal.mutating()
        result = t.apply_gradients(id_arr, g)
        self._journal.acknowledge(before)
        return result

    def lookup_many(
        self, parts: Sequence[tuple[str, object, bool]]
    ) -> list[npt.NDArray[np.float32]]:
        """:meth:`lookup` of several tables at once: one ``(table, ids, train)`` per part.

        Every part is validated before any is looked up, so an invalid part fails the call with
        nothing inserted or refreshed; a call with a training part waits once for durability.

        Returns:
            One ``(len(ids), dim)`` array per part, in order.

        Raises:
            TableNotFoundError, InvalidArgumentError (also: a table named by two parts),
            FailedPreconditionError (a training part on a read-only shard), StorageError.
        """
        try:
            checked = [(t, ids, bool(train)) for t, ids, (_, _, train) in self._quick(parts)]
        except _REFUSED:  # the same checks part by part: the first problem, as named there
            checked = [
                (self._table(table), self._owned(ids, f"lookups[{k}].ids"), bool(train))
                for k, (table, ids, train) in enumerate(parts)
            ]
        distinct_tables(table for table, _, _ in parts)
        if not any(train for _, _, train in checked):
            return [t.lookup(ids, False) for t, ids, _ in checked]
        before = self._journal.mutating()
        fused = [
            k for k, (t, ids, train) in enumerate(checked) if train and t.fits_one_pass(ids.size)
        ]
        resident = self._journal.stripes.lookup_resident([checked[k][:2] for k in fused])
        done = {k: v for k, v in zip(fused, resident, strict=True) if v is not None}
        plans = {
            k: t.lookup_begin(ids, True)
            for k, (t, ids, train) in enumerate(checked)
            if train and k not in done
        }  # the parts with an id to promote or create (or too large for one pass)
        if plans:
            self._journal.commit([checked[k][0].lookup_call(plan) for k, plan in plans.items()])
        out = [
            done[k] if k in done else plans[k].out if k in plans else t.lookup(i, False)
            for k, (t, i, _) in enumerate(checked)
        ]
        self._journal.acknowledge(before)
        return out

    def apply_gradients_many(
        self, parts: Sequence[tuple[str, object, object]]
    ) -> list[UpdateResult]:
        """:meth:`apply_gradients` of several tables at once: one ``(table, ids, grads)`` per
        part.

        Every part is validated before any is applied, so an invalid part fails the call with
        no row changed; NaN/Inf gradients are skipped and counted per part, as in
        :meth:`apply_gradients`. The call waits once for durability.

        Returns:
            One result per part, in order.

        Raises:
            TableNotFoundError, InvalidArgumentError (also: a table named by two parts),
            FailedPreconditionError, StorageError.
        """
        checked: list[tuple[TieredTable, npt.NDArray[np.uint64], npt.NDArray[np.float32]]] = []
        try:
            for t, id_arr, (_, _, grads) in self._quick(parts):
                checked.append((t, id_arr, matrix(grads, id_arr.size, t.dim, "grads")))
        except _REFUSED:  # the same checks part by part: the first problem, as named there
            checked.clear()
            for k, (table, ids, grads) in enumerate(parts):
                t = self._table(table)
                id_arr = self._owned(ids, f"updates[{k}].ids")
                checked.append((t, id_arr, matrix(grads, id_arr.size, t.dim, "grads")))
        distinct_tables(table for table, _, _ in parts)
        before = self._journal.mutating()
        if all(t.fits_one_pass(ids.size) for t, ids, _ in checked):
            results = self._journal.update_many(checked)
        else:  # large enough for the stripe pool: table by table, each on several cores
            results = self._journal.commit([t.update_call(ids, g) for t, ids, g in checked])
        self._journal.acknowledge(before)
        return results

    def assign(self, table: str, ids: object, vectors: object) -> int:
        """Set vectors (creating rows regardless of admission) and reset optimizer state.

        For duplicate ids the last vector wins. Returns the number of distinct ids written.
        """
        t = self._table(table)
        id_arr = self._owned(ids)
        v = matrix(vectors, id_arr.size, t.dim, "vectors")
        finite(v, "vectors")
        before = self._journal.mutating()
        written = t.assign(id_arr, v)
        self._journal.acknowledge(before)
        return written

    def delete(self, table: str, ids: object) -> int:
        """Remove ``ids`` from both tiers. Returns how many of them existed."""
        t = self._table(table)
        id_arr = self._owned(ids)
        before = self._journal.mutating()
        deleted = t.delete(id_arr)
        self._journal.acknowledge(before)
        return deleted

    def peek(
        self, table: str, ids: object
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float32]]:
        """Full rows ``[vector | optimizer state]`` of ``ids``, changing nothing.

        Returns:
            ``(found, rows)`` with ``rows`` of shape ``(len(ids), dim + state_dim)``; rows of
            ids stored in neither tier are zeros and ``found`` is false there.
        """
        t = self._table(table)
        return t.peek(as_ids(ids))

    def scan(self, table: str, after: int | None, limit: int) -> ScanPage:
        """Up to ``limit`` rows with ids above ``after`` (None: from the smallest), ascending,
        changing nothing (:mod:`embeddb.engine.storage.scan`; the caller bounds ``limit >= 1``)."""
        t = self._table(table)
        assert self._disk is not None  # an open shard has its disk tier
        return scan_table(t, self._disk, after, limit)

    def stats(self) -> ShardStats:
        """Sizes and counters of every table."""
        self._table_check_open()
        return ShardStats({name: t.stats() for name, t in self._tables.items()})
