"""gRPC serving of one shard: servicer (translation only), interceptors, health, reflection."""

from __future__ import annotations

from embeddb.server.app import SERVICE_NAME, ServerConfig, ShardServer, build_server

__all__ = ["SERVICE_NAME", "ServerConfig", "ShardServer", "build_server"]
