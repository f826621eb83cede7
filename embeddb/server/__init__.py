"""gRPC serving of one shard: servicer (translation only), access policy, shard metrics, health,
reflection; the daemon (``embeddb serve``), the cluster supervisor, and followers
(:mod:`.follower`: a read-only replica fed by a primary's update log, serving the tables and
place :mod:`.follower_config` learns from the primary). What is not specific
to a shard (tokens, interceptors, listen config, assembly, process lifecycle) is
:mod:`embeddb.transport.rpc`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embeddb.server.app import SERVICE_NAME, ServerConfig, build_server

__all__ = ["SERVICE_NAME", "ServerConfig", "build_server"]


def __getattr__(name: str) -> Any:
    """The shard server's names, imported on first use: the cluster supervisor
    (:mod:`.cluster`) lives in this package and must not load the shard engine (numba)."""
    if name in __all__:
        from embeddb.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
