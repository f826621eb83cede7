"""How a failed gRPC call becomes an embeddb exception (:mod:`embeddb.client.errors`)."""

from __future__ import annotations

import grpc
import pytest

from embeddb.client import DeadlineExceededError, RemoteError
from embeddb.client.errors import translate_rpc_error
from embeddb.errors import EmbeddbError, InvalidArgumentError, UnavailableError


class Failed(grpc.RpcError):
    """A failed call as grpc raises it: ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, UnavailableError),
        # a shard shutting down cancels the calls still in flight: the shard is unavailable
        (grpc.StatusCode.CANCELLED, UnavailableError),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceededError),
        (grpc.StatusCode.UNIMPLEMENTED, RemoteError),
    ],
)
def test_status_codes_map_to_their_errors(
    code: grpc.StatusCode, expected: type[EmbeddbError]
) -> None:
    error = translate_rpc_error(Failed(code, "why"), 1, "127.0.0.1:7071", "LookupMany", 2)

    assert type(error) is expected
    assert (
        str(error)
        == f"shard 1 (127.0.0.1:7071) LookupMany failed after 2 attempts: {code.name}: why"
    )
