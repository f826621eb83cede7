"""The boundary is closed by default: every method of every service, enumerated from the
generated descriptors (not from the policy under test), needs a token of the right role, and
every method kind — unary-unary, unary-stream, stream-unary, stream-stream — is refused
before the servicer (or the request's bytes) is reached."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.serving.server import ModelServerConfig, build_model_server
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.assembly import (
    OPEN_SERVICES,
    ConnectionConfig,
    ServerPools,
    Service,
    start_server,
)
from embeddb.transport.rpc.auth import AccessPolicy, Role, Tokens
from embeddb.transport.wire import LEGACY_SERVICE_NAME
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from embeddb.v1 import model_pb2 as mpb

RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"
REPLICA = "replica-token-00112233445566"
TOKENS = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}), replica=frozenset({REPLICA}))
TOKEN_OF = {Role.READ_WRITE: RW, Role.READ_ONLY: RO, Role.REPLICA: REPLICA}
ALL = frozenset(Role)
READS = ALL  # ro reads the ids it names
BULK = frozenset({Role.READ_WRITE, Role.REPLICA})
WRITE = frozenset({Role.READ_WRITE})

# Who may call what, written out by hand: a method the descriptors list and this table does
# not is a failure (a new method must be given its roles here and in the policy).
EXPECTED: dict[str, dict[str, frozenset[Role]]] = {
    "EmbeddingStoreService": {
        "Lookup": READS,
        "LookupMany": READS,
        "ListTables": READS,
        "DescribeTable": READS,
        "DescribeShard": READS,
        "Stats": READS,
        "ListSnapshots": READS,
        "Scan": BULK,
        "Subscribe": BULK,
        "FetchSnapshot": BULK,
        "ApplyGradients": WRITE,
        "ApplyGradientsMany": WRITE,
        "Assign": WRITE,
        "Delete": WRITE,
        "Snapshot": WRITE,
    },
    "ModelService": {"Predict": ALL, "DescribeModel": ALL},
}
DENIED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


def call(channel: grpc.Channel, path: str, method: MethodDescriptor, token: str | None) -> Any:
    """One call of ``method`` with an empty request: its status code (``OK`` when it answered,
    or, for a stream, sent a first message)."""
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    kinds = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }
    multicallable = kinds[(method.client_streaming, method.server_streaming)](path)
    request: Any = iter([b""]) if method.client_streaming else b""
    try:
        answer = multicallable(request, metadata=metadata, timeout=10)
        if method.server_streaming:
            next(answer, None)
            answer.cancel()
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


class _Stub:
    spec = SimpleNamespace(id_features=(), non_id=(), snapshot_id="")

    def predict(self, batch: object) -> Any:
        raise RuntimeError("not a model")

    def batch_from_records(self, records: object) -> Any:
        raise RuntimeError("not a model")

    def batch_from_hashed_records(self, records: object) -> Any:
        raise RuntimeError("not a model")


@pytest.fixture
def servers(tmp_path: Any) -> Iterator[dict[str, int]]:
    """Service short name -> the port of a server of it, tokens on."""
    config = EmbeddingConfig(
        tables={
            "t": TableConfig(
                name="t", dim=4, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
            )
        }
    )
    shard = Shard(config, tmp_path / "shard")
    store = build_server(shard, ServerConfig(ListenConfig(tokens=TOKENS)))
    model = build_model_server(
        _Stub(), ModelServerConfig(ListenConfig(tokens=TOKENS), http_port=None, warm_up=False)
    )
    try:
        yield {"EmbeddingStoreService": store.port, "ModelService": model.port}
    finally:
        model.stop(grace=0)
        store.stop(grace=0)
        shard.close()


@pytest.mark.slow
def test_every_method_of_every_service_needs_a_token_of_its_roles(servers) -> None:
    services = [
        pb.DESCRIPTOR.services_by_name["EmbeddingStoreService"],
        mpb.DESCRIPTOR.services_by_name["ModelService"],
    ]
    for service in services:
        expected = EXPECTED[service.name]
        assert {m.name for m in service.methods} == set(expected), service.name
        names = [service.full_name]
        if service.name == "EmbeddingStoreService":
            names.append(LEGACY_SERVICE_NAME)
        with grpc.insecure_channel(f"127.0.0.1:{servers[service.name]}") as channel:
            reflected = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            listed = {s.name for r in reflected for s in r.list_services_response.service}
            assert listed <= {service.full_name} | OPEN_SERVICES  # nothing else is served
            for name in names:
                for method in service.methods:
                    path = f"/{name}/{method.name}"
                    for token in (None, "an-unknown-token-0123456789"):
                        code = call(channel, path, method, token)
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (path, token)
                    for role in Role:
                        code = call(channel, path, method, TOKEN_OF[role])
                        if role in expected[method.name]:
                            assert code not in DENIED, (path, role, code)
                        else:
                            assert code == grpc.StatusCode.PERMISSION_DENIED, (path, role)


# ---------------------------------------------------------------------- every method kind
KINDS = "test.embeddb.Kinds"


@pytest.fixture
def kinds() -> Iterator[tuple[RpcServer, list[str]]]:
    """A service with one method of each kind (echoing), rw only; the list of methods run."""
    ran: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> None:
        with lock:
            ran.append(name)

    def unary_unary(request: bytes, context: Any) -> bytes:
        record("UnaryUnary")
        return request

    def unary_stream(request: bytes, context: Any) -> Iterator[bytes]:
        record("UnaryStream")
        yield request

    def stream_unary(requests: Iterator[bytes], context: Any) -> bytes:
        record("StreamUnary")
        return b"".join(requests)

    def stream_stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        record("StreamStream")
        yield from requests

    handlers = {
        "UnaryUnary": grpc.unary_unary_rpc_method_handler(unary_unary),
        "UnaryStream": grpc.unary_stream_rpc_method_handler(unary_stream),
        "StreamUnary": grpc.stream_unary_rpc_method_handler(stream_unary),
        "StreamStream": grpc.stream_stream_rpc_method_handler(stream_stream),
    }
    service = Service(
        KINDS,
        lambda s: s.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(KINDS, handlers),)
        ),
        AccessPolicy(allowed={Role.READ_WRITE: None}),
    )
    server = start_server(
        ListenConfig(tokens=TOKENS), service, ServerPools.create(4), ConnectionConfig()
    )
    try:
        yield server, ran
    finally:
        server.stop(grace=0)


def test_every_method_kind_is_closed_without_a_token_and_open_with_one(kinds) -> None:
    """Before: the boundary let request-streaming methods through without a token."""
    server, ran = kinds
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for name, streams_in, streams_out in (
            ("UnaryUnary", False, False),
            ("UnaryStream", False, True),
            ("StreamUnary", True, False),
            ("StreamStream", True, True),
        ):
            method = SimpleNamespace(client_streaming=streams_in, server_streaming=streams_out)
            path = f"/{KINDS}/{name}"
            for token in (None, RO, REPLICA):
                code = call(channel, path, method, token)  # type: ignore[arg-type]
                refused = "UNAUTHENTICATED" if token is None else "PERMISSION_DENIED"
                assert code == getattr(grpc.StatusCode, refused), (name, token)
            assert ran == [], name  # nothing ran for the refused calls
            assert call(channel, path, method, RW) == grpc.StatusCode.OK  # type: ignore[arg-type]
            assert ran == [name]
            ran.clear()


def test_a_follower_refuses_to_take_snapshots(tmp_path: Any) -> None:
    """A follower's snapshots follow its primary's: ``Snapshot`` and ``FetchSnapshot`` with
    ``take_new`` are FAILED_PRECONDITION naming the primary (before: it took one)."""
    config = EmbeddingConfig(
        tables={
            "t": TableConfig(
                name="t", dim=4, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
            )
        }
    )
    follower = Shard(config, tmp_path / "follower", follower=True)
    server = build_server(follower, ServerConfig(ListenConfig(tokens=TOKENS)))
    rw = (("authorization", f"Bearer {RW}"),)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            for attempt in (
                lambda: stub.Snapshot(pb.SnapshotRequest(), metadata=rw),
                lambda: list(
                    stub.FetchSnapshot(pb.FetchSnapshotRequest(take_new=True), metadata=rw)
                ),
            ):
                with pytest.raises(grpc.RpcError) as info:
                    attempt()
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "follower" in (info.value.details() or "")
            assert follower.snapshots() == []
    finally:
        server.stop(grace=0)
        follower.close()
