"""Client settings (frozen, validated once; the retry policy is :mod:`embeddb.client.retry`)
and the address file.

Shared by :class:`~embeddb.client.Client` and :class:`~embeddb.client.AsyncClient`, which differ
only in how they wait (threads vs. ``asyncio``).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from embeddb.client.retry import RetryPolicy
from embeddb.errors import ConfigError

__all__ = [
    "ClientOptions",
    "SimulatedNetwork",
    "check_address",
    "check_addresses",
    "parse_addresses",
    "read_address_file",
    "tls_credentials",
]


_GBIT = 1e9 / 8  # bytes per second in one Gbit/s
_NETWORK_KEYS = ("rtt_ms", "bandwidth_gbit")


@dataclass(frozen=True)
class SimulatedNetwork:
    """A slower network between a client and its shards, simulated in the client (off unless
    :attr:`ClientOptions.network` is set): for benchmarks and what-if runs on one machine.

    Method: the kernels this runs on have no ``netem`` (no ``sch_netem`` module, and changing
    qdiscs needs privileges a job does not have), so the delay is injected in the client, around
    each call to one shard: before the request is sent it waits ``rtt / 2 + request bytes /
    bandwidth``, after the answer arrives ``rtt / 2 + response bytes / bandwidth``, so each
    attempt (a retry is one more) takes ``rtt + (request + response bytes) / bandwidth`` longer
    than on loopback. The :class:`~embeddb.client.AsyncClient` awaits the delay
    (``asyncio.sleep``), the :class:`~embeddb.client.Client` sleeps in its fan-out thread:
    calls to different shards and concurrent calls overlap, as on a real network. Not modelled:
    link contention (every call has the whole bandwidth), packet loss, jitter, TCP slow start.
    Bytes are the messages' serialized sizes (protobuf framing included, HTTP/2 and gRPC headers
    not). See :mod:`embeddb.client.netsim`.

    Attributes:
        rtt: round-trip time added to each call, in seconds (>= 0).
        bandwidth: bytes per second of the simulated link (> 0); default 1.25e9 (10 Gbit/s).

    Raises:
        ConfigError: a negative or non-finite ``rtt``, a non-positive or non-finite
            ``bandwidth`` (naming the attribute).
    """

    rtt: float
    bandwidth: float = 10 * _GBIT

    def __post_init__(self) -> None:
        if not (_is_number(self.rtt) and math.isfinite(self.rtt) and self.rtt >= 0):
            raise ConfigError("rtt", f"must be a number of seconds >= 0, got {self.rtt!r}")
        if not (
            _is_number(self.bandwidth) and math.isfinite(self.bandwidth) and self.bandwidth > 0
        ):
            raise ConfigError(
                "bandwidth", f"must be a positive number of bytes/s, got {self.bandwidth!r}"
            )

    @classmethod
    def from_mapping(cls, value: object, key: str = "simulated_network") -> SimulatedNetwork:
        """The network of a job file's ``{rtt_ms: 20, bandwidth_gbit: 10}`` (``bandwidth_gbit``
        optional, default 10).

        Raises:
            ConfigError: not a mapping, an unknown or missing key, or a bad value; the key is
                named as ``KEY.rtt_ms``.
        """
        if not isinstance(value, Mapping):
            raise ConfigError(
                key, f"must be a mapping {{rtt_ms: ..., bandwidth_gbit: ...}}, got {value!r}"
            )
        raw: Mapping[str, Any] = value
        unknown = sorted(str(k) for k in raw if k not in _NETWORK_KEYS)
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", f"is not a key ({', '.join(_NETWORK_KEYS)})")
        if "rtt_ms" not in raw:
            raise ConfigError(f"{key}.rtt_ms", "is required (milliseconds, >= 0)")
        rtt_ms, gbit = raw["rtt_ms"], raw.get("bandwidth_gbit", 10)
        if not (_is_number(rtt_ms) and math.isfinite(rtt_ms) and rtt_ms >= 0):
            raise ConfigError(
                f"{key}.rtt_ms", f"must be a number of milliseconds >= 0, got {rtt_ms!r}"
            )
        if not (_is_number(gbit) and math.isfinite(gbit) and gbit > 0):
            raise ConfigError(f"{key}.bandwidth_gbit", f"must be a number > 0, got {gbit!r}")
        return cls(rtt=rtt_ms / 1000.0, bandwidth=gbit * _GBIT)

    def delay(self, request_bytes: int, response_bytes: int) -> float:
        """Seconds one call to one shard takes longer: ``rtt + (request_bytes +
        response_bytes) / bandwidth``."""
        return self.rtt + (request_bytes + response_bytes) / self.bandwidth


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class ClientOptions:
    """How a client talks to the shards.

    Attributes:
        timeout: seconds one logical call to one shard may take, retries and backoff included
            (the gRPC deadline of each attempt is what is left of it).
        retries: extra attempts after an ``UNAVAILABLE`` (or server-side ``CANCELLED``) answer,
            for idempotent calls only (evaluation lookups, assign, delete, metadata). Training
            lookups and gradient pushes change the shard's state and are never retried.
            ``RetryPolicy.attempts`` is ``retries + 1``.
        backoff: the first retry waits about this many seconds; each further one twice as long
            (up to ``max_backoff``), each delay jittered to between half and all of its value
            (``RetryPolicy.initial_backoff``, ``multiplier=2``, ``jitter=0.5``).
        max_backoff: cap of one retry delay, in seconds (``RetryPolicy.max_backoff``).
        retry: the whole :class:`~embeddb.client.retry.RetryPolicy`; when set, it replaces
            ``retries``, ``backoff`` and ``max_backoff`` (:attr:`retry_policy` is the one used).
        fp16: lookups return, and gradients travel as, per-row scaled float16 (lossy: each
            element within ``2**-11 * max|row|``). Assigned vectors always travel as float32.
        lz4_min_bytes: LZ4-compress payloads (both directions) at least this large; 0 (the
            default) disables. Worth it on slow links with compressible data: embedding
            vectors barely compress (ratio 1.00 in benchmarks/rpc.py), sorted ids halve.
        max_ids_per_message: unique ids per request; larger per-shard batches are split. A
            request is also kept within each shard's own limits, which the client fetches once
            (``DescribeShard``): its ``max_ids_per_request``, and rows of at most
            ``max_response_bytes`` (see :mod:`embeddb.client.topology`).
        max_message_bytes: the channel's send and receive limit.
        credentials: TLS (or other) channel credentials; ``None`` for a plaintext channel.
        token: sent as ``authorization: Bearer <token>`` metadata on every call.
        tune_allocator: raise glibc's mmap and trim thresholds for this process, so the
            buffers of large answers are reused instead of page-faulted in on every call (see
            :mod:`embeddb.common.allocator`).
        verify_topology: before its first call of any kind, the client asks every shard (once,
            in parallel) which shard of how many it is and how it routes ids, and raises
            ``ConfigError`` naming the address if shard ``i`` is not ``addresses[i]`` of
            ``len(addresses)`` or routes another way, so nothing reaches a misconfigured
            cluster. ``False`` skips the check (the shards still refuse ids they do not own);
            the limits are fetched all the same.
        network: delay every call as a slower network would (:class:`SimulatedNetwork`:
            ``rtt + bytes / bandwidth`` per call to one shard, injected in the client);
            ``None`` (the default): no delay.
    """

    timeout: float = 10.0
    retries: int = 3
    backoff: float = 0.05
    max_backoff: float = 2.0
    fp16: bool = False
    lz4_min_bytes: int = 0
    max_ids_per_message: int = 1 << 20
    max_message_bytes: int = 1 << 30
    credentials: grpc.ChannelCredentials | None = None
    token: str | None = None
    tune_allocator: bool = True
    verify_topology: bool = True
    network: SimulatedNetwork | None = None
    retry: RetryPolicy | None = None
    _policy: RetryPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(
                "timeout", f"must be a positive number of seconds, got {self.timeout}"
            )
        if self.retries < 0:
            raise ConfigError("retries", f"must be >= 0, got {self.retries}")
        if not (self.backoff >= 0 and self.max_backoff >= self.backoff):
            raise ConfigError(
                "backoff",
                f"need 0 <= backoff <= max_backoff, got {self.backoff} and {self.max_backoff}",
            )
        if self.lz4_min_bytes < 0:
            raise ConfigError("lz4_min_bytes", f"must be >= 0, got {self.lz4_min_bytes}")
        if self.max_ids_per_message < 1:
            raise ConfigError(
                "max_ids_per_message", f"must be >= 1, got {self.max_ids_per_message}"
            )
        if self.max_message_bytes < 1:
            raise ConfigError("max_message_bytes", f"must be >= 1, got {self.max_message_bytes}")
        if self.token is not None and (not self.token or any(c in self.token for c in "\r\n")):
            raise ConfigError("token", "must be a non-empty single-line string")
        if self.network is not None and not isinstance(self.network, SimulatedNetwork):
            raise ConfigError(
                "network", f"must be a SimulatedNetwork or None, got {self.network!r}"
            )
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ConfigError("retry", f"must be a RetryPolicy or None, got {self.retry!r}")
        policy = self.retry
        if policy is None:
            policy = RetryPolicy.from_retries(self.retries, self.backoff, self.max_backoff)
        object.__setattr__(self, "_policy", policy)

    @property
    def retry_policy(self) -> RetryPolicy:
        """The policy the client retries with: :attr:`retry`, else the one of ``retries``,
        ``backoff`` and ``max_backoff``."""
        return self._policy

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata sent with every call."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    @property
    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel arguments (the channel's reconnect backoff that of the retry policy)."""
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            *self.retry_policy.channel_options(),
        ]

    def retry_delay(
        self, idempotent: bool, status: str, attempt: int, remaining: float, rng: random.Random
    ) -> float | None:
        """Seconds to wait before retrying a failed attempt, or ``None`` to give up
        (:meth:`RetryPolicy.delay` of :attr:`retry_policy`; never for a call that is not
        idempotent).

        Args:
            idempotent: whether repeating the call is harmless.
            status: the gRPC status name of the failure.
            attempt: attempts made so far (1 after the first failure).
            remaining: seconds left of the call's ``timeout``.
            rng: the client's jitter source.
        """
        if not idempotent:
            return None
        code = getattr(grpc.StatusCode, status, None)
        return self.retry_policy.delay(code, attempt, rng, remaining)


def check_addresses(addresses: Sequence[str]) -> tuple[str, ...]:
    """Validate ``host:port`` addresses (shard ``i`` is ``addresses[i]``).

    Raises:
        ConfigError: no addresses, or one that is not ``host:port``.
    """
    if isinstance(addresses, str):
        raise ConfigError("addresses", "must be a sequence of 'host:port' strings, not one string")
    out = tuple(addresses)
    if not out:
        raise ConfigError("addresses", "at least one shard address is needed")
    for i, address in enumerate(out):
        check_address(address, f"addresses[{i}]")
    return out


def check_address(address: str, key: str) -> None:
    """Validate one ``host:port`` address.

    Raises:
        ConfigError: ``address`` is not ``host:port``, under ``key``.
    """
    host, sep, port = str(address).rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(key, f"must be 'host:port', got {address!r}")


def read_address_file(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Read shard addresses: one ``host:port`` per line, in shard order.

    Blank lines and ``#`` comments (whole-line or trailing) are ignored.

    Raises:
        ConfigError: the file is missing or unreadable, lists no address, or a line is not
            ``host:port`` (the message names the file and line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read the shard address file: {exc}") from exc
    addresses: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        address = line.split("#", 1)[0].strip()
        if not address:
            continue
        check_address(address, f"{p}:{number}")
        addresses.append(address)
    if not addresses:
        raise ConfigError(str(p), "the shard address file lists no 'host:port' address")
    return tuple(addresses)


def parse_addresses(values: Sequence[str], key: str = "--addresses") -> tuple[str, ...]:
    """The shard addresses that ``values`` name, in order: each value is a comma-separated
    ``HOST:PORT`` list or ``@FILE``, a cluster address file (:func:`read_address_file`). The
    one spelling of every command's ``--addresses`` (the CLI's and
    ``embeddb.trainer.launcher.run``'s).

    Raises:
        ConfigError: no address, an item that is not ``HOST:PORT``, or a bad address file.
    """
    found: list[str] = []
    for value in values:
        if value.startswith("@"):
            found += read_address_file(value[1:])
            continue
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items:
            raise ConfigError(key, f"{value!r} names no address")
        for item in items:
            try:
                check_address(item, key)
            except ConfigError:
                raise ConfigError(
                    key, f"{item!r} is not HOST:PORT (give an address file as @FILE)"
                ) from None
        found += items
    if not found:
        raise ConfigError(key, "at least one shard address is needed")
    return tuple(found)


def tls_credentials(ca: str | os.PathLike[str] | None) -> grpc.ChannelCredentials | None:
    """TLS channel credentials trusting the PEM certificate(s) in ``ca``; ``None`` for
    plaintext (for callers such as the trainer, which never import grpc themselves).

    Raises:
        ConfigError: ``ca`` cannot be read.
    """
    if ca is None:
        return None
    try:
        pem = Path(ca).read_bytes()
    except OSError as exc:
        raise ConfigError("tls_ca", f"cannot read {ca}: {exc}") from exc
    return grpc.ssl_channel_credentials(root_certificates=pem)
