"""What a shard call will hold in memory beyond its request, for the server's memory budget
(:mod:`embeddb.transport.rpc.budget`): computed from the decoded request before any work, with the
same arithmetic the servicer uses to refuse an oversized answer (ids x
:func:`~embeddb.transport.wire.row_bytes`).

=========================  ==================================================================
method                     expected bytes
=========================  ==================================================================
``Lookup``, ``LookupMany``  ids x row bytes of the answer (all parts)
``Scan``                    rows of the page (``limit``, or the largest page) x (row + id)
``ApplyGradients``,         ids x (id + float32 row): the decoded arrays (an LZ4-compressed
``Assign``                  tensor decompresses to that)
``ApplyGradientsMany``      the same over every part
anything else               0 (the request alone is charged)
=========================  ==================================================================

Each is capped at the server's ``max_response_bytes`` (the servicer refuses more), and an
unknown table costs 0: the servicer answers it with its precise error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from embeddb.server.served_shard import ServedShard
from embeddb.transport import wire
from embeddb.transport.rpc.boundary import Cost

__all__ = ["shard_costs"]

_ID_BYTES = 8


def _items(tensor: Any) -> int:
    n = 1
    for d in tensor.shape:
        n *= max(int(d), 0)
    return n


def shard_costs(served: ServedShard, max_response_bytes: int) -> Cost:
    """The :data:`~embeddb.transport.rpc.boundary.Cost` of the shard ``served`` serves."""

    def dim(table: str) -> int:
        shard = served.current
        if shard is None:
            return 0
        try:
            return shard.config.table(table).dim
        except Exception:  # an unknown table: the servicer names it
            return 0

    def lookups(parts: Iterable[Any]) -> int:
        return sum(_items(p.ids) * wire.row_bytes(dim(p.table), p.encoding.fp16) for p in parts)

    def pushes(parts: Iterable[Any]) -> int:
        return sum(_items(p.ids) * (_ID_BYTES + 4 * dim(p.table)) for p in parts)

    def scan(request: Any) -> int:
        if not request.limit:
            return max_response_bytes
        row = wire.row_bytes(dim(request.table), request.encoding.fp16)
        return int(request.limit) * (row + _ID_BYTES)

    by_method: dict[str, Callable[[Any], int]] = {
        "Lookup": lambda r: lookups([r]),
        "LookupMany": lambda r: lookups(r.lookups),
        "Scan": scan,
        "ApplyGradients": lambda r: pushes([r]),
        "Assign": lambda r: pushes([r]),
        "ApplyGradientsMany": lambda r: pushes(r.updates),
    }

    def cost(method: str, request: Any) -> int:
        estimate = by_method.get(method)
        if estimate is None:
            return 0
        return min(int(estimate(request)), max_response_bytes)

    return cost
