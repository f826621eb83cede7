"""What each client method sends to which shard, and how the answers combine. No I/O.

A :class:`Plan` is a list of :class:`ShardCall` (a request for one shard) plus a ``merge``
function from their responses, in the same order, to the method's result. The sync and the
async client build the same plans and differ only in how they execute the calls.

Data plans take one :class:`~embeddb.client.batching.Budget` per shard (from the shards' limits,
:func:`embeddb.client.topology.budget`) and split their ids so that every request fits it, each
table's ids costing its rows' bytes (:mod:`embeddb.client.topology`). Job checkpoints are
planned in :mod:`.snapshots`, the ``DescribeShard`` check in :mod:`.topology`; their names are
re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

import embeddb.transport.wire as wire
from embeddb.client.batching import Budget, IdBatch, Part, as_matrix, split_many
from embeddb.client.calls import Plan, ShardCall
from embeddb.client.options import ClientOptions
from embeddb.client.snapshots import (
    CheckpointPart,
    ListedSnapshot,
    list_snapshots,
    new_snapshot_id,
    snapshot,
    snapshot_error,
)
from embeddb.client.topology import ID_COST, lookup_cost, push_cost
from embeddb.common.arrays import F32
from embeddb.errors import InvalidArgumentError, TableNotFoundError, UnavailableError
from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "CheckpointPart",
    "ListedSnapshot",
    "Plan",
    "PushResult",
    "ShardCall",
    "ShardStatsDict",
    "TableDescription",
    "advance_scan",
    "apply_gradients",
    "apply_gradients_many",
    "assign",
    "delete",
    "describe_table",
    "dims_of",
    "gradient_batches",
    "list_snapshots",
    "list_tables",
    "lookup",
    "lookup_many",
    "new_snapshot_id",
    "scan_calls",
    "scan_page",
    "snapshot",
    "snapshot_error",
    "stats",
]

T = TypeVar("T")


@dataclass(frozen=True)
class PushResult:
    """Outcome of :meth:`Client.apply_gradients`, summed over shards (counts of distinct ids).

    Attributes:
        applied: ids updated.
        nan_skipped: ids whose summed gradient had NaN or Inf: not applied.
        missing: ids stored on no shard (never looked up for training, or deleted): ignored.
    """

    applied: int = 0
    nan_skipped: int = 0
    missing: int = 0

    def __add__(self, other: PushResult) -> PushResult:
        return PushResult(
            self.applied + other.applied,
            self.nan_skipped + other.nan_skipped,
            self.missing + other.missing,
        )


@dataclass(frozen=True)
class TableDescription:
    """A table as a shard describes it."""

    name: str
    dim: int
    optimizer: str
    state_dim: int
    capacity: int

    @classmethod
    def from_proto(cls, info: Any) -> TableDescription:
        return cls(
            name=info.name,
            dim=int(info.dim),
            optimizer=info.optimizer,
            state_dim=int(info.state_dim),
            capacity=int(info.capacity),
        )


class ShardStatsDict(TypedDict):
    """One shard's answer to :meth:`Client.stats`.

    ``tables`` maps each table to its counters (``rows``, ``ram_rows``, ``lookup_ids``, ...; the
    integer fields of the shard's table statistics).
    """

    shard_index: int
    num_shards: int
    address: str
    tables: dict[str, dict[str, int]]


def lookup(
    table: str,
    batch: IdBatch,
    dim: int,
    train: bool,
    options: ClientOptions,
    budgets: Sequence[Budget],
) -> Plan[npt.NDArray[np.float32]]:
    """Each shard gets its unique ids, in requests whose answers fit its budget; vectors of
    ``dim`` come back in the caller's order. ``batch`` must not be empty."""
    cost = lookup_cost(dim, options.fp16)
    parts = batch.parts(len(budgets), [b.max_ids(cost) for b in budgets])
    encoding = pb.Encoding(fp16=options.fp16, lz4_min_bytes=options.lz4_min_bytes)
    calls = [
        ShardCall(
            part.shard,
            "Lookup",
            pb.LookupRequest(
                table=table,
                ids=wire.encode_ids(_ids_of(batch, part), options.lz4_min_bytes),
                train=train,
                encoding=encoding,
            ),
            idempotent=not train,  # a training lookup admits rows and refreshes recency
        )
        for part in parts
    ]

    def merge(responses: list[Any]) -> npt.NDArray[np.float32]:
        if len(parts) == 1 and parts[0].whole:  # one request in unique order: no scatter
            vectors = wire.decode_matrix(responses[0].vectors, "vectors", batch.unique.size, dim)
            # float32 answers are read-only views of the message; fp16 ones are fresh arrays
            owned = vectors if vectors.flags.writeable else vectors.copy()
            return batch.expand(owned)
        out = np.empty((batch.unique.size, dim), dtype=np.float32)
        for part, response in zip(parts, responses, strict=True):
            out[part.rows] = wire.decode_matrix(response.vectors, "vectors", part.rows.size, dim)
        return batch.expand(out)

    return Plan(calls, merge)


def apply_gradients(
    table: str, batch: IdBatch, grads: object, options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[PushResult]:
    """Gradients of duplicate ids are summed here, so each shard gets one row per id, in
    requests whose gradient matrices fit its budget."""
    summed = batch.sum_rows(as_matrix(grads, batch.size, "grads"))
    cost = push_cost(summed.shape[1], options.fp16)
    parts = batch.parts(len(budgets), [b.max_ids(cost) for b in budgets])
    calls = [
        ShardCall(
            part.shard,
            "ApplyGradients",
            pb.ApplyGradientsRequest(
                table=table,
                ids=wire.encode_ids(_ids_of(batch, part), options.lz4_min_bytes),
                grads=wire.encode_matrix(
                    _rows_of(summed, part), fp16=options.fp16, lz4_min_bytes=options.lz4_min_bytes
                ),
            ),
            idempotent=False,
        )
        for part in parts
    ]

    def merge(responses: list[Any]) -> PushResult:
        total = PushResult()
        for r in responses:
            total += PushResult(int(r.applied), int(r.nan_skipped), int(r.missing))
        return total

    return Plan(calls, merge)


def dims_of(tables: Sequence[str], known: Mapping[str, int]) -> dict[str, int]:
    """The dim of each table from ``known`` (what the cluster serves).

    Raises:
        TableNotFoundError: a table the cluster does not serve.
    """
    for table in tables:
        if table not in known:
            raise TableNotFoundError(table, tuple(known))
    return {table: known[table] for table in tables}


def gradient_batches(
    updates: Mapping[str, tuple[object, object]], dims: Mapping[str, int]
) -> dict[str, tuple[IdBatch, F32]]:
    """Each table's deduplicated ids and its gradients, summed per unique id.

    Raises:
        InvalidArgumentError: ids that are not ids, or gradients that are not a float matrix of
            one row per id and the table's dim (the message names the table).
    """
    out: dict[str, tuple[IdBatch, F32]] = {}
    for table, (ids, grads) in updates.items():
        batch = IdBatch.of(ids)
        matrix = as_matrix(grads, batch.size, f"grads of table {table!r}")
        if matrix.shape[1] != dims[table]:
            raise InvalidArgumentError(
                f"grads of table {table!r} must have shape ({batch.size}, {dims[table]}) (one "
                f"row of dim {dims[table]} per id), got {matrix.shape}"
            )
        out[table] = (batch, batch.sum_rows(matrix))
    return out


def lookup_many(
    batches: Mapping[str, IdBatch],
    dims: Mapping[str, int],
    train: bool,
    options: ClientOptions,
    budgets: Sequence[Budget],
) -> Plan[dict[str, F32]]:
    """One ``LookupMany`` per shard with every table's ids for it (more only when the parts'
    ids or answer rows together exceed the shard's budget, each table's rows of its own dim);
    each table's vectors come back in the caller's order."""
    costs = {table: lookup_cost(dims[table], options.fp16) for table in batches}
    requests = split_many(batches, budgets, costs)
    encoding = {"fp16": options.fp16, "lz4_min_bytes": options.lz4_min_bytes}
    calls = [
        ShardCall(
            pieces[0][1].shard,
            "LookupMany",
            pb.LookupManyRequest(
                lookups=[  # fields, not messages: the constructor builds them in place
                    {
                        "table": table,
                        "ids": _id_fields(_ids_of(batches[table], part), options.lz4_min_bytes),
                        "train": train,
                        "encoding": encoding,
                    }
                    for table, part in pieces
                ]
            ),
            idempotent=not train,  # a training lookup admits rows and refreshes recency
        )
        for pieces in requests
    ]

    def merge(responses: list[Any]) -> dict[str, F32]:
        unique: dict[str, F32] = {}
        for pieces, response in zip(requests, responses, strict=True):
            results = _results(response, pieces, "LookupMany")
            for (table, part), result in zip(pieces, results, strict=True):
                vectors = wire.decode_matrix(result.vectors, "vectors", part.rows.size, dims[table])
                if part.whole:  # the table's only part, in unique order: no scatter
                    unique[table] = vectors
                    continue
                if table not in unique:
                    unique[table] = np.empty((batches[table].unique.size, dims[table]), np.float32)
                unique[table][part.rows] = vectors
        out: dict[str, F32] = {}
        for table, batch in batches.items():
            if table not in unique:  # no ids
                out[table] = np.zeros((0, dims[table]), dtype=np.float32)
                continue
            rows = unique[table]
            if not (rows.flags.writeable or batch.has_duplicates):
                rows = rows.copy()  # float32 answers are read-only views of the message
            out[table] = batch.expand(rows)
        return out

    return Plan(calls, merge)


def apply_gradients_many(
    updates: Mapping[str, tuple[IdBatch, F32]], options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[dict[str, PushResult]]:
    """One ``ApplyGradientsMany`` per shard with every table's rows for it (more only past the
    shard's budget, as in :func:`lookup_many`). ``updates`` comes from
    :func:`gradient_batches`."""
    batches = {table: batch for table, (batch, _) in updates.items()}
    costs = {
        table: push_cost(grads.shape[1], options.fp16) for table, (_, grads) in updates.items()
    }
    requests = split_many(batches, budgets, costs)
    calls = [
        ShardCall(
            pieces[0][1].shard,
            "ApplyGradientsMany",
            pb.ApplyGradientsManyRequest(
                updates=[  # fields, not messages: the constructor builds them in place
                    {
                        "table": table,
                        "ids": _id_fields(_ids_of(batches[table], part), options.lz4_min_bytes),
                        "grads": _matrix_fields(_rows_of(updates[table][1], part), options),
                    }
                    for table, part in pieces
                ]
            ),
            idempotent=False,
        )
        for pieces in requests
    ]

    def merge(responses: list[Any]) -> dict[str, PushResult]:
        totals = {table: PushResult() for table in updates}
        for pieces, response in zip(requests, responses, strict=True):
            results = _results(response, pieces, "ApplyGradientsMany")
            for (table, _), r in zip(pieces, results, strict=True):
                totals[table] += PushResult(int(r.applied), int(r.nan_skipped), int(r.missing))
        return totals

    return Plan(calls, merge)


def _results(response: Any, pieces: list[tuple[str, Part]], method: str) -> Any:
    """The per-part results of a ``*Many`` answer, checked to be one per part."""
    results = response.results
    if len(results) != len(pieces):
        raise InvalidArgumentError(
            f"shard {pieces[0][1].shard} answered {len(results)} results to a {method} of "
            f"{len(pieces)} parts"
        )
    return results


def assign(
    table: str, batch: IdBatch, vectors: object, options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[int]:
    """For duplicate ids the last vector wins (as on the shard). Vectors travel as float32, in
    requests whose matrices fit the shard's budget."""
    last = batch.last_rows(as_matrix(vectors, batch.size, "vectors"))
    cost = push_cost(last.shape[1], fp16=False)
    parts = batch.parts(len(budgets), [b.max_ids(cost) for b in budgets])
    calls = [
        ShardCall(
            part.shard,
            "Assign",
            pb.AssignRequest(
                table=table,
                ids=wire.encode_ids(_ids_of(batch, part), options.lz4_min_bytes),
                vectors=wire.encode_matrix(
                    _rows_of(last, part), lz4_min_bytes=options.lz4_min_bytes
                ),
            ),
            idempotent=True,
        )
        for part in parts
    ]
    return Plan(calls, lambda responses: sum(int(r.written) for r in responses))


def delete(
    table: str, batch: IdBatch, options: ClientOptions, budgets: Sequence[Budget]
) -> Plan[int]:
    """Each shard deletes its ids; the result is how many existed."""
    calls = [
        ShardCall(
            part.shard,
            "Delete",
            pb.DeleteRequest(
                table=table, ids=wire.encode_ids(_ids_of(batch, part), options.lz4_min_bytes)
            ),
            idempotent=True,
        )
        for part in batch.parts(len(budgets), [b.max_ids(ID_COST) for b in budgets])
    ]
    return Plan(calls, lambda responses: sum(int(r.deleted) for r in responses))


def _id_fields(ids: npt.NDArray[np.uint64], lz4_min_bytes: int) -> wire.TensorFields:
    return wire.encode_id_parts(ids, (0, ids.size), lz4_min_bytes)[0]


def _matrix_fields(values: F32, options: ClientOptions) -> wire.TensorFields:
    bounds = (0, values.shape[0])
    return wire.encode_matrix_parts(values, bounds, options.fp16, options.lz4_min_bytes)[0]


def _ids_of(batch: IdBatch, part: Part) -> npt.NDArray[np.uint64]:
    return batch.unique if part.whole else batch.unique[part.rows]


def _rows_of(values: npt.NDArray[np.float32], part: Part) -> npt.NDArray[np.float32]:
    if part.whole:
        return values
    picked: npt.NDArray[np.float32] = values[part.rows]
    return picked


def list_tables() -> Plan[list[TableDescription]]:
    """Every shard serves the same tables; shard 0 answers."""
    call = ShardCall(0, "ListTables", pb.ListTablesRequest(), idempotent=True)
    return Plan([call], lambda r: [TableDescription.from_proto(t) for t in r[0].tables])


def describe_table(table: str) -> Plan[TableDescription]:
    """Shard 0 describes the table."""
    call = ShardCall(0, "DescribeTable", pb.DescribeTableRequest(table=table), idempotent=True)
    return Plan([call], lambda r: TableDescription.from_proto(r[0]))


def stats(addresses: Sequence[str]) -> Plan[list[ShardStatsDict]]:
    """Every shard's statistics, in shard order."""
    calls = [
        ShardCall(k, "Stats", pb.StatsRequest(), idempotent=True) for k in range(len(addresses))
    ]

    def merge(responses: list[Any]) -> list[ShardStatsDict]:
        return [
            ShardStatsDict(
                shard_index=int(r.shard_index),
                num_shards=int(r.num_shards),
                address=address,
                tables={t.table: {k: int(v) for k, v in t.counters.items()} for t in r.tables},
            )
            for address, r in zip(addresses, responses, strict=True)
        ]

    return Plan(calls, merge)


def scan_calls(
    table: str, num_shards: int, limit: int, after: int | None, options: ClientOptions
) -> list[ShardCall]:
    """The first ``Scan`` call of every shard, in shard order. A client sends a shard's call,
    yields :func:`scan_page` of the answer and, until ``done``, sends it again with
    ``request.after_id`` set to the answer's ``last_id``. Vectors come back exact float32.

    Raises:
        InvalidArgumentError: ``limit`` below 1 or above 2^32 - 1.
    """
    if not 1 <= limit <= 0xFFFFFFFF:
        raise InvalidArgumentError(f"limit must be a row count of at least 1, got {limit}")
    encoding = pb.Encoding(lz4_min_bytes=options.lz4_min_bytes)
    calls = []
    for shard in range(num_shards):
        request = pb.ScanRequest(table=table, limit=limit, encoding=encoding)
        if after is not None:
            request.after_id = after
        calls.append(ShardCall(shard, "Scan", request, idempotent=True))
    return calls


def advance_scan(call: ShardCall, response: Any) -> None:
    """Set ``call``'s cursor to ``response.last_id`` for the shard's next ``Scan`` page.

    Raises:
        UnavailableError: the cursor does not advance (a ``last_id`` at or below the page's
            own cursor): asking again would return the same page forever.
    """
    request = call.request
    after = request.after_id if request.HasField("after_id") else None
    if after is not None and response.last_id <= after:
        raise UnavailableError(
            f"shard {call.shard} answered Scan of table {request.table!r} after id {after} with "
            f"last_id {response.last_id} and done false: its cursor does not advance; stopping"
        )
    request.after_id = response.last_id


def scan_page(response: Any) -> tuple[npt.NDArray[np.uint64], F32]:
    """The ``(ids, vectors)`` of one ``Scan`` answer (possibly empty)."""
    ids = wire.decode_ids(response.ids, "ids")
    if ids.size == 0:
        return ids, np.zeros((0, 0), dtype=np.float32)
    return ids, wire.decode_matrix(response.vectors, "vectors", ids.size)
