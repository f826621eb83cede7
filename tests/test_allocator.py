"""The allocator tuning: large buffers come from the reusable heap instead of fresh mmaps."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from embeddb import allocator

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
        from embeddb.allocator import tune_allocator
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
