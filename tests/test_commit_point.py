"""The update log is the commit point: a mutating call is logged whole before any of it is
visible, and a storage fault leaves no trace of the call that met it.

Faults are injected through the update log's file layer (:class:`FaultyIO`: the n-th write or
fsync fails with ENOSPC or EIO), never by patching :mod:`os`. The property test checks, for
fault points drawn across assign, apply, delete, training lookups, snapshots and log rolls,
that the primary, the primary recovered from its directory and an in-process follower fed
from its log all equal the acknowledged history (replayed on a fault-free shard).
"""

from __future__ import annotations

import errno
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.durability.fileio import FaultyIO
from embeddb.engine.durability.log_fence import FENCE
from embeddb.engine.shard import Shard
from embeddb.errors import (
    FailedPreconditionError,
    StorageError,
    StorageFaultError,
    StorageFullError,
)
from embeddb.transport.status import code_of
from tests.support import blocked_in, eventually

DIM = 64
UNIVERSE = np.arange(400, dtype=np.uint64)
TABLES = ("a", "b")


def config(fsync: str = "always") -> EmbeddingConfig:
    """Two tables of 4 stripes, small RAM (rows overflow and evict to RocksDB), 1 MB log
    segments (a call of up to 300 rows per table logs up to 300 KB: a few calls roll one)."""
    opt = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1)
    tables = {n: TableConfig(name=n, dim=DIM, capacity=96, optimizer=opt) for n in TABLES}
    store = StoreConfig(ram=RamTierConfig(stripes=4, eviction_chunk=1e-6, min_stripe_rows=1))
    store = replace(store, log=replace(store.log, fsync=fsync, segment_mb=1, lz4_min_bytes=0))
    return EmbeddingConfig(tables=tables, store=store)


def state(shard: Shard) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {t: shard.peek(t, UNIVERSE) for t in TABLES}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(
        np.array_equal(a[t][0], b[t][0]) and np.array_equal(a[t][1], b[t][1]) for t in TABLES
    )


Op = tuple[str, int]  # (kind, seed)


def run(shard: Shard, op: Op) -> object:
    """Apply one call, drawn deterministically from its seed."""
    kind, seed = op
    rng = np.random.default_rng(seed)
    ids = rng.choice(UNIVERSE, size=int(rng.integers(1, 300))).astype(np.uint64)
    table = TABLES[seed % 2]
    if kind == "assign":
        return shard.assign(table, ids, rng.standard_normal((ids.size, DIM), dtype=np.float32))
    if kind == "apply":
        grads = rng.standard_normal((ids.size, DIM), dtype=np.float32)
        return shard.apply_gradients_many([(t, ids, grads) for t in TABLES])
    if kind == "delete":
        return shard.delete(table, ids[: ids.size // 4 + 1])
    if kind == "lookup":
        return shard.lookup_many([(t, ids, True) for t in TABLES])
    if kind == "snapshot":
        return shard.snapshot().info.seq
    raise AssertionError(kind)


def replayed(history: list[Op]) -> dict[str, Any]:
    """The state a fault-free shard reaches from ``history``."""
    with Shard(config("never")) as reference:
        for op in history:
            if op[0] != "snapshot":
                run(reference, op)
        return state(reference)


def feed(follower: Shard, primary: Shard) -> None:
    """Apply the primary's new records; a feed ends at a record whose fsync failed."""
    try:
        for record in primary.read_log(follower.seq):
            follower.apply_record(record.seq, record.payload)
    except StorageError:
        assert primary.read_only


# ------------------------------------------------------------------------------ direct cases
@pytest.mark.slow
def test_a_full_disk_fails_a_call_spanning_stripes_and_tables_without_a_trace(
    tmp_path: Path,
) -> None:
    """Before: each stripe was its own record, written after its rows changed, so a call
    that met a full disk left the rows of its first stripes visible, logged and replicated."""
    io = FaultyIO("write", 3, errno.ENOSPC)
    with (
        Shard(config(), tmp_path / "p", file_io=io) as primary,
        Shard(config(), follower=True) as follower,
    ):
        run(primary, ("assign", 0))
        run(primary, ("apply", 1))
        acked = state(primary)
        with pytest.raises(StorageFullError) as failed:
            run(primary, ("apply", 2))  # both tables, every stripe: one record
        assert code_of(failed.value).name == "RESOURCE_EXHAUSTED"
        assert str(tmp_path) not in str(failed.value)  # paths go to the server log only
        assert same(state(primary), acked)  # nothing of the failed call is visible
        assert primary.read_only
        with pytest.raises(StorageFullError):  # still full: the retry fails the same way
            run(primary, ("assign", 3))
        assert same(state(primary), acked)
        feed(follower, primary)
        assert same(state(follower), acked)
        io.free()
        run(primary, ("assign", 4))  # space is back: writes resume without a restart
        assert not primary.read_only
        feed(follower, primary)
        final = state(primary)
        assert same(state(follower), final)
    with Shard(config(), tmp_path / "p") as recovered:
        assert same(state(recovered), final)
    assert same(final, replayed([("assign", 0), ("apply", 1), ("assign", 4)]))


def test_an_io_error_stops_writes_until_a_restart_and_shutdown_still_succeeds(
    tmp_path: Path,
) -> None:
    io = FaultyIO("write", 2, errno.EIO)
    with Shard(config(), tmp_path / "p", file_io=io) as primary:
        run(primary, ("assign", 0))
        acked = state(primary)
        with pytest.raises(StorageFaultError) as failed:
            run(primary, ("lookup", 1))  # a training lookup that admits rows
        assert code_of(failed.value).name == "UNAVAILABLE"
        assert same(state(primary), acked)
        with pytest.raises(StorageFaultError, match="restarted"):  # fail-stop, even with
            run(primary, ("assign", 2))  # a working disk: the page cache is not trusted
        assert primary.read_only
        primary.lookup("a", UNIVERSE[:5], train=False)  # reads go on
    # The shutdown above did not raise and skipped the clean-shutdown record: the next start
    # recovers from the log.
    with Shard(config(), tmp_path / "p") as recovered:
        assert recovered.recovery.source != "clean"
        assert same(state(recovered), acked)
        run(recovered, ("assign", 3))  # writable again


@pytest.mark.slow
def test_an_fsync_failure_publishes_nothing_and_stops_writes(tmp_path: Path) -> None:
    """Before: the failed call's record stayed in the file, so a restart replayed it (the call
    came back whole, never acknowledged). Now the log is cut back to its last durable record."""
    io = FaultyIO("fsync", 2, errno.EIO)
    with (
        Shard(config("always"), tmp_path / "p", file_io=io) as primary,
        Shard(config(), follower=True) as follower,
    ):
        run(primary, ("assign", 0))
        acked = state(primary)
        with pytest.raises(StorageFaultError):
            run(primary, ("assign", 1))
        assert same(state(primary), acked)
        with pytest.raises(StorageFaultError):
            run(primary, ("delete", 2))
        feed(follower, primary)
        assert follower.seq == 1 and same(state(follower), acked)  # never fed the failed call
        assert io.calls["truncate"] == 1  # cut back at the failure
    assert (tmp_path / "p" / "log" / FENCE).exists()  # applied (and removed) at the next open
    with Shard(config(), tmp_path / "p") as recovered:  # nothing of the failed call
        assert same(state(recovered), acked)
        assert not (tmp_path / "p" / "log" / FENCE).exists()
        run(recovered, ("assign", 3))
        final = state(recovered)
    with Shard(config(), tmp_path / "p") as again:
        assert same(state(again), final)
    assert same(final, replayed([("assign", 0), ("assign", 3)]))


class _NoCut(FaultyIO):
    """Fails the n-th fsync with EIO, and every truncation: the cut after it cannot be made."""

    def truncate(self, fd: int, length: int) -> None:
        self.calls["truncate"] += 1
        raise OSError(errno.EIO, "injected: cannot truncate")


def test_a_failed_fsync_whose_cut_fails_is_dropped_at_the_next_start(tmp_path: Path) -> None:
    """The cut back after a failed fsync fails too: the fence (durable-end.json) written at the
    failure makes the next start drop the refused call's record."""
    io = _NoCut("fsync", 2, errno.EIO)
    with Shard(config("always"), tmp_path / "p", file_io=io) as primary:
        run(primary, ("assign", 0))
        acked = state(primary)
        with pytest.raises(StorageFaultError):
            run(primary, ("apply", 1))
        assert io.calls["truncate"] == 1
        assert (tmp_path / "p" / "log" / FENCE).exists()
    with Shard(config(), tmp_path / "p") as recovered:
        assert same(state(recovered), acked)
        assert not (tmp_path / "p" / "log" / FENCE).exists()


def test_a_full_disk_at_shutdown_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """Before: a shutdown whose disk-tier flush hit ENOSPC raised ("disk tier close failed")
    and left the directory without a clean-shutdown record after a partial write-back."""
    io = FaultyIO("write", 2, errno.ENOSPC)
    primary = Shard(config(), tmp_path / "p", file_io=io)
    run(primary, ("assign", 0))
    with pytest.raises(StorageFullError):
        run(primary, ("assign", 1))
    acked = state(primary)
    primary.close()  # must not raise
    with Shard(config(), tmp_path / "p") as recovered:
        assert same(state(recovered), acked)


@pytest.mark.slow
def test_a_full_disk_while_rolling_a_segment_fails_only_that_call(tmp_path: Path) -> None:
    calls = [("assign", 2 * k) for k in range(60)]  # table "a", up to 150 KB a record
    counting = FaultyIO("write", 1 << 30)  # never fires: counts the writes of a dry run
    with Shard(config(), tmp_path / "dry", file_io=counting) as dry:
        k = 0
        while len(list((tmp_path / "dry" / "log").glob("*.log"))) == 1:
            writes = counting.calls["write"]
            run(dry, calls[k])
            k += 1
        k -= 1  # calls[k] rolled the segment
    io = FaultyIO("write", writes + 1, errno.ENOSPC)  # the new segment's header
    with Shard(config(), tmp_path / "p", file_io=io) as primary:
        for op in calls[:k]:
            run(primary, op)
        acked = state(primary)
        with pytest.raises(StorageFullError):
            run(primary, calls[k])
        assert io.fired and same(state(primary), acked)
        assert len(list((tmp_path / "p" / "log").glob("*.log"))) == 1  # no stray segment
        io.free()
        run(primary, calls[k])
        final = state(primary)
    with Shard(config(), tmp_path / "p") as recovered:
        assert same(state(recovered), final)
    assert same(final, replayed(calls[: k + 1]))


def test_a_follower_refuses_writes_with_failed_precondition() -> None:
    with Shard(config(), follower=True) as follower, pytest.raises(FailedPreconditionError):
        run(follower, ("assign", 0))


class _WatchedLock:
    """A stripe lock whose waiters wait in :class:`threading.Condition` (Python code), so that
    :func:`blocked_in` can see them; a plain lock's acquire is a C call it cannot see."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False

    def acquire(self) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: not self._held)
            self._held = True
        return True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def test_a_follower_reader_never_sees_part_of_a_record(tmp_path: Path) -> None:
    """Before: a follower applied a record stripe by stripe, so a reader of a stripe the
    applier had passed saw the record's rows there while its other stripes were still old.
    Now the applier holds every stripe of the record until all of it is published."""
    with (
        Shard(config(), tmp_path / "p") as primary,
        Shard(config(), follower=True) as follower,
    ):
        ids = UNIVERSE[:64]
        vectors = np.random.default_rng(0).standard_normal((ids.size, DIM), dtype=np.float32)
        primary.assign("a", ids, vectors + 1.0)  # never zero
        (record,) = primary.read_log(follower.seq)
        table = follower._tables["a"]  # the follower's own stripes, instrumented
        parts = table.split(ids)
        assert len(parts) >= 2
        for stripe in table.stripes:
            stripe.lock = _WatchedLock()  # type: ignore[assignment]
        (_, first_ids, _), (second, _, _) = parts[0], parts[1]
        gate = table.stripes[second].lock
        gate.acquire()  # the applier will wait for the record's second stripe
        applier = threading.Thread(target=follower.apply_record, args=(record.seq, record.payload))
        applier.start()
        eventually(lambda: blocked_in(applier, "apply_record"), 10, "the applier to block")
        seen: list[np.ndarray] = []
        reader = threading.Thread(
            target=lambda: seen.append(follower.lookup("a", first_ids, train=False))
        )
        reader.start()  # reads the record's first stripe only
        eventually(
            lambda: not reader.is_alive() or blocked_in(reader, "lookup"),
            10,
            "the reader to read or to block",
        )
        if seen:  # it read while the second stripe was unapplied: it must see the old rows
            assert not seen[0].any(), "a reader saw part of a record"
        gate.release()
        applier.join(10)
        reader.join(10)
        assert not applier.is_alive() and not reader.is_alive()
        where = np.searchsorted(ids, first_ids)
        assert np.array_equal(seen[0], vectors[where] + 1.0)  # the whole record, after it
        assert np.array_equal(follower.lookup("a", ids, False), vectors + 1.0)


# ------------------------------------------------------------------------------ property
_KINDS = st.sampled_from(["assign", "apply", "delete", "lookup", "snapshot"])


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.tuples(_KINDS, st.integers(0, 10_000)), min_size=3, max_size=12),
    operation=st.sampled_from(["write", "fsync"]),
    nth=st.integers(1, 8),
    code=st.sampled_from([errno.ENOSPC, errno.EIO]),
)
def test_primary_recovered_and_follower_equal_the_acknowledged_history(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[Op],
    operation: str,
    nth: int,
    code: int,
) -> None:
    directory = tmp_path_factory.mktemp("p")
    io = FaultyIO(operation, nth, code)  # type: ignore[arg-type]
    acked: list[Op] = []
    with (
        Shard(config(), directory, file_io=io) as primary,
        Shard(config(), follower=True) as follower,
    ):
        for k, op in enumerate(ops):
            before = state(primary)
            try:
                run(primary, op)
            except StorageError as exc:
                assert code_of(exc).name in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"), exc
                assert same(state(primary), before)  # nothing of it is visible
                if k % 3 == 2:
                    io.free()
            else:
                if op[0] != "snapshot":
                    acked.append(op)
            feed(follower, primary)
        live = state(primary)
        followed = state(follower)
    with Shard(config(), directory) as recovered:
        restarted = state(recovered)
    expected = replayed(acked)
    assert same(live, expected)
    assert same(followed, expected)  # a follower is fed fsynced records only
    # Before: after a failed fsync the call was "history or history plus the failed call".
    assert same(restarted, expected)  # nothing of a refused call, even after a restart
