"""The compiled open-addressing index, driven against a Python dict model.

The model maps ``id -> (slot, stamp)``. Keys are chosen so that many share a home bucket near the
end of a tiny table (16 or 32 buckets), so probe chains wrap around the table end and
backward-shift deletion has to move entries across the wrap. The layout is read back through
the documented bucket format ``[id | stamp << 32 | slot + 1]`` and checked for the linear-probing
invariant: every entry is reachable from its home bucket without crossing an empty bucket.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from embeddb.common.routing import STRIPE_SALT, mix64
from embeddb.engine.storage.hash_index import (
    BUCKET_SALT,
    collect_victims,
    dedup_sum,
    insert,
    lookup_gather,
    new_index,
    partition,
    probe,
    remove,
)

LOW32 = np.uint64(0xFFFFFFFF)
Model = dict[int, tuple[int, int]]  # id -> (slot, stamp)


# ---------------------------------------------------------------- helpers
def u64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def homes(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Home buckets as documented: ``mix64(id ^ BUCKET_SALT) & mask``."""
    return (mix64(keys, BUCKET_SALT) & np.uint64(buckets - 1)).astype(np.int64)


def home(key: int, buckets: int) -> int:
    return int(homes(u64([key]), buckets)[0])


def read_index(index: np.ndarray) -> dict[int, tuple[int, int]]:
    """``id -> (slot, stamp)`` decoded from the bucket array (asserting each id is stored once)."""
    out: dict[int, tuple[int, int]] = {}
    for b in np.flatnonzero(index[:, 1] != 0):
        key = int(index[b, 0])
        word = index[b, 1]
        assert key not in out, f"id {key} stored twice"
        out[key] = (int(word & LOW32) - 1, int(word >> np.uint64(32)))
    return out


def check_layout(index: np.ndarray, model: Model) -> None:
    """The index holds exactly the model, and every probe run from a home bucket is unbroken."""
    assert read_index(index) == model
    buckets = index.shape[0]
    occupied = index[:, 1] != 0
    where = np.flatnonzero(occupied)
    for b, h in zip(where.tolist(), homes(index[where, 0], buckets).tolist(), strict=True):
        run = [(h + d) % buckets for d in range((b - h) % buckets + 1)]
        assert occupied[run].all(), f"entry at bucket {b} unreachable from its home {h}"


def check_probe(index: np.ndarray, model: Model, keys: list[int]) -> None:
    """Probing (without touching) finds every model key's slot and nothing else."""
    before = index.copy()
    slots = np.full(len(keys), -99, dtype=np.int64)
    missing = probe(index, u64(keys), 0, False, slots)
    want = [model[k][0] if k in model else -1 for k in keys]
    assert slots.tolist() == want
    assert missing == sum(k not in model for k in keys)
    np.testing.assert_array_equal(index, before)  # touch=False changes nothing


def make_pool(buckets: int) -> list[int]:
    """Keys for a table of ``buckets``: most crowd the last two buckets, some go elsewhere."""
    rng = np.random.default_rng(buckets)
    candidates = np.concatenate(
        [
            np.arange(1, 5000, dtype=np.uint64),
            rng.integers(0, 2**64 - 1, size=5000, dtype=np.uint64, endpoint=True),
        ]
    )
    h = homes(candidates, buckets)
    crowd = candidates[h >= buckets - 2][:buckets]
    middle = candidates[h == buckets // 2][:4]
    spread = candidates[(h > 0) & (h < buckets - 2) & (h != buckets // 2)][: buckets // 2]
    pool = [*crowd.tolist(), *middle.tolist(), *spread.tolist(), 0, 2**64 - 1]
    assert len(set(pool)) == len(pool) > buckets  # more keys than the table can hold
    return pool


POOLS = {16: make_pool(16), 32: make_pool(32)}
TICKS = st.integers(0, 12)
DIM = 3


def gather_rows(max_slot: int) -> np.ndarray:
    """A row array whose every value names its slot and column (all exact in float32)."""
    width = DIM + 2  # extra state columns that must not be copied
    slots = np.arange(max_slot + 1, dtype=np.float32)[:, None]
    return slots * 16 + np.arange(width, dtype=np.float32)[None, :]


# ---------------------------------------------------------------- new_index
@pytest.mark.parametrize("capacity", [0, 1, 2, 7, 8, 9, 16, 17, 100, 1000])
def test_new_index_is_empty_with_a_power_of_two_of_at_least_twice_the_capacity(
    capacity: int,
) -> None:
    index = new_index(capacity)
    buckets = index.shape[0]
    assert index.dtype == np.uint64 and index.shape == (buckets, 2)
    assert not index.any()
    assert buckets & (buckets - 1) == 0
    assert buckets >= 2 * capacity
    assert buckets < max(16, 4 * capacity) + 1  # the next power of two, not more


# ---------------------------------------------------------------- model-based test
class IndexMachine(RuleBasedStateMachine):
    """Random insert / remove / probe / gather / victim sequences against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        self.index = np.zeros((0, 2), dtype=np.uint64)
        self.buckets = 0
        self.pool: list[int] = []
        self.model: Model = {}
        self.next_slot = 0

    @initialize(capacity=st.sampled_from([1, 8, 16]), data=st.data(), tick=TICKS)
    def start(self, capacity: int, data: st.DataObject, tick: int) -> None:
        self.index = new_index(capacity)
        self.buckets = self.index.shape[0]
        self.pool = POOLS[self.buckets]
        # start anywhere from empty to one bucket short of full, so long runs are common
        n = data.draw(st.sampled_from(range(self.buckets)), label="prefill")
        keys = data.draw(st.permutations(self.pool), label="prefill keys")[:n]
        self.next_slot = n
        insert(self.index, u64(keys), i64(list(range(n))), tick)
        self.model = {k: (i, tick) for i, k in enumerate(keys)}

    def keys(self, data: st.DataObject, max_size: int, label: str) -> list[int]:
        return data.draw(st.lists(st.sampled_from(self.pool), max_size=max_size), label=label)

    @precondition(lambda self: len(self.model) < self.buckets - 1)
    @rule(data=st.data(), tick=TICKS)
    def insert_absent(self, data: st.DataObject, tick: int) -> None:
        absent = [k for k in self.pool if k not in self.model]
        room = self.buckets - 1 - len(self.model)  # keep one bucket empty
        keys = data.draw(
            st.lists(st.sampled_from(absent), min_size=1, max_size=min(room, 6), unique=True),
            label="insert",
        )
        slots = list(range(self.next_slot, self.next_slot + len(keys)))
        self.next_slot += len(keys)
        insert(self.index, u64(keys), i64(slots), tick)
        for k, s in zip(keys, slots, strict=True):
            self.model[k] = (s, tick)

    @rule(data=st.data())
    def remove_some(self, data: st.DataObject) -> None:
        keys = self.keys(data, 6, "remove")
        if self.model:  # make sure present keys are removed too, not only pool draws
            present = st.lists(st.sampled_from(sorted(self.model)), max_size=4)
            keys += data.draw(present, label="remove present")
        freed = np.full(len(keys), -99, dtype=np.int64)
        removed = remove(self.index, u64(keys), freed)
        want = []
        for k in keys:
            slot = self.model.pop(k, (-1, 0))[0]
            want.append(slot)
        assert freed.tolist() == want
        assert removed == sum(s >= 0 for s in want)

    @rule(data=st.data(), touch=st.booleans(), tick=TICKS)
    def probe_some(self, data: st.DataObject, touch: bool, tick: int) -> None:
        keys = self.keys(data, 8, "probe")
        slots = np.full(len(keys), -99, dtype=np.int64)
        missing = probe(self.index, u64(keys), tick, touch, slots)
        assert slots.tolist() == [self.model[k][0] if k in self.model else -1 for k in keys]
        assert missing == sum(k not in self.model for k in keys)
        if touch:
            for k in keys:
                if k in self.model:
                    self.model[k] = (self.model[k][0], tick)

    @rule(data=st.data(), touch=st.booleans(), tick=TICKS)
    def gather_some(self, data: st.DataObject, touch: bool, tick: int) -> None:
        keys = self.keys(data, 8, "gather")
        n = len(keys)
        positions = data.draw(st.permutations(range(n + 2)), label="positions")[:n]
        rows = gather_rows(self.next_slot)
        out = np.full((n + 2, DIM), -7.0, dtype=np.float32)
        miss = np.full(n + 1, -99, dtype=np.int64)
        n_miss = lookup_gather(self.index, rows, u64(keys), i64(positions), out, tick, touch, miss)
        want_miss = [i for i, k in enumerate(keys) if k not in self.model]
        assert n_miss == len(want_miss)
        assert miss[:n_miss].tolist() == want_miss
        assert (miss[n_miss:] == -99).all()
        want = np.full((n + 2, DIM), -7.0, dtype=np.float32)
        for i, k in enumerate(keys):
            if k in self.model:
                want[positions[i]] = rows[self.model[k][0], :DIM]
        np.testing.assert_array_equal(out, want)
        if touch:
            for k in keys:
                if k in self.model:
                    self.model[k] = (self.model[k][0], tick)

    @rule(count=st.integers(-1, 34), below=st.integers(0, 14), evict=st.booleans())
    def victims(self, count: int, below: int, evict: bool) -> None:
        chosen = check_victims(self.index, self.model, count, below)
        if evict and chosen:
            freed = np.empty(len(chosen), dtype=np.int64)
            assert remove(self.index, u64(chosen), freed) == len(chosen)
            assert freed.tolist() == [self.model.pop(k)[0] for k in chosen]

    @invariant()
    def index_matches_model(self) -> None:
        if self.buckets == 0:
            return
        check_layout(self.index, self.model)
        check_probe(self.index, self.model, self.pool)


def check_victims(index: np.ndarray, model: Model, count: int, below: int) -> list[int]:
    """Run collect_victims and check its answer against the model; return the chosen ids."""
    before = index.copy()
    extra = 3
    keys_out = np.full(max(count, 0) + extra, 12345, dtype=np.uint64)
    slots_out = np.full(max(count, 0) + extra, -99, dtype=np.int64)
    n = collect_victims(index, count, below, keys_out, slots_out)
    np.testing.assert_array_equal(index, before)  # choosing victims changes nothing

    eligible = {k: stamp for k, (_, stamp) in model.items() if stamp < below}
    assert n == min(max(count, 0), len(eligible))
    assert (keys_out[n:] == 12345).all() and (slots_out[n:] == -99).all()
    chosen = [int(k) for k in keys_out[:n]]
    assert len(set(chosen)) == n
    for k, s in zip(chosen, slots_out[:n].tolist(), strict=True):
        assert k in eligible  # present and stamped before `below`
        assert s == model[k][0]
    unchosen = set(eligible) - set(chosen)
    if chosen and unchosen:
        oldest_left = min(eligible[k] for k in unchosen)
        newest_taken = max(eligible[k] for k in chosen)
        assert newest_taken <= oldest_left
        # ties at the threshold stamp go in bucket order
        order = [int(k) for k in index[index[:, 1] != 0, 0]]
        tied = [k for k in order if eligible.get(k) == newest_taken]
        taken = [k for k in tied if k in chosen]
        assert taken == tied[: len(taken)]
    return chosen


TestIndexAgainstModel = IndexMachine.TestCase
TestIndexAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIndexAgainstModel.pytestmark = [pytest.mark.slow]


# ---------------------------------------------------------------- deterministic wrap-around
def wrapped_keys(buckets: int, n: int) -> list[int]:
    """``n`` keys whose home is one of the last two buckets (their run must wrap)."""
    pool = POOLS[buckets]
    keys = [k for k in pool if home(k, buckets) >= buckets - 2][:n]
    assert len(keys) == n
    return keys


def test_probe_runs_wrap_around_the_table_end() -> None:
    index = new_index(8)
    buckets = index.shape[0]
    keys = wrapped_keys(buckets, 10)
    insert(index, u64(keys), i64(list(range(10))), 1)
    model = {k: (i, 1) for i, k in enumerate(keys)}
    check_layout(index, model)
    # ten keys from buckets 14-15 occupy 14, 15 and then 0..7
    occupied = np.flatnonzero(index[:, 1] != 0).tolist()
    assert occupied == [0, 1, 2, 3, 4, 5, 6, 7, buckets - 2, buckets - 1]
    check_probe(index, model, POOLS[buckets])


def test_removing_any_entry_of_a_wrapped_run_keeps_the_rest_reachable() -> None:
    buckets = new_index(8).shape[0]
    keys = wrapped_keys(buckets, 12)
    others = [k for k in POOLS[buckets] if k not in keys][:2]
    keys = [*keys[:6], *others, *keys[6:]]  # two foreign keys inserted mid-way
    base = {k: (i, i) for i, k in enumerate(keys)}

    def fresh() -> np.ndarray:
        index = new_index(8)
        insert(index, u64(keys), i64(list(range(len(keys)))), 0)
        # restamp each entry so stamps are distinct (probe with touch)
        for i, k in enumerate(keys):
            probe(index, u64([k]), i, True, np.empty(1, dtype=np.int64))
        check_layout(index, base)
        return index

    for k in keys:  # every single removal
        index = fresh()
        freed = np.empty(1, dtype=np.int64)
        assert remove(index, u64([k]), freed) == 1
        assert freed[0] == base[k][0]
        model = {key: v for key, v in base.items() if key != k}
        check_layout(index, model)
        check_probe(index, model, POOLS[buckets])

    rng = np.random.default_rng(5)
    for _ in range(30):  # whole random removal orders, checked after every step
        index = fresh()
        model = dict(base)
        for k in rng.permutation(np.array(keys, dtype=np.uint64)).tolist():
            freed = np.empty(2, dtype=np.int64)
            assert remove(index, u64([k, k]), freed) == 1  # the repeat finds nothing
            assert freed.tolist() == [model.pop(k)[0], -1]
            check_layout(index, model)
            check_probe(index, model, POOLS[buckets])
        assert not index[:, 1].any()


# ---------------------------------------------------------------- touch and recency
def three_entries() -> tuple[np.ndarray, list[int]]:
    index = new_index(8)
    keys = POOLS[16][:3]
    for i, k in enumerate(keys):
        insert(index, u64([k]), i64([10 + i]), i + 1)  # stamps 1, 2, 3
    return index, keys


def oldest(index: np.ndarray, below: int = 1000) -> list[int]:
    keys_out = np.empty(3, dtype=np.uint64)
    slots_out = np.empty(3, dtype=np.int64)
    n = collect_victims(index, 3, below, keys_out, slots_out)
    stamps = read_index(index)
    chosen = [int(k) for k in keys_out[:n]]
    return sorted(chosen, key=lambda k: stamps[k][1])


def victim(index: np.ndarray) -> int:
    keys_out = np.empty(1, dtype=np.uint64)
    slots_out = np.empty(1, dtype=np.int64)
    assert collect_victims(index, 1, 1000, keys_out, slots_out) == 1
    return int(keys_out[0])


def test_gather_touch_refreshes_recency_and_no_touch_does_not() -> None:
    index, (a, b, c) = three_entries()
    assert victim(index) == a
    rows = gather_rows(12)
    out = np.empty((1, DIM), dtype=np.float32)
    miss = np.empty(1, dtype=np.int64)
    lookup_gather(index, rows, u64([a]), i64([0]), out, 50, False, miss)
    assert victim(index) == a  # a read without touch leaves a the oldest
    assert read_index(index)[a] == (10, 1)
    lookup_gather(index, rows, u64([a]), i64([0]), out, 50, True, miss)
    assert victim(index) == b  # a is now the newest
    assert read_index(index)[a] == (10, 50)
    np.testing.assert_array_equal(out[0], rows[10, :DIM])
    lookup_gather(index, rows, u64([b]), i64([0]), out, 60, True, miss)
    assert victim(index) == c
    assert oldest(index) == [c, a, b]


@pytest.mark.parametrize("touch", [False, True])
def test_gather_over_many_blocks_matches_probe(touch: bool) -> None:
    """lookup_gather works in blocks of ids (loads, probes, copies): across block edges,
    with duplicates, misses and crowded runs, it must answer what ``probe`` answers."""
    rng = np.random.default_rng(7)
    index = new_index(300)
    present = rng.choice(1 << 40, size=300, replace=False).astype(np.uint64)
    insert(index, present, np.arange(300, dtype=np.int64), 1)
    absent = rng.choice(1 << 40, size=80).astype(np.uint64) | np.uint64(1 << 41)
    keys = np.concatenate([present[rng.integers(0, 300, size=170)], absent])
    rng.shuffle(keys)  # 250 ids: 7 full blocks and a partial one, repeats included
    positions = rng.permutation(keys.size + 5)[: keys.size].astype(np.int64)
    rows = gather_rows(300)
    expected_slots = np.empty(keys.size, dtype=np.int64)
    probe(index.copy(), keys, 9, False, expected_slots)

    out = np.full((keys.size + 5, DIM), -7.0, dtype=np.float32)
    miss = np.full(keys.size, -99, dtype=np.int64)
    n_miss = lookup_gather(index, rows, keys, positions, out, 9, touch, miss)

    assert miss[:n_miss].tolist() == np.flatnonzero(expected_slots < 0).tolist()
    want = np.full_like(out, -7.0)
    hit = expected_slots >= 0
    want[positions[hit]] = rows[expected_slots[hit], :DIM]
    np.testing.assert_array_equal(out, want)
    stamps = {k: stamp for k, (_, stamp) in read_index(index).items()}
    touched = {int(k) for k in keys[hit]}
    assert all(stamps[k] == (9 if touch and k in touched else 1) for k in map(int, present))


def test_probe_touch_refreshes_recency_and_no_touch_does_not() -> None:
    index, (a, b, c) = three_entries()
    slots = np.empty(2, dtype=np.int64)
    probe(index, u64([a, b]), 70, False, slots)
    assert slots.tolist() == [10, 11]
    assert oldest(index) == [a, b, c]
    probe(index, u64([b, a]), 70, True, slots)
    assert slots.tolist() == [11, 10]
    assert victim(index) == c
    # a and b now carry stamp 70: only entries stamped before `below` are eligible
    assert oldest(index, below=70) == [c]
    assert set(oldest(index, below=71)) == {a, b, c}
    assert read_index(index) == {a: (10, 70), b: (11, 70), c: (12, 3)}


def test_collect_victims_edge_cases() -> None:
    index = new_index(8)
    keys_out = np.empty(4, dtype=np.uint64)
    slots_out = np.empty(4, dtype=np.int64)
    assert collect_victims(index, 4, 100, keys_out, slots_out) == 0  # empty index
    keys = POOLS[16][:5]
    insert(index, u64(keys), i64([0, 1, 2, 3, 4]), 5)
    assert collect_victims(index, 0, 100, keys_out, slots_out) == 0  # count 0
    assert collect_victims(index, 4, 5, keys_out, slots_out) == 0  # nothing stamped before 5
    assert collect_victims(index, 4, 0, keys_out, slots_out) == 0
    assert collect_victims(index, 4, 6, keys_out, slots_out) == 4
    assert len(set(keys_out.tolist())) == 4 and set(keys_out.tolist()) <= set(keys)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 6), min_size=0, max_size=15),
    count=st.integers(0, 16),
    below=st.integers(0, 8),
)
def test_collect_victims_picks_the_oldest_eligible(
    stamps: list[int], count: int, below: int
) -> None:
    index = new_index(8)
    keys = POOLS[16][: len(stamps)]
    model: Model = {}
    for i, (k, s) in enumerate(zip(keys, stamps, strict=True)):
        insert(index, u64([k]), i64([i]), s)
        model[k] = (i, s)
    check_layout(index, model)
    check_victims(index, model, count, below)


# ---------------------------------------------------------------- dedup_sum
def reference_dedup(
    slots: list[int], grads: np.ndarray, rows_of: list[int]
) -> tuple[list[int], list[list[int]]]:
    """Distinct non-negative slots in first-appearance order and their summed gradient rows."""
    sums: OrderedDict[int, list[int]] = OrderedDict()
    for s, r in zip(slots, rows_of, strict=True):
        if s < 0:
            continue
        g = [int(v) for v in grads[r]]
        sums[s] = [a + b for a, b in zip(sums[s], g, strict=True)] if s in sums else g
    return list(sums), list(sums.values())


def run_dedup(
    slots: list[int], grads: np.ndarray, rows_of: list[int], scratch: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray]:
    n = len(slots)
    uniq = np.full(n, -99, dtype=np.int64)
    sums = np.full((n, grads.shape[1]), 1e9, dtype=np.float32)
    k = dedup_sum(i64(slots), grads, i64(rows_of), scratch, uniq, sums)
    assert (uniq[k:] == -99).all() and (sums[k:] == 1e9).all()  # nothing written past k
    return k, uniq[:k], sums[:k]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    slots=st.lists(st.integers(-3, 9), max_size=40),
    dim=st.integers(1, 4),
    n_grads=st.integers(1, 12),
    identity=st.booleans(),
)
def test_dedup_sum_sums_duplicates_in_first_appearance_order(
    data: st.DataObject, slots: list[int], dim: int, n_grads: int, identity: bool
) -> None:
    n = len(slots)
    if identity:  # the gradient of slots[i] is grads[i]
        n_grads, rows_of = n, list(range(n))
    else:  # gradients read through an arbitrary row map (repeats allowed)
        rows_of = data.draw(st.lists(st.integers(0, n_grads - 1), min_size=n, max_size=n))
    flat = data.draw(st.lists(st.integers(-64, 64), min_size=n_grads * dim, max_size=n_grads * dim))
    grads = np.array(flat, dtype=np.float32).reshape(n_grads, dim)  # small ints: exact sums
    before = grads.copy()
    scratch = np.full(10, -1, dtype=np.int64)
    want_slots, want_sums = reference_dedup(slots, grads, rows_of)
    for _ in range(2):  # a second call reuses the restored scratch
        k, uniq, sums = run_dedup(slots, grads, rows_of, scratch)
        assert k == len(want_slots)
        assert uniq.tolist() == want_slots
        np.testing.assert_array_equal(sums, np.array(want_sums, dtype=np.float32).reshape(k, dim))
        assert (scratch == -1).all()
    np.testing.assert_array_equal(grads, before)  # gradients are read in place, not modified


def test_dedup_sum_worked_example() -> None:
    slots = [4, -1, 2, 4, 7, 2, 4, -5]
    grads = np.array(
        [[1, 2], [100, 100], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [50, 50]], dtype=np.float32
    )
    scratch = np.full(8, -1, dtype=np.int64)
    k, uniq, sums = run_dedup(slots, grads, list(range(8)), scratch)
    assert k == 3
    assert uniq.tolist() == [4, 2, 7]
    assert sums.tolist() == [[1 + 5 + 11, 2 + 6 + 12], [3 + 9, 4 + 10], [7, 8]]
    assert (scratch == -1).all()
    # the same slots reading their gradients through a reversed row map
    k, uniq, sums = run_dedup(slots, grads, list(range(7, -1, -1)), scratch)
    assert uniq.tolist() == [4, 2, 7]
    # slot 4 reads rows 7, 4, 1; slot 2 reads rows 5, 2; slot 7 reads row 3
    assert sums.tolist() == [[50 + 7 + 100, 50 + 8 + 100], [9 + 3, 10 + 4], [5, 6]]
    assert (scratch == -1).all()


def test_dedup_sum_of_only_skipped_slots() -> None:
    scratch = np.full(4, -1, dtype=np.int64)
    grads = np.ones((3, 2), dtype=np.float32)
    k, _, _ = run_dedup([-1, -1, -2], grads, [0, 1, 2], scratch)
    assert k == 0
    assert (scratch == -1).all()


@pytest.mark.slow
@given(
    keys=st.lists(st.integers(0, 2**64 - 1), max_size=300),
    log_stripes=st.integers(1, 6),  # one stripe never partitions (a shift by 64 is undefined)
)
def test_partition_groups_ids_by_stripe_stably(keys: list[int], log_stripes: int) -> None:
    n_stripes = 1 << log_stripes
    ids = np.array(keys, dtype=np.uint64)
    order = np.empty(ids.size, dtype=np.int64)
    grouped = np.empty(ids.size, dtype=np.uint64)
    bounds = np.empty(n_stripes + 1, dtype=np.int64)
    shift = 64 - log_stripes
    partition(ids, shift, n_stripes, order, grouped, bounds)
    stripe = mix64(ids, STRIPE_SALT) >> np.uint64(shift)
    assert sorted(order.tolist()) == list(range(ids.size))
    np.testing.assert_array_equal(grouped, ids[order])
    assert bounds[0] == 0 and bounds[-1] == ids.size
    for s in range(n_stripes):
        segment = order[bounds[s] : bounds[s + 1]]
        assert np.all(stripe[segment] == s)
        assert np.all(np.diff(segment) > 0)  # original relative order kept


@pytest.mark.slow
@given(
    stamps=st.lists(st.integers(0, 2**32 - 3), min_size=1, max_size=60),
    count=st.integers(1, 70),
)
def test_collect_victims_with_stamps_far_apart(stamps: list[int], count: int) -> None:
    """Ages beyond the 2**16-bin histogram take the exact fallback; the choice stays LRU."""
    index = new_index(len(stamps))
    keys = np.arange(len(stamps), dtype=np.uint64) * np.uint64(7919)
    for k, stamp in enumerate(stamps):
        insert(index, keys[k : k + 1], np.array([k], dtype=np.int64), stamp)
    below = 2**32 - 2
    out_keys = np.empty(count, dtype=np.uint64)
    out_slots = np.empty(count, dtype=np.int64)
    n = collect_victims(index, count, below, out_keys, out_slots)
    assert n == min(count, len(stamps))
    chosen = sorted(stamps[int(s)] for s in out_slots[:n])
    assert chosen == sorted(stamps)[:n]  # exactly the n oldest stamps (as a multiset)
    np.testing.assert_array_equal(out_keys[:n], keys[out_slots[:n]])
