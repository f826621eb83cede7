"""gRPC serving of one shard: servicer (translation only), interceptors, health, reflection;
the daemon (``embeddb serve``), the cluster supervisor, and followers (:mod:`.follower`: a
read-only replica fed by a primary's update log)."""

from __future__ import annotations

from embeddb.server.app import SERVICE_NAME, ServerConfig, ShardServer, build_server

__all__ = ["SERVICE_NAME", "ServerConfig", "ShardServer", "build_server"]
