"""Compile the core's numba kernels before a process serves, so no call pays for compilation.

Every kernel is ``numba.njit(cache=True)``: the first call of each *signature* (the argument
types, where an array's type is its dtype, dimensions, layout and whether it is read-only)
compiles it, or loads it from numba's on-disk cache (``NUMBA_CACHE_DIR``, else ``__pycache__``
next to the sources). Without a warm-up that happens on the first lookup and the first
gradient push after the server already reports SERVING (seconds with an empty cache).
:func:`warm_up_core` calls each kernel once on tiny arrays of the kinds the shard passes at run
time::

    kernel                         arrays it gets at run time
    routing.first_foreign          request ids: read-only (decoded from the wire) or writable
    hash_index.partition           the same ids
    hash_index.lookup_gather/probe request ids (a table with one stripe) or writable copies
    hash_index.remove              writable, or read-only ids of a replayed log record
    hash_index.insert              writable keys
    hash_index.collect_victims     the stripe's index
    hash_index.scatter_rows        a stripe's rows and flags, the rows an update prepared
    hash_index.dedup_sum           request gradients: read-only or writable
    creation (4 kernels)           a stripe's index, rows, ids, flags and free stack; writable
                                   ids, rows and flags of a lookup's misses
    many_kernels (3)               request ids and gradients (one part: read-only or
                                   writable; several: a writable concatenation)
    initializers (3 kinds)         writable ids
    optim: finite_rows, apply_rows the summed gradients (writable), per optimizer kind
    capture._gather                a stripe's rows, flags and ids, and writable buffers (a
                                   snapshot's capture)
    admission (6 kernels)          a tinylfu stripe's sketch and index; writable ids, keys,
                                   frequencies and outputs (the admission of a full stripe)

Dims and values do not matter (numba specialises on types only), so one call per signature
covers every table. ``tests/test_warmup.py`` checks that real shard and gRPC traffic after the
warm-up adds no signature to any core kernel; a new kernel or a new kind of argument makes it
fail until it is added here. The client's kernels: :func:`embeddb.client.warm_up_client`.
"""

from __future__ import annotations

import time

import numpy as np

from embeddb.common.arrays import F32, I64, U64
from embeddb.common.routing import first_foreign
from embeddb.config import InitializerConfig, InitializerKind, OptimizerConfig, OptimizerKind
from embeddb.engine.initializers import initial_vectors, table_key
from embeddb.engine.optim import Optimizer
from embeddb.engine.storage import admission, capture, creation, hash_index, many_kernels
from embeddb.engine.storage.many import stripe_row
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, RamStripe

__all__ = ["warm_up_core"]

_DIM = 2
_IDS = np.array([11, 22, 33, 22], dtype=np.uint64)  # one duplicate, as in a real batch


def warm_up_core() -> float:
    """Compile (or load from numba's cache) every core kernel for every run-time signature.

    Idempotent; once the kernels are loaded a call costs well under a millisecond.

    Returns:
        The seconds it took.
    """
    start = time.perf_counter()
    for readonly in (False, True):
        ids = _ids(readonly)
        first_foreign(ids, 0, 2)
        _hash_index(ids, readonly)
        _many(ids, readonly)
    _creation()
    for kind in InitializerKind:
        initial_vectors(_IDS, _DIM, InitializerConfig(kind=kind), table_key("warm-up", 0))
    for optimizer in _optimizers():
        _optimize(optimizer)
    _capture()
    _admission()
    return time.perf_counter() - start


def _admission() -> None:
    """A full tinylfu stripe admitting rows: count, estimate, choose, restamp, check proposals."""
    index = hash_index.new_index(8)
    keys = np.unique(_IDS)
    hash_index.insert(index, keys, np.arange(keys.size, dtype=np.int64), 1)
    sketch = admission.FrequencySketch(8)
    sketch.counting = True
    for readonly in (False, True):  # a one-stripe table counts the request's own ids
        sketch.add(_ids(readonly))
    freq = sketch.frequencies(keys)
    keep, window, evict = (np.empty(n, dtype=bool) for n in (keys.size, keys.size, keys.size))
    admission.choose(freq, 0, freq, 1, keep, window, evict)
    admission.restamp(index, keys, 2)
    words = np.empty(keys.size, dtype=np.uint64)
    admission.bucket_words(index, keys, words)
    admission.unchanged(index, keys, words, 3, np.empty(keys.size, dtype=bool))


def _capture() -> None:
    """A snapshot's capture: the occupied slots of a stripe gathered into its buffers."""
    rows, flags = np.zeros((4, _DIM + 1), dtype=np.float32), np.zeros(4, dtype=np.uint8)
    flags[1] = DIRTY
    buf = capture.StripeCapture.sized(2, _DIM + 1)
    capture._gather(rows, flags, np.zeros(4, dtype=np.uint64), buf.rows, buf.flags, buf.ids)


def _ids(readonly: bool) -> U64:
    """Request ids: a read-only array is what ``np.frombuffer`` gives the server."""
    ids: U64 = _IDS.copy()
    ids.flags.writeable = not readonly
    return ids


def _hash_index(ids: U64, readonly: bool) -> None:
    """Every hash-index kernel once; the read-only variants only where requests reach."""
    n = ids.size
    index = hash_index.new_index(8)
    keys = np.unique(ids)
    slots = np.arange(keys.size, dtype=np.int64)
    tick = 1
    order, grouped = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.uint64)
    bounds = np.empty(3, dtype=np.int64)
    hash_index.partition(ids, np.uint64(63), 2, order, grouped, bounds)
    if not readonly:
        hash_index.insert(index, keys, slots, tick)
    rows = np.zeros((keys.size, _DIM), dtype=np.float32)
    out = np.empty((n, _DIM), dtype=np.float32)
    miss = np.empty(n, dtype=np.int64)
    positions = np.arange(n, dtype=np.int64)
    hash_index.lookup_gather(index, rows, ids, positions, out, tick, True, miss)
    found = np.empty(n, dtype=np.int64)
    hash_index.probe(index, ids, tick, True, found)
    grads = _grads(n, readonly)
    scratch = np.full(keys.size, -1, dtype=np.int64)
    uniq, sums = np.empty(n, dtype=np.int64), np.empty((n, _DIM), dtype=np.float32)
    hash_index.dedup_sum(found, grads, positions, scratch, uniq, sums)
    if not readonly:
        victims, freed = np.empty(1, dtype=np.uint64), np.empty(1, dtype=np.int64)
        hash_index.collect_victims(index, 1, tick + 1, victims, freed)
        flags = np.zeros(keys.size, dtype=np.uint8)
        hash_index.scatter_rows(rows, slots, rows.take(slots, axis=0), flags, np.uint8(1))
    removed = np.empty(n, dtype=np.int64)
    hash_index.remove(index, ids, removed)


def _creation() -> None:
    """The kernels of a lookup's phase 3 (settling misses, creating and placing rows)."""
    n, width = 3, _DIM + 1
    index = hash_index.new_index(8)
    rows = np.zeros((8, width), dtype=np.float32)
    uniq = np.array([11, 22, 33], dtype=np.uint64)
    values = np.zeros((n, width), dtype=np.float32)
    found = np.array([False, True, False])
    mine = np.array([0, 1, 2, 1], dtype=np.int64)
    local, inverse = np.empty(mine.size, dtype=np.int64), np.empty(mine.size, dtype=np.int64)
    creation.sorted_unique(uniq, np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.int64))
    k = creation.local_unique(mine, n, local, inverse)
    local = local[:k]
    resident = np.empty(k, dtype=bool)
    creation.probe_rows(index, rows, uniq, local, 1, True, values, resident)
    out = np.empty((mine.size, _DIM), dtype=np.float32)
    new_rows = np.empty((n, width), dtype=np.float32)
    admitted, promoted = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    counts = np.empty(creation.N_COUNTS, dtype=np.int64)
    state = np.ones(1, dtype=np.float32)
    key = table_key("warm-up", 0)
    creation.settle_rows(
        uniq, local, values, found, resident, inverse, mine, out, True, np.full(2, 0.5), 0.9,
        key, 0, -1.0, 1.0, state, new_rows, admitted, promoted, counts,
    )  # fmt: skip
    ids, flags = np.zeros(8, dtype=np.uint64), np.zeros(8, dtype=np.uint8)
    free = np.arange(7, -1, -1, dtype=np.int64)
    creation.place_rows(
        index, rows, ids, flags, free, 8, uniq, values, found, 1, False, ON_DISK, DIRTY
    )


def _many(ids: U64, readonly: bool) -> None:
    """The kernels of calls spanning tables, on one stripe holding ``ids``."""
    stripe = RamStripe(8, _DIM)
    keys = np.unique(ids)
    hash_index.insert(stripe.index, keys, stripe.take_slots(keys.size), 1)
    table = np.array([stripe_row(stripe)], dtype=np.int64)
    n = ids.size
    bounds, zero = np.array([0, n], dtype=np.int64), np.zeros(1, dtype=np.int64)
    one, ticks, missed = (
        np.ones(1, dtype=np.int64),
        np.ones(1, dtype=np.int64),
        np.zeros(1, np.uint8),
    )
    out = np.empty((n, _DIM), dtype=np.float32)
    many_kernels.lookup_resident(ids, bounds, zero, zero, one, table, ticks, out, missed)
    seg_stripe, seg_bounds, seg_ids = (np.empty(k, dtype=np.int64) for k in (1, 2, 1))
    slots, sums = np.empty(n, dtype=np.int64), np.empty((n, _DIM), dtype=np.float32)
    rows, row_ids = np.empty((n, _DIM), dtype=np.float32), np.empty(n, dtype=np.uint64)
    many_kernels.update_resident(
        ids, bounds, zero, zero, one, table, ticks, _grads(n, readonly),
        missed, seg_stripe, seg_bounds, seg_ids, slots, sums, rows, row_ids,
    )  # fmt: skip
    if not readonly:
        many_kernels.scatter_segments(table, seg_stripe, seg_bounds, slots, rows, np.uint8(1))


def _grads(n: int, readonly: bool) -> F32:
    grads = np.ones((n, _DIM), dtype=np.float32)
    grads.flags.writeable = not readonly
    return grads


def _optimizers() -> list[Optimizer]:
    kinds = [OptimizerConfig(kind=kind) for kind in OptimizerKind]
    kinds.append(OptimizerConfig(kind=OptimizerKind.ADAGRAD, vectorwise_shared=True))
    return [Optimizer(config, _DIM, weight_bound=1.0) for config in kinds]


def _optimize(optimizer: Optimizer) -> None:
    """One update of two rows, one of them with a NaN gradient (the skipping path)."""
    rows = np.zeros((2, _DIM + optimizer.state_dim), dtype=np.float32)
    rows[:, _DIM:] = optimizer.initial_state(2)
    index: I64 = np.arange(2, dtype=np.int64)
    grads = np.ones((2, _DIM), dtype=np.float32)
    grads[1, 0] = np.nan
    optimizer.apply(rows, index, grads)
