"""What every embeddb gRPC server is built from: its thread pools and connection settings.

Both servers — a shard's (:mod:`embeddb.server.app`) and the model server
(``embeddb.trainer.serving.server``) — serve calls on three pools, so that no kind of call can
starve another::

    data pool     ``workers`` threads: unary calls (lookups, gradients, predictions, metadata)
    stream pool   the long-lived server streams (Subscribe, FetchSnapshot), bounded per role
    health pool   grpc.health.v1.Health/Check only: a probe is answered while every other
                  thread is busy (orchestrators restart servers whose probes time out)

Connections (:func:`connection_options`): besides the message-size limits, an HTTP/2 keepalive
ping every ``keepalive_s`` (a peer that does not answer within ``keepalive_timeout_s`` is
disconnected: dead clients do not hold streams or memory), and a connection without any call
for ``max_idle_s`` is closed (GOAWAY; a client reconnects on its next call).
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass
from typing import Any

from grpc_health.v1 import health

from embeddb.errors import ConfigError

__all__ = ["HEALTH_CHECK", "ConnectionConfig", "ServerPools", "connection_options"]

HEALTH_CHECK = f"/{health.SERVICE_NAME}/Check"
"""The method served on the health pool."""


@dataclass(frozen=True)
class ConnectionConfig:
    """Connection-level settings of a gRPC server.

    Attributes:
        max_message_bytes: largest request or response message.
        keepalive_s: seconds between keepalive pings the server sends on a connection.
        keepalive_timeout_s: seconds a ping may go unanswered before the connection is closed.
        max_idle_s: a connection without any call for this long is closed.

    Raises:
        ConfigError: a value out of range.
    """

    max_message_bytes: int = 256 << 20
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    max_idle_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ConfigError("max_message_bytes", f"must be >= 1, got {self.max_message_bytes}")
        for name in ("keepalive_s", "keepalive_timeout_s", "max_idle_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0 seconds, got {getattr(self, name)}")


def connection_options(config: ConnectionConfig) -> list[tuple[str, Any]]:
    """The ``grpc.server`` options of ``config``."""
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(config.max_idle_s * 1000)),
    ]


@dataclass
class ServerPools:
    """The three executors of one server (see the module docstring).

    Args (of :meth:`create`):
        workers: threads of the data pool.
        streams: threads of the stream pool (0: none; streams then share the data pool).
        prefix: thread name prefix.
    """

    data: futures.ThreadPoolExecutor
    health: futures.ThreadPoolExecutor
    streams: futures.ThreadPoolExecutor | None = None

    @classmethod
    def create(cls, workers: int, streams: int = 0, prefix: str = "embeddb") -> ServerPools:
        return cls(
            data=futures.ThreadPoolExecutor(workers, thread_name_prefix=f"{prefix}-rpc"),
            health=futures.ThreadPoolExecutor(2, thread_name_prefix=f"{prefix}-health"),
            streams=(
                futures.ThreadPoolExecutor(streams, thread_name_prefix=f"{prefix}-stream")
                if streams
                else None
            ),
        )

    @property
    def dedicated(self) -> dict[str, futures.ThreadPoolExecutor]:
        """Method → pool, for :class:`~embeddb.server.boundary.Boundary`."""
        return {HEALTH_CHECK: self.health}

    def shutdown(self) -> None:
        """Wait for every running call of every pool, then stop their threads."""
        for pool in (self.data, self.streams, self.health):
            if pool is not None:
                pool.shutdown(wait=True)
