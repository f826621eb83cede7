"""Shard durability: every acknowledged mutation is logged, snapshots are exact and
self-checking, recovery picks the newest complete state and replays the rest of the log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.config.schema import store_from_keys
from embeddb.engine.durability import records, snapshot
from embeddb.engine.shard import Shard
from embeddb.errors import (
    CorruptDataError,
    FailedPreconditionError,
    InvalidArgumentError,
    StorageError,
    UnavailableError,
)
from tests.conftest import one_table_config

DIM = 4
UNIVERSE = np.arange(3000, dtype=np.uint64)


def config(**store: object) -> EmbeddingConfig:
    """Adagrad (state matters), a RAM tier much smaller than the id space (rows spill)."""
    cfg = one_table_config(
        dim=DIM, capacity=512, stripes=4, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )
    return replace(cfg, store=store_from_keys(store, cfg.store))


def crash(shard: Shard) -> None:
    """What a SIGKILL leaves: no write-back, no clean-shutdown record."""
    shard.discard()
    with pytest.raises(UnavailableError, match="closed"):
        shard.lookup("t", UNIVERSE[:1])


def churn(shard: Shard, rng: np.random.Generator, steps: int = 6) -> None:
    """Training lookups (creating rows), gradient pushes, assigns and deletes over UNIVERSE."""
    for _ in range(steps):
        ids = rng.choice(UNIVERSE, size=700).astype(np.uint64)
        shard.lookup("t", ids)
        grads = rng.standard_normal((ids.size, DIM)).astype(np.float32)
        shard.apply_gradients("t", ids, grads)
        picked = rng.choice(UNIVERSE, size=50, replace=False).astype(np.uint64)
        shard.assign("t", picked, rng.standard_normal((50, DIM)).astype(np.float32))
        shard.delete("t", rng.choice(UNIVERSE, size=20, replace=False).astype(np.uint64))


def state(shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    return shard.peek("t", UNIVERSE)


def assert_same_state(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# ------------------------------------------------------------------------------ the log
def test_every_mutation_gets_a_seq_and_reads_do_not(tmp_path: Path) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        assert shard.seq == 0
        shard.lookup("t", UNIVERSE[:10], train=False)
        assert shard.seq == 0  # an evaluation lookup changes nothing
        shard.lookup("t", UNIVERSE[:10])  # creates 10 rows: one record for the whole call
        after_create = shard.seq
        assert after_create == 1  # before: one record per stripe touched (up to 4)
        shard.lookup("t", UNIVERSE[:10])  # nothing new: nothing logged
        assert shard.seq == after_create
        shard.apply_gradients("t", UNIVERSE[:10], np.ones((10, DIM), np.float32))
        shard.delete("t", UNIVERSE[:1])
        assert shard.seq == after_create + 2
        changes = [c for r in shard.read_log(0) for c in records.decode(r.payload)]
    created = np.concatenate([c.ids for c in changes if c.op is records.Op.PUT][:4])
    assert set(created.tolist()) >= set(range(10))
    assert changes[-1].op is records.Op.DELETE and changes[-1].ids.tolist() == [0]


def test_fsync_always_acknowledges_only_durable_records(tmp_path: Path) -> None:
    with Shard(config(fsync="always"), tmp_path / "s") as shard:
        for k in range(5):
            shard.assign("t", UNIVERSE[k : k + 3], np.full((3, DIM), k, np.float32))
            assert shard.durable_seq == shard.seq > 0


def test_a_clean_restart_keeps_seq_and_state(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shard = Shard(config(), tmp_path / "s")
    churn(shard, rng)
    seq, before = shard.seq, state(shard)
    shard.close()
    with Shard(config(), tmp_path / "s") as reopened:
        assert reopened.recovery.source == "clean"
        assert reopened.seq == seq
        assert_same_state(state(reopened), before)
        reopened.assign("t", UNIVERSE[:1], np.zeros((1, DIM), np.float32))
        assert reopened.seq == seq + 1  # numbering goes on


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_crash_loses_no_acknowledged_mutation(tmp_path: Path, restarts: int) -> None:
    """restarts=1: a clean restart first, so recovery starts from that shutdown's disk tier."""
    rng = np.random.default_rng(1)
    shard = Shard(config(), tmp_path / "s")
    churn(shard, rng, steps=3)
    for _ in range(restarts):
        shard.close()
        shard = Shard(config(), tmp_path / "s")
        churn(shard, rng, steps=3)
    before, seq = state(shard), shard.seq
    crash(shard)
    with Shard(config(), tmp_path / "s") as recovered:
        assert recovered.recovery.source == ("base" if restarts else "log")
        assert recovered.seq == seq
        assert recovered.recovery.replayed > 0
        assert_same_state(state(recovered), before)
        stats = recovered.stats().tables["t"]
        assert stats.rows == int(before[0].sum())


# ------------------------------------------------------------------------------ snapshots
@pytest.mark.slow
def test_a_snapshot_restores_exactly_its_seq(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    shard = Shard(config(), tmp_path / "s")
    churn(shard, rng)
    at_snapshot = state(shard)
    result = shard.snapshot("first")
    assert result.info.seq == shard.seq and result.info.snapshot_id == "first"
    assert result.pause_s <= result.seconds  # the pause is a part of the snapshot's time
    manifest = snapshot.verify(result.info.path)
    assert manifest["tables"]["t"]["width"] == 2 * DIM
    churn(shard, rng)  # later mutations must not leak into the snapshot
    later = state(shard)
    shard.close()
    with Shard(config(), tmp_path / "s", restore="first") as restored:
        assert restored.recovery.source == "snapshot" and restored.seq == result.info.seq
        assert_same_state(state(restored), at_snapshot)
    aside = [p for p in (tmp_path / "s").iterdir() if p.name.startswith("log.before-restore")]
    assert len(aside) == 1  # the newer history is kept aside, not destroyed
    assert not np.array_equal(later[1], at_snapshot[1])


@pytest.mark.slow
def test_a_crash_after_a_snapshot_recovers_from_it_plus_the_log(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    shard = Shard(config(), tmp_path / "s")
    churn(shard, rng)
    taken = shard.snapshot("s1").info
    churn(shard, rng)
    before, seq = state(shard), shard.seq
    crash(shard)
    with Shard(config(), tmp_path / "s") as recovered:
        assert recovered.recovery.source == "snapshot"
        assert recovered.recovery.snapshot_id == "s1"
        assert recovered.recovery.from_seq == taken.seq
        assert recovered.recovery.replayed == seq - taken.seq
        assert_same_state(state(recovered), before)


@pytest.mark.slow
def test_a_snapshot_taken_under_concurrent_writes_is_a_clean_cut(tmp_path: Path) -> None:
    """The snapshot must equal the log replayed up to its seq, not a blend of two moments."""
    shard = Shard(config(), tmp_path / "s")
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            ids = rng.choice(UNIVERSE, size=64, replace=False).astype(np.uint64)
            shard.assign("t", ids, rng.standard_normal((64, DIM)).astype(np.float32))
            shard.apply_gradients("t", ids, rng.standard_normal((64, DIM)).astype(np.float32))

    threads = [threading.Thread(target=writer, args=(s,)) for s in (10, 11)]
    for t in threads:
        t.start()
    try:
        taken = [shard.snapshot(f"cut{k}").info for k in range(3)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    follower = Shard(config(), follower=True)
    try:
        applied = 0
        for record in shard.read_log(0):
            if record.seq > taken[-1].seq:
                break
            follower.apply_record(record.seq, record.payload)
            applied += 1
        assert applied == taken[-1].seq
        shard.close()
        with Shard(config(), tmp_path / "s", restore="cut2") as restored:
            assert_same_state(state(restored), state(follower))
    finally:
        follower.close()


@pytest.mark.slow
def test_retention_prunes_snapshots_and_the_log_they_no_longer_need(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    cfg = config(snapshot_retention=2, log_segment_mb=1, log_lz4_min_bytes=0)
    with Shard(cfg, tmp_path / "s") as shard:
        seqs = []
        for k in range(6):
            churn(shard, rng, steps=10)
            seqs.append(shard.snapshot(f"r{k}").info.seq)
        assert [s.snapshot_id for s in shard.snapshots()] == ["r4", "r5"]
        assert shard._log is not None
        assert 1 < shard._log.first_seq <= seqs[4] + 1  # only segments before r4 are gone
        with pytest.raises(StorageError, match="truncated"):
            next(iter(shard._log.read(0)))


def test_snapshot_ids_are_checked(tmp_path: Path) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        shard.snapshot("same")
        with pytest.raises(InvalidArgumentError, match="already exists"):
            shard.snapshot("same")
        for bad in ("../escape", "", ".hidden", "a/b"):
            with pytest.raises(InvalidArgumentError, match="snapshot id"):
                shard.snapshot(bad)
        assert [s.snapshot_id for s in shard.snapshots()] == ["same"]
        assert not [p for p in (tmp_path / "s" / "snapshots").iterdir() if p.name[0] == "."]
    with Shard(config()) as ephemeral, pytest.raises(FailedPreconditionError):
        ephemeral.snapshot()


# ------------------------------------------------------------------------------ corruption
def _flip(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["ram/t.rows", "ram/t.ids", "manifest.json"])
def test_a_corrupt_snapshot_is_never_loaded_silently(tmp_path: Path, victim: str) -> None:
    rng = np.random.default_rng(5)
    shard = Shard(config(), tmp_path / "s")
    churn(shard, rng)
    shard.snapshot("old")
    at_old = state(shard)
    churn(shard, rng)
    shard.snapshot("new")
    churn(shard, rng)
    final = state(shard)
    crash(shard)
    target = tmp_path / "s" / "snapshots" / "new" / victim
    _flip(target, 3 if victim == "manifest.json" else target.stat().st_size // 2)
    with pytest.raises(CorruptDataError, match="fallback") as err:
        Shard(config(), tmp_path / "s")
    assert "new" in str(err.value)
    with Shard(config(), tmp_path / "s", fallback=True) as recovered:  # older snapshot + log
        assert recovered.recovery.snapshot_id == "old"
        assert_same_state(state(recovered), final)
    assert not np.array_equal(at_old[1], final[1])


def test_a_truncated_snapshot_file_is_named(tmp_path: Path) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        churn(shard, np.random.default_rng(6), steps=2)
        path = shard.snapshot("x").info.path
    rows = path / "ram" / "t.rows"
    with open(rows, "r+b") as f:
        f.truncate(rows.stat().st_size - 4)
    with pytest.raises(CorruptDataError, match=r"t\.rows"):
        snapshot.verify(path)
    with pytest.raises(InvalidArgumentError, match="no complete snapshot"):
        Shard(config(), tmp_path / "s", restore="missing")
    with pytest.raises(CorruptDataError, match=r"t\.rows"):
        Shard(config(), tmp_path / "s", restore="x")


def test_a_corrupt_log_record_stops_recovery(tmp_path: Path) -> None:
    shard = Shard(config(log_lz4_min_bytes=0), tmp_path / "s")
    churn(shard, np.random.default_rng(7), steps=3)
    crash(shard)
    segment = sorted((tmp_path / "s" / "log").glob("*.log"))[0]
    _flip(segment, 200)  # inside an early record, with good records after it
    with pytest.raises(CorruptDataError, match=segment.name):
        Shard(config(), tmp_path / "s")


# ------------------------------------------------------------------------------ followers
def test_a_follower_applies_the_log_and_refuses_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    with Shard(config(), tmp_path / "p") as primary, Shard(config(), follower=True) as follower:
        churn(primary, rng)
        for record in primary.read_log(0):
            assert follower.apply_record(record.seq, record.payload)
        assert follower.seq == primary.seq
        assert_same_state(state(follower), state(primary))
        first = next(iter(primary.read_log(0)))
        assert not follower.apply_record(first.seq, first.payload)  # a repeat is ignored
        with pytest.raises(FailedPreconditionError, match="follower"):
            follower.assign("t", UNIVERSE[:1], np.zeros((1, DIM), np.float32))
        with pytest.raises(FailedPreconditionError):
            follower.lookup("t", UNIVERSE[:1], train=True)
        follower.lookup("t", UNIVERSE[:1], train=False)  # reads are served
        primary.assign("t", UNIVERSE[:1], np.ones((1, DIM), np.float32))
        primary.assign("t", UNIVERSE[:1], np.ones((1, DIM), np.float32))
        last = list(primary.read_log(follower.seq))
        with pytest.raises(CorruptDataError, match="does not follow"):
            follower.apply_record(last[-1].seq, last[-1].payload)  # skipped one: a gap
        with pytest.raises(FailedPreconditionError):
            primary.apply_record(1, b"")


# ------------------------------------------------------------------------------ bad disks
_FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    from dataclasses import replace
    from embeddb.errors import StorageFullError
    from embeddb.transport.status import code_of
    from embeddb.engine.shard import Shard
    from tests.conftest import one_table_config

    cfg = one_table_config(dim=4, capacity=64)
    cfg = replace(cfg, store=replace(cfg.store, log=replace(cfg.store.log, lz4_min_bytes=0)))
    shard = Shard(cfg, sys.argv[1])
    shard.assign("t", np.arange(8, dtype=np.uint64), np.ones((8, 4), np.float32))
    kept = shard.peek("t", np.arange(8, dtype=np.uint64))[1].copy()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    try:
        for k in range(1, 100):
            ids = np.arange(8, dtype=np.uint64) + 100 * k
            shard.assign("t", ids, np.ones((8, 4), np.float32))
        print("no failure")
    except StorageFullError as exc:
        print("failed:", code_of(exc).name, "path named:", sys.argv[1] in str(exc))
        print("failed call visible:", int(shard.peek("t", ids)[0].sum()))
        print("failed at:", int(ids[0]))
    print("read-only:", shard.read_only)
    try:  # the next write retries the append: still full
        shard.apply_gradients("t", np.arange(8, dtype=np.uint64), np.ones((8, 4), np.float32))
        print("mutation accepted")
    except StorageFullError as exc:
        print("retry:", code_of(exc).name)
    now = shard.peek("t", np.arange(8, dtype=np.uint64))[1]
    print("reads intact:", bool(np.array_equal(now, kept)))
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    shard.assign("t", np.array([7], dtype=np.uint64), np.full((1, 4), 2, np.float32))
    print("resumed:", not shard.read_only)
    shard.discard()  # as a crash: the next start recovers from the log
    """
)


@pytest.mark.slow
def test_a_full_disk_fails_writes_without_a_trace_and_they_resume(tmp_path: Path) -> None:
    """A write that finds the disk full (EFBIG here, as ENOSPC) fails RESOURCE_EXHAUSTED with
    none of its rows visible, before or after recovery; writes resume once there is room."""
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        check=True,
    ).stdout
    assert "failed: RESOURCE_EXHAUSTED path named: False" in out
    assert "failed call visible: 0" in out
    assert "read-only: True" in out
    assert "retry: RESOURCE_EXHAUSTED" in out
    assert "reads intact: True" in out
    assert "resumed: True" in out
    failed_at = int(out.split("failed at:")[1].split()[0])
    with Shard(one_table_config(dim=4, capacity=64), tmp_path / "s") as recovered:
        assert recovered.recovery.source == "log"
        found, rows = recovered.peek("t", np.arange(8, dtype=np.uint64))
        assert found.all() and (rows[:7, :4] == 1).all()  # what was acknowledged survived
        assert (rows[7, :4] == 2).all()  # the write after space came back, too
        acked = np.concatenate(
            [np.arange(8, dtype=np.uint64) + k for k in range(100, failed_at, 100)]
        )
        assert recovered.peek("t", acked)[0].all()
        failed = np.arange(failed_at, failed_at + 8, dtype=np.uint64)
        assert not recovered.peek("t", failed)[0].any()  # the failed call left no trace


# ------------------------------------------------------------------------------ deletion
def _holds(path: Path, pattern: bytes) -> list[str]:
    return [
        str(f.relative_to(path))
        for f in path.rglob("*")
        if f.is_file() and pattern in f.read_bytes()
    ]


def test_a_deleted_row_is_physically_absent_from_later_snapshots(tmp_path: Path) -> None:
    """Not only masked by a RocksDB tombstone: the value bytes are gone from every file."""
    cfg = config(log_lz4_min_bytes=0)
    shard = Shard(cfg, tmp_path / "s")
    victim = np.array([4242], dtype=np.uint64)
    marker = np.array([[1234.5678, -8765.4321, 3.14159e-7, 2.71828e9]], dtype=np.float32)
    shard.assign("t", victim, marker)
    shard.close()  # the row is written to the disk tier (RocksDB SST files)
    shard = Shard(cfg, tmp_path / "s")
    try:
        pattern = marker.tobytes()
        before = shard.snapshot("before").info.path
        assert any(p.startswith("disk/") for p in _holds(before, pattern))  # the control
        assert shard.delete("t", victim) == 1
        shard.lookup("t", UNIVERSE[:100])  # unrelated activity
        after = shard.snapshot("after").info.path
        assert _holds(after, pattern) == []
        assert not shard.peek("t", victim)[0].any()
    finally:
        shard.close()
    with Shard(cfg, tmp_path / "s", restore="after") as restored:
        assert not restored.peek("t", victim)[0].any()


@pytest.mark.slow
def test_embeddb_restore_rolls_a_stopped_shard_back(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from embeddb.cli import main

    preset = EmbeddingConfig.from_yaml(
        Path(__file__).resolve().parents[1] / "embeddb" / "presets" / "default.yaml"
    )
    shard = Shard(preset, tmp_path / "s")
    ids = np.arange(50, dtype=np.uint64)
    shard.lookup("item_id", ids)
    shard.snapshot("good")
    at_good = shard.peek("item_id", ids)
    shard.assign("item_id", ids, np.ones((50, 16), np.float32))  # the mistake to undo
    shard.close()
    runner = CliRunner()
    listed = runner.invoke(main, ["restore", "--data-dir", str(tmp_path / "s")])
    assert listed.exit_code == 0 and listed.output.startswith("good\tseq ")
    done = runner.invoke(main, ["restore", "--data-dir", str(tmp_path / "s"), "--snapshot", "good"])
    assert done.exit_code == 0, done.output
    with Shard(preset, tmp_path / "s") as reopened:
        assert reopened.recovery.source == "clean"
        assert_same_state(reopened.peek("item_id", ids), at_good)
    missing = runner.invoke(
        main, ["restore", "--data-dir", str(tmp_path / "s"), "--snapshot", "nope"]
    )
    assert missing.exit_code == 1 and "no complete snapshot" in missing.output


@pytest.mark.slow
def test_random_byte_flips_anywhere_in_a_snapshot_are_detected(tmp_path: Path) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        churn(shard, np.random.default_rng(9), steps=2)
        shard.close()  # rows on disk: the checkpoint holds real SST files
    with Shard(config(), tmp_path / "s") as shard:
        source = shard.snapshot("x").info.path
    rng = np.random.default_rng(10)
    for k in range(25):
        # a private copy: the snapshot's SST files are hard links shared with the live shard
        copy = tmp_path / f"copy{k}"
        shutil.copytree(source, copy)
        files = sorted(p for p in copy.rglob("*") if p.is_file() and p.stat().st_size)
        victim = files[rng.integers(len(files))]
        _flip(victim, int(rng.integers(victim.stat().st_size)))
        with pytest.raises(CorruptDataError):
            snapshot.verify(copy)
        shutil.rmtree(copy)


@pytest.mark.slow
def test_tables_with_dotted_names_keep_their_own_snapshot_files(tmp_path) -> None:
    """``a.b`` and ``a.c`` once both wrote ``ram/a.ids``: each table has files of its own."""
    from embeddb import EmbeddingConfig

    cfg = EmbeddingConfig.from_yaml_text("slots_config:\n  a.b: {dim: 4}\n  a.c: {dim: 4}\n")
    with Shard(cfg, tmp_path / "s") as shard:
        shard.assign("a.b", [1, 2], np.full((2, 4), 1.0, np.float32))
        shard.assign("a.c", [3], np.full((1, 4), 2.0, np.float32))
        info = shard.snapshot("dotted").info
    assert sorted(p.name for p in (info.path / "ram").iterdir()) == [
        "a.b.flags", "a.b.ids", "a.b.rows", "a.c.flags", "a.c.ids", "a.c.rows",
    ]  # fmt: skip
    with Shard(cfg, tmp_path / "s", restore="dotted") as shard:
        np.testing.assert_array_equal(shard.lookup("a.b", [1, 2], train=False), 1.0)
        np.testing.assert_array_equal(shard.lookup("a.c", [3], train=False), 2.0)


@pytest.mark.slow
def test_two_restores_in_one_second_keep_both_logs_aside(tmp_path) -> None:
    from embeddb import EmbeddingConfig

    cfg = EmbeddingConfig.single_table("t", 4, capacity=100)
    with Shard(cfg, tmp_path / "s") as shard:
        shard.assign("t", [1], np.ones((1, 4), np.float32))
        shard.snapshot("one")
    for _ in range(3):  # each restore sets the current log aside; none may fail or overwrite
        with Shard(cfg, tmp_path / "s", restore="one") as shard:
            shard.assign("t", [2], np.ones((1, 4), np.float32))
    aside = sorted(p.name for p in (tmp_path / "s").glob("log.before-restore-*"))
    assert len(aside) == 3
