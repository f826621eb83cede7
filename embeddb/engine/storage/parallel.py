"""Run one large call's per-stripe work on several cores.

Every kernel that touches a stripe is ``numba.njit(nogil=True)`` and each stripe has its own
lock, so the stripes of one call can be served at the same time. :class:`StripePool` does that
for calls of at least ``min_ids`` ids: the calling thread and up to ``threads - 1`` pool
threads take stripes from a shared counter until none is left. Smaller calls stay on the
calling thread (a hand-off costs tens of microseconds), and so does everything when the pool
is busy with other calls: the caller never waits for a pool thread to become free, only for
the stripes a pool thread has already taken (so a pool thread may map again: the disk tier
splits a multi-get over the same pool from inside a stripe's work).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from typing import TypeVar

__all__ = ["StripePool", "default_threads"]

T = TypeVar("T")
R = TypeVar("R")


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class StripePool:
    """Maps a function over a call's stripes, in parallel when the call is large.

    Args:
        threads: threads that may work on one call, the caller included (1: no pool).
        min_ids: calls with fewer ids run on the calling thread alone.
    """

    def __init__(self, threads: int, min_ids: int) -> None:
        self.threads = max(1, threads)
        self.min_ids = min_ids
        self._executor = (
            ThreadPoolExecutor(self.threads - 1, thread_name_prefix="embeddb-stripes")
            if self.threads > 1
            else None
        )

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], ids: int, min_ids: int | None = None
    ) -> list[R]:
        """``[fn(x) for x in items]``, spread over threads when ``ids >= min_ids`` (the
        pool's own ``min_ids`` unless given: a caller whose work costs more per id, such as a
        RocksDB multi-get, passes a lower threshold).

        Every ``fn`` call has finished when this returns or raises (the first error is raised).
        """
        executor = self._executor
        threshold = self.min_ids if min_ids is None else min_ids
        if executor is None or len(items) < 2 or ids < threshold:
            return [fn(x) for x in items]
        results: list[R | None] = [None] * len(items)
        errors: list[BaseException] = []
        lock = threading.Lock()
        taken = 0

        def work() -> None:
            nonlocal taken
            while True:
                with lock:
                    if taken >= len(items) or errors:
                        return
                    i = taken
                    taken += 1
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # handed to the caller below
                    with lock:
                        errors.append(exc)
                    return

        helpers: list[Future[None]] = []
        with suppress(RuntimeError):  # the pool was shut down meanwhile: the caller does it all
            for _ in range(min(self.threads, len(items)) - 1):
                helpers.append(executor.submit(work))
        work()
        for helper in helpers:
            # A helper still queued has no item left to take: drop it rather than wait for a
            # pool thread (a call made from a pool thread would wait for itself).
            if not helper.cancel():
                helper.result()
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the pool threads (after the calls in progress). Idempotent."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
