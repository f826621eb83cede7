"""Where and how a server listens: one :class:`ListenConfig` for ``embeddb serve`` (shards and
followers) and ``embeddb serve-model``.

::

    host:port            the gRPC port: plain, or TLS only when tls_cert and tls_key are set
    tokens               bearer tokens every guarded call must carry (embeddb.transport.rpc.auth)
    metrics_host:port    the Prometheus endpoint (/metrics only, plain HTTP, no tokens)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import grpc

from embeddb.errors import ConfigError
from embeddb.transport.rpc.auth import Tokens

__all__ = ["ListenConfig", "is_loopback"]


@dataclass(frozen=True)
class ListenConfig:
    """The addresses, TLS material and tokens of one server.

    Attributes:
        host: address to bind (``127.0.0.1`` by default; ``0.0.0.0`` for all interfaces).
        port: TCP port; 0 picks a free one (the server reports the bound port).
        tls_cert, tls_key: PEM certificate chain and private key; when both are set the port
            serves TLS only. Set both or neither.
        tokens: accepted bearer tokens (see :mod:`embeddb.transport.rpc.auth`); None serves every
        caller.
        metrics_port: serve the server's metrics over HTTP at
            ``http://{metrics_host}:{metrics_port}/metrics`` (0 picks a free port); None serves
            no endpoint. Every other path answers 404.
        metrics_host: address the metrics endpoint binds; None binds ``host``. The endpoint has
            no TLS and no tokens: keep it on loopback or a private network.

    Raises:
        ConfigError: a port out of range, PEM data that is not PEM, half a TLS key pair, or
            tokens that are not :class:`~embeddb.transport.rpc.auth.Tokens`.
    """

    host: str = "127.0.0.1"
    port: int = 0
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tokens: Tokens | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None

    def __post_init__(self) -> None:
        for name in ("port", "metrics_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ConfigError(name, f"must be in 0..65535, got {value}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert", "set both tls_cert and tls_key, or neither")
        if self.tls_cert is not None and b"-----BEGIN CERTIFICATE-----" not in self.tls_cert:
            raise ConfigError("tls_cert", "not a PEM certificate (no BEGIN CERTIFICATE line)")
        if self.tls_key is not None and not (
            b"-----BEGIN" in self.tls_key and b"PRIVATE KEY-----" in self.tls_key
        ):
            raise ConfigError("tls_key", "not a PEM private key (no BEGIN ... PRIVATE KEY line)")
        if self.tokens is not None and not isinstance(self.tokens, Tokens):
            raise ConfigError("tokens", f"must be a Tokens, not {type(self.tokens).__name__}")
        if self.metrics_host is not None and not self.metrics_host.strip():
            raise ConfigError("metrics_host", "must be an address, not empty (None: host)")

    @property
    def tls(self) -> bool:
        """Whether the port serves TLS."""
        return self.tls_cert is not None

    @property
    def address(self) -> str:
        """``host:port`` of the gRPC port."""
        return f"{self.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        """The host the metrics endpoint binds."""
        return self.metrics_host or self.host

    @property
    def plaintext_tokens(self) -> bool:
        """Whether bearer tokens would cross a network in plain text (no TLS, not loopback)."""
        return self.tokens is not None and not self.tls and not is_loopback(self.host)

    def bind(self, server: grpc.Server) -> int:
        """Add the port to ``server`` (TLS or plain); returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        if self.tls_cert is not None and self.tls_key is not None:
            credentials: Any = grpc.ssl_server_credentials([(self.tls_key, self.tls_cert)])
            port = server.add_secure_port(self.address, credentials)
        else:
            port = server.add_insecure_port(self.address)
        if port == 0:
            raise OSError(f"cannot bind {self.address}")
        return int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.0.0.1``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
