"""The ``asyncio`` client: the same API as :class:`~embeddb.client.Client`, as coroutines.

Built for the trainer's prefetching: a lookup for batch ``t + 1`` can be awaited while batch
``t`` trains. Fan-out to shards uses :func:`asyncio.gather` on ``grpc.aio`` channels. The
channels are opened on first use, inside the running event loop, and belong to that loop: use
one client within one loop (one ``asyncio.run``). Before the first call the shards are
described once (``DescribeShard``), however many calls start together; see
:class:`~embeddb.client.Client`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from embeddb.client import netsim, plans, table_plans, topology
from embeddb.client.base import ClientBase
from embeddb.client.batching import Budget, IdBatch, TableBatches, as_matrix
from embeddb.client.options import ClientOptions, read_address_file
from embeddb.client.plans import (
    CheckpointPart,
    ListedSnapshot,
    Plan,
    PushResult,
    ShardCall,
    ShardStatsDict,
    TableDescription,
)
from embeddb.client.stubs import store_stub
from embeddb.client.sync import SCAN_PAGE_ROWS, SNAPSHOT_TIMEOUT
from embeddb.errors import InvalidArgumentError, UnavailableError

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient(ClientBase):
    """An ``asyncio`` client of a sharded embeddb cluster.

    Arguments, routing, retries and errors are those of :class:`~embeddb.client.Client`;
    ``channel_factory`` here returns a :class:`grpc.aio.Channel`.

    Raises:
        ConfigError: an invalid address.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        options: ClientOptions | None = None,
        *,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> None:
        super().__init__(addresses, options)
        self._factory = channel_factory
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []
        self._describe_lock = asyncio.Lock()  # one DescribeShard round at a time
        self._link = netsim.link_of(self.options.network)  # a simulated network, or None

    @classmethod
    def from_address_file(
        cls,
        path: str | Path,
        options: ClientOptions | None = None,
        *,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> AsyncClient:
        """A client of the shards listed in ``path``; see :meth:`Client.from_address_file`.

        Raises:
            ConfigError: the file is missing, unreadable, empty or has a malformed line.
        """
        return cls(read_address_file(path), options, channel_factory=channel_factory)

    def _open(self, address: str) -> grpc.aio.Channel:
        if self._factory is not None:
            return self._factory(address)
        opts = self.options.channel_options
        if self.options.credentials is not None:
            return grpc.aio.secure_channel(address, self.options.credentials, options=opts)
        return grpc.aio.insecure_channel(address, options=opts)

    def _stub(self, shard: int) -> Any:
        if not self._stubs:  # first use: inside the running loop
            self._channels = [self._open(a) for a in self.addresses]
            self._stubs = [store_stub(c) for c in self._channels]
        return self._stubs[shard]

    # ------------------------------------------------------------------ data plane
    async def lookup(self, table: str, ids: object, train: bool = True) -> npt.NDArray[np.float32]:
        """See :meth:`Client.lookup`."""
        batch = IdBatch.of(ids)
        dim = await self._dim(table)
        if batch.size == 0:
            return np.zeros((0, dim), dtype=np.float32)
        budgets = await self._shard_budgets()
        return await self._run(plans.lookup(table, batch, dim, train, self.options, budgets))

    async def apply_gradients(self, table: str, ids: object, grads: object) -> PushResult:
        """See :meth:`Client.apply_gradients`. Never retried."""
        batch = IdBatch.of(ids)
        if batch.size == 0:
            as_matrix(grads, 0, "grads")
            await self._dim(table)
            return PushResult()
        budgets = await self._shard_budgets()
        return await self._run(plans.apply_gradients(table, batch, grads, self.options, budgets))

    async def lookup_many(
        self, requests: Mapping[str, object], train: bool = True
    ) -> dict[str, npt.NDArray[np.float32]]:
        """See :meth:`Client.lookup_many` (one call per shard for every table)."""
        batches = {table: IdBatch.of(ids) for table, ids in requests.items()}
        dims = await self._dims_of(list(batches))
        budgets = await self._shard_budgets()
        return await self._run(plans.lookup_many(batches, dims, train, self.options, budgets))

    async def apply_gradients_many(
        self, updates: Mapping[str, tuple[object, object]]
    ) -> dict[str, PushResult]:
        """See :meth:`Client.apply_gradients_many`. Never retried."""
        dims = await self._dims_of(list(updates))
        checked = plans.gradient_batches(updates, dims)
        budgets = await self._shard_budgets()
        return await self._run(plans.apply_gradients_many(checked, self.options, budgets))

    async def lookup_tables(
        self, batches: TableBatches, train: bool = True
    ) -> npt.NDArray[np.float32]:
        """:meth:`lookup_many` of tables of one ``dim`` given as one
        :class:`~embeddb.client.batching.TableBatches`: the same requests, built and answered
        over concatenated arrays. Returns the vectors of ``batches.unique``, ``(len(unique),
        dim)`` (``batches.expand`` gives them in the ids' order).

        Raises:
            InvalidArgumentError: tables of different dims. Otherwise as :meth:`lookup_many`.
        """
        dim = table_plans.one_dim(await self._dims_of(list(batches.names)))
        budgets = await self._shard_budgets()
        plan = table_plans.lookup_tables(batches, dim, train, self.options, budgets)
        return await self._run(plan)

    async def apply_gradients_tables(
        self, batches: TableBatches, grads: object
    ) -> dict[str, PushResult]:
        """:meth:`apply_gradients_many` of tables of one ``dim`` given as one
        :class:`~embeddb.client.batching.TableBatches` and ``grads`` with one row per unique id
        (``batches.unique`` order, already summed per id; ``batches.sum_rows`` does that).
        Never retried.

        Raises:
            InvalidArgumentError: tables of different dims, or grads of another shape.
                Otherwise as :meth:`apply_gradients_many`.
        """
        dim = table_plans.one_dim(await self._dims_of(list(batches.names)))
        matrix = as_matrix(grads, batches.unique.size, "grads")
        if matrix.shape[1] != dim:
            raise InvalidArgumentError(
                f"grads must have shape ({batches.unique.size}, {dim}) (one row of dim {dim} "
                f"per unique id), got {matrix.shape}"
            )
        budgets = await self._shard_budgets()
        plan = table_plans.apply_gradients_tables(batches, matrix, self.options, budgets)
        return await self._run(plan)

    async def assign(self, table: str, ids: object, vectors: object) -> int:
        """See :meth:`Client.assign`."""
        batch = IdBatch.of(ids)
        if batch.size == 0:
            as_matrix(vectors, 0, "vectors")
            await self._dim(table)
            return 0
        budgets = await self._shard_budgets()
        return await self._run(plans.assign(table, batch, vectors, self.options, budgets))

    async def delete(self, table: str, ids: object) -> int:
        """See :meth:`Client.delete`."""
        batch = IdBatch.of(ids)
        if batch.size == 0:
            await self._dim(table)
            return 0
        budgets = await self._shard_budgets()
        return await self._run(plans.delete(table, batch, self.options, budgets))

    # ------------------------------------------------------------------ metadata
    async def list_tables(self) -> list[TableDescription]:
        """See :meth:`Client.list_tables`."""
        tables = await self._run(plans.list_tables())
        self._dims.update({t.name: t.dim for t in tables})
        return tables

    async def describe_table(self, table: str) -> TableDescription:
        """See :meth:`Client.describe_table`."""
        info = await self._run(plans.describe_table(table))
        self._dims[table] = info.dim
        return info

    async def stats(self) -> list[ShardStatsDict]:
        """See :meth:`Client.stats`."""
        return await self._run(plans.stats(self.addresses))

    async def scan(
        self, table: str, limit: int = SCAN_PAGE_ROWS, after: int | None = None
    ) -> AsyncIterator[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]]:
        """See :meth:`Client.scan`: an async iterator of pages ``(ids, vectors)``, shard 0's
        rows in ascending id order, then shard 1's, ... (read-only; each page one call, retried
        like a lookup).

        Raises:
            InvalidArgumentError: ``limit`` below 1 or above a shard's limits.
            TableNotFoundError and the rest of :mod:`embeddb.errors`, naming the shard.
        """
        calls = plans.scan_calls(table, self.num_shards, limit, after, self.options)
        await self._shard_budgets()
        for call in calls:
            while True:
                if self._closed:
                    raise UnavailableError("the client is closed")
                r = await self._call(call)
                ids, vectors = plans.scan_page(r)
                if ids.size:
                    yield ids, vectors
                if r.done:
                    break
                plans.advance_scan(call, r)

    async def check_topology(self) -> None:
        """See :meth:`Client.check_topology`."""
        async with self._describe_lock:
            self._budgets = None
            self._budgets = await self._describe(verify=True)

    # ------------------------------------------------------------------ durability
    async def snapshot(
        self, snapshot_id: str | None = None, *, timeout: float = SNAPSHOT_TIMEOUT
    ) -> list[CheckpointPart]:
        """See :meth:`Client.snapshot` (the job checkpoint; never retried)."""
        name = snapshot_id if snapshot_id is not None else plans.new_snapshot_id()
        plan = plans.snapshot(name, self.addresses, timeout)
        await self._shard_budgets()
        outcomes = await self._outcomes(plan.calls)
        error = plans.snapshot_error(name, self.addresses, outcomes)
        if error is not None:
            first = next(o for o in outcomes if isinstance(o, BaseException))
            raise error from first
        return plan.merge(list(outcomes))

    async def list_snapshots(self) -> list[list[ListedSnapshot]]:
        """See :meth:`Client.list_snapshots`."""
        return await self._run(plans.list_snapshots(self.addresses))

    async def _shard_budgets(self) -> tuple[Budget, ...]:
        """See :meth:`Client._shard_budgets`: concurrent first calls wait for one
        ``DescribeShard`` round; a failure is not remembered."""
        budgets = self._budgets
        if budgets is not None:
            return budgets
        async with self._describe_lock:
            if self._budgets is None:
                self._budgets = await self._describe(self.options.verify_topology)
            return self._budgets

    async def _describe(self, verify: bool) -> tuple[Budget, ...]:
        outcomes = await self._outcomes(topology.describe_calls(self.num_shards))
        limits = topology.shard_limits(self.addresses, outcomes, verify)
        return tuple(topology.budget(lim, self.options) for lim in limits)

    async def _dim(self, table: str) -> int:
        dim = self._dims.get(table)
        return dim if dim is not None else (await self.describe_table(table)).dim

    async def _dims_of(self, tables: list[str]) -> dict[str, int]:
        """The dims of ``tables``; one ``ListTables`` when any is not cached yet."""
        known = self._dims
        if any(t not in known for t in tables):
            known = {t.name: t.dim for t in await self.list_tables()}
        return plans.dims_of(tables, known)

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Close every channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        channels, self._channels, self._stubs = self._channels, [], []
        await asyncio.gather(*(c.close() for c in channels))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ execution
    async def _run(self, plan: Plan[T]) -> T:
        """The plan's result, once every shard has been described."""
        await self._shard_budgets()
        if self._closed:
            raise UnavailableError("the client is closed")
        if len(plan.calls) == 1:
            return plan.merge([await self._call(plan.calls[0])])
        # Every shard answers before anything is raised, so no call is left in flight.
        results = await self._outcomes(plan.calls)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return plan.merge(results)

    async def _outcomes(self, calls: Sequence[ShardCall]) -> list[Any]:
        """Every call's response or exception, in order (all calls run to completion)."""
        if self._closed:
            raise UnavailableError("the client is closed")
        return list(await asyncio.gather(*(self._call(c) for c in calls), return_exceptions=True))

    async def _call(self, call: ShardCall) -> Any:
        """One call with a deadline, retrying UNAVAILABLE for idempotent calls."""
        method = getattr(self._stub(call.shard), call.method)
        if self._link is not None:  # each attempt crosses the simulated network
            method = functools.partial(self._link.call_async, method)
        opts = self.options
        deadline = time.monotonic() + (call.timeout or opts.timeout)
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            try:
                return await method(
                    call.request, timeout=max(remaining, 0.0), metadata=opts.metadata
                )
            except grpc.aio.AioRpcError as exc:
                delay = self._retry_delay(call, exc, attempt, deadline)
            await asyncio.sleep(delay)
