"""The staleness bound: a FIFO gate on training batches looked up and not yet updated.

``max_staleness`` places; a training lookup takes one before it is sent (waiting in arrival
order when none is free) and gives it back once the batch's gradients are applied by the
shards, or the batch expires, is discarded or fails. With ``limit = 2``::

    lookup 0  -> admitted (1 in flight)
    lookup 1  -> admitted (2 in flight)
    lookup 2  -> waits
    gradients of 0 applied -> release -> lookup 2 admitted (2 in flight)

``limit = 1`` is the ``sync`` mode: the lookup of batch t + 1 waits for batch t's update.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["StalenessWindow"]


class StalenessWindow:
    """A FIFO gate: at most ``limit`` training batches admitted and not yet released.

    Must be used from one ``asyncio`` loop. ``on_change`` gets the new count after each change.
    """

    def __init__(self, limit: int, on_change: Callable[[int], None] = lambda n: None) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_change = on_change

    async def acquire(self) -> None:
        """Wait for a place (in arrival order)."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            self._on_change(self.in_flight)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # admitted and cancelled at once: give the place back
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    @property
    def waiting(self) -> int:
        """Acquires waiting for a place."""
        return sum(not waiter.done() for waiter in self._waiters)

    def release(self) -> None:
        """Free a place; admit waiters in order."""
        self.in_flight -= 1
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.in_flight += 1
            waiter.set_result(None)
        self._on_change(self.in_flight)

    def cancel_waiters(self) -> None:
        """Cancel every waiting acquire (at close)."""
        while self._waiters:
            self._waiters.popleft().cancel()
