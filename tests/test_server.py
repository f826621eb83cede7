"""The gRPC server on a real port: round trips, status codes, limits, health, reflection."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.server import SERVICE_NAME, ServerConfig, build_server
from embeddb.transport import wire
from embeddb.transport.rpc import RpcServer
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

DIM = 4


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Shard, RpcServer, pb_grpc.EmbeddingStoreServiceStub]]:
    config = EmbeddingConfig(
        tables={
            "t": TableConfig(
                name="t", dim=DIM, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
            )
        }
    )
    shard = Shard(config, tmp_path / "shard")
    server = build_server(
        shard, ServerConfig(max_message_bytes=1 << 20, max_ids_per_request=10_000, shard_index=0)
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield shard, server, pb_grpc.EmbeddingStoreServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=1)
        shard.close()


def ids_tensor(*values: int) -> pb.Tensor:
    return wire.encode_ids(np.array(values, dtype=np.uint64))


def test_round_trip_of_every_rpc(served) -> None:
    shard, _, stub = served
    ids = ids_tensor(5, 9, 5)
    got = wire.decode_matrix(
        stub.Lookup(pb.LookupRequest(table="t", ids=ids, train=True)).vectors, "v"
    )
    np.testing.assert_array_equal(got, shard.lookup("t", [5, 9, 5], train=False))
    grads = wire.encode_matrix(np.ones((3, DIM), np.float32))
    applied = stub.ApplyGradients(pb.ApplyGradientsRequest(table="t", ids=ids, grads=grads))
    assert (applied.applied, applied.nan_skipped, applied.missing) == (2, 0, 0)
    after = shard.lookup("t", [5, 9], train=False)
    lr = shard.config.tables["t"].optimizer.lr  # id 5 came twice: its gradient sums to 2
    np.testing.assert_allclose(
        after, got[:2] - lr * np.array([[2.0] * DIM, [1.0] * DIM]), rtol=1e-5
    )
    written = stub.Assign(
        pb.AssignRequest(
            table="t", ids=ids_tensor(1), vectors=wire.encode_matrix(np.ones((1, DIM), np.float32))
        )
    )
    assert written.written == 1
    assert stub.Delete(pb.DeleteRequest(table="t", ids=ids_tensor(1, 2))).deleted == 1
    tables = stub.ListTables(pb.ListTablesRequest()).tables
    assert [(t.name, t.dim, t.optimizer, t.state_dim) for t in tables] == [("t", DIM, "sgd", 0)]
    assert stub.DescribeTable(pb.DescribeTableRequest(table="t")).capacity == 100
    stats = stub.Stats(pb.StatsRequest())
    assert (stats.shard_index, stats.num_shards) == (0, 1)
    assert stats.tables[0].counters["rows"] == 2 and stats.tables[0].counters["deleted_rows"] == 1


def test_fp16_and_lz4_responses_decode_to_the_same_vectors(served) -> None:
    _, _, stub = served
    ids = ids_tensor(*range(200))
    exact = wire.decode_matrix(
        stub.Lookup(pb.LookupRequest(table="t", ids=ids, train=True)).vectors, "v"
    )
    for encoding in (
        pb.Encoding(fp16=True),
        pb.Encoding(lz4_min_bytes=1),
        pb.Encoding(fp16=True, lz4_min_bytes=1),
    ):
        reply = stub.Lookup(pb.LookupRequest(table="t", ids=ids, encoding=encoding)).vectors
        decoded = wire.decode_matrix(reply, "v", 200, DIM)
        bound = 2.0**-11 * np.abs(exact).max(axis=1, keepdims=True) if encoding.fp16 else 0.0
        assert np.all(np.abs(decoded - exact) <= bound)


BAD = {
    "unknown table": (
        lambda s: s.Lookup(pb.LookupRequest(table="nope", ids=ids_tensor(1))),
        grpc.StatusCode.NOT_FOUND,
        "unknown table 'nope'",
    ),
    "wrong dim": (
        lambda s: s.ApplyGradients(
            pb.ApplyGradientsRequest(
                table="t",
                ids=ids_tensor(1),
                grads=wire.encode_matrix(np.ones((1, DIM + 1), np.float32)),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "grads must have shape",
    ),
    "count mismatch": (
        lambda s: s.Assign(
            pb.AssignRequest(
                table="t",
                ids=ids_tensor(1, 2),
                vectors=wire.encode_matrix(np.ones((1, DIM), np.float32)),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "vectors must have shape",
    ),
    "wrong dtype": (
        lambda s: s.Lookup(
            pb.LookupRequest(table="t", ids=wire.encode_matrix(np.ones((1, 1), np.float32)))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ids must be UINT64",
    ),
    "byte length": (
        lambda s: s.Delete(
            pb.DeleteRequest(
                table="t", ids=pb.Tensor(dtype=pb.D_TYPE_UINT64, shape=[2], data=b"\0" * 12)
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ids holds 12 bytes",
    ),
    "too many ids": (
        lambda s: s.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(*range(10_001)))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "max_ids_per_request",
    ),
    "message too large": (
        lambda s: s.Assign(
            pb.AssignRequest(
                table="t",
                ids=ids_tensor(*range(70_000)),
                vectors=wire.encode_matrix(np.ones((70_000, DIM), np.float32)),
            )
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_get_precise_statuses_and_change_nothing(served, case: str) -> None:
    shard, _, stub = served
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 2, 3), train=True))
    _, before = shard.peek("t", [1, 2, 3])
    call, code, message = BAD[case]
    with pytest.raises(grpc.RpcError) as info:
        call(stub)
    assert info.value.code() == code
    assert message in info.value.details()
    _, after = shard.peek("t", [1, 2, 3])
    assert after.tobytes() == before.tobytes()
    assert stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1))).vectors.shape == [1, DIM]


def test_nan_gradient_rows_are_skipped_and_reported(served) -> None:
    shard, _, stub = served
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 2), train=True))
    _, before = shard.peek("t", [1])
    grads = np.ones((2, DIM), np.float32)
    grads[0, 0] = np.nan
    reply = stub.ApplyGradients(
        pb.ApplyGradientsRequest(table="t", ids=ids_tensor(1, 2), grads=wire.encode_matrix(grads))
    )
    assert (reply.applied, reply.nan_skipped) == (1, 1)
    _, after = shard.peek("t", [1])
    np.testing.assert_array_equal(after, before)


def test_health_and_reflection(served) -> None:
    _, server, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names
    server.health.enter_graceful_shutdown()
    status = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME)).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    channel.close()
