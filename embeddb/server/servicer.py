"""The ``EmbeddingStore`` servicer: translate proto ⇄ numpy and call the shard. Nothing else.

Errors raised by the shard or the codec propagate as :mod:`embeddb.errors` exceptions; the
:class:`~embeddb.transport.rpc.interceptors.ErrorInterceptor` turns them into gRPC statuses.

Every call borrows the shard from a :class:`~embeddb.server.served_shard.ServedShard` (a
follower swaps its shard when it bootstraps again). The two server-streaming calls, ``Subscribe`` (a
follower's feed: :meth:`Shard.tail_log`) and ``FetchSnapshot`` (a snapshot's files), each hold
a thread of the server's stream pool while they run, so at most ``max_streams`` per role run
at once (RESOURCE_EXHAUSTED beyond), and a caller that stops reading is dropped after
``stream_idle_timeout`` seconds (:mod:`embeddb.server.streams`);
:meth:`StoreServicer.stop_streams` ends them all with UNAVAILABLE within ``STREAM_POLL_S`` when
the server shuts down, so open streams never hold up the shutdown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from embeddb.common.allocator import Trimmer
from embeddb.common.routing import ROUTING_ALGORITHM, SHARD_SALT, Topology
from embeddb.engine.durability.log import LogRecord
from embeddb.engine.shard import Shard
from embeddb.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)
from embeddb.server.served_shard import ServedShard
from embeddb.server.streams import StreamSlots
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

__all__ = [
    "HEARTBEAT_S",
    "SNAPSHOT_CHUNK_BYTES",
    "STREAM_POLL_S",
    "ServicerLimits",
    "StoreServicer",
    "store_handlers",
]

STREAM_POLL_S = 0.05  # how often an idle stream checks for cancellation and shutdown
HEARTBEAT_S = 1.0  # an idle Subscribe stream sends a heartbeat this often
SNAPSHOT_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ServicerLimits:
    """Per-request limits enforced before any work is done.

    Attributes:
        max_ids_per_request: ids one request may carry.
        max_streams: ``Subscribe`` and ``FetchSnapshot`` calls running at once, per role (each
            holds a thread of the stream pool for as long as it runs).
        stream_idle_timeout: seconds a stream's caller may leave a message unread before the
            stream is dropped.
        max_message_bytes: the largest request or response message (reported by
            ``DescribeShard``; gRPC enforces it).
        max_response_bytes: the largest answer, computed before any gathering (ids x dim x
            bytes per value, all parts together); also the most bytes an LZ4-compressed request
            tensor may decompress to.
    """

    max_ids_per_request: int = 1 << 22
    max_streams: int = 4
    stream_idle_timeout: float = 30.0
    max_message_bytes: int = 256 << 20
    max_response_bytes: int = 64 << 20


class StoreServicer(pb_grpc.EmbeddingStoreServiceServicer):
    """Serves one shard.

    Args:
        shard: the open shard, or the ServedShard of a follower (swapped on re-bootstrap).
        shard_index, num_shards: the cluster place reported while a follower serves no shard yet
            (a shard reports its own); None: not known until the follower has bootstrapped
            (``DescribeShard`` is UNAVAILABLE meanwhile).
        limits: request limits.
        trimmer: told the size of every large call, to give the memory of a burst back.
    """

    def __init__(
        self,
        shard: Shard | ServedShard,
        shard_index: int | None = 0,
        num_shards: int | None = 1,
        limits: ServicerLimits | None = None,
        trimmer: Trimmer | None = None,
    ) -> None:
        self._served = shard if isinstance(shard, ServedShard) else ServedShard(shard)
        self._topology = (
            Topology(shard_index, num_shards)
            if shard_index is not None and num_shards is not None
            else None
        )
        self._limits = limits or ServicerLimits()
        self._trimmer = trimmer
        self._stopping = threading.Event()
        self.streams = StreamSlots(self._limits.max_streams, self._limits.stream_idle_timeout)

    def stop_streams(self) -> None:
        """End every running and future stream with UNAVAILABLE (the server is stopping)."""
        self._stopping.set()

    def close(self) -> None:
        """Stop the stream watchdog (after the server has stopped). Idempotent."""
        self.streams.close()

    def _ids(self, tensor: pb.Tensor, field: str = "ids") -> npt.NDArray[np.uint64]:
        n = _items(tensor)
        if n > self._limits.max_ids_per_request:
            raise ResourceExhaustedError(
                f"{field} has {n} ids, more than max_ids_per_request "
                f"{self._limits.max_ids_per_request}; split the request"
            )
        return wire.decode_ids(tensor, field, max_lz4_bytes=self._limits.max_response_bytes)

    def _many_ids(self, tensors: list[pb.Tensor], field: str) -> list[npt.NDArray[np.uint64]]:
        """The ids of every part; the parts' ids together count against the limit."""
        n = sum(_items(t) for t in tensors)
        if n > self._limits.max_ids_per_request:
            raise ResourceExhaustedError(
                f"the {len(tensors)} parts of {field} have {n} ids together, more than "
                f"max_ids_per_request {self._limits.max_ids_per_request}; split the request"
            )
        return [
            wire.decode_ids(t, f"{field}[{i}].ids", max_lz4_bytes=self._limits.max_response_bytes)
            for i, t in enumerate(tensors)
        ]

    def _matrix(
        self, tensor: pb.Tensor, field: str, rows: int, dim: int
    ) -> npt.NDArray[np.float32]:
        values = wire.decode_matrix(
            tensor, field, rows, dim, max_lz4_bytes=self._limits.max_response_bytes
        )
        self._note(values.nbytes)
        return values

    def _check_answer(self, shard: Shard, parts: list[pb.LookupRequest], what: str) -> None:
        """Refuse a lookup whose answer would exceed ``max_response_bytes``, computed from the
        ids the request claims (after any decompression) before anything is decoded or
        gathered."""
        total = 0
        for p in parts:
            total += _items(p.ids) * wire.row_bytes(self._dim(shard, p.table), p.encoding.fp16)
        limit = self._limits.max_response_bytes
        if total > limit:
            raise ResourceExhaustedError(
                f"the answer to this {what} would hold {total} bytes of vectors, more than this "
                f"server's max_response_bytes {limit}; split the request (DescribeShard reports "
                f"the limits)"
            )

    def _note(self, nbytes: int) -> None:
        if self._trimmer is not None:
            self._trimmer.note(nbytes)

    @staticmethod
    def _dim(shard: Shard, table: str) -> int:
        return shard.config.table(table).dim

    def Lookup(self, request: pb.LookupRequest, context: grpc.ServicerContext) -> wire.Encoded:
        """Answers an already serialized ``LookupResponse`` (one copy of the vectors)."""
        with self._served.use() as shard:
            self._check_answer(shard, [request], "Lookup")
            ids = self._ids(request.ids)
            vectors = shard.lookup(request.table, ids, train=request.train)
        enc = request.encoding
        answer = wire.encode_lookup_response(
            vectors, fp16=enc.fp16, lz4_min_bytes=enc.lz4_min_bytes
        )
        self._note(answer.ByteSize())
        return answer

    def ApplyGradients(
        self, request: pb.ApplyGradientsRequest, context: grpc.ServicerContext
    ) -> pb.ApplyGradientsResponse:
        ids = self._ids(request.ids)
        with self._served.use() as shard:
            dim = self._dim(shard, request.table)
            grads = self._matrix(request.grads, "grads", ids.size, dim)
            result = shard.apply_gradients(request.table, ids, grads)
        return pb.ApplyGradientsResponse(
            applied=result.applied, nan_skipped=result.nan_skipped, missing=result.missing
        )

    def LookupMany(
        self, request: pb.LookupManyRequest, context: grpc.ServicerContext
    ) -> wire.Encoded:
        """Every part validated before any is looked up (``Shard.lookup_many``)."""
        parts = request.lookups
        with self._served.use() as shard:
            self._check_answer(shard, list(parts), "LookupMany")
            ids = self._many_ids([p.ids for p in parts], "lookups")
            vectors = shard.lookup_many(
                [(p.table, i, p.train) for p, i in zip(parts, ids, strict=True)]
            )
        answer = wire.encode_lookup_many_response(
            [
                wire.encode_lookup_response(
                    v, fp16=p.encoding.fp16, lz4_min_bytes=p.encoding.lz4_min_bytes
                )
                for p, v in zip(parts, vectors, strict=True)
            ]
        )
        self._note(answer.ByteSize())
        return answer

    def ApplyGradientsMany(
        self, request: pb.ApplyGradientsManyRequest, context: grpc.ServicerContext
    ) -> pb.ApplyGradientsManyResponse:
        """Every part validated before any is applied (``Shard.apply_gradients_many``)."""
        parts = request.updates
        ids = self._many_ids([p.ids for p in parts], "updates")
        with self._served.use() as shard:
            grads = [
                self._matrix(p.grads, f"updates[{k}].grads", i.size, self._dim(shard, p.table))
                for k, (p, i) in enumerate(zip(parts, ids, strict=True))
            ]
            results = shard.apply_gradients_many(
                [(p.table, i, g) for p, i, g in zip(parts, ids, grads, strict=True)]
            )
        return pb.ApplyGradientsManyResponse(
            results=[
                pb.ApplyGradientsResponse(
                    applied=r.applied, nan_skipped=r.nan_skipped, missing=r.missing
                )
                for r in results
            ]
        )

    def Assign(self, request: pb.AssignRequest, context: grpc.ServicerContext) -> pb.AssignResponse:
        ids = self._ids(request.ids)
        with self._served.use() as shard:
            dim = self._dim(shard, request.table)
            vectors = self._matrix(request.vectors, "vectors", ids.size, dim)
            return pb.AssignResponse(written=shard.assign(request.table, ids, vectors))

    def Delete(self, request: pb.DeleteRequest, context: grpc.ServicerContext) -> pb.DeleteResponse:
        ids = self._ids(request.ids)
        with self._served.use() as shard:
            return pb.DeleteResponse(deleted=shard.delete(request.table, ids))

    def ListTables(
        self, request: pb.ListTablesRequest, context: grpc.ServicerContext
    ) -> pb.ListTablesResponse:
        with self._served.use() as shard:
            tables = [pb.TableInfo(**self._info(shard, n)) for n in shard.tables]
        return pb.ListTablesResponse(tables=tables)

    def DescribeTable(
        self, request: pb.DescribeTableRequest, context: grpc.ServicerContext
    ) -> pb.DescribeTableResponse:
        with self._served.use() as shard:
            return pb.DescribeTableResponse(**self._info(shard, request.table))

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        with self._served.use() as shard:
            stats = shard.stats()
            topology = shard.topology
        tables = [
            pb.TableStats(
                table=name,
                counters={k: v for k, v in s.as_dict().items() if isinstance(v, int)},
            )
            for name, s in stats.tables.items()
        ]
        return pb.StatsResponse(
            shard_index=topology.shard_index, num_shards=topology.num_shards, tables=tables
        )

    def Scan(self, request: pb.ScanRequest, context: grpc.ServicerContext) -> pb.ScanResponse:
        """One page of a table's rows above ``after_id``, ascending (``Shard.scan``)."""
        fp16, lz4 = request.encoding.fp16, request.encoding.lz4_min_bytes
        after = request.after_id if request.HasField("after_id") else None
        with self._served.use() as shard:
            limit = self._scan_limit(
                request.limit, wire.row_bytes(self._dim(shard, request.table), fp16)
            )
            page = shard.scan(request.table, after, limit)
        answer = pb.ScanResponse(
            ids=wire.encode_ids(page.ids, lz4),
            vectors=wire.encode_matrix(page.vectors, fp16, lz4),
            last_id=int(page.ids[-1]) if page.ids.size else (after or 0),
            done=page.done,
        )
        self._note(answer.ByteSize())
        return answer

    def _scan_limit(self, limit: int, row_bytes: int) -> int:
        """``limit``, or the largest page the limits allow when 0 (INVALID_ARGUMENT beyond)."""
        ids_cap = self._limits.max_ids_per_request
        bytes_cap = max(self._limits.max_response_bytes // (row_bytes + 8), 1)
        if limit == 0:
            return min(ids_cap, bytes_cap)
        if limit > ids_cap or limit > bytes_cap:
            raise InvalidArgumentError(
                f"limit {limit} is too large: a page may hold at most {min(ids_cap, bytes_cap)} "
                f"rows here (max_ids_per_request {ids_cap}, max_response_bytes "
                f"{self._limits.max_response_bytes}; DescribeShard reports both)"
            )
        return limit

    def DescribeShard(
        self, request: pb.DescribeShardRequest, context: grpc.ServicerContext
    ) -> pb.DescribeShardResponse:
        """Topology, routing and limits; answered even before a follower has bootstrapped."""
        shard = self._served.current
        topology = shard.topology if shard is not None else self._topology
        if topology is None:  # a follower learns its place from its primary
            raise UnavailableError("this follower has not bootstrapped from its primary yet")
        limits = self._limits
        return pb.DescribeShardResponse(
            shard_index=topology.shard_index,
            num_shards=topology.num_shards,
            routing=pb.Routing(algorithm=ROUTING_ALGORITHM, salt=int(SHARD_SALT)),
            limits=pb.ServerLimits(
                max_message_bytes=limits.max_message_bytes,
                max_ids_per_request=limits.max_ids_per_request,
                max_response_bytes=limits.max_response_bytes,
            ),
            follower=shard.follower if shard is not None else self._served.follower,
        )

    # ------------------------------------------------------------------ durability
    def Snapshot(
        self, request: pb.SnapshotRequest, context: grpc.ServicerContext
    ) -> pb.SnapshotResponse:
        with self._served.use() as shard:
            _refuse_on_follower(shard, "Snapshot")
            result = shard.snapshot(request.snapshot_id or None)
        return pb.SnapshotResponse(
            snapshot_id=result.info.snapshot_id,
            seq=result.info.seq,
            bytes=result.info.bytes,
            pause_ms=result.pause_s * 1000.0,
            seconds=result.seconds,
            shard_index=shard.topology.shard_index,
        )

    def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        with self._served.use() as shard:
            infos = shard.snapshots()
        return pb.ListSnapshotsResponse(
            snapshots=[
                pb.SnapshotInfo(
                    snapshot_id=s.snapshot_id, seq=s.seq, bytes=s.bytes, created=s.created
                )
                for s in infos
            ]
        )

    def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.SubscribeResponse]:
        """Records after ``from_seq``, then new ones as they are logged; a heartbeat (seq 0)
        after every ``HEARTBEAT_S`` without one. Ends when the caller cancels, or with
        UNAVAILABLE when the server stops or the shard closes."""
        with self.streams.hold(context) as ticket, self._served.use() as shard:
            records = shard.tail_log(request.from_seq, idle_s=STREAM_POLL_S)
            with closing(records):
                for message in self._feed(shard, records, context):
                    with ticket.sending():
                        yield message

    def _feed(
        self, shard: Shard, records: Iterator[LogRecord | None], context: grpc.ServicerContext
    ) -> Iterator[pb.SubscribeResponse]:
        sent = time.monotonic()
        for record in records:
            self._check_stopping()
            if not context.is_active():
                return
            if record is None:
                if time.monotonic() - sent < HEARTBEAT_S:
                    continue
                message = pb.SubscribeResponse(primary_seq=shard.seq)
            else:
                message = pb.SubscribeResponse(
                    seq=record.seq,
                    payload=record.payload,
                    primary_seq=shard.seq,
                    appended_at=shard.append_time(record.seq) or 0.0,
                )
            sent = time.monotonic()
            yield message

    def FetchSnapshot(
        self, request: pb.FetchSnapshotRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchSnapshotResponse]:
        """The files of a complete snapshot in chunks, the manifest last (see the proto)."""
        with self.streams.hold(context) as ticket:
            with self._served.use() as shard:
                if request.take_new:
                    _refuse_on_follower(shard, "FetchSnapshot with take_new")
                reader = shard.open_snapshot(request.snapshot_id or None, request.take_new)
            with reader:
                info = reader.info
                for chunk in reader.chunks(SNAPSHOT_CHUNK_BYTES):
                    self._check_stopping()
                    if not context.is_active():
                        return
                    with ticket.sending():
                        yield pb.FetchSnapshotResponse(
                            snapshot_id=info.snapshot_id,
                            seq=info.seq,
                            path=chunk.path,
                            offset=chunk.offset,
                            data=chunk.data,
                        )

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise UnavailableError("the server is shutting down; reconnect later")

    @staticmethod
    def _info(shard: Shard, name: str) -> dict[str, Any]:
        """The fields of a ``TableInfo`` (and of a ``DescribeTableResponse``: the same)."""
        t = shard.config.table(name)
        return {
            "name": t.name,
            "dim": t.dim,
            "optimizer": t.optimizer.kind.value,
            "state_dim": t.state_dim,
            "capacity": t.capacity,
        }


def store_handlers(servicer: StoreServicer) -> tuple[grpc.GenericRpcHandler, ...]:
    """The ``EmbeddingStoreService`` handlers, from the proto descriptor, under the service's
    name and under :data:`~embeddb.transport.wire.LEGACY_SERVICE_NAME` (the same handlers).

    Unlike the generated ``add_EmbeddingStoreServiceServicer_to_server``, every response is
    serialized by calling its own ``SerializeToString``, so a method may answer a
    :class:`wire.Encoded` (``Lookup`` does) as well as a generated message.
    """
    service = pb.DESCRIPTOR.services_by_name["EmbeddingStoreService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        request_type = getattr(pb, method.input_type.name)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=request_type.FromString,
            response_serializer=_serialize,
        )
    return tuple(
        grpc.method_handlers_generic_handler(name, handlers)
        for name in (service.full_name, wire.LEGACY_SERVICE_NAME)
    )


def _refuse_on_follower(shard: Shard, what: str) -> None:
    """A follower's snapshots are its primary's: it takes none when asked (it serves the one
    its bootstrap fetched)."""
    if shard.follower:
        raise FailedPreconditionError(
            f"{what} refused: this server is a follower, whose snapshots follow its primary's; "
            "call its primary"
        )


def _serialize(message: pb.LookupResponse | wire.Encoded) -> bytes:
    return message.SerializeToString()


def _items(tensor: pb.Tensor) -> int:
    """Items the shape of ``tensor`` claims (negative dimensions count as 0)."""
    n = 1
    for d in tensor.shape:
        n *= max(int(d), 0)
    return n
