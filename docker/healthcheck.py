"""Exit 0 when the gRPC server at HOST:PORT reports SERVING (grpc.health.v1), else 1.

The containers' health check (``python /usr/local/bin/embeddb-healthcheck HOST:PORT``): works
for ``embeddb serve`` (a shard; a follower once bootstrapped) and ``embeddb serve-model``.
Health needs no bearer token. Plain text only: a TLS-only server needs a probe that trusts its
certificate.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: embeddb-healthcheck HOST:PORT", file=sys.stderr)
        return 2
    with grpc.insecure_channel(argv[0]) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
        except grpc.RpcError as exc:
            print(f"{argv[0]}: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{argv[0]}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
