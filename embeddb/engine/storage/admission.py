"""Frequency-aware admission to a RAM stripe (``eviction: tinylfu``, W-TinyLFU style).

Exact LRU (``eviction: lru``) evicts the least recently used rows for whatever misses: a scan of
one-off ids, or the long tail of a Zipf workload, pushes out rows that are looked up far more
often. With ``tinylfu`` a full stripe admits a candidate row (a disk row to promote, a created
or assigned row) only if it is looked up more often than the row it would evict:

* **frequency sketch** — a count-min sketch of recent training lookups per stripe: blocks of
  ``BLOCK`` (64) uint8 counters, one cache line each, 16 counters per RAM slot (the block count
  rounded up to a power of two), so 16 to 32 bytes per RAM row (a dim-16 Adagrad row is 128
  bytes, its index entry 32). One 64-bit mix of an id picks its block and ``DEPTH`` (4)
  counters in it, one per 16-counter segment (Caffeine's layout: one cache miss per id, not
  four); a training lookup adds one to each (saturating at 255), and the estimate is the least
  of them. After every
  ``AGING_FACTOR * capacity`` (100x) increments every counter is halved, so the sketch follows
  recent popularity. Both sizes were chosen on the spill benchmark (Zipf 1.05, 2M ids over
  200K rows): at 10x aging, or at 100x with a sketch 1x the capacity wide, the ids near the
  hot-set boundary (a few lookups per aging period) drown in collision noise and disk share
  stays near LRU's. Counting starts when the stripe first fills: before, every miss gets a
  slot and no frequency is needed (a table that fits in RAM pays nothing).
* **admission** (:func:`choose`) — the candidates of one call, most frequent first, take the
  free slots, then are paired with the victims the LRU search proposes
  (:func:`~embeddb.engine.storage.hash_index.collect_victims`), least frequent first: the
  ``i``-th candidate is admitted, evicting its victim, only if its estimate is strictly higher.
  Victims that survive are re-stamped (the next search considers other rows: a CLOCK-like sweep
  over the LRU order), so a once-frequent row that is no longer looked up is reconsidered once
  per sweep and leaves when aging has brought its count below a candidate's. One search
  proposes at least ``eviction_chunk`` rows; the ones a call does not use serve the next calls
  while their index word (stamp and slot) is unchanged (:func:`unchanged`), so the
  ``O(capacity)`` search runs about as often as LRU's.
* **window** — up to ``WINDOW_FRACTION`` (1%) of the stripe's capacity holds rows admitted
  without beating a victim (flag ``WINDOW``): the most frequent rejected candidates, each
  evicting the least frequent surviving victim. This gives a new id the chance to be looked up
  again before it must compete: a window row loses its flag when the sweep first proposes it,
  and from then on it competes by frequency like any other row. A scan of one-off ids can thus
  displace at most 1% of the stripe per sweep.

A rejected candidate is served from the disk tier without promotion (a disk row read by the
lookup is returned, not made resident; a created or assigned row is written to the disk tier,
as an overflowing row is). Values are never affected, only where rows live. Every kernel is
``numba.njit(nogil=True)``: callers hold the stripe's lock, not the GIL.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from embeddb.common._routing_kernel import mix as _mix
from embeddb.common.arrays import U64
from embeddb.config.ram_budget import SKETCH_BLOCK, sketch_bytes
from embeddb.engine.storage.hash_index import _home

__all__ = [
    "AGING_FACTOR",
    "BLOCK",
    "DEPTH",
    "WINDOW_FRACTION",
    "FrequencySketch",
    "bucket_words",
    "choose",
    "estimate",
    "restamp",
    "sketch_add",
    "unchanged",
]

DEPTH = 4
BLOCK = SKETCH_BLOCK  # counters per block: one cache line
_SEGMENT = BLOCK // DEPTH  # counter d of an id lies in the d-th 16-counter segment of its block
AGING_FACTOR = 100
WINDOW_FRACTION = 0.01
_SKETCH_SALT = np.uint64(0x9E3779B97F4A7C15)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_MAX = np.uint8(255)


@numba.njit(nogil=True, cache=True, inline="always")
def _block(key, mask):
    """The sketch block (row of ``BLOCK`` counters) of ``key`` and the hash that places its
    ``DEPTH`` counters in it: counter ``d`` is ``d * 16 + (h >> 4 d) & 15``."""
    h = _mix(key ^ _SKETCH_SALT)
    return np.int64((h >> _S32) & mask), h


@numba.njit(nogil=True, cache=True)
def sketch_add(sketch, ids, added, sample):
    """Add one to the counters of every id of ``ids`` (duplicates count each time); after every
    ``sample`` increments (``added`` so far) halve every counter. Returns the new ``added``."""
    mask = np.uint64(sketch.shape[0] - 1)
    for i in range(ids.size):
        b, h = _block(ids[i], mask)
        for d in range(DEPTH):
            col = d * _SEGMENT + np.int64((h >> np.uint64(4 * d)) & np.uint64(_SEGMENT - 1))
            v = sketch[b, col]
            if v < _MAX:
                sketch[b, col] = v + np.uint8(1)
        added += 1
        if added >= sample:
            added = 0
            for r in range(sketch.shape[0]):
                for col in range(sketch.shape[1]):
                    sketch[r, col] >>= np.uint8(1)
    return added


@numba.njit(nogil=True, cache=True)
def estimate(sketch, ids, out):
    """``out[i]`` = the estimated recent lookups of ``ids[i]`` (the least of its counters)."""
    mask = np.uint64(sketch.shape[0] - 1)
    for i in range(ids.size):
        b, h = _block(ids[i], mask)
        best = _MAX
        for d in range(DEPTH):
            col = d * _SEGMENT + np.int64((h >> np.uint64(4 * d)) & np.uint64(_SEGMENT - 1))
            v = sketch[b, col]
            if v < best:
                best = v
        out[i] = best


@numba.njit(nogil=True, cache=True)
def choose(cand_freq, n_free, victim_freq, room, admit_out, window_out, evict_out):
    """Decide one call's admissions (see the module docstring).

    Candidates, most frequent first (ties: input order), take the ``n_free`` free slots; the
    rest are paired with the victims, least frequent first: the ``j``-th is admitted (its
    victim evicted) iff its frequency is strictly higher. Then up to ``room`` rejected
    candidates, most frequent first, are admitted into the window, each evicting the least
    frequent victim still kept. Writes boolean ``admit_out`` (every admitted candidate),
    ``window_out`` (those admitted into the window) and ``evict_out`` (victims to evict).

    Returns:
        The number of admitted candidates.
    """
    k = cand_freq.size
    n = victim_freq.size
    corder = np.argsort(-cand_freq.astype(np.int64), kind="mergesort")
    vorder = np.argsort(victim_freq, kind="mergesort")
    for i in range(k):
        admit_out[i] = False
        window_out[i] = False
    for j in range(n):
        evict_out[j] = False
    take = min(n_free, k)
    for r in range(take):
        admit_out[corder[r]] = True
    admitted = take
    v = 0  # victims are consumed in ascending frequency
    r = take
    while r < k and v < n and cand_freq[corder[r]] > victim_freq[vorder[v]]:
        admit_out[corder[r]] = True
        evict_out[vorder[v]] = True
        admitted += 1
        r += 1
        v += 1
    while r < k and v < n and room > 0:  # the window: the best rejected, unconditionally
        admit_out[corder[r]] = True
        window_out[corder[r]] = True
        evict_out[vorder[v]] = True
        admitted += 1
        room -= 1
        r += 1
        v += 1
    return admitted


@numba.njit(nogil=True, cache=True)
def restamp(index, keys, tick):
    """Give the resident ``keys`` the stamp ``tick`` (the survivors of a sweep)."""
    mask = np.uint64(index.shape[0] - 1)
    stamp = np.uint64(tick) << _S32
    for k in range(keys.size):
        key = keys[k]
        b = _home(key, mask)
        while index[b, 1] != 0:
            if index[b, 0] == key:
                index[b, 1] = stamp | (index[b, 1] & _LOW32)
                break
            b = (b + _ONE) & mask


@numba.njit(nogil=True, cache=True)
def bucket_words(index, keys, out):
    """``out[k]`` = the stamp-and-slot word of resident ``keys[k]`` (0 if absent)."""
    mask = np.uint64(index.shape[0] - 1)
    for k in range(keys.size):
        key = keys[k]
        b = _home(key, mask)
        out[k] = 0
        while index[b, 1] != 0:
            if index[b, 0] == key:
                out[k] = index[b, 1]
                break
            b = (b + _ONE) & mask


@numba.njit(nogil=True, cache=True)
def unchanged(index, keys, words, tick, out):
    """``out[k]``: ``keys[k]`` is still resident in the same slot, untouched since its word was
    ``words[k]``, and older than ``tick`` (a cached proposal that is still a valid victim)."""
    mask = np.uint64(index.shape[0] - 1)
    limit = np.uint64(tick)
    for k in range(keys.size):
        key = keys[k]
        b = _home(key, mask)
        out[k] = False
        while index[b, 1] != 0:
            if index[b, 0] == key:
                v = index[b, 1]
                out[k] = v == words[k] and (v >> _S32) < limit
                break
            b = (b + _ONE) & mask


class FrequencySketch:
    """The count-min sketch of one stripe (its lock held by every caller).

    Args:
        capacity: the stripe's slots; sets the size (16 counters per slot, rounded up to a
            power of two of blocks) and the aging sample.
    """

    def __init__(self, capacity: int) -> None:
        blocks = sketch_bytes(capacity) // BLOCK
        self.table: npt.NDArray[np.uint8] = np.zeros((blocks, BLOCK), dtype=np.uint8)
        self.sample = AGING_FACTOR * max(capacity, 1)
        self.window = max(1, int(capacity * WINDOW_FRACTION))
        self.added = 0
        self.counting = False  # set when the stripe first fills
        # Victims proposed by the last LRU search and not used yet, with their index words
        # (stamp and slot): valid while unchanged, so one O(capacity) search serves several
        # calls, as LRU's eviction chunk does.
        self.proposals: tuple[U64, npt.NDArray[np.int64], U64] = (
            np.empty(0, np.uint64),
            np.empty(0, np.int64),
            np.empty(0, np.uint64),
        )

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def add(self, ids: U64) -> None:
        """Count one lookup of each of ``ids`` (once counting started)."""
        if self.counting and ids.size:
            self.added = int(sketch_add(self.table, ids, self.added, self.sample))

    def frequencies(self, ids: U64) -> npt.NDArray[np.uint8]:
        out = np.empty(ids.size, dtype=np.uint8)
        estimate(self.table, ids, out)
        return out
