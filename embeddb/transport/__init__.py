"""The transport: how tensors, calls and errors cross a network, knowing nothing of the engine.

Owns: :mod:`.wire` (numpy arrays ⇄ ``embeddb.v1.Tensor`` messages, zero-copy where it can;
its answer decoding in :mod:`.wire_decode`),
:mod:`.status` (the one table between exceptions and gRPC/HTTP statuses, used by every server
and client) and :mod:`.rpc` (the gRPC server layer: listen config, tokens and roles, the
boundary interceptor, memory budget, metrics, assembly, lifecycle). The generated messages and
stubs are :mod:`embeddb.v1` (from ``embeddb/proto``).

May import: :mod:`embeddb.v1`, :mod:`embeddb.common`, :mod:`embeddb.errors`, grpc, protobuf,
prometheus-client. Never :mod:`embeddb.engine` or :mod:`embeddb.config` (the ``transport``
contract). The client uses :mod:`.wire` and :mod:`.status` but not :mod:`.rpc`.
"""
