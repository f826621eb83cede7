"""The ``EmbeddingStore`` stub both clients use: generated, except that ``Lookup`` and
``LookupMany`` answers are parsed without copying the vectors
(:func:`embeddb.transport.wire.parse_lookup_response`,
:func:`embeddb.transport.wire.parse_lookup_many_response`)."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

import embeddb.transport.wire as wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

__all__ = ["store_stub"]

_SERVICE = pb.DESCRIPTOR.services_by_name["EmbeddingStoreService"].full_name


def store_stub(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """A stub of ``channel`` (sync or asyncio) with the zero-copy ``Lookup`` and
    ``LookupMany``."""
    stub = pb_grpc.EmbeddingStoreServiceStub(channel)  # type: ignore[no-untyped-call]
    stub.Lookup = channel.unary_unary(
        f"/{_SERVICE}/Lookup",
        request_serializer=pb.LookupRequest.SerializeToString,
        response_deserializer=wire.parse_lookup_response,
    )
    stub.LookupMany = channel.unary_unary(
        f"/{_SERVICE}/LookupMany",
        request_serializer=pb.LookupManyRequest.SerializeToString,
        response_deserializer=wire.parse_lookup_many_response,
    )
    return stub
