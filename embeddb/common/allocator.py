"""Keep glibc from handing large buffers back to the kernel after every request.

A 65,536-id lookup of dim 16 allocates and frees several 4 MiB buffers per call (the gathered
vectors, the serialized response, gRPC's receive buffer, the decoded array). With glibc's
defaults, blocks above the dynamic mmap threshold are ``mmap``-ed and ``munmap``-ed each time and
the top of the heap is trimmed as soon as it is free, so every call page-faults its buffers in
again: on this project's 2-core development VM that made a served lookup 2.5x slower than the
same work with reused memory (19 ms against 7.5 ms in the servicer; see benchmarks/README.md).

:func:`tune_allocator` raises the two thresholds with ``mallopt``: blocks up to ``mmap_max``
come from the heap, and freed memory at the top of the heap is returned to the kernel only
beyond ``trim_threshold``. The cost is that much memory kept by an idle process. The server
applies it at start (``ServerConfig.tune_allocator``), and so does the client
(``tune_allocator=True``); both can opt out. Elsewhere than glibc it does nothing.

The memory kept is bounded: a server lets its threads share one malloc arena
(:func:`limit_arenas`) and hands what a burst of large calls left behind back to the kernel
once the burst is over (:class:`Trimmer`), so its resident size returns to its level before
the burst (``tests/test_boundaries.py``; measured before the in-flight budget of
:mod:`embeddb.transport.rpc.budget`: 193 MiB before eight concurrent 60 MiB lookups, 1.5-1.6 GiB at
their
end, 197-206 MiB a few seconds later; with the default budget they run two at a time and the
peak is about 618 MiB).
"""

from __future__ import annotations

import ctypes
import logging
import platform
import threading
import time
from typing import Any

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "DEFAULT_TRIM_THRESHOLD",
    "Trimmer",
    "limit_arenas",
    "tune_allocator",
]

logger = logging.getLogger(__name__)

DEFAULT_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
DEFAULT_TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD = -1  # from malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_lock = threading.Lock()
_applied: tuple[int, int] | None = None


def tune_allocator(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD, trim_threshold: int = DEFAULT_TRIM_THRESHOLD
) -> bool:
    """Set glibc's mmap and trim thresholds for this process, once; later calls are no-ops.

    Args:
        mmap_threshold: allocations below this many bytes come from the heap (at most 32 MiB).
        trim_threshold: free memory kept at the top of the heap before it is returned.

    Returns:
        Whether the thresholds are in effect (``False`` off glibc or if ``mallopt`` refused).

    Raises:
        ValueError: a threshold that is not positive, or ``mmap_threshold`` above 32 MiB.
    """
    global _applied
    if not 0 < mmap_threshold <= DEFAULT_MMAP_THRESHOLD:
        raise ValueError(f"mmap_threshold must be in (0, {DEFAULT_MMAP_THRESHOLD}]")
    if trim_threshold <= 0:
        raise ValueError("trim_threshold must be positive")
    with _lock:
        if _applied is not None:
            return True
        mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
        if mallopt is None:
            return False
        ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
        ok = mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)) == 1 and ok
        if not ok:  # pragma: no cover - only with values glibc rejects, checked above
            logger.warning("mallopt refused the allocator thresholds; keeping glibc's defaults")
            return False
        _applied = (mmap_threshold, trim_threshold)
        logger.debug("allocator: mmap threshold %d B, trim threshold %d B", *_applied)
        return True


def limit_arenas(count: int = 1) -> bool:
    """Let glibc create at most ``count`` malloc arenas in this process (``M_ARENA_MAX``).

    A server calls it with 1 before its threads start: ``malloc_trim`` returns the free top of
    the main arena's heap but never the top of another arena's (up to 64 MiB each), so with an
    arena per thread a burst of large calls left up to that much resident per thread; with one
    arena the memory of a burst goes back entirely (:class:`Trimmer`). Measured on this
    project's 2-core machine, lookups over gRPC run as fast (``benchmarks/rpc.py``, 615 vs 650
    MiB/s, within noise). Threads that already hold an arena keep it. Elsewhere than glibc it
    does nothing.

    Returns:
        Whether the limit is in effect.
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and mallopt(_M_ARENA_MAX, count) == 1


def applied() -> tuple[int, int] | None:
    """The ``(mmap_threshold, trim_threshold)`` in effect, or ``None`` if never tuned."""
    return _applied


class Trimmer:
    """Hands the memory of a burst of large calls back to the kernel once the burst is over.

    With :func:`tune_allocator`'s thresholds, glibc keeps freed heap memory for reuse (that is
    their point); after a burst of large requests (several concurrent lookups of tens of MiB)
    a server would keep the peak resident for good. :meth:`note` records each call's size;
    a background thread calls ``malloc_trim(0)`` — which returns every free page of every
    arena — once no call of at least ``min_bytes`` has been noted for ``quiet_s`` seconds, and
    again after ``5 * quiet_s`` (by then gRPC has sent the last answers and freed their
    buffers too).
    Steady traffic of small calls never triggers it; a trim takes milliseconds and runs off
    the request path. Elsewhere than glibc it does nothing.

    Args:
        min_bytes: calls smaller than this are not part of a burst.
        quiet_s: seconds without a large call before trimming.
    """

    def __init__(self, min_bytes: int = 8 << 20, quiet_s: float = 2.0) -> None:
        self.min_bytes = min_bytes
        self.quiet_s = quiet_s
        self.trims = 0
        self._last = 0.0
        self._pending = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._trim = _glibc("malloc_trim", ctypes.c_size_t)
        self._thread: threading.Thread | None = None

    def note(self, nbytes: int) -> None:
        """Record a call that allocated about ``nbytes`` (cheap; called per request)."""
        if nbytes < self.min_bytes or self._trim is None:
            return
        with self._lock:
            self._last = time.monotonic()
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="embeddb-malloc-trim", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the background thread. Idempotent."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            stage = 0
            while stage < len(_TRIM_AFTER) and not self._stop.is_set():
                with self._lock:
                    if self._pending:  # a large call since: start over
                        self._pending, stage = False, 0
                    left = self._last + _TRIM_AFTER[stage] * self.quiet_s - time.monotonic()
                if left <= 0:
                    assert self._trim is not None
                    self._trim(0)
                    self.trims += 1
                    stage += 1
                elif self._stop.wait(left):
                    return


# Trims at these multiples of quiet_s after the last large call: the first returns what the
# calls' handlers freed, the second what gRPC freed once it had sent the last large answers.
_TRIM_AFTER = (1, 5)


def _glibc(name: str, *argtypes: Any) -> Any:
    """glibc's function ``name`` (returning int) with ``argtypes``, or None elsewhere."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # pragma: no cover - glibc always has them
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function
