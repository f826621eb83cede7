"""The allocator tuning: large buffers come from the reusable heap instead of fresh mmaps."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from embeddb.common import allocator

glibc_only = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are a glibc feature"
)

# Allocates a 4 MiB numpy array in a fresh interpreter and reports whether glibc served it with
# mmap (mallinfo2().hblkhd, the bytes in mmapped blocks, grows) -- before or after tuning.
_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "tuned":
        from embeddb.common.allocator import tune_allocator
        assert tune_allocator()
    before = libc.mallinfo2().hblkhd
    buffer = np.ones(1 << 20, dtype=np.float32)
    print(libc.mallinfo2().hblkhd - before)
    """
)


def _mmapped_growth(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.slow
@glibc_only
def test_tuning_moves_large_buffers_from_mmap_to_the_heap() -> None:
    assert _mmapped_growth("default") >= 4 << 20  # glibc's default: a fresh mmap per buffer
    assert _mmapped_growth("tuned") == 0


@glibc_only
def test_tuning_is_applied_once_and_reported() -> None:
    assert allocator.tune_allocator()
    assert allocator.applied() is not None
    assert allocator.tune_allocator(1 << 20, 1 << 20)  # later calls keep the first setting
    assert allocator.applied() != (1 << 20, 1 << 20)


@pytest.mark.parametrize(("mmap", "trim"), [(0, 1), (64 << 20, 1), (1 << 20, 0)])
def test_invalid_thresholds_are_refused(mmap: int, trim: int) -> None:
    with pytest.raises(ValueError, match="threshold"):
        allocator.tune_allocator(mmap, trim)


_ARENAS = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    from embeddb.common import allocator
    if sys.argv[1] == "limited":
        assert allocator.limit_arenas(1)
    def work():
        for _ in range(20):
            np.ones(1 << 16)  # a 512 KiB block from this thread's arena
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    import os
    maps = open(f"/proc/{os.getpid()}/maps").read().splitlines()
    # a non-main arena is a 64 MiB-aligned heap: count the distinct such reservations
    heaps = {int(m.split("-")[0], 16) for m in maps if int(m.split("-")[0], 16) % (64 << 20) == 0}
    print(len(heaps))
    """
)


@pytest.mark.slow
@glibc_only
def test_limit_arenas_keeps_threads_off_new_arenas() -> None:
    """Threads allocating at once get arenas of their own, whose heap tops malloc_trim never
    returns; after limit_arenas(1) they share the main arena."""

    def heaps(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    assert heaps("limited") < heaps("default")
    with pytest.raises(ValueError):
        allocator.limit_arenas(0)
