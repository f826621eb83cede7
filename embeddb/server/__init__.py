"""gRPC serving of one shard: servicer (translation only), access policy, shard metrics, health,
reflection; the daemon (``embeddb serve``), the cluster supervisor, and followers
(:mod:`.follower`: a read-only replica fed by a primary's update log). What is not specific
to a shard (tokens, interceptors, listen config, assembly, process lifecycle) is
:mod:`embeddb.rpc`."""

from __future__ import annotations

from embeddb.server.app import SERVICE_NAME, ServerConfig, build_server

__all__ = ["SERVICE_NAME", "ServerConfig", "build_server"]
