"""Plans of several tables' lookups and gradient pushes over concatenated arrays (a
:class:`~embeddb.client.batching.TableBatches`). No I/O.

The same requests as :func:`embeddb.client.plans.lookup_many` and
:func:`~embeddb.client.plans.apply_gradients_many` (one ``LookupMany`` / ``ApplyGradientsMany``
per shard, every table's part for it, cut only past the shard's budget; the wire format is
unchanged), for tables of one ``dim``, built without per-table array work: the shard split is
one pass over every table's unique ids, the cut into requests is index arithmetic on the
concatenated ids, the answers land in one ``(len(unique), dim)`` array, and gradients are read
from one. What remains per part is the part's message (its ids' bytes, its rows' bytes).

With one id cost for every table (one ``dim``), cutting a shard's concatenated rows into
chunks of ``Budget.max_ids(cost)`` and every chunk at table boundaries gives exactly the
requests of :func:`~embeddb.client.batching.split_many`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import embeddb.transport.wire as wire
from embeddb.client.batching import Budget, TableBatches
from embeddb.client.calls import Plan, ShardCall
from embeddb.client.options import ClientOptions
from embeddb.client.plans import PushResult
from embeddb.client.topology import lookup_cost, push_cost
from embeddb.common.arrays import F32, IntP
from embeddb.common.routing import split_by_shard
from embeddb.errors import InvalidArgumentError
from embeddb.v1 import embeddb_pb2 as pb

__all__ = ["ShardRequests", "apply_gradients_tables", "lookup_tables", "one_dim", "split_tables"]


@dataclass(frozen=True)
class ShardRequests:
    """One shard's requests.

    Attributes:
        shard: the shard.
        rows: the shard's rows of ``TableBatches.unique`` (ascending: table after table);
            ``None`` for all of them (one shard).
        requests: each request's pieces ``(table index, start, stop)``: rows ``start:stop`` of
            ``rows``, one table's.
    """

    shard: int
    rows: IntP | None
    requests: list[list[tuple[int, int, int]]]


def one_dim(dims: Mapping[str, int]) -> int:
    """The one ``dim`` of ``dims``' tables.

    Raises:
        InvalidArgumentError: tables of different dims (use ``lookup_many``).
    """
    values = set(dims.values())
    if len(values) != 1:
        raise InvalidArgumentError(
            f"the tables of one concatenated batch must share one dim, got {dict(dims)}"
        )
    return values.pop()


def split_tables(
    batches: TableBatches, budgets: Sequence[Budget], cost: Sequence[int]
) -> list[ShardRequests]:
    """Every shard's requests: shards in order, each table at most once per request, tables in
    ``batches`` order; shards and tables without ids get none."""
    num_shards = len(budgets)
    total = batches.unique.size
    if total == 0:
        return []
    if num_shards > 1:
        order, bounds = split_by_shard(batches.unique, num_shards)
    out: list[ShardRequests] = []
    for shard in range(num_shards):
        rows: IntP | None = None
        if num_shards == 1:
            n, table_cuts = total, batches.unique_bounds
        else:
            rows = order[bounds[shard] : bounds[shard + 1]].astype(np.intp, copy=False)
            n = rows.size
            # rows ascend, so each table's rows are one run of them
            table_cuts = np.searchsorted(rows, batches.unique_bounds)
        if n == 0:
            continue
        step = budgets[shard].max_ids(cost)
        cuts = np.union1d(table_cuts, np.arange(0, n, step))
        cuts = np.append(cuts[cuts < n], n)
        starts, stops = cuts[:-1], cuts[1:]
        tables = np.searchsorted(table_cuts, starts, side="right") - 1
        requests: list[list[tuple[int, int, int]]] = []
        last = -1
        for t, start, stop, c in zip(
            tables.tolist(), starts.tolist(), stops.tolist(), (starts // step).tolist(), strict=True
        ):
            if c != last:
                requests.append([])
                last = c
            requests[-1].append((t, start, stop))
        out.append(ShardRequests(shard, rows, requests))
    return out


def _bounds(requests: list[list[tuple[int, int, int]]]) -> list[int]:
    """The row bounds of every piece of ``requests``, in order (pieces are consecutive)."""
    bounds = [requests[0][0][1]]
    bounds += [stop for pieces in requests for _, _, stop in pieces]
    return bounds


def _results(response: Any, shard: int, pieces: list[tuple[int, int, int]], method: str) -> Any:
    results = response.results
    if len(results) != len(pieces):
        raise InvalidArgumentError(
            f"shard {shard} answered {len(results)} results to a {method} of {len(pieces)} parts"
        )
    return results


_FLOAT32 = pb.D_TYPE_FLOAT32


def _vectors(tensor: Any, n: int, dim: int) -> F32:
    """An answer part's ``(n, dim)`` vectors: plain float32 read in place; anything else (and
    anything malformed, to raise its precise error) through :func:`wire.decode_matrix`."""
    if (
        tensor.dtype == _FLOAT32
        and not tensor.compression
        and len(tensor.data) == 4 * n * dim
        and list(tensor.shape) == [n, dim]
    ):
        return np.frombuffer(tensor.data, dtype="<f4").reshape(n, dim)
    return wire.decode_matrix(tensor, "vectors", n, dim)


def lookup_tables(
    batches: TableBatches, dim: int, train: bool, options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[F32]:
    """Every table's unique vectors, ``(len(batches.unique), dim)`` in ``batches.unique``
    order (:meth:`TableBatches.expand` turns them into the ids' order)."""
    split = split_tables(batches, budgets, lookup_cost(dim, options.fp16))
    encoding = {"fp16": options.fp16, "lz4_min_bytes": options.lz4_min_bytes}
    names, unique = batches.names, batches.unique
    calls: list[ShardCall] = []
    for part in split:
        ids = unique if part.rows is None else unique[part.rows]
        tensors = iter(wire.encode_id_parts(ids, _bounds(part.requests), options.lz4_min_bytes))
        for pieces in part.requests:
            lookups = [  # fields, not messages: the constructor builds them in place
                {"table": names[t], "ids": next(tensors), "train": train, "encoding": encoding}
                for t, _, _ in pieces
            ]
            calls.append(
                ShardCall(
                    part.shard,
                    "LookupMany",
                    pb.LookupManyRequest(lookups=lookups),
                    idempotent=not train,  # a training lookup admits rows and refreshes recency
                )
            )

    def merge(responses: list[Any]) -> F32:
        out = np.empty((unique.size, dim), dtype=np.float32)
        answers = iter(responses)
        for part in split:
            rows = out if part.rows is None else np.empty((part.rows.size, dim), np.float32)
            for pieces in part.requests:
                results = _results(next(answers), part.shard, pieces, "LookupMany")
                for (_, start, stop), result in zip(pieces, results, strict=True):
                    rows[start:stop] = _vectors(result.vectors, stop - start, dim)
            if part.rows is not None:
                out[part.rows] = rows
        return out

    return Plan(calls, merge)


def apply_gradients_tables(
    batches: TableBatches, grads: F32, options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[dict[str, PushResult]]:
    """``grads`` (one row per unique id, ``batches.unique`` order) pushed in one
    ``ApplyGradientsMany`` per shard (more only past its budget); table → its result."""
    split = split_tables(batches, budgets, push_cost(grads.shape[1], options.fp16))
    names, unique, lz4 = batches.names, batches.unique, options.lz4_min_bytes
    calls: list[ShardCall] = []
    for part in split:
        ids = unique if part.rows is None else unique[part.rows]
        rows = grads if part.rows is None else grads[part.rows]
        bounds = _bounds(part.requests)
        id_tensors = iter(wire.encode_id_parts(ids, bounds, lz4))
        grad_tensors = iter(wire.encode_matrix_parts(rows, bounds, options.fp16, lz4))
        for pieces in part.requests:
            updates = [  # fields, not messages: the constructor builds them in place
                {"table": names[t], "ids": next(id_tensors), "grads": next(grad_tensors)}
                for t, _, _ in pieces
            ]
            calls.append(
                ShardCall(
                    part.shard,
                    "ApplyGradientsMany",
                    pb.ApplyGradientsManyRequest(updates=updates),
                    idempotent=False,
                )
            )

    def merge(responses: list[Any]) -> dict[str, PushResult]:
        totals = dict.fromkeys(names, PushResult())
        answers = iter(responses)
        for part in split:
            for pieces in part.requests:
                results = _results(next(answers), part.shard, pieces, "ApplyGradientsMany")
                for (t, _, _), r in zip(pieces, results, strict=True):
                    totals[names[t]] += PushResult(
                        int(r.applied), int(r.nan_skipped), int(r.missing)
                    )
        return totals

    return Plan(calls, merge)
