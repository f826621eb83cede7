"""The language-neutral API on a real port: server reflection v1 and v1alpha, the former service
name ``embeddb.v1.EmbeddingStore`` still served (guarded, observed, health-checked), and the
renamed messages keeping their bytes (tests/test_proto_buf.py checks the same with buf)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.server import SERVICE_NAME, ServerConfig, build_server
from embeddb.transport import wire
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Tokens
from embeddb.transport.rpc.reflection import V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME, v1_file
from embeddb.v1 import embeddb_pb2 as pb
from tests.test_metrics import scrape, value

DIM = 4
RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"
LEGACY = wire.LEGACY_SERVICE_NAME


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RpcServer]:
    table = TableConfig(
        name="t", dim=DIM, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )
    shard = Shard(EmbeddingConfig(tables={"t": table}), tmp_path / "shard")
    tokens = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}))
    served = build_server(shard, ServerConfig(ListenConfig(tokens=tokens, metrics_port=0)))
    try:
        yield served
    finally:
        served.stop(grace=1)
        shard.close()


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def reflect_v1(channel: grpc.Channel, **request: Any) -> Any:
    """One reflection request through the v1 path, with v1 message classes built from the v1
    descriptors (as a client generated from grpc/reflection/v1/reflection.proto has them)."""
    file = v1_file()
    request_cls = message_factory.GetMessageClass(
        file.message_types_by_name["ServerReflectionRequest"]
    )
    response_cls = message_factory.GetMessageClass(
        file.message_types_by_name["ServerReflectionResponse"]
    )
    call = channel.stream_stream(
        f"/{V1_SERVICE_NAME}/ServerReflectionInfo",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    (reply,) = list(call(iter([request_cls(**request)]), timeout=10))
    return reply


@pytest.mark.slow
def test_reflection_v1_lists_and_describes_the_api(server: RpcServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # no token: open
        listed = reflect_v1(channel, list_services="")
        names = {s.name for s in listed.list_services_response.service}
        assert names == {
            SERVICE_NAME,
            "grpc.health.v1.Health",
            V1_SERVICE_NAME,
            V1ALPHA_SERVICE_NAME,
        }
        assert LEGACY not in names  # served, but not offered to new clients

        reply = reflect_v1(channel, file_containing_symbol=SERVICE_NAME)
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in reply.file_descriptor_response.file_descriptor_proto
        ]
        api = next(f for f in files if f.name == "embeddb/v1/embeddb.proto")
        (service,) = (s for s in api.service if s.name == "EmbeddingStoreService")
        assert {"DescribeShard", "Lookup", "Scan"} <= {m.name for m in service.method}
        assert api.options.go_package.endswith(";embeddbv1")

        # Reflection describes itself in v1 too (what grpcurl's `describe` asks).
        itself = reflect_v1(channel, file_containing_symbol=V1_SERVICE_NAME)
        (raw,) = itself.file_descriptor_response.file_descriptor_proto
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
        assert proto.package == "grpc.reflection.v1"
        method = proto.service[0].method[0]
        assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"

        missing = reflect_v1(channel, file_containing_symbol="embeddb.v1.NoSuchThing")
        assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.mark.slow
def test_reflection_v1alpha_still_served(server: RpcServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(
            f"/{V1ALPHA_SERVICE_NAME}/ServerReflectionInfo",
            request_serializer=alpha_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=alpha_pb2.ServerReflectionResponse.FromString,
        )
        (reply,) = list(call(iter([alpha_pb2.ServerReflectionRequest(list_services="")])))
        assert SERVICE_NAME in {s.name for s in reply.list_services_response.service}


@pytest.mark.slow
def test_reflection_garbage_is_invalid_argument(server: RpcServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(f"/{V1_SERVICE_NAME}/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([b"\xff\xff\xff"]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def legacy_call(channel: grpc.Channel, method: str, response: Any) -> Any:
    return channel.unary_unary(
        f"/{LEGACY}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


@pytest.mark.slow
def test_former_service_name_serves_the_same_methods(server: RpcServer) -> None:
    ids = np.array([3, 5, 8], np.uint64)
    vectors = np.arange(12, dtype=np.float32).reshape(3, DIM)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assign = legacy_call(channel, "Assign", pb.AssignResponse)
        written = assign(
            pb.AssignRequest(
                table="t", ids=wire.encode_ids(ids), vectors=wire.encode_matrix(vectors)
            ),
            metadata=bearer(RW),
            timeout=10,
        )
        assert written.written == 3
        lookup = legacy_call(channel, "Lookup", pb.LookupResponse)
        got = lookup(
            pb.LookupRequest(table="t", ids=wire.encode_ids(ids), train=False),
            metadata=bearer(RO),
            timeout=10,
        )
        np.testing.assert_array_equal(wire.decode_matrix(got.vectors, "vectors"), vectors)

        # Guarded like the new name: no token, or a read-only token writing, is refused.
        for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED), (bearer(RO), None)):
            with pytest.raises(grpc.RpcError) as info:
                assign(
                    pb.AssignRequest(
                        table="t", ids=wire.encode_ids(ids), vectors=wire.encode_matrix(vectors)
                    ),
                    metadata=metadata,
                    timeout=10,
                )
            assert info.value.code() == (code or grpc.StatusCode.PERMISSION_DENIED)

        health = health_pb2_grpc.HealthStub(channel)
        for name in (SERVICE_NAME, LEGACY):
            status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING

    assert server.metrics_port is not None
    samples = scrape(server.metrics_port)
    assert value(samples, "embeddb_requests_total", method="Lookup", status="OK") == 1
    assert value(samples, "embeddb_requests_total", method="Assign", status="OK") == 1


@pytest.mark.slow
def test_describe_table_answer_keeps_the_bytes_of_table_info(server: RpcServer) -> None:
    """DescribeTable answered a TableInfo before the renames: a client of that release reads
    today's DescribeTableResponse bytes as the same TableInfo."""
    new = pb.DESCRIPTOR.message_types_by_name["DescribeTableResponse"]
    old = pb.DESCRIPTOR.message_types_by_name["TableInfo"]
    shape = [(f.number, f.name, f.type) for f in new.fields]
    assert shape == [(f.number, f.name, f.type) for f in old.fields]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        describe = legacy_call(channel, "DescribeTable", pb.TableInfo)  # the old answer type
        info = describe(pb.DescribeTableRequest(table="t"), metadata=bearer(RO), timeout=10)
    assert (info.name, info.dim, info.optimizer, info.state_dim) == ("t", DIM, "adagrad", DIM)


def test_enum_numbers_unchanged_by_the_renames() -> None:
    """The renamed enum values keep their numbers (the binary encoding)."""
    assert [pb.D_TYPE_UNSPECIFIED, pb.D_TYPE_UINT64, pb.D_TYPE_FLOAT32, pb.D_TYPE_FLOAT16] == [
        0,
        1,
        2,
        3,
    ]
    assert [pb.COMPRESSION_UNSPECIFIED, pb.COMPRESSION_LZ4] == [0, 1]
