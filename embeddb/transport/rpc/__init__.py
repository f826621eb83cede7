"""The gRPC server layer every embeddb server is built on: the shard server (``embeddb serve``,
followers) and the model server (``embeddb serve-model``). Nothing here knows a shard.

Modules:
    :mod:`.listen`        :class:`ListenConfig`: host, port, TLS, tokens, metrics endpoint
    :mod:`.auth`          bearer tokens, roles, :class:`AccessPolicy`
    :mod:`.boundary`      the interceptor that authenticates, authorizes and decodes first
    :mod:`.budget`        the memory budget shared by every call in flight
    :mod:`.interceptors`  the error interceptor, a rate-limited log
    :mod:`.metrics`       the request-metrics interceptor, latency buckets
    :mod:`.metrics_http`  the ``/metrics`` HTTP endpoint
    :mod:`.assembly`      :func:`start_server`: pools, connection options, health,
                          reflection, the ordered shutdown of :class:`RpcServer`
    :mod:`.lifecycle`     a server process: private umask, signals, port files
"""

from __future__ import annotations

from embeddb.transport.rpc.assembly import (
    ConnectionConfig,
    RpcServer,
    ServerPools,
    Service,
    start_server,
)
from embeddb.transport.rpc.auth import AccessPolicy, Role, Tokens
from embeddb.transport.rpc.listen import ListenConfig

__all__ = [
    "AccessPolicy",
    "ConnectionConfig",
    "ListenConfig",
    "Role",
    "RpcServer",
    "ServerPools",
    "Service",
    "Tokens",
    "start_server",
]
