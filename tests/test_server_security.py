"""Server security on a real port: bearer tokens with three roles, token files, and TLS."""

from __future__ import annotations

import datetime
import ipaddress
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from embeddb.common.secrets import read_token_file
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError
from embeddb.server import SERVICE_NAME, ServerConfig, build_server
from embeddb.transport import wire
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Role, Tokens
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

DIM = 4
RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"
REPLICA = "replica-token-00112233445566"
TOKENS = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}), replica=frozenset({REPLICA}))


def write_secret(path: Path, text: str) -> Path:
    """A token file as an operator writes it: private to its owner."""
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def ids_tensor(*values: int) -> pb.Tensor:
    return wire.encode_ids(np.array(values, dtype=np.uint64))


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    config = EmbeddingConfig(
        tables={
            "t": TableConfig(
                name="t", dim=DIM, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
            )
        }
    )
    s = Shard(config, tmp_path / "shard")
    yield s
    s.close()


Serve = Callable[..., RpcServer]


@pytest.fixture
def serve(shard: Shard) -> Iterator[Serve]:
    servers: list[RpcServer] = []

    def start(**config: object) -> RpcServer:
        server = build_server(shard, ServerConfig(ListenConfig(**config)))  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace=1)


@pytest.fixture
def stub(serve: Serve) -> Iterator[pb_grpc.EmbeddingStoreServiceStub]:
    server = serve(tokens=TOKENS)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.EmbeddingStoreServiceStub(channel)


def code_of(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# ---------------------------------------------------------------- authentication


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        bearer("not-a-valid-token-at-all"),
        bearer(RW + "x"),
        (("authorization", RW),),  # no scheme
        (("authorization", f"Basic {RW}"),),
        (("authorization", f"Bearer {RW}"), ("authorization", f"Bearer {RW}")),
    ],
    ids=["none", "wrong", "prefix", "no-scheme", "basic", "twice"],
)
def test_missing_or_wrong_token_is_unauthenticated_for_every_method(
    stub: pb_grpc.EmbeddingStoreServiceStub, shard: Shard, metadata: object
) -> None:
    shard.lookup("t", [1], train=True)
    _, before = shard.peek("t", [1, 2])
    calls = [
        lambda: stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(2)), metadata=metadata),
        lambda: stub.Stats(pb.StatsRequest(), metadata=metadata),
        lambda: stub.ListTables(pb.ListTablesRequest(), metadata=metadata),
        lambda: stub.Delete(pb.DeleteRequest(table="t", ids=ids_tensor(1)), metadata=metadata),
    ]
    for call in calls:
        error = code_of(call)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert RW not in (error.details() or "")
    _, after = shard.peek("t", [1, 2])
    assert after.tobytes() == before.tobytes()


def test_read_write_token_may_call_everything(stub: pb_grpc.EmbeddingStoreServiceStub) -> None:
    md = bearer(RW)
    ids = ids_tensor(1, 2)
    assert stub.Lookup(pb.LookupRequest(table="t", ids=ids, train=True), metadata=md)
    grads = wire.encode_matrix(np.ones((2, DIM), np.float32))
    reply = stub.ApplyGradients(
        pb.ApplyGradientsRequest(table="t", ids=ids, grads=grads), metadata=md
    )
    assert reply.applied == 2
    vectors = wire.encode_matrix(np.zeros((1, DIM), np.float32))
    assert stub.Assign(pb.AssignRequest(table="t", ids=ids_tensor(3), vectors=vectors), metadata=md)
    assert stub.Delete(pb.DeleteRequest(table="t", ids=ids_tensor(3)), metadata=md).deleted == 1
    assert stub.Stats(pb.StatsRequest(), metadata=md).tables[0].counters["rows"] == 2


def test_read_only_token_may_read(stub: pb_grpc.EmbeddingStoreServiceStub, shard: Shard) -> None:
    shard.lookup("t", [1, 2], train=True)
    md = bearer(RO)
    reply = stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1, 2, 99)), metadata=md)
    got = wire.decode_matrix(reply.vectors, "v", 3, DIM)
    np.testing.assert_array_equal(got, shard.lookup("t", [1, 2, 99], train=False))
    assert [t.name for t in stub.ListTables(pb.ListTablesRequest(), metadata=md).tables] == ["t"]
    assert stub.DescribeTable(pb.DescribeTableRequest(table="t"), metadata=md).dim == DIM
    assert stub.Stats(pb.StatsRequest(), metadata=md).tables[0].counters["rows"] == 2
    # Errors after authorisation still map to their own statuses.
    error = code_of(lambda: stub.DescribeTable(pb.DescribeTableRequest(table="x"), metadata=md))
    assert error.code() == grpc.StatusCode.NOT_FOUND


READ_ONLY_REFUSED = {
    "training lookup": lambda s, md: s.Lookup(
        pb.LookupRequest(table="t", ids=ids_tensor(1, 2, 50), train=True), metadata=md
    ),
    "apply gradients": lambda s, md: s.ApplyGradients(
        pb.ApplyGradientsRequest(
            table="t", ids=ids_tensor(1, 2), grads=wire.encode_matrix(np.ones((2, DIM), np.float32))
        ),
        metadata=md,
    ),
    "assign": lambda s, md: s.Assign(
        pb.AssignRequest(
            table="t", ids=ids_tensor(1), vectors=wire.encode_matrix(np.ones((1, DIM), np.float32))
        ),
        metadata=md,
    ),
    "delete": lambda s, md: s.Delete(
        pb.DeleteRequest(table="t", ids=ids_tensor(1, 2)), metadata=md
    ),
}


@pytest.mark.parametrize("case", sorted(READ_ONLY_REFUSED))
def test_read_only_token_may_not_write(
    stub: pb_grpc.EmbeddingStoreServiceStub, shard: Shard, case: str
) -> None:
    shard.lookup("t", [1, 2], train=True)
    found_before, before = shard.peek("t", [1, 2, 50])
    stats_before = shard.stats().tables["t"]
    error = code_of(lambda: READ_ONLY_REFUSED[case](stub, bearer(RO)))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "read-only (ro)" in (error.details() or "") and "may not" in (error.details() or "")
    assert RO not in (error.details() or "")
    found_after, after = shard.peek("t", [1, 2, 50])
    assert found_after.tolist() == found_before.tolist() == [True, True, False]
    assert after.tobytes() == before.tobytes()
    # Refused calls never reach the shard: not even its lookup counters move.
    assert shard.stats().tables["t"] == stats_before


def test_health_and_reflection_need_no_token(serve: Serve) -> None:
    server = serve(tokens=TOKENS)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for reply in replies for s in reply.list_services_response.service}
        assert SERVICE_NAME in names


def test_tokens_never_appear_in_logs_or_repr(
    stub: pb_grpc.EmbeddingStoreServiceStub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-but-plausible-token-123456"
    for md in (bearer(wrong), bearer(RO), None):
        code_of(
            lambda md=md: stub.Delete(pb.DeleteRequest(table="t", ids=ids_tensor(1)), metadata=md)
        )
    code_of(
        lambda: stub.Lookup(
            pb.LookupRequest(table="t", ids=ids_tensor(1), train=True), metadata=bearer(RO)
        )
    )
    stub.Lookup(pb.LookupRequest(table="t", ids=ids_tensor(1)), metadata=bearer(RW))
    assert any("refused" in r.getMessage() for r in caplog.records)
    for secret in (RW, RO, wrong):
        assert secret not in caplog.text
    assert RW not in repr(TOKENS) and RO not in repr(TOKENS)
    assert RW not in repr(ServerConfig(ListenConfig(tokens=TOKENS)))


def test_grpc_access_token_credentials_over_tls(
    serve: Serve, tls_pair: tuple[bytes, bytes]
) -> None:
    cert, key = tls_pair
    server = serve(tokens=TOKENS, tls_cert=cert, tls_key=key)
    ssl = grpc.ssl_channel_credentials(root_certificates=cert)
    for token, code in ((RW, None), (RO, grpc.StatusCode.PERMISSION_DENIED)):
        creds = grpc.composite_channel_credentials(ssl, grpc.access_token_call_credentials(token))
        with grpc.secure_channel(f"127.0.0.1:{server.port}", creds) as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            call = lambda stub=stub: stub.Assign(  # noqa: E731
                pb.AssignRequest(
                    table="t",
                    ids=ids_tensor(7),
                    vectors=wire.encode_matrix(np.ones((1, DIM), np.float32)),
                ),
                timeout=10,
            )
            if code is None:
                assert call().written == 1
            else:
                assert code_of(call).code() == code


# ---------------------------------------------------------------- token parsing


def test_role_of_matches_each_token_to_its_role() -> None:
    tokens = Tokens(read_write=frozenset({RW, RW + "2"}), read_only=frozenset({RO}))
    assert tokens.role_of(RW) is Role.READ_WRITE
    assert tokens.role_of(RW + "2") is Role.READ_WRITE
    assert tokens.role_of(RO) is Role.READ_ONLY
    assert tokens.role_of(RO[:-1]) is None
    assert tokens.role_of("") is None
    assert tokens.role_of("ünïcode-is-never-a-valid-token") is None


def test_tokens_from_file(tmp_path: Path) -> None:
    path = write_secret(
        tmp_path / "tokens",
        f"# embeddb tokens\n\nrw {RW}\n   ro {RO}   # the dashboard\nrw {RW}2\nreplica {REPLICA}\n",
    )
    tokens = Tokens.from_file(path)
    assert tokens == Tokens(frozenset({RW, RW + "2"}), frozenset({RO}), frozenset({REPLICA}))
    assert tokens.role_of(REPLICA) is Role.REPLICA


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_token_file_others_may_read_is_refused_naming_chmod(tmp_path: Path, mode: int) -> None:
    path = write_secret(tmp_path / "tokens", f"rw {RW}\n")
    path.chmod(mode)
    for read in (Tokens.from_file, read_token_file):
        with pytest.raises(ConfigError, match="chmod 600") as info:
            read(path)
        assert f"{mode:04o}" in str(info.value) and RW not in str(info.value)
    path.chmod(0o600)
    assert read_token_file(path) == RW
    path.chmod(0o400)
    assert Tokens.from_file(path).role_of(RW) is Role.READ_WRITE


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (f"rw {RW}\nadmin {RO}\n", ":2", "expected 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN'"),
        (f"rw {RW}\n\n{RO}\n", ":3", "expected 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN'"),
        (f"rw {RW} extra\n", ":1", "expected 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN'"),
        ("# nothing\nro short\n", ":2", "fewer than 16"),
        (f"rw {RW}\nro {RW}\n", "tokens", "listed under two roles"),
        (f"replica {RW}\nrw {RW}\n", "tokens", "listed under two roles"),
        ("# only comments\n\n", "tokens", "holds no tokens"),
    ],
)
def test_bad_token_files_name_the_line_and_hide_the_token(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = write_secret(tmp_path / "tokens", text)
    with pytest.raises(ConfigError) as info:
        Tokens.from_file(path)
    text_of_error = str(info.value)
    assert message in text_of_error
    if where.startswith(":"):
        assert info.value.key == f"{path}{where}"
    for secret in (RW, RO, "short"):
        assert secret not in text_of_error.replace(str(path), "")


def test_missing_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the token file"):
        Tokens.from_file(tmp_path / "absent")


def test_tokens_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDDB_RW_TOKEN", RW)
    monkeypatch.setenv("EMBEDDB_RO_TOKEN", f"{RO}, {RO}2")
    assert Tokens.from_env() == Tokens(frozenset({RW}), frozenset({RO, RO + "2"}))
    env = {"SHARD7_RO_TOKEN": RO}
    assert Tokens.from_env("SHARD7", env) == Tokens(frozenset(), frozenset({RO}))
    env = {"SHARD9_REPLICA_TOKEN": REPLICA}
    assert Tokens.from_env("SHARD9", env) == Tokens(frozenset(), frozenset(), frozenset({REPLICA}))
    with pytest.raises(ConfigError, match="none of SHARD8_RW_TOKEN, SHARD8_RO_TOKEN, SHARD8_REPL"):
        Tokens.from_env("SHARD8", {})
    with pytest.raises(ConfigError) as info:
        Tokens.from_env("X", {"X_RW_TOKEN": "tiny-secret"})
    assert info.value.key == "X_RW_TOKEN" and "tiny-secret" not in str(info.value)


def test_tokens_validate_their_values() -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        Tokens(frozenset({"has a space inside it...."}), frozenset())
    with pytest.raises(ConfigError, match="no tokens"):
        Tokens(frozenset(), frozenset())
    with pytest.raises(ConfigError, match="set of token strings"):
        Tokens(RW, frozenset())  # type: ignore[arg-type]


# ---------------------------------------------------------------- TLS


def make_cert(name: str = "localhost") -> tuple[bytes, bytes]:
    """A throwaway self-signed certificate for localhost / 127.0.0.1 and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture(scope="module")
def tls_pair() -> tuple[bytes, bytes]:
    return make_cert()


def test_tls_port_serves_tls_clients_only(serve: Serve, tls_pair: tuple[bytes, bytes]) -> None:
    cert, key = tls_pair
    server = serve(tls_cert=cert, tls_key=key)
    target = f"127.0.0.1:{server.port}"
    creds = grpc.ssl_channel_credentials(root_certificates=cert)
    with grpc.secure_channel(target, creds) as channel:
        tables = pb_grpc.EmbeddingStoreServiceStub(channel).ListTables(
            pb.ListTablesRequest(), timeout=10
        )
        assert [t.name for t in tables.tables] == ["t"]
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(target) as channel:
        error = code_of(
            lambda: pb_grpc.EmbeddingStoreServiceStub(channel).ListTables(
                pb.ListTablesRequest(), timeout=5
            )
        )
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    other_cert, _ = make_cert()  # a client trusting another root refuses the server
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(other_cert)) as channel:
        error = code_of(
            lambda: pb_grpc.EmbeddingStoreServiceStub(channel).ListTables(
                pb.ListTablesRequest(), timeout=5
            )
        )
        assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_config_is_checked(tls_pair: tuple[bytes, bytes]) -> None:
    cert, key = tls_pair
    with pytest.raises(ConfigError, match="both tls_cert and tls_key"):
        ListenConfig(tls_cert=cert)
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        ListenConfig(tls_cert=b"garbage", tls_key=key)
    with pytest.raises(ConfigError, match="not a PEM private key"):
        ListenConfig(tls_cert=cert, tls_key=cert)
