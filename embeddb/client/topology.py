"""What a client learns from ``DescribeShard`` before its first call, and what it makes of it.
No I/O.

**Topology.** Shard ``i`` of a client's address list must call itself shard ``i`` of
``len(addresses)`` and route ids with :data:`embeddb.common.routing.ROUTING_ALGORITHM` and
:data:`~embeddb.common.routing.SHARD_SALT`; otherwise the client would send ids to shards that do
not own
them. Shards refuse such ids themselves, but only shard by shard: a client that checks every
shard first sends nothing at all to a misconfigured cluster. :func:`shard_limits` names the first
wrong address, what it serves and what the client expected.

**Request budgets** (:func:`budget`, used by :mod:`.batching`). A request to a shard carries at
most ``min(max_ids_per_message, max_ids_per_request)`` ids, and costs each id bytes against two
of the shard's limits:

* ``max_response_bytes``: the rows of a lookup's answer, or of a push's request matrix (whose
  LZ4 frame must decompress within it). A row is ``dim * 4`` bytes, ``dim * 2 + 4`` as scaled
  float16 (the server's own formula), and at least the 8 bytes of its id, which an
  LZ4-compressed ids tensor decompresses to.
* the message limit, the smaller of the server's and the client's ``max_message_bytes`` less
  1/64 of it and 64 KiB (framing, and LZ4's growth of incompressible data): a lookup's larger
  message (ids out, rows back), a push's ids and rows together.

Worked example: a table of dim 16 (64 bytes per float32 row, 36 as float16) on shards with
``max_response_bytes`` 1 MiB, the other limits at their defaults::

    lookup, float32     1 MiB / 64 = 16384 ids per request
    lookup, float16     1 MiB / 36 = 29127 ids per request
    100k ids, 2 shards  about 50k ids per shard: 4 requests each (float32), 2 (float16)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embeddb.client.batching import Budget
from embeddb.client.calls import ShardCall
from embeddb.client.options import ClientOptions
from embeddb.common.routing import ROUTING_ALGORITHM, SHARD_SALT
from embeddb.errors import ConfigError
from embeddb.transport.wire import row_bytes
from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "DEFAULT_LIMITS",
    "ID_COST",
    "ShardLimits",
    "budget",
    "describe_calls",
    "lookup_cost",
    "push_cost",
    "shard_limits",
]

_ID_BYTES = 8
_FRAMING_BYTES = 64 << 10


@dataclass(frozen=True)
class ShardLimits:
    """The limits a shard enforces (``DescribeShardResponse.limits``)."""

    max_ids_per_request: int
    max_response_bytes: int
    max_message_bytes: int

    @classmethod
    def from_proto(cls, limits: Any) -> ShardLimits:
        """A field the server left at 0 (not reported) reads as the server default."""
        return cls(
            max_ids_per_request=int(limits.max_ids_per_request)
            or DEFAULT_LIMITS.max_ids_per_request,
            max_response_bytes=int(limits.max_response_bytes) or DEFAULT_LIMITS.max_response_bytes,
            max_message_bytes=int(limits.max_message_bytes) or DEFAULT_LIMITS.max_message_bytes,
        )


DEFAULT_LIMITS = ShardLimits(
    max_ids_per_request=1 << 22, max_response_bytes=64 << 20, max_message_bytes=256 << 20
)
"""The defaults of ``embeddb.server.ServerConfig``."""


def describe_calls(num_shards: int) -> list[ShardCall]:
    """``DescribeShard`` on every shard, in shard order (idempotent: retried when unavailable)."""
    return [
        ShardCall(k, "DescribeShard", pb.DescribeShardRequest(), idempotent=True)
        for k in range(num_shards)
    ]


def shard_limits(
    addresses: Sequence[str], outcomes: Sequence[Any], verify: bool
) -> tuple[ShardLimits, ...]:
    """Each shard's limits from its ``DescribeShard`` answer, checking its topology first.

    Args:
        addresses: the client's address list, in shard order.
        outcomes: each shard's answer, or the exception its call raised, in shard order.
        verify: check every answering shard's place and routing.

    Raises:
        ConfigError: with ``verify``, a shard that is not shard ``i`` of ``len(addresses)`` at
            ``addresses[i]``, or routes ids another way (the first such address, even when
            another shard failed to answer).
        EmbeddbError: the first failed call, when every answer was right.
    """
    n = len(addresses)
    if verify:
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                continue
            problem = _mismatch(addresses[i], i, n, outcome)
            if problem is not None:
                raise ConfigError(f"addresses[{i}]", f"{problem}; no data call was sent")
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return tuple(ShardLimits.from_proto(r.limits) for r in outcomes)


def _mismatch(address: str, i: int, n: int, answer: Any) -> str | None:
    """What is wrong with the shard at ``addresses[i]``, or None."""
    index, count = int(answer.shard_index), int(answer.num_shards)
    if (index, count) != (i, n):
        hint = (
            f"its cluster has {count} shards: list all {count} addresses, in shard order"
            if count != n
            else f"list the addresses in shard order (this one belongs at addresses[{index}])"
        )
        return (
            f"{address} serves shard {index} of {count}, but the client lists it as shard {i} "
            f"of {n}: {hint}"
        )
    algorithm, salt = answer.routing.algorithm, int(answer.routing.salt)
    if (algorithm, salt) != (ROUTING_ALGORITHM, int(SHARD_SALT)):
        return (
            f"{address} routes ids with {algorithm or '(no algorithm)'!s} and salt {salt:#018x}, "
            f"this client with {ROUTING_ALGORITHM} and salt {int(SHARD_SALT):#018x}: they "
            f"disagree on which shard owns an id"
        )
    return None


def budget(limits: ShardLimits, options: ClientOptions) -> Budget:
    """What one request to a shard with ``limits`` may carry: ``(max_response_bytes, message
    bytes)`` are the byte capacities, in the order of :func:`lookup_cost` and
    :func:`push_cost`."""
    message = min(limits.max_message_bytes, options.max_message_bytes)
    usable = max(message - message // 64 - _FRAMING_BYTES, 0)
    return Budget(
        ids=min(options.max_ids_per_message, limits.max_ids_per_request),
        bytes=(limits.max_response_bytes, usable),
    )


def lookup_cost(dim: int, fp16: bool) -> tuple[int, int]:
    """Per-id cost of a lookup: its answer row (or its id, if larger) in both budgets."""
    row = max(row_bytes(dim, fp16), _ID_BYTES)
    return (row, row)


def push_cost(dim: int, fp16: bool) -> tuple[int, int]:
    """Per-id cost of a gradient push or an assign: the request matrix's row, and the row plus
    the id in one message."""
    row = row_bytes(dim, fp16)
    return (max(row, _ID_BYTES), row + _ID_BYTES)


ID_COST = (_ID_BYTES, _ID_BYTES)
"""Per-id cost of a request carrying ids only (``Delete``)."""
