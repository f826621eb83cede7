"""The blocking client: one gRPC channel per shard, parallel fan-out on a thread pool.

Before its first call the client asks every shard to describe itself (``DescribeShard``, once,
in parallel; :mod:`.topology`): it checks the address list against what the shards serve and
sizes every later request from their limits.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from embeddb.client import netsim, plans, topology
from embeddb.client.base import ClientBase
from embeddb.client.batching import Budget, IdBatch, as_matrix
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
from embeddb.errors import UnavailableError

__all__ = ["SCAN_PAGE_ROWS", "SNAPSHOT_TIMEOUT", "Client"]

T = TypeVar("T")

SCAN_PAGE_ROWS = 4096  # rows per Scan page, by default
SNAPSHOT_TIMEOUT = 600.0  # seconds a shard may take to write a snapshot, by default


class Client(ClientBase):
    """A blocking client of a sharded embeddb cluster; safe to share between threads.

    Ids are routed with :func:`embeddb.common.routing.shard_of`: shard ``i`` is ``addresses[i]``.
    Before its first call of any kind the client checks that (``verify_topology``): every shard
    is asked, once and in parallel, which shard of how many it is, how it routes and what it
    accepts, and a wrong address list raises ``ConfigError`` before anything else is sent.
    Every method deduplicates its ids once, sends each shard only its own ids in parallel, in
    requests that fit the shard's limits (at most ``max_ids_per_message`` ids and the shard's
    ``max_ids_per_request``, and rows within its ``max_response_bytes``), and answers in the
    caller's order.

    A call that fails on one shard raises after all its shards have answered; mutations on the
    other shards stay applied (there is no cross-shard transaction).

    Args:
        addresses: ``host:port`` of each shard, in shard order.
        options: timeouts, retries, encoding, TLS credentials, token, ...: see
            :class:`~embeddb.client.ClientOptions`; ``None``: its defaults.
        channel_factory: builds the channel of an address instead of the default
            (``grpc.secure_channel`` with ``options.credentials`` or ``grpc.insecure_channel``),
            e.g. to add interceptors or TLS settings.

    Raises:
        ConfigError: an invalid address.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        options: ClientOptions | None = None,
        *,
        channel_factory: Callable[[str], grpc.Channel] | None = None,
    ) -> None:
        super().__init__(addresses, options)
        self._channels = [self._open(a, channel_factory) for a in self.addresses]
        self._stubs = [store_stub(c) for c in self._channels]
        self._pool = (
            ThreadPoolExecutor(max_workers=self.num_shards, thread_name_prefix="embeddb-client")
            if self.num_shards > 1
            else None
        )
        self._lock = threading.Lock()  # guards _dims and _closed
        self._describe_lock = threading.Lock()  # one DescribeShard round at a time
        self._link = netsim.link_of(self.options.network)  # a simulated network, or None

    @classmethod
    def from_address_file(
        cls,
        path: str | Path,
        options: ClientOptions | None = None,
        *,
        channel_factory: Callable[[str], grpc.Channel] | None = None,
    ) -> Client:
        """A client of the shards listed in ``path`` (one ``host:port`` per line, in shard
        order; blank lines and ``#`` comments ignored); the other arguments are the
        constructor's.

        Raises:
            ConfigError: the file is missing, unreadable, empty or has a malformed line.
        """
        return cls(read_address_file(path), options, channel_factory=channel_factory)

    def _open(self, address: str, factory: Callable[[str], grpc.Channel] | None) -> grpc.Channel:
        if factory is not None:
            return factory(address)
        opts = self.options.channel_options
        if self.options.credentials is not None:
            return grpc.secure_channel(address, self.options.credentials, options=opts)
        return grpc.insecure_channel(address, options=opts)

    # ------------------------------------------------------------------ data plane
    def lookup(self, table: str, ids: object, train: bool = True) -> npt.NDArray[np.float32]:
        """The ``(len(ids), dim)`` float32 vectors of ``ids``, in order, duplicates repeated.

        Args:
            table: table name.
            ids: 1-D non-negative integer ids, or an
                :class:`~embeddb.client.batching.IdBatch` (not deduplicated again; ids known to
                be distinct skip the hash pass with ``IdBatch.distinct(ids)``).
            train: a training lookup admits new rows and refreshes recency (never retried);
                ``False`` (evaluation, inference) changes nothing and reads unknown ids as zeros.

        Raises:
            InvalidArgumentError, NotFoundError, UnavailableError, DeadlineExceededError and the
            rest of :mod:`embeddb.errors`, naming the shard that failed.
        """
        batch = IdBatch.of(ids)
        dim = self._dim(table)
        if batch.size == 0:
            return np.zeros((0, dim), dtype=np.float32)
        plan = plans.lookup(table, batch, dim, train, self.options, self._shard_budgets())
        return self._run(plan)

    def apply_gradients(self, table: str, ids: object, grads: object) -> PushResult:
        """Push gradients ``(len(ids), dim)``; the shards' optimizers apply them. Never retried.

        Gradients of duplicate ids are summed before sending. Rows with NaN or Inf are sent
        as they are; the shard skips and counts them.
        """
        batch = IdBatch.of(ids)
        if batch.size == 0:
            as_matrix(grads, 0, "grads")
            self._dim(table)
            return PushResult()
        budgets = self._shard_budgets()
        return self._run(plans.apply_gradients(table, batch, grads, self.options, budgets))

    def lookup_many(
        self, requests: Mapping[str, object], train: bool = True
    ) -> dict[str, npt.NDArray[np.float32]]:
        """:meth:`lookup` of several tables in one call per shard.

        Each table's ids are deduplicated once; every shard with ids gets one ``LookupMany``
        holding every table's part for it (split only where the parts together would exceed
        the shard's limits), the shards in parallel. The answer equals calling :meth:`lookup`
        per table.

        Args:
            requests: table → 1-D non-negative integer ids, or an ``IdBatch`` (as in
                :meth:`lookup`).
            train: as in :meth:`lookup`; training lookups are never retried, evaluation
                lookups are.

        Returns:
            table → its ``(len(ids), dim)`` float32 vectors, in the caller's order.

        Raises:
            TableNotFoundError: a table the cluster does not serve (checked against the
                cluster's table list, fetched once and cached, before anything is sent).
            InvalidArgumentError, UnavailableError, DeadlineExceededError and the rest of
            :mod:`embeddb.errors`, naming the shard that failed.
        """
        batches = {table: IdBatch.of(ids) for table, ids in requests.items()}
        dims = self._dims_of(list(batches))
        budgets = self._shard_budgets()
        return self._run(plans.lookup_many(batches, dims, train, self.options, budgets))

    def apply_gradients_many(
        self, updates: Mapping[str, tuple[object, object]]
    ) -> dict[str, PushResult]:
        """:meth:`apply_gradients` of several tables in one call per shard. Never retried.

        Args:
            updates: table → ``(ids, grads)``, grads of shape ``(len(ids), dim)``.

        Returns:
            table → its :class:`PushResult`, summed over shards.

        Raises:
            TableNotFoundError, InvalidArgumentError: an unknown table, or grads of the wrong
                shape for their table; checked for every table before anything is sent, so
                no shard applies anything. Otherwise as :meth:`lookup_many`; a shard refuses
                its whole request if any part is bad, while the other shards' parts stay
                applied (there is no cross-shard transaction).
        """
        dims = self._dims_of(list(updates))
        checked = plans.gradient_batches(updates, dims)
        budgets = self._shard_budgets()
        return self._run(plans.apply_gradients_many(checked, self.options, budgets))

    def assign(self, table: str, ids: object, vectors: object) -> int:
        """Set the vectors of ``ids`` (last duplicate wins). Returns distinct ids written."""
        batch = IdBatch.of(ids)
        if batch.size == 0:
            as_matrix(vectors, 0, "vectors")
            self._dim(table)
            return 0
        budgets = self._shard_budgets()
        return self._run(plans.assign(table, batch, vectors, self.options, budgets))

    def delete(self, table: str, ids: object) -> int:
        """Remove ``ids`` from every tier. Returns how many of them existed."""
        batch = IdBatch.of(ids)
        if batch.size == 0:
            self._dim(table)
            return 0
        return self._run(plans.delete(table, batch, self.options, self._shard_budgets()))

    # ------------------------------------------------------------------ metadata
    def list_tables(self) -> list[TableDescription]:
        """The tables the cluster serves (as shard 0 reports them)."""
        tables = self._run(plans.list_tables())
        with self._lock:
            self._dims.update({t.name: t.dim for t in tables})
        return tables

    def describe_table(self, table: str) -> TableDescription:
        """One table's settings (as shard 0 reports them)."""
        info = self._run(plans.describe_table(table))
        with self._lock:
            self._dims[table] = info.dim
        return info

    def stats(self) -> list[ShardStatsDict]:
        """Every shard's statistics, in shard order."""
        return self._run(plans.stats(self.addresses))

    def scan(
        self, table: str, limit: int = SCAN_PAGE_ROWS, after: int | None = None
    ) -> Iterator[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]]:
        """Every row of ``table``, read-only, as pages ``(ids, vectors)``: shard 0's rows in
        ascending id order, then shard 1's, and so on (the ``Scan`` RPC; nothing is inserted
        or refreshed). Vectors are exact float32 whatever ``options.fp16`` says.

        A row that exists, unchanged, for the whole scan comes exactly once; rows written or
        deleted meanwhile may or may not. Each page is one call, retried like a lookup.

        Args:
            table: table name.
            limit: rows per page (each shard caps it: see its ``DescribeShard`` limits).
            after: on every shard, start above this id (a cursor: the last id of a shard's
                previous page); None: from the smallest id.

        Raises:
            InvalidArgumentError: ``limit`` below 1 or above a shard's limits.
            TableNotFoundError and the rest of :mod:`embeddb.errors`, naming the shard.
        """
        calls = plans.scan_calls(table, self.num_shards, limit, after, self.options)
        self._shard_budgets()
        for call in calls:
            while True:
                if self._closed:
                    raise UnavailableError("the client is closed")
                r = self._call(call)
                ids, vectors = plans.scan_page(r)
                if ids.size:
                    yield ids, vectors
                if r.done:
                    break
                plans.advance_scan(call, r)

    def check_topology(self) -> None:
        """Ask every shard now (``DescribeShard``, in parallel) which shard of how many it is and
        how it routes ids, and compare with the address list; also refreshes the limits the
        client sizes requests by. Checks even with ``verify_topology=False``.

        Raises:
            ConfigError: naming the first address that serves another shard, another shard
                count (an incomplete list, or a cluster of another size) or another routing.
        """
        with self._describe_lock:
            self._budgets = None
            self._budgets = self._describe(verify=True)

    # ------------------------------------------------------------------ durability
    def snapshot(
        self, snapshot_id: str | None = None, *, timeout: float = SNAPSHOT_TIMEOUT
    ) -> list[CheckpointPart]:
        """Take a job checkpoint of the embeddings: every shard snapshots, in parallel, under
        one id (restore them together with ``embeddb serve --restore ID`` on every shard).

        Each shard's snapshot holds exactly its mutations up to its own seq; shards are not
        paused together, so pause training (stop pushing gradients) around the call for a
        checkpoint consistent across shards and with the dense model.

        Not retried, whatever the failure: a retry after a lost answer would find the id taken
        (``INVALID_ARGUMENT``). If any shard fails, the snapshots the other shards took remain
        (they are pruned by each shard's retention like any other); take the checkpoint again
        under a new id.

        Args:
            snapshot_id: the id (letters, digits, ``._-``); default ``job-<UTC time>``.
            timeout: seconds each shard may take.

        Returns:
            One result per shard, in shard order.

        Raises:
            InvalidArgumentError: a bad id, or one a shard already has. FailedPreconditionError:
                a shard keeps no snapshots (no data directory). Any error of
                :mod:`embeddb.errors`, of the first failing shard's type, naming every failed
                shard and those whose snapshot was taken.
        """
        name = snapshot_id if snapshot_id is not None else plans.new_snapshot_id()
        plan = plans.snapshot(name, self.addresses, timeout)
        outcomes = self._run_each(plan)
        error = plans.snapshot_error(name, self.addresses, outcomes)
        if error is not None:
            first = next(o for o in outcomes if isinstance(o, BaseException))
            raise error from first
        return plan.merge(outcomes)

    def list_snapshots(self) -> list[list[ListedSnapshot]]:
        """Every shard's complete snapshots (oldest first), in shard order."""
        return self._run(plans.list_snapshots(self.addresses))

    def _shard_budgets(self) -> tuple[Budget, ...]:
        """What one request to each shard may carry; on first use, every shard is described
        (and checked, with ``verify_topology``). A failure is not remembered: the next call
        asks again."""
        budgets = self._budgets
        if budgets is not None:
            return budgets
        with self._describe_lock:  # concurrent first calls wait for one DescribeShard round
            if self._budgets is None:
                self._budgets = self._describe(self.options.verify_topology)
            return self._budgets

    def _describe(self, verify: bool) -> tuple[Budget, ...]:
        outcomes = self._outcomes(topology.describe_calls(self.num_shards))
        limits = topology.shard_limits(self.addresses, outcomes, verify)
        return tuple(topology.budget(lim, self.options) for lim in limits)

    def _dim(self, table: str) -> int:
        with self._lock:
            dim = self._dims.get(table)
        return dim if dim is not None else self.describe_table(table).dim

    def _dims_of(self, tables: list[str]) -> dict[str, int]:
        """The dims of ``tables``; one ``ListTables`` when any is not cached yet."""
        with self._lock:
            known = dict(self._dims)
        if any(t not in known for t in tables):
            known = {t.name: t.dim for t in self.list_tables()}
        return plans.dims_of(tables, known)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close every channel and the fan-out pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ execution
    def _run(self, plan: Plan[T]) -> T:
        """The plan's result, once every shard has been described; the first failure raises
        after every call has finished, so none is left in flight."""
        self._shard_budgets()
        if self._closed:
            raise UnavailableError("the client is closed")
        calls = plan.calls
        if len(calls) <= 1 or self._pool is None:
            return plan.merge([self._call(c) for c in calls])
        futures = [self._pool.submit(self._call, c) for c in calls]
        wait_all(futures)  # let every shard answer before raising, so none is left in flight
        for f in futures:
            error = f.exception()
            if error is not None:
                raise error
        return plan.merge([f.result() for f in futures])

    def _run_each(self, plan: Plan[T]) -> list[Any]:
        """Every call's response or exception, in order, once every shard has been described."""
        self._shard_budgets()
        return self._outcomes(plan.calls)

    def _outcomes(self, calls: Sequence[ShardCall]) -> list[Any]:
        """Every call's response or exception, in order (all calls run to completion)."""
        if self._closed:
            raise UnavailableError("the client is closed")
        if self._pool is None:
            outcomes: list[Any] = []
            for c in calls:
                try:
                    outcomes.append(self._call(c))
                except Exception as exc:
                    outcomes.append(exc)
            return outcomes
        futures = [self._pool.submit(self._call, c) for c in calls]
        wait_all(futures)
        return [f.exception() or f.result() for f in futures]

    def _call(self, call: ShardCall) -> Any:
        """One call with a deadline, retrying UNAVAILABLE for idempotent calls."""
        method = getattr(self._stubs[call.shard], call.method)
        if self._link is not None:  # each attempt crosses the simulated network
            method = functools.partial(self._link.call, method)
        opts = self.options
        deadline = time.monotonic() + (call.timeout or opts.timeout)
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            try:
                return method(call.request, timeout=max(remaining, 0.0), metadata=opts.metadata)
            except grpc.RpcError as exc:
                delay = self._retry_delay(call, exc, attempt, deadline)
            time.sleep(delay)
