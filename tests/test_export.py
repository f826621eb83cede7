"""Incremental export: changed rows reach numpy files every interval, the tail is written on
close, deletes are exported, files are complete, and a crashed export resumes without a gap."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embeddb.common.routing import shard_of
from embeddb.config import EmbeddingConfig, ExportConfig, OptimizerConfig, OptimizerKind
from embeddb.config.schema import store_from_keys
from embeddb.engine.durability.export import INDEX, Exporter, load_file, read_index
from embeddb.engine.durability.reshard import reshard
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError, StorageError
from tests.conftest import one_table_config
from tests.support import eventually

DIM = 4
UNIVERSE = np.arange(1, 801, dtype=np.uint64)


def config(**store: object) -> EmbeddingConfig:
    cfg = one_table_config(
        dim=DIM, capacity=128, stripes=2, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )
    return replace(cfg, store=store_from_keys({"export_dir": "export", **store}, cfg.store))


def replay(directory: Path) -> dict[int, np.ndarray]:
    """What a consumer holds after applying every export in index order."""
    rows: dict[int, np.ndarray] = {}
    last_seq = None
    for line in read_index(directory):
        if last_seq is not None:
            assert line["first_seq"] == last_seq + 1 and not line["gap_before"]
        last_seq = line["last_seq"]
        for entry in line["files"].values():
            f = load_file(directory / entry["path"])
            assert (f.first_seq, f.last_seq) == (line["first_seq"], line["last_seq"])
            assert (f.ids.size, f.deleted.size) == (entry["rows"], entry["deleted"])
            assert not set(f.ids.tolist()) & set(f.deleted.tolist())
            for x in f.deleted.tolist():
                rows.pop(x, None)
            rows.update(zip(f.ids.tolist(), f.rows, strict=True))
    return rows


def state(shard: Shard) -> dict[int, np.ndarray]:
    found, rows = shard.peek("t", UNIVERSE)
    return {int(x): row.copy() for x, row, f in zip(UNIVERSE, rows, found, strict=True) if f}


def assert_same(got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> None:
    assert set(got) == set(want)
    for x, row in want.items():
        np.testing.assert_array_equal(got[x], row)


def churn(shard: Shard, rng: np.random.Generator) -> None:
    ids = rng.choice(UNIVERSE, size=300).astype(np.uint64)
    shard.lookup("t", ids)
    shard.apply_gradients("t", ids, rng.standard_normal((ids.size, DIM)).astype(np.float32))
    shard.delete("t", rng.choice(UNIVERSE, size=10, replace=False).astype(np.uint64))


def exported(shard: Shard, export: Path) -> bool:
    """Whether an export covers every record of ``shard`` so far."""
    lines = read_index(export)
    return bool(lines) and lines[-1]["last_seq"] >= shard.seq


def test_updates_appear_after_the_interval(tmp_path: Path) -> None:
    with Shard(config(export_interval_s=0.2), tmp_path / "s") as shard:
        ids = UNIVERSE[:50]
        shard.lookup("t", ids)
        shard.apply_gradients("t", ids, np.ones((50, DIM), np.float32))
        seq = shard.seq
        export = tmp_path / "s" / "export"
        eventually(
            lambda: any(line["last_seq"] >= seq for line in read_index(export)),
            10,
            f"an export up to seq {seq}",
        )
        assert_same(replay(export), state(shard))
        line = read_index(export)[1]
        f = load_file(export / line["files"]["t"]["path"])
        assert f.rows.shape == (50, 2 * DIM) and f.vectors.shape == (50, DIM)
        assert f.dim == DIM and f.table == "t" and f.ids.dtype == np.uint64
        np.testing.assert_array_equal(f.ids, np.sort(ids))


def test_close_writes_the_tail(tmp_path: Path) -> None:
    """With an interval longer than the test nothing is exported until close, which writes
    every acknowledged mutation."""
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        churn(shard, np.random.default_rng(1))
        exporter = shard._exporter
        assert exporter is not None
        # The thread has read the log, but the interval is not over.
        eventually(lambda: exporter._read_seq == shard.seq, 10, "the export to read the log")
        start = read_index(tmp_path / "s" / "export")
        assert len(start) == 1 and (start[0]["last_seq"], start[0]["files"]) == (0, {})
        want, seq = state(shard), shard.seq
    lines = read_index(tmp_path / "s" / "export")
    assert len(lines) == 2 and (lines[1]["first_seq"], lines[1]["last_seq"]) == (1, seq)
    assert_same(replay(tmp_path / "s" / "export"), want)


@pytest.mark.slow
def test_the_latest_file_wins_over_many_exports(tmp_path: Path) -> None:
    rng, export = np.random.default_rng(2), tmp_path / "s" / "export"
    with Shard(config(export_interval_s=0.05), tmp_path / "s") as shard:
        for step in range(12):
            churn(shard, rng)
            if step % 3 == 0:  # several exports, each with rows the next ones change again
                eventually(lambda: exported(shard, export), 10, f"the export after step {step}")
        want = state(shard)
    lines = read_index(tmp_path / "s" / "export")
    assert len(lines) >= 3
    assert [line["n"] for line in lines] == list(range(1, len(lines) + 1))
    assert_same(replay(tmp_path / "s" / "export"), want)


def test_deletes_are_exported_and_a_recreated_row_is_not_deleted(tmp_path: Path) -> None:
    export = tmp_path / "s" / "export"
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[:20])
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.delete("t", UNIVERSE[:5])
        shard.delete("t", UNIVERSE[5:7])
        shard.lookup("t", UNIVERSE[5:7])  # re-created in the same interval
        want = state(shard)
    last = read_index(export)[-1]
    f = load_file(export / last["files"]["t"]["path"])
    np.testing.assert_array_equal(f.deleted, UNIVERSE[:5])
    np.testing.assert_array_equal(f.ids, UNIVERSE[5:7])
    assert_same(replay(export), want)


def test_files_are_complete_and_plain_numpy(tmp_path: Path) -> None:
    export = tmp_path / "s" / "export"
    with Shard(config(export_interval_s=0.05), tmp_path / "s") as shard:
        for _ in range(3):
            churn(shard, np.random.default_rng(3))
            eventually(lambda: exported(shard, export), 10, "an export")
    assert not list(export.rglob(".tmp-*"))
    named = {line["files"]["t"]["path"] for line in read_index(export) if line["files"]}
    assert {p.relative_to(export).as_posix() for p in export.glob("t/*.npz")} == named
    for rel in named:
        with np.load(export / rel, allow_pickle=False) as z:
            assert set(z.files) == {
                "ids", "rows", "deleted", "dim", "table", "first_seq", "last_seq"
            }  # fmt: skip
            assert z["ids"].dtype == np.uint64 and z["rows"].dtype == np.float32
    assert (export / INDEX).read_bytes().endswith(b"\n")


@pytest.mark.slow
def test_a_crashed_export_resumes_and_the_log_keeps_its_records(tmp_path: Path) -> None:
    """A crash loses the pending (unexported) changes from memory only: the log keeps the
    records after the last export even across snapshots that truncate it, and the restarted
    shard exports them."""
    cfg = config(export_interval_s=3600, snapshot_retention=1, log_segment_mb=1)
    rng = np.random.default_rng(4)
    shard = Shard(cfg, tmp_path / "s")  # new: no clean-shutdown base pins the log
    shard.lookup("t", UNIVERSE)
    for k in range(4):  # about 1.5 MB of log per round: segments seal and could be truncated
        vectors = rng.standard_normal((UNIVERSE.size, DIM)).astype(np.float32)
        for _ in range(50):
            shard.assign("t", UNIVERSE, vectors)
        churn(shard, rng)
        shard.snapshot(f"s{k}")
    want = state(shard)
    log_files = sorted((tmp_path / "s" / "log").glob("*.log"))
    shard.discard()  # a crash: nothing pending is written
    assert log_files[0].name == f"{1:020d}.log"  # kept for the export, not for a snapshot
    assert len(log_files) > 2
    with Shard(cfg, tmp_path / "s") as shard:
        assert shard.recovery.source == "snapshot"
    assert_same(replay(tmp_path / "s" / "export"), want)


@pytest.mark.slow
def test_a_torn_index_line_is_cut_and_stale_temp_files_removed(tmp_path: Path) -> None:
    export = tmp_path / "s" / "export"
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[:10])
    with open(export / INDEX, "ab") as f:
        f.write(b'{"n": 3, "first_')
    (export / "t" / ".tmp-inc-00000003-9-9.npz").write_bytes(b"partial")
    assert len(read_index(export)) == 2  # consumers ignore the torn line
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[10:20])
        want = state(shard)
    assert [line["n"] for line in read_index(export)] == [1, 2, 3]
    assert not list(export.rglob(".tmp-*"))
    assert_same(replay(export), want)


def test_a_shard_restored_to_an_older_state_marks_a_gap(tmp_path: Path) -> None:
    export = tmp_path / "s" / "export"
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[:10])
        shard.snapshot("old")
        shard.lookup("t", UNIVERSE[10:20])
    with Shard(config(export_interval_s=3600), tmp_path / "s", restore="old") as shard:
        shard.lookup("t", UNIVERSE[30:35])
    lines = read_index(export)
    assert [line["gap_before"] for line in lines] == [False, False, True, False]
    assert lines[2]["last_seq"] == lines[2]["first_seq"] - 1 < lines[1]["last_seq"]
    assert lines[3]["first_seq"] == lines[2]["last_seq"] + 1


def test_export_directory_placement_and_config(tmp_path: Path) -> None:
    absolute = str(tmp_path / "exports" / "shard-{index}")
    cfg = replace(config(), store=replace(config().store, export=ExportConfig(absolute)))
    with Shard(cfg, tmp_path / "s", shard_index=3, num_shards=4) as shard:
        shard.lookup("t", UNIVERSE[shard_of(UNIVERSE, 4) == 3][:3])  # ids shard 3 owns
    assert len(read_index(tmp_path / "exports" / "shard-3")) == 2
    with pytest.raises(ConfigError, match=r"store\.export_dir"):
        Shard(config())  # no data directory: no update log to export from
    with pytest.raises(ConfigError, match="export_interval_s"):
        ExportConfig(interval_s=0)
    with pytest.raises(ConfigError, match="export_dir"):
        ExportConfig(directory="  ")
    yaml = "tables: {t: {dim: 4}}\nstore: {export_dir: out, export_interval_s: 2.5}\n"
    store = EmbeddingConfig.from_yaml_text(yaml).store
    assert (store.export.directory, store.export.interval_s) == ("out", 2.5)


def test_an_export_started_on_a_non_empty_shard_marks_a_gap(tmp_path: Path) -> None:
    cfg = replace(config(), store=replace(config().store, export=ExportConfig()))
    with Shard(cfg, tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[:10])
        seq = shard.seq
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[10:12])
    first, second = read_index(tmp_path / "s" / "export")
    assert (first["last_seq"], first["gap_before"], first["files"]) == (seq, True, {})
    assert second["first_seq"] == seq + 1 and list(second["files"]) == ["t"]


@pytest.mark.slow
def test_an_export_of_a_resharded_shard_starts_with_a_gap(tmp_path: Path) -> None:
    """A shard recovered from ``embeddb reshard`` output holds rows at seq 0."""
    cfg = replace(config(), store=replace(config().store, export=ExportConfig()))
    with Shard(cfg, tmp_path / "src" / "shard-0") as shard:
        shard.lookup("t", UNIVERSE[:10])
        shard.snapshot("ckpt")
    reshard(tmp_path / "src", tmp_path / "dst", 1, "ckpt")
    with Shard(config(export_interval_s=3600), tmp_path / "dst" / "shard-0") as shard:
        assert shard.seq == 0 and shard.stats().tables["t"].rows == 10
    (line,) = read_index(tmp_path / "dst" / "shard-0" / "export")
    assert (line["last_seq"], line["gap_before"]) == (0, True)


def test_exporter_flush_on_demand(tmp_path: Path) -> None:
    with Shard(config(export_interval_s=3600), tmp_path / "s") as shard:
        shard.lookup("t", UNIVERSE[:4])
        exporter = shard._exporter
        assert isinstance(exporter, Exporter)
        exporter.flush()
        assert exporter.exported_seq == shard.seq
        assert len(read_index(tmp_path / "s" / "export")) == 2


@pytest.mark.slow
def test_a_failed_write_loses_nothing_and_is_retried(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    export = tmp_path / "s" / "export"
    with Shard(config(export_interval_s=0.05), tmp_path / "s") as shard:
        exporter = shard._exporter
        assert exporter is not None
        shutil.rmtree(export / "t")
        (export / "t").write_bytes(b"")  # the table's directory is unusable: writes fail
        churn(shard, rng)
        eventually(lambda: exporter.error is not None, 10, "the export to fail")
        assert isinstance(exporter.error, StorageError)
        (export / "t").unlink()
        (export / "t").mkdir()
        churn(shard, rng)
        eventually(
            lambda: exporter.error is None and exporter.exported_seq == shard.seq,
            10,
            "the export to recover",
        )
        churn(shard, rng)
        want = state(shard)
    assert_same(replay(export), want)
