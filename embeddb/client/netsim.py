"""A simulated network between a client and its shards (:class:`~embeddb.client.options.
SimulatedNetwork`): each call to one shard waits as if it crossed a slower link.

One attempt of a call to one shard, with ``rtt`` and ``bandwidth`` (bytes/s) from the options::

    wait  rtt / 2 + request bytes / bandwidth      # the request travels
    call  the shard (on loopback: ~no network)
    wait  rtt / 2 + response bytes / bandwidth     # the answer travels back

so the attempt takes ``rtt + (request + response bytes) / bandwidth`` longer; a failed attempt
waits ``rtt / 2`` on its way back (an error answer has no payload to speak of). Each retry is
one more attempt, so it pays the delay again. Byte counts are the serialized messages' sizes
(:func:`message_bytes`). The :class:`~embeddb.client.AsyncClient` awaits the waits
(``asyncio.sleep``) and the :class:`~embeddb.client.Client` sleeps in the thread making the call,
so concurrent calls and calls to different shards overlap; no link contention is modelled.

Both clients build a :class:`Link` from ``ClientOptions.network`` (:func:`link_of`) and wrap each
attempt in it; the sleeps are injectable, so the arithmetic is testable without a clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from embeddb.client.options import SimulatedNetwork

__all__ = ["Link", "link_of", "message_bytes"]

Sleep = Callable[[float], None]
AsyncSleep = Callable[[float], Awaitable[None]]
_VIEW_OVERHEAD = 16  # bytes of tags, lengths, dtype and shape of one parsed tensor view


def message_bytes(message: object) -> int:
    """The serialized size of a request or response, in bytes.

    Generated messages and :class:`embeddb.transport.wire.Encoded` report their ``ByteSize()``;
    lookup
    answers parsed without a copy (``embeddb.transport.wire.LookupResponseView``, a ``vectors``
    tensor
    view, and ``LookupManyResponseView``, a list of them in ``results``) count their tensors'
    payloads plus a few bytes of framing each. Anything else counts 0.
    """
    size = getattr(message, "ByteSize", None)
    if callable(size):
        return int(size())
    results = getattr(message, "results", None)
    if isinstance(results, list):
        return sum(message_bytes(r) for r in results)
    vectors = getattr(message, "vectors", None)
    if vectors is not None:
        return _tensor_bytes(vectors)
    return 0


def _tensor_bytes(tensor: Any) -> int:
    data = getattr(tensor, "data", b"")
    scales = getattr(tensor, "row_scales", b"")
    return len(data) + len(scales) + 8 * len(getattr(tensor, "shape", ())) + _VIEW_OVERHEAD


class Link:
    """The simulated link of one client: wraps one attempt of a call to one shard.

    Args:
        network: the link's round-trip time and bandwidth.
        sleep: how the blocking client waits (default :func:`time.sleep`).
        async_sleep: how the ``asyncio`` client waits (default :func:`asyncio.sleep`).
    """

    def __init__(
        self,
        network: SimulatedNetwork,
        *,
        sleep: Sleep = time.sleep,
        async_sleep: AsyncSleep = asyncio.sleep,
    ) -> None:
        self.network = network
        self._sleep = sleep
        self._async_sleep = async_sleep

    def outbound(self, request_bytes: int) -> float:
        """Seconds a request of ``request_bytes`` takes to reach the shard."""
        return self.network.rtt / 2 + request_bytes / self.network.bandwidth

    def inbound(self, response_bytes: int) -> float:
        """Seconds an answer of ``response_bytes`` takes to come back."""
        return self.network.rtt / 2 + response_bytes / self.network.bandwidth

    def call(
        self, method: Callable[..., Any], request: Any, *, timeout: float, **kwargs: Any
    ) -> Any:
        """``method(request, timeout=..., **kwargs)`` across the link, blocking.

        The outbound wait counts against ``timeout`` (the attempt's gRPC deadline is what is
        left of it). Exceptions of the call propagate after the inbound wait of an empty answer.
        """
        before = self.outbound(message_bytes(request))
        self._sleep(before)
        try:
            response = method(request, timeout=max(timeout - before, 0.0), **kwargs)
        except Exception:
            self._sleep(self.inbound(0))
            raise
        self._sleep(self.inbound(message_bytes(response)))
        return response

    async def call_async(
        self, method: Callable[..., Any], request: Any, *, timeout: float, **kwargs: Any
    ) -> Any:
        """:meth:`call` for ``grpc.aio`` methods: the waits are awaited, so other calls run."""
        before = self.outbound(message_bytes(request))
        await self._async_sleep(before)
        try:
            response = await method(request, timeout=max(timeout - before, 0.0), **kwargs)
        except Exception:
            await self._async_sleep(self.inbound(0))
            raise
        await self._async_sleep(self.inbound(message_bytes(response)))
        return response


def link_of(network: SimulatedNetwork | None) -> Link | None:
    """The client's link for ``ClientOptions.network``; ``None`` without a simulated network."""
    return None if network is None else Link(network)
