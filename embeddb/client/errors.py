"""Client-side errors: gRPC failures translated back into the embeddb exception tree.

Servers send :mod:`embeddb.errors` as gRPC status codes, and the client maps them back, with the
one table of :mod:`embeddb.transport.status`: ``DEADLINE_EXCEEDED`` is a
:class:`~embeddb.errors.DeadlineExceededError` (a ``TimeoutError``), ``CANCELLED`` an
:class:`~embeddb.errors.UnavailableError` like ``UNAVAILABLE``, ``INTERNAL`` (a bug on the server)
an :class:`~embeddb.errors.InternalError`, and a status embeddb does not map (``UNKNOWN``,
``UNIMPLEMENTED``, ...) a :class:`~embeddb.errors.RemoteError`. The last three classes are
importable from here and from :mod:`embeddb.client` as before.

Every translated error names the shard index, its address and the method, carries the server's
details, and is raised ``from`` the :class:`grpc.RpcError` so the status stays visible.
"""

from __future__ import annotations

from typing import Any

from embeddb.errors import DeadlineExceededError, EmbeddbError, InternalError, RemoteError
from embeddb.transport.status import error_from_rpc

__all__ = [
    "DeadlineExceededError",
    "InternalError",
    "RemoteError",
    "translate_rpc_error",
]


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
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return error_from_rpc(exc, f"shard {shard} ({address}) {method} failed{tries}")
