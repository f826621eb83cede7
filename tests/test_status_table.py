"""The one table between embeddb exceptions and gRPC status codes (:mod:`embeddb.transport.status`):
every
code round-trips, every translator (both clients' shard calls, the follower's feed, the model
server's client) raises the same class for a code, and a bug on a server reaches its client as
``InternalError``, never as a ``StorageError`` (a disk failure).

Before: three translators disagreed (CANCELLED was a ``RemoteError`` from the model server and an
``UnavailableError`` elsewhere; DEADLINE_EXCEEDED and unknown codes were ``UnavailableError`` in
the follower), and INTERNAL became ``StorageError`` everywhere."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

import embeddb.engine.durability.dirlock
import embeddb.engine.durability.log_read
import embeddb.errors as errors_module
import embeddb.trainer.errors
from embeddb.client import Client, ClientOptions
from embeddb.client.errors import translate_rpc_error
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    DeadlineExceededError,
    EmbeddbError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    RemoteError,
    ResourceExhaustedError,
    StorageError,
    StorageFaultError,
    StorageFullError,
    TableNotFoundError,
    UnavailableError,
)
from embeddb.server.follower import Follower
from embeddb.serving import client as model_client
from embeddb.serving import http as model_http
from embeddb.trainer.errors import LookupFailedError
from embeddb.transport.status import (
    HTTP_STATUS,
    TABLE,
    UNMAPPED,
    code_of,
    error_class,
    error_from_rpc,
    http_status,
)

Code = grpc.StatusCode
FAILED = [c for c in Code if c is not Code.OK]

#: Codes a client maps to a class that a server sends as another code (documented in the
#: module docstring of embeddb.transport.status): the code each comes back as.
ALIASES = {
    Code.CANCELLED: Code.UNAVAILABLE,
    Code.ALREADY_EXISTS: Code.UNKNOWN,
    Code.ABORTED: Code.UNKNOWN,
    Code.UNIMPLEMENTED: Code.UNKNOWN,
}


class Failed(grpc.RpcError):
    """A failed call as grpc raises it: ``code()`` and ``details()``."""

    def __init__(self, code: Any, details: str | None = "why") -> None:
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str | None:
        return self._details


def _bare(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` without its constructor's arguments (only its type matters)."""
    return cls.__new__(cls)


def _tree() -> set[type[EmbeddbError]]:
    """Every class of the embeddb tree that the package defines (durability, trainer included)."""
    assert (
        embeddb.engine.durability.dirlock
        and embeddb.engine.durability.log_read
        and embeddb.trainer.errors
    )
    found: set[type[EmbeddbError]] = set()
    todo = [EmbeddbError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("embeddb.") and cls not in found:
            found.add(cls)
            todo += cls.__subclasses__()
    return found


# ---------------------------------------------------------------------------- the table itself
def test_every_status_code_has_exactly_one_row() -> None:
    assert sorted(r.code.name for r in TABLE) == sorted(c.name for c in FAILED)
    sent = [cls for r in TABLE for cls in r.sent_for]
    assert len(sent) == len(set(sent)), "a class is sent as two codes"


@pytest.mark.parametrize("code", FAILED, ids=lambda c: c.name)
def test_a_code_comes_back_as_itself_or_its_documented_alias(code: grpc.StatusCode) -> None:
    cls = error_class(code)
    assert issubclass(cls, EmbeddbError)
    assert code_of(_bare(cls)) == ALIASES.get(code, code)


@pytest.mark.parametrize("cls", sorted(_tree(), key=lambda c: c.__qualname__), ids=str)
def test_every_error_class_reaches_the_client_as_itself_or_a_base(cls: type[EmbeddbError]) -> None:
    code = code_of(_bare(cls))
    raised = error_class(code)
    if code is Code.INTERNAL:  # a plain StorageError, or an error no row names: a bug
        assert raised is InternalError
        assert not issubclass(raised, StorageError) and not issubclass(raised, OSError)
    elif cls is ConfigError:  # a bad request setting: both are ValueErrors
        assert raised is InvalidArgumentError and issubclass(raised, ValueError)
    else:
        assert issubclass(cls, raised), f"{cls} is sent as {code.name}, raised as {raised}"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("k", "bad"), Code.INVALID_ARGUMENT),
        (TableNotFoundError("t"), Code.NOT_FOUND),
        (StorageFullError("full"), Code.RESOURCE_EXHAUSTED),
        (StorageFaultError("eio"), Code.UNAVAILABLE),
        (CorruptDataError("bad crc"), Code.DATA_LOSS),
        (StorageError("cannot lock"), Code.INTERNAL),
        (_bare(embeddb.engine.durability.log_read.LogTruncatedError), Code.OUT_OF_RANGE),
        (LookupFailedError("lost", cause="x"), Code.INTERNAL),  # not UNKNOWN any more
        (ZeroDivisionError("a bug"), Code.INTERNAL),
        (DeadlineExceededError("slow"), Code.DEADLINE_EXCEEDED),
        (RemoteError("?"), Code.UNKNOWN),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.name,
)
def test_a_server_sends_the_code_of_the_most_specific_class(
    error: BaseException, code: grpc.StatusCode
) -> None:
    assert code_of(error) is code


def test_an_unknown_code_is_a_remote_error() -> None:
    assert UNMAPPED is RemoteError
    for code in (Code.OK, None, 99, "NOT_A_CODE"):
        assert error_class(code) is RemoteError


# ------------------------------------------------------------------- every translator agrees
def _follower_translate(exc: grpc.RpcError) -> EmbeddbError:
    follower: Any = SimpleNamespace(options=SimpleNamespace(primary="127.0.0.1:7070"))
    return Follower._translate(follower, exc, "Subscribe")


TRANSLATORS = {
    "client": lambda exc: translate_rpc_error(exc, 0, "127.0.0.1:7070", "Lookup"),
    "follower": _follower_translate,
    "model client": lambda exc: model_client._translate(exc, "127.0.0.1:7080", "Predict"),
}


@pytest.mark.parametrize("code", FAILED, ids=lambda c: c.name)
def test_every_translator_raises_the_class_of_the_table(code: grpc.StatusCode) -> None:
    for name, translate in TRANSLATORS.items():
        error = translate(Failed(code))
        assert type(error) is error_class(code), name
        assert str(error).endswith(f": {code.name}: why"), name


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (Code.CANCELLED, UnavailableError),
        (Code.DEADLINE_EXCEEDED, DeadlineExceededError),
        (Code.INTERNAL, InternalError),
        (Code.UNIMPLEMENTED, RemoteError),
        (Code.UNKNOWN, RemoteError),
        (Code.DATA_LOSS, CorruptDataError),
        (Code.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (Code.OUT_OF_RANGE, OutOfRangeError),
        (Code.NOT_FOUND, NotFoundError),
        (Code.INVALID_ARGUMENT, InvalidArgumentError),
    ],
    ids=lambda v: getattr(v, "name", getattr(v, "__name__", str(v))),
)
def test_the_disagreements_are_settled(code: grpc.StatusCode, expected: type[Exception]) -> None:
    """The cells where the three translators differed, and INTERNAL (a StorageError before)."""
    for translate in TRANSLATORS.values():
        assert type(translate(Failed(code))) is expected


def test_a_call_without_details_says_so() -> None:
    error = error_from_rpc(Failed(Code.UNAVAILABLE, None), "primary p Subscribe")
    assert str(error) == "primary p Subscribe: UNAVAILABLE: no details"


# -------------------------------------------------------------------------- the HTTP statuses
def test_the_model_servers_http_statuses_are_the_tables() -> None:
    """The model server's HTTP front end answers with the table's statuses (no copy of its own)."""
    assert model_http.HTTP_STATUS is HTTP_STATUS
    assert http_status(InvalidArgumentError("x")) == 400
    assert http_status(StorageFullError("full")) == 413
    assert http_status(StorageFaultError("eio")) == 503
    assert http_status(ZeroDivisionError()) == 500


# ------------------------------------------------------------------------ a real server's bug
@pytest.fixture
def served(tmp_path: Path) -> Iterator[Any]:
    from tests.test_client import serve_cluster

    with serve_cluster(tmp_path, 1) as cluster:
        yield cluster


def test_a_server_bug_reaches_the_client_as_internal_error(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``StorageError`` ("the disk tier or the data directory failed")."""

    def bug() -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(served.shards[0], "stats", bug)
    with (
        Client(served.addresses, ClientOptions(verify_topology=False)) as client,
        pytest.raises(EmbeddbError) as info,
    ):
        client.stats()
    assert type(info.value) is InternalError
    assert not isinstance(info.value, OSError)
    assert "Stats failed: INTERNAL: internal error in" in str(info.value)
    assert isinstance(info.value.__cause__, grpc.RpcError)
    assert info.value.__cause__.code() is Code.INTERNAL


def test_a_storage_error_on_the_server_is_internal_and_a_full_disk_exhausted(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for raised, expected in (
        (StorageError("cannot lock the data directory"), InternalError),
        (StorageFullError("no space left"), ResourceExhaustedError),
        (CorruptDataError("bad checksum"), CorruptDataError),
    ):

        def fail(error: Exception = raised) -> None:
            raise error

        monkeypatch.setattr(served.shards[0], "stats", fail)
        with (
            Client(served.addresses, ClientOptions(verify_topology=False)) as client,
            pytest.raises(EmbeddbError) as info,
        ):
            client.stats()
        assert type(info.value) is expected
        assert str(raised) in str(info.value)


def test_the_errors_module_imports_no_grpc() -> None:
    """The exception tree knows no transport: the table lives in embeddb.transport.status."""
    source = Path(errors_module.__file__).read_text()
    tree = ast.parse(source)
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not {m for m in imported if m.startswith(("grpc", "embeddb.transport"))}, imported
