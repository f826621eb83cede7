"""A memory budget shared by every call of a server: a byte-counting semaphore.

The boundary (:mod:`embeddb.transport.rpc.boundary`) charges each admitted call, after its request
is
decoded and before the servicer runs, with what the call will hold in memory: its request and
the answer it will build (``Service.cost``: a lookup's ids x row bytes, computed from the
request before anything is gathered). The charge is given back when the call is over — when
gRPC has sent the answer and ended the call, not when the handler returns, so answers that a
slow reader has not taken yet still count. A call that does not fit waits a little for others
to finish, then is refused with RESOURCE_EXHAUSTED before it allocates anything; a call whose
charge alone exceeds the budget is admitted only when nothing else is in flight (its charge is
clamped to the budget), so a legitimate largest request still runs.
"""

from __future__ import annotations

import threading
import time

__all__ = ["MemoryBudget"]


class MemoryBudget:
    """At most ``limit`` bytes charged at once, across all callers.

    Args:
        limit: bytes; must be >= 1.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memory budget must be >= 1 byte, got {limit}")
        self.limit = limit
        self._used = 0
        self._cond = threading.Condition()
        self.refused = 0

    @property
    def in_use(self) -> int:
        """Bytes charged now."""
        with self._cond:
            return self._used

    def charge_of(self, nbytes: int) -> int:
        """What a call of ``nbytes`` is charged: at least 1, at most the whole budget."""
        return min(max(int(nbytes), 1), self.limit)

    def acquire(self, nbytes: int, timeout: float = 0.0) -> int:
        """Charge ``nbytes`` (clamped, see :meth:`charge_of`), waiting up to ``timeout``
        seconds for room. Returns the charge to :meth:`release`, or 0 when there was no room
        (nothing was charged)."""
        charge = self.charge_of(nbytes)
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while self._used + charge > self.limit:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if self._used + charge <= self.limit:
                        break
                    self.refused += 1
                    return 0
            self._used += charge
            return charge

    def release(self, charge: int) -> None:
        """Give back a charge :meth:`acquire` returned."""
        if charge <= 0:
            return
        with self._cond:
            self._used -= charge
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is charged (or ``timeout`` seconds); whether it is idle."""
        with self._cond:
            return self._cond.wait_for(lambda: self._used == 0, timeout)
