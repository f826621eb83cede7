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
"""

from __future__ import annotations

import ctypes
import logging
import platform
import threading

__all__ = ["DEFAULT_MMAP_THRESHOLD", "DEFAULT_TRIM_THRESHOLD", "tune_allocator"]

log = logging.getLogger(__name__)

DEFAULT_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
DEFAULT_TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD = -1  # from malloc.h
_M_MMAP_THRESHOLD = -3

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
        if platform.libc_ver()[0] != "glibc":
            return False
        try:
            libc = ctypes.CDLL(None)
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # pragma: no cover - glibc always has mallopt
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
        ok = mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)) == 1 and ok
        if not ok:  # pragma: no cover - only with values glibc rejects, checked above
            log.warning("mallopt refused the allocator thresholds; keeping glibc's defaults")
            return False
        _applied = (mmap_threshold, trim_threshold)
        log.debug("allocator: mmap threshold %d B, trim threshold %d B", *_applied)
        return True


def applied() -> tuple[int, int] | None:
    """The ``(mmap_threshold, trim_threshold)`` in effect, or ``None`` if never tuned."""
    return _applied
