"""A snapshot's capture of the RAM tier costs what the table holds, not its capacity
(embeddb.engine.storage.capture): its buffers are O(resident rows), a sparse table of a large
capacity restores exactly, and rows created between sizing the buffers and taking the locks are
in the snapshot whose seq covers them."""

from __future__ import annotations

import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.shard import Shard
from embeddb.engine.storage import capture, hash_index
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK, RamStripe
from tests.conftest import one_table_config

WIDTH = 8


def filled_stripe(capacity: int, n: int, seed: int = 0) -> RamStripe:
    """A stripe of ``capacity`` slots holding ``n`` rows (some flagged on disk)."""
    rng = np.random.default_rng(seed)
    stripe = RamStripe(capacity, WIDTH)
    ids = rng.choice(1 << 40, size=n, replace=False).astype(np.uint64)
    rows = rng.standard_normal((n, WIDTH)).astype(np.float32)
    on_disk = rng.random(n) < 0.5
    stripe.place(ids, rows, on_disk, stripe.next_tick(), dirty=False)
    return stripe


def by_id(got: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[int, tuple[bytes, int]]:
    ids, rows, flags = got
    return {int(i): (r.tobytes(), int(f)) for i, r, f in zip(ids, rows, flags, strict=True)}


def test_a_capture_allocates_for_the_resident_rows_not_the_capacity() -> None:
    stripe = filled_stripe(1 << 18, 2000)
    full = stripe.rows.nbytes + stripe.ids.nbytes + stripe.flags.nbytes  # ~9 MB
    tracemalloc.start()
    try:
        ids, rows, flags = capture.capture_ram([stripe])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ids.size == rows.shape[0] == flags.size == 2000
    assert peak < full // 20  # before: a buffer of the full capacity (peak > full)


def test_a_capture_holds_exactly_the_resident_rows() -> None:
    stripes = [filled_stripe(4096, n, seed=k) for k, n in enumerate([0, 1, 700, 4096])]
    occupied = np.flatnonzero(stripes[2].flags)[:50]  # free 50 rows: zeroed flags
    slots = np.empty(occupied.size, np.int64)
    hash_index.remove(stripes[2].index, stripes[2].ids[occupied], slots)
    stripes[2].release_slots(slots)
    got = by_id(capture.capture_ram(stripes))
    want: dict[int, tuple[bytes, int]] = {}
    for s in stripes:
        occupied = np.flatnonzero(s.flags)
        want |= by_id((s.ids[occupied], s.rows[occupied], s.flags[occupied]))
    assert got == want
    assert len(got) == 0 + 1 + 650 + 4096
    assert {f for _, f in got.values()} <= {int(DIRTY), int(ON_DISK), int(DIRTY | ON_DISK)}


def test_rows_created_after_the_buffers_are_sized_are_captured() -> None:
    """The buffers are sized from the live count before the locks; a stripe that grew past
    their slack meanwhile still has all its rows captured."""
    stripe = filled_stripe(1 << 14, 10)
    bufs = capture.capture_buffers([stripe])
    room = bufs[0].rows.shape[0]
    more = np.arange(1, 5001, dtype=np.uint64) + np.uint64(1 << 41)
    stripe.place(
        more, np.ones((more.size, WIDTH), np.float32), np.zeros(more.size, bool), 2, dirty=True
    )
    assert stripe.size > room
    capture.capture_into([stripe], bufs)
    ids, rows, _ = capture.captured(bufs)
    assert ids.size == 5010 and set(more.tolist()) <= set(ids.tolist())
    assert np.all(rows[np.isin(ids, more)] == 1.0)


def config(capacity: int) -> EmbeddingConfig:
    return one_table_config(
        dim=4, capacity=capacity, stripes=4, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )


def test_a_sparse_table_of_a_large_capacity_restores_exactly(tmp_path: Path) -> None:
    cfg = config(1 << 17)
    ids = np.arange(0, 30000, 7, dtype=np.uint64)
    with Shard(cfg, tmp_path / "s") as shard:
        shard.lookup("t", ids)
        shard.apply_gradients("t", ids[::2], np.ones((ids[::2].size, 4), np.float32))
        shard.delete("t", ids[:100])
        result = shard.snapshot("sparse")
        at_snapshot = shard.peek("t", ids)
        shard.assign("t", ids[100:200], np.full((100, 4), 9.0, np.float32))  # after: not in it
    with Shard(cfg, tmp_path / "s", restore="sparse") as restored:
        assert restored.seq == result.info.seq
        got = restored.peek("t", ids)
        np.testing.assert_array_equal(got[0], at_snapshot[0])
        np.testing.assert_array_equal(got[1], at_snapshot[1])
        assert restored.stats().tables["t"].rows == int(at_snapshot[0].sum())


def test_a_mutation_between_sizing_and_locking_is_in_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows created after the buffers were sized (more than their slack) but before the locks
    are in the snapshot, whose seq covers them; one made after the snapshot is not."""
    cfg = config(1 << 16)
    early = np.arange(10, dtype=np.uint64)
    late = np.arange(1000, 9000, dtype=np.uint64)  # ~2000 per stripe: past the slack
    with Shard(cfg, tmp_path / "s") as shard:
        shard.lookup("t", early)
        sized = capture.capture_buffers

        def size_then_create(stripes: list[RamStripe]) -> capture.Buffers:
            bufs = sized(stripes)
            worker = threading.Thread(
                target=shard.assign, args=("t", late, np.full((late.size, 4), 3.0, np.float32))
            )
            worker.start()  # another client's mutation, before the snapshot takes the locks
            worker.join()
            return bufs

        monkeypatch.setattr(capture, "capture_buffers", size_then_create)
        result = shard.snapshot("mid")
        monkeypatch.undo()
        seq_in = shard.seq
        universe = np.concatenate([early, late])
        at_snapshot = shard.peek("t", universe)
        shard.delete("t", late[:10])  # after the snapshot: not in it
    assert result.info.seq == seq_in
    assert at_snapshot[0].all()
    with Shard(cfg, tmp_path / "s", restore="mid") as restored:
        got = restored.peek("t", universe)
        np.testing.assert_array_equal(got[0], at_snapshot[0])
        np.testing.assert_array_equal(got[1], at_snapshot[1])
