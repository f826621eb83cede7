"""Per-stripe parallelism of large calls: same answers as serial, errors after all work ends."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import OptimizerConfig, OptimizerKind, ParallelConfig
from embeddb.engine.shard import Shard
from embeddb.engine.storage.parallel import StripePool
from tests.conftest import one_table_config


def test_large_calls_run_on_two_threads_at_once() -> None:
    pool = StripePool(threads=2, min_ids=10)
    barrier = threading.Barrier(2, timeout=10)  # breaks unless two threads arrive together
    try:
        seen = pool.map(lambda x: (barrier.wait(), threading.get_ident(), x)[1:], [1, 2], ids=10)
        assert [x for _, x in seen] == [1, 2]  # results in item order
        assert len({ident for ident, _ in seen}) == 2
    finally:
        pool.close()


def test_small_calls_stay_on_the_calling_thread() -> None:
    pool = StripePool(threads=4, min_ids=100)
    try:
        idents = pool.map(lambda _: threading.get_ident(), range(8), ids=99)
        assert set(idents) == {threading.get_ident()}
    finally:
        pool.close()


def test_an_error_is_raised_after_every_stripe_finished() -> None:
    pool = StripePool(threads=2, min_ids=1)
    finished: list[int] = []
    release = threading.Event()

    def work(x: int) -> int:
        if x == 0:
            release.wait(10)
            finished.append(x)
            return x
        release.set()
        raise ValueError(f"stripe {x}")

    try:
        with pytest.raises(ValueError, match="stripe 1"):
            pool.map(work, [0, 1], ids=1)
        assert finished == [0]  # the slow stripe completed before map raised
    finally:
        pool.close()


def test_a_call_made_from_a_pool_thread_does_not_wait_for_that_thread() -> None:
    """A pool thread that maps again (a stripe's work reading the disk tier, which splits its
    multi-get over the same pool) finds no free pool thread: it must do the work itself rather
    than wait for a helper that only it could run."""
    pool = StripePool(threads=2, min_ids=1)
    barrier = threading.Barrier(2, timeout=10)  # both outer items run at once, one per thread
    outcome: list[object] = []

    def outer(x: int) -> list[int]:
        barrier.wait()
        return pool.map(lambda y: x * 10 + y, [1, 2], ids=1)

    def run() -> None:
        outcome.append(pool.map(outer, [1, 2], ids=1))

    caller = threading.Thread(target=run, daemon=True)
    try:
        caller.start()
        caller.join(30)  # a liveness bound, not a timing: it deadlocks or finishes in ms
        assert outcome == [[[11, 12], [21, 22]]]
    finally:
        if not caller.is_alive():
            pool.close()


def test_a_closed_pool_still_answers_on_the_calling_thread() -> None:
    pool = StripePool(threads=2, min_ids=1)
    pool.close()
    assert pool.map(lambda x: x * 2, [1, 2, 3], ids=5) == [2, 4, 6]


@pytest.mark.parametrize("kind", [OptimizerKind.SGD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM])
def test_parallel_shards_match_serial_ones_exactly(tmp_path: Path, kind: OptimizerKind) -> None:
    """The same calls, with spill (capacity below the id space), parallel against serial."""
    base = one_table_config(dim=8, capacity=600, stripes=8, optimizer=OptimizerConfig(kind=kind))
    shards = [
        Shard(
            replace(base, store=replace(base.store, parallel=ParallelConfig(threads=t, min_ids=1))),
            tmp_path / f"s{t}",
        )
        for t in (1, 2)
    ]
    rng = np.random.default_rng(3)
    try:
        for _ in range(12):
            batch = rng.integers(0, 1500, size=400).astype(np.uint64)
            grads = rng.standard_normal((batch.size, 8)).astype(np.float32)
            got = [s.lookup("t", batch, train=True) for s in shards]
            np.testing.assert_array_equal(got[0], got[1])
            results = [s.apply_gradients("t", batch, grads) for s in shards]
            assert results[0] == results[1]
        probe = np.arange(1500, dtype=np.uint64)
        found = [s.peek("t", probe) for s in shards]
        np.testing.assert_array_equal(found[0][0], found[1][0])
        np.testing.assert_array_equal(found[0][1], found[1][1])
        assert shards[0].stats().tables["t"].evicted == shards[1].stats().tables["t"].evicted
    finally:
        for s in shards:
            s.close()


def test_stripes_reading_large_disk_batches_on_pool_threads_match_serial(tmp_path: Path) -> None:
    """Each stripe's share of a gradient push reads more than the disk tier's parallel
    threshold from disk, on a pool thread: the nested split neither deadlocks nor changes a
    value."""
    base = one_table_config(dim=4, capacity=1000, stripes=2)
    shards = [
        Shard(
            replace(base, store=replace(base.store, parallel=ParallelConfig(threads=t, min_ids=1))),
            tmp_path / f"s{t}",
        )
        for t in (1, 2)
    ]
    batch = np.arange(20_000, dtype=np.uint64)
    grads = np.full((batch.size, 4), 0.5, dtype=np.float32)
    outcome: list[object] = []

    def run() -> None:
        for s in shards:
            s.lookup("t", batch, train=True)  # all but 1000 rows go to disk
        outcome.append([s.apply_gradients("t", batch, grads) for s in shards])
        outcome.append([s.peek("t", batch)[1] for s in shards])

    caller = threading.Thread(target=run, daemon=True)
    try:
        caller.start()
        caller.join(60)  # a liveness bound: a nested wait deadlocks forever
        assert len(outcome) == 2
        results, rows = outcome
        assert results[0] == results[1]  # type: ignore[index]
        np.testing.assert_array_equal(rows[0], rows[1])  # type: ignore[index]
    finally:
        if not caller.is_alive():
            for s in shards:
                s.close()
