"""Compile the client's numba kernels before a process sends its first batch.

The client deduplicates every batch and combines the rows of duplicate ids with compiled
kernels (:mod:`._kernels`); each compiles, or loads from numba's on-disk cache, on its first
call with a new signature (argument types, read-only arrays included). An embedding worker calls
:func:`warm_up_client` before it reports ready and a model server before it accepts calls, so
the first training batch pays for none of it. The calls go through :class:`.batching.IdBatch`,
the path every client method takes, with writable and read-only arrays (what
``np.frombuffer`` gives a process that reads batches from a buffer). The routing kernel
(:func:`embeddb.common.routing.first_foreign`) is warmed too, for processes that check ownership.
The server's kernels: :func:`embeddb.engine.warmup.warm_up_core`.
"""

from __future__ import annotations

import time

import numpy as np

from embeddb.client.batching import IdBatch
from embeddb.common.routing import first_foreign

__all__ = ["warm_up_client"]


def warm_up_client() -> float:
    """Compile (or load from numba's cache) every client kernel for every run-time signature.

    Idempotent; once the kernels are loaded a call costs well under a millisecond.

    Returns:
        The seconds it took.
    """
    start = time.perf_counter()
    for readonly in (False, True):
        ids = np.array([7, 42, 7], dtype=np.uint64)  # a duplicate: the combining paths run
        values = np.ones((ids.size, 2), dtype=np.float32)
        ids.flags.writeable = values.flags.writeable = not readonly
        batch = IdBatch.of(ids)
        batch.sum_rows(values)
        batch.last_rows(values)
        first_foreign(ids, 0, 2)
    return time.perf_counter() - start
