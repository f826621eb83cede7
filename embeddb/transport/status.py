"""The one table between the :mod:`embeddb.errors` tree and gRPC status codes (and the model
server's HTTP statuses). Every server and every client translates through it.

One row per status code (``OK`` aside)::

    code                 a client raises          a server sends it for                 HTTP
    CANCELLED            UnavailableError         (none)                                503
    UNKNOWN              RemoteError              RemoteError                           500
    INVALID_ARGUMENT     InvalidArgumentError     InvalidArgumentError, ConfigError     400
    DEADLINE_EXCEEDED    DeadlineExceededError    DeadlineExceededError                 504
    NOT_FOUND            NotFoundError            NotFoundError                         404
    ALREADY_EXISTS       RemoteError              (none)                                409
    PERMISSION_DENIED    PermissionDeniedError    PermissionDeniedError                 403
    RESOURCE_EXHAUSTED   ResourceExhaustedError   ResourceExhaustedError                413
    FAILED_PRECONDITION  FailedPreconditionError  FailedPreconditionError               400
    ABORTED              RemoteError              (none)                                409
    OUT_OF_RANGE         OutOfRangeError          OutOfRangeError                       400
    UNIMPLEMENTED        RemoteError              (none)                                501
    INTERNAL             InternalError            InternalError, StorageError, and any  500
                                                  other exception (a bug)
    UNAVAILABLE          UnavailableError         UnavailableError                      503
    DATA_LOSS            CorruptDataError         CorruptDataError                      500
    UNAUTHENTICATED      UnauthenticatedError     UnauthenticatedError                  401

Server side (:func:`code_of`): an exception is sent as the code of the first class of its MRO
listed in the third column, so subclasses follow their parents (``TableNotFoundError`` is
``NOT_FOUND``, ``StorageFullError`` ``RESOURCE_EXHAUSTED``, ``StorageFaultError``
``UNAVAILABLE``, ``LogTruncatedError`` ``OUT_OF_RANGE``); an exception outside the embeddb tree
is a bug and goes out as ``INTERNAL``. Client side (:func:`error_class`): a code becomes the class
of the second column; a code outside the table (a future one) becomes :class:`RemoteError`.

Aliases, where a code does not come back as itself: ``CANCELLED`` is an ``UnavailableError``
(embeddb never cancels a call it still waits for, so the status means the other side ended it,
a shard shutting down with the call in flight, or the connection dropped: the same event as the
``UNAVAILABLE`` of the next call), and ``ALREADY_EXISTS``, ``ABORTED`` and ``UNIMPLEMENTED``
are ``RemoteError``\\ s (no embeddb server sends them; ``UNIMPLEMENTED`` is an older server
without the method). A plain ``StorageError`` (a data directory that failed in a way none of its
subclasses names) reaches a client as ``InternalError``: the client cannot tell a disk from a
bug, and the server's log says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    DeadlineExceededError,
    EmbeddbError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    RemoteError,
    ResourceExhaustedError,
    StorageError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "HTTP_STATUS",
    "TABLE",
    "UNMAPPED",
    "Row",
    "code_of",
    "error_class",
    "error_from_rpc",
    "http_status",
]

Code = grpc.StatusCode


@dataclass(frozen=True)
class Row:
    """One status code: the class a client raises for it, the classes a server sends as it,
    and the HTTP status of the model server's JSON API."""

    code: grpc.StatusCode
    raised_as: type[EmbeddbError]
    sent_for: tuple[type[BaseException], ...]
    http: int


#: The class a client raises for a code outside :data:`TABLE`.
UNMAPPED: type[EmbeddbError] = RemoteError

TABLE: tuple[Row, ...] = (
    Row(Code.CANCELLED, UnavailableError, (), 503),
    Row(Code.UNKNOWN, RemoteError, (RemoteError,), 500),
    Row(Code.INVALID_ARGUMENT, InvalidArgumentError, (InvalidArgumentError, ConfigError), 400),
    Row(Code.DEADLINE_EXCEEDED, DeadlineExceededError, (DeadlineExceededError,), 504),
    Row(Code.NOT_FOUND, NotFoundError, (NotFoundError,), 404),
    Row(Code.ALREADY_EXISTS, RemoteError, (), 409),
    Row(Code.PERMISSION_DENIED, PermissionDeniedError, (PermissionDeniedError,), 403),
    Row(Code.RESOURCE_EXHAUSTED, ResourceExhaustedError, (ResourceExhaustedError,), 413),
    Row(Code.FAILED_PRECONDITION, FailedPreconditionError, (FailedPreconditionError,), 400),
    Row(Code.ABORTED, RemoteError, (), 409),
    Row(Code.OUT_OF_RANGE, OutOfRangeError, (OutOfRangeError,), 400),
    Row(Code.UNIMPLEMENTED, RemoteError, (), 501),
    Row(Code.INTERNAL, InternalError, (InternalError, StorageError, BaseException), 500),
    Row(Code.UNAVAILABLE, UnavailableError, (UnavailableError,), 503),
    Row(Code.DATA_LOSS, CorruptDataError, (CorruptDataError,), 500),
    Row(Code.UNAUTHENTICATED, UnauthenticatedError, (UnauthenticatedError,), 401),
)

_RAISED_AS: dict[grpc.StatusCode, type[EmbeddbError]] = {r.code: r.raised_as for r in TABLE}
_SENT_AS: dict[type[BaseException], grpc.StatusCode] = {
    cls: r.code for r in TABLE for cls in r.sent_for
}
_HTTP: dict[grpc.StatusCode, int] = {Code.OK: 200, **{r.code: r.http for r in TABLE}}

#: The HTTP status of each status name (``OK``: 200), for the model server's JSON API.
HTTP_STATUS: Mapping[str, int] = {code.name: http for code, http in _HTTP.items()}


def code_of(error: BaseException) -> grpc.StatusCode:
    """The status a server answers ``error`` with (the first class of its MRO in the table;
    ``INTERNAL`` for anything outside the embeddb tree)."""
    for cls in type(error).__mro__:
        code = _SENT_AS.get(cls)
        if code is not None:
            return code
    return Code.INTERNAL  # pragma: no cover - BaseException is in the table


def error_class(code: Any) -> type[EmbeddbError]:
    """The class a client raises for status ``code`` (:data:`UNMAPPED` for one not in the
    table, ``OK`` included: a call that failed with ``OK`` is not a status embeddb knows)."""
    return _RAISED_AS.get(code, UNMAPPED)


def error_from_rpc(exc: Any, what: str) -> EmbeddbError:
    """The embeddb exception for a failed call (raise it ``from exc``).

    Args:
        exc: the :class:`grpc.RpcError` (sync) or :class:`grpc.aio.AioRpcError`: its
            ``code()`` and ``details()``.
        what: what failed, for the message: ``"<what>: <STATUS>: <details>"``.
    """
    code = exc.code()
    name = getattr(code, "name", str(code))
    return error_class(code)(f"{what}: {name}: {exc.details() or 'no details'}")


def http_status(error: BaseException) -> int:
    """The HTTP status the model server's JSON API answers ``error`` with."""
    return _HTTP[code_of(error)]
