"""The ``EmbeddingStore`` servicer: translate proto ⇄ numpy and call the shard. Nothing else.

Errors raised by the shard or the codec propagate as :mod:`embeddb.errors` exceptions; the
:class:`~embeddb.server.interceptors.ErrorInterceptor` turns them into gRPC statuses.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
import numpy.typing as npt

from embeddb import wire
from embeddb.errors import ResourceExhaustedError
from embeddb.shard import Shard
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

__all__ = ["ServicerLimits", "StoreServicer", "store_handler"]


@dataclass(frozen=True)
class ServicerLimits:
    """Per-request limits enforced before any work is done."""

    max_ids_per_request: int = 1 << 22


class StoreServicer(pb_grpc.EmbeddingStoreServicer):
    """Serves one shard.

    Args:
        shard: the open shard.
        shard_index, num_shards: this shard's place in the cluster (reported by ``Stats``).
        limits: request limits.
    """

    def __init__(
        self,
        shard: Shard,
        shard_index: int = 0,
        num_shards: int = 1,
        limits: ServicerLimits | None = None,
    ) -> None:
        self._shard = shard
        self._index = shard_index
        self._count = num_shards
        self._limits = limits or ServicerLimits()

    def _ids(self, tensor: pb.Tensor, field: str = "ids") -> npt.NDArray[np.uint64]:
        n = 1
        for d in tensor.shape:
            n *= max(int(d), 0)
        if n > self._limits.max_ids_per_request:
            raise ResourceExhaustedError(
                f"{field} has {n} ids, more than max_ids_per_request "
                f"{self._limits.max_ids_per_request}; split the request"
            )
        return wire.decode_ids(tensor, field)

    def _dim(self, table: str) -> int:
        return self._shard.config.table(table).dim

    def Lookup(self, request: pb.LookupRequest, context: grpc.ServicerContext) -> wire.Encoded:
        """Answers an already serialized ``LookupResponse`` (one copy of the vectors)."""
        ids = self._ids(request.ids)
        vectors = self._shard.lookup(request.table, ids, train=request.train)
        enc = request.encoding
        return wire.encode_lookup_response(vectors, fp16=enc.fp16, lz4_min_bytes=enc.lz4_min_bytes)

    def ApplyGradients(
        self, request: pb.ApplyGradientsRequest, context: grpc.ServicerContext
    ) -> pb.ApplyGradientsResponse:
        ids = self._ids(request.ids)
        grads = wire.decode_matrix(request.grads, "grads", ids.size, self._dim(request.table))
        result = self._shard.apply_gradients(request.table, ids, grads)
        return pb.ApplyGradientsResponse(
            applied=result.applied, nan_skipped=result.nan_skipped, missing=result.missing
        )

    def Assign(self, request: pb.AssignRequest, context: grpc.ServicerContext) -> pb.AssignResponse:
        ids = self._ids(request.ids)
        vectors = wire.decode_matrix(request.vectors, "vectors", ids.size, self._dim(request.table))
        return pb.AssignResponse(written=self._shard.assign(request.table, ids, vectors))

    def Delete(self, request: pb.DeleteRequest, context: grpc.ServicerContext) -> pb.DeleteResponse:
        ids = self._ids(request.ids)
        return pb.DeleteResponse(deleted=self._shard.delete(request.table, ids))

    def ListTables(
        self, request: pb.ListTablesRequest, context: grpc.ServicerContext
    ) -> pb.ListTablesResponse:
        return pb.ListTablesResponse(tables=[self._info(name) for name in self._shard.tables])

    def DescribeTable(
        self, request: pb.DescribeTableRequest, context: grpc.ServicerContext
    ) -> pb.TableInfo:
        return self._info(request.table)

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        stats = self._shard.stats()
        tables = [
            pb.TableStats(
                table=name,
                counters={k: v for k, v in s.as_dict().items() if isinstance(v, int)},
            )
            for name, s in stats.tables.items()
        ]
        return pb.StatsResponse(shard_index=self._index, num_shards=self._count, tables=tables)

    def _info(self, name: str) -> pb.TableInfo:
        t = self._shard.config.table(name)
        return pb.TableInfo(
            name=t.name,
            dim=t.dim,
            optimizer=t.optimizer.kind.value,
            state_dim=t.state_dim,
            capacity=t.capacity,
        )


def store_handler(servicer: StoreServicer) -> grpc.GenericRpcHandler:
    """The ``EmbeddingStore`` service's handlers, from the proto descriptor.

    Unlike the generated ``add_EmbeddingStoreServicer_to_server``, every response is serialized
    by calling its own ``SerializeToString``, so a method may answer a :class:`wire.Encoded`
    (``Lookup`` does) as well as a generated message.
    """
    service = pb.DESCRIPTOR.services_by_name["EmbeddingStore"]
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
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _serialize(message: pb.LookupResponse | wire.Encoded) -> bytes:
    return message.SerializeToString()
