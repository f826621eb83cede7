"""Client-side errors: gRPC failures translated back into the embeddb exception tree.

The server maps :mod:`embeddb.errors` to gRPC status codes with one table
(:data:`embeddb.errors.STATUS_BY_ERROR`); the client maps them back with its reverse
(:data:`embeddb.errors.ERROR_BY_STATUS`). Two statuses have no server-side exception and get
client-side classes here::

    EmbeddbError                                   (embeddb.errors)
    ├── ... every class of embeddb.errors          mapped from its status code
    ├── DeadlineExceededError    (TimeoutError)    DEADLINE_EXCEEDED: the call ran past ``timeout``
    └── RemoteError                                any other status (UNKNOWN, UNIMPLEMENTED, ...)

``CANCELLED`` is an :class:`~embeddb.errors.UnavailableError`: the client never cancels a call
through gRPC (an abandoned asyncio call ends in :class:`asyncio.CancelledError`), so the status
means the other side ended it, a shard shutting down with the call in flight (its grace period
over) or a connection dropped: the same event as the ``UNAVAILABLE`` of the next call.

Every translated error names the shard index, its address and the method, carries the server's
details, and is raised ``from`` the :class:`grpc.RpcError` so the status stays visible.
"""

from __future__ import annotations

from typing import Any

from embeddb.errors import ERROR_BY_STATUS, EmbeddbError, UnavailableError

__all__ = [
    "UNAVAILABLE_STATUSES",
    "DeadlineExceededError",
    "RemoteError",
    "translate_rpc_error",
]

#: Statuses meaning the shard is (for now) gone: an UnavailableError, retried when idempotent.
UNAVAILABLE_STATUSES = frozenset({"UNAVAILABLE", "CANCELLED"})


class DeadlineExceededError(EmbeddbError, TimeoutError):
    """A call did not finish within the client's ``timeout`` (status ``DEADLINE_EXCEEDED``)."""


class RemoteError(EmbeddbError):
    """A shard answered with a status embeddb does not map (``UNKNOWN``, ``UNIMPLEMENTED``...)."""


def translate_rpc_error(
    exc: Any, shard: int, address: str, method: str, attempts: int = 1
) -> EmbeddbError:
    """The embeddb exception for a failed call (raise it ``from exc``).

    Args:
        exc: the :class:`grpc.RpcError` (sync) or :class:`grpc.aio.AioRpcError`.
        shard, address: which shard failed, for the message.
        method: the RPC name, for the message.
        attempts: how many times the call was tried.
    """
    code = exc.code()
    status = getattr(code, "name", str(code))
    details = exc.details() or "no details"
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    message = f"shard {shard} ({address}) {method} failed{tries}: {status}: {details}"
    if status == "DEADLINE_EXCEEDED":
        return DeadlineExceededError(message)
    if status in UNAVAILABLE_STATUSES:
        return UnavailableError(message)
    cls = ERROR_BY_STATUS.get(status, RemoteError)
    return cls(message)
