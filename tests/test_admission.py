"""tinylfu admission of the RAM tier: the kernels, scan resistance against LRU, exact values under
both policies, and the ``eviction`` setting."""

from __future__ import annotations

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, Eviction, TableConfig
from embeddb.engine.shard import Shard
from embeddb.engine.storage import admission, hash_index
from embeddb.errors import ConfigError
from tests.conftest import MakeShard, sgd
from tests.test_storage import resident_ids

U64 = np.uint64


# ------------------------------------------------------------------------------------ kernels
def test_the_sketch_counts_each_lookup_and_halves_when_aged() -> None:
    sketch = np.zeros((4, admission.BLOCK), dtype=np.uint8)
    keys = np.array([7, 7, 7, 9], dtype=U64)
    added = admission.sketch_add(sketch, keys, 0, 1000)
    assert added == 4
    est = np.empty(3, dtype=np.uint8)
    admission.estimate(sketch, np.array([7, 9, 11], dtype=U64), est)
    assert est[0] >= 3 and est[1] >= 1  # count-min never under-counts
    assert est[2] <= 1  # 11 was never counted: only a collision could raise it
    admission.sketch_add(sketch, np.array([7] * 5, dtype=U64), 0, 4)  # aged after 4 adds
    admission.estimate(sketch, np.array([7], dtype=U64), est[:1])
    assert est[0] == (3 + 4) // 2 + 1


def test_the_sketch_saturates_instead_of_wrapping() -> None:
    sketch = np.zeros((1, admission.BLOCK), dtype=np.uint8)
    admission.sketch_add(sketch, np.full(600, 3, dtype=U64), 0, 10**9)
    est = np.empty(1, dtype=np.uint8)
    admission.estimate(sketch, np.array([3], dtype=U64), est)
    assert est[0] == 255


def test_choose_pairs_the_most_frequent_candidates_with_the_least_frequent_victims() -> None:
    cand = np.array([1, 9, 5, 2], dtype=np.uint8)
    victims = np.array([6, 1, 3], dtype=np.uint8)
    keep, window, evict = np.empty(4, bool), np.empty(4, bool), np.empty(3, bool)
    # one free slot: 9 takes it; then 5 > 1 and 2 < 3: one admitted; no window room
    n = admission.choose(cand, 1, victims, 0, keep, window, evict)
    assert n == 2 and keep.tolist() == [False, True, True, False]
    assert evict.tolist() == [False, True, False] and not window.any()
    # a window of one: the best rejected (2) enters too, evicting the next victim (3)
    n = admission.choose(cand, 1, victims, 1, keep, window, evict)
    assert n == 3 and keep.tolist() == [False, True, True, True]
    assert window.tolist() == [False, False, False, True]
    assert evict.tolist() == [False, True, True]


def test_ties_are_rejected_and_no_victim_means_no_admission() -> None:
    keep, window, evict = np.empty(2, bool), np.empty(2, bool), np.empty(2, bool)
    n = admission.choose(
        np.array([4, 4], np.uint8), 0, np.array([4, 4], np.uint8), 0, keep, window, evict
    )
    assert n == 0 and not keep.any() and not evict.any()
    n = admission.choose(
        np.array([4, 4], np.uint8), 0, np.empty(0, np.uint8), 5, keep, window, evict[:0]
    )
    assert n == 0 and not keep.any()


def test_a_cached_proposal_stays_valid_only_while_untouched_and_resident() -> None:
    index = hash_index.new_index(8)
    keys = np.array([3, 4, 5], dtype=U64)
    hash_index.insert(index, keys, np.arange(3, dtype=np.int64), 2)
    words = np.empty(3, dtype=U64)
    admission.bucket_words(index, keys, words)
    ok = np.empty(3, dtype=bool)
    admission.unchanged(index, keys, words, 3, ok)
    assert ok.all()
    admission.unchanged(index, keys, words, 2, ok)  # not older than the tick: not a victim
    assert not ok.any()
    hash_index.probe(index, keys[:1], 7, True, np.empty(1, np.int64))  # 3 looked up again
    hash_index.remove(index, keys[1:2], np.empty(1, np.int64))  # 4 deleted
    admission.unchanged(index, keys, words, 8, ok)
    assert ok.tolist() == [False, False, True]


# ------------------------------------------------------------------------------------ policy
def _hot_set_after_a_scan(make_shard: MakeShard, eviction: str) -> tuple[int, Shard]:
    """A full RAM tier of 80 rows, a hot set of 40 ids looked up 6 times, then a scan of 400
    one-off ids (5x the RAM tier), then the hot set again: how many hot lookups RAM answers."""
    shard = make_shard(capacity=80, stripes=1, eviction=eviction)
    shard.lookup("t", np.arange(500, 580, dtype=U64))  # fills RAM: counting starts
    hot = np.arange(40, dtype=U64)
    for _ in range(6):
        shard.lookup("t", hot)
    for start in range(1000, 1400, 20):
        shard.lookup("t", np.arange(start, start + 20, dtype=U64))
    before = shard.stats().tables["t"].ram_hits
    shard.lookup("t", hot)
    return shard.stats().tables["t"].ram_hits - before, shard


def test_tinylfu_keeps_the_hot_set_through_a_scan_that_flushes_lru(make_shard: MakeShard) -> None:
    lru_hits, _ = _hot_set_after_a_scan(make_shard, "lru")
    hits, shard = _hot_set_after_a_scan(make_shard, "tinylfu")
    assert lru_hits == 0  # the scan pushed every hot row out
    assert hits >= 38  # at most the 1-row window's displacements
    stats = shard.stats().tables["t"]
    assert stats.not_admitted > 0 and stats.ram_rows == 80


@pytest.mark.parametrize("eviction", ["lru", "tinylfu"])
def test_random_operations_keep_exact_values(make_shard: MakeShard, eviction: str) -> None:
    """Lookups (training and evaluation), updates, assigns and deletes on a small RAM tier,
    compared with a model of what every row must hold."""
    rng = np.random.default_rng(5)
    shard = make_shard(capacity=24, stripes=2, optimizer=sgd(0.5), eviction=eviction)
    model: dict[int, np.ndarray] = {}
    for step in range(60):
        batch = (rng.zipf(1.3, size=12) % 200).astype(U64)
        op = step % 5
        if op in (0, 1):
            got = shard.lookup("t", batch, train=True)
            for x, row in zip(batch.tolist(), got, strict=True):
                if x in model:
                    np.testing.assert_array_equal(row, model[x])
                model[x] = row.copy()
        elif op == 2:
            uniq = np.unique(batch)
            grads = rng.normal(size=(uniq.size, 4)).astype(np.float32)
            shard.apply_gradients("t", uniq, grads)
            for x, g in zip(uniq.tolist(), grads, strict=True):
                if x in model:
                    model[x] = model[x] - np.float32(0.5) * g
        elif op == 3:
            uniq = np.unique(batch)[:4]
            vectors = rng.normal(size=(uniq.size, 4)).astype(np.float32)
            shard.assign("t", uniq, vectors)
            model.update({x: v for x, v in zip(uniq.tolist(), vectors, strict=True)})
        else:
            gone = np.unique(batch)[:2]
            shard.delete("t", gone)
            for x in gone.tolist():
                model.pop(x, None)
        keys = np.array(sorted(model), dtype=U64)
        found, rows = shard.peek("t", keys)
        assert found.all()
        np.testing.assert_allclose(rows[:, :4], np.array([model[int(k)] for k in keys]), rtol=1e-6)
        got = shard.lookup("t", keys, train=False)
        np.testing.assert_array_equal(got, rows[:, :4])
        assert shard.stats().tables["t"].rows == len(model)
        assert len(resident_ids(shard)) <= 24


# ------------------------------------------------------------------------------------ setting
def test_eviction_is_validated_once_with_the_choices() -> None:
    assert TableConfig(name="t", dim=4).eviction is Eviction.LRU
    assert TableConfig(name="t", dim=4, eviction="tinylfu").eviction is Eviction.TINYLFU
    with pytest.raises(ConfigError, match=r"eviction.*'lfu'.*tinylfu, lru"):
        TableConfig(name="t", dim=4, eviction="lfu")


def test_eviction_is_a_table_setting_in_yaml() -> None:
    base = {"slots_config": {"a": {"dim": 4}, "b": {"dim": 4}}}
    tables = {"b": {"eviction": "tinylfu"}}
    config = EmbeddingConfig.from_dict({**base, "defaults": {"eviction": "lru"}, "tables": tables})
    assert config.tables["a"].eviction is Eviction.LRU
    assert config.tables["b"].eviction is Eviction.TINYLFU
    with pytest.raises(ConfigError, match="eviction"):
        EmbeddingConfig.from_dict({**base, "tables": {"a": {"eviction": "random"}}})


def test_a_lookup_spanning_tables_counts_its_resident_ids(make_shard: MakeShard) -> None:
    """A fully resident part of ``lookup_many`` is served by the fused kernel, not the table's
    lookup: it must still count, or tinylfu would see hot rows as cold."""
    shard = make_shard(capacity=16, stripes=1, eviction="tinylfu")
    shard.lookup("t", np.arange(20, dtype=U64))  # fills RAM: counting starts
    stripe = shard._tables["t"].stripes[0]
    assert stripe.sketch is not None and stripe.sketch.counting
    resident = np.array(sorted(resident_ids(shard))[:4], dtype=U64)
    before = stripe.sketch.frequencies(resident).astype(int)
    for _ in range(3):
        shard.lookup_many([("t", resident, True)])
    after = stripe.sketch.frequencies(resident).astype(int)
    assert (after - before >= 3).all()
