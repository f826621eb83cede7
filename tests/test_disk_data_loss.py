"""Disk-tier data loss is visible: a real ``embeddb serve`` whose SST file was damaged while it
was stopped answers DATA_LOSS for the rows in the damaged block, logs one ERROR line per failed
read, counts the failures in ``Stats`` and in ``embeddb_disk_data_loss_total``, and keeps
serving every other row."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embeddb.engine.storage import DiskTier
from embeddb.errors import CorruptDataError
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.support import StartServe, serve_processes

TABLE = "t"
DIM = 16
ROWS = 3000  # with adagrad, 3000 rows of 128 bytes fill about 100 RocksDB blocks
CHUNK = 100
# A RAM tier of 64 rows: nearly every row lives on disk only.
CONFIG = f"""
slots_config:
  {TABLE}: {{dim: {DIM}}}
defaults:
  optimizer: {{type: adagrad, lr: 0.01}}
  capacity: 64
store: {{stripes: 1, eviction_chunk: 0.25, min_stripe_rows: 1}}
"""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


def lookup(stub: pb_grpc.EmbeddingStoreServiceStub, ids: np.ndarray, train: bool) -> np.ndarray:
    reply = stub.Lookup(
        pb.LookupRequest(table=TABLE, ids=wire.encode_ids(ids), train=train), timeout=30
    )
    return wire.decode_matrix(reply.vectors, "vectors")


def data_loss_counter(stub: pb_grpc.EmbeddingStoreServiceStub) -> int:
    (table,) = [t for t in stub.Stats(pb.StatsRequest(), timeout=10).tables if t.table == TABLE]
    return int(table.counters["data_loss"])


def data_loss_metric(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "embeddb_disk_data_loss_total" and sample.labels == {"table": TABLE}:
                return float(sample.value)
    raise AssertionError(f"embeddb_disk_data_loss_total{{table={TABLE!r}}} not exported")


def damage_the_middle(path: Path, n: int = 64) -> None:
    """Invert ``n`` bytes in the middle of ``path``: inside a data block, far from the footer
    and the index (written at the end of an SST file)."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 2)
        original = f.read(n)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in original))


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


@pytest.mark.slow
def test_a_damaged_sst_block_is_answered_data_loss_logged_counted_and_others_keep_serving(
    serve: StartServe, tmp_path: Path
) -> None:
    config, data_dir = tmp_path / "config.yaml", tmp_path / "shard"
    config.write_text(CONFIG)
    args = ("--config", str(config), "--data-dir", str(data_dir), "--metrics-port", "0")
    ids = np.arange(1, ROWS + 1, dtype=np.uint64)

    first = serve(*args)
    with grpc.insecure_channel(first.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        vectors = np.concatenate(
            [lookup(stub, ids[i : i + CHUNK], train=True) for i in range(0, ROWS, CHUNK)]
        )  # creates every row; the RAM tier evicts all but the newest to disk
    first.stop()  # clean: every row is on disk, in SST files

    ssts = sorted((data_dir / "disk").glob("*.sst"), key=lambda p: p.stat().st_size)
    assert ssts, "no SST file was written"
    damage_the_middle(ssts[-1])

    second = serve(*args)
    with grpc.insecure_channel(second.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        with pytest.raises(grpc.RpcError) as lost:
            lookup(stub, ids, train=False)
        assert lost.value.code() == grpc.StatusCode.DATA_LOSS, lost.value.details()
        assert "Corruption" in (lost.value.details() or "")

        # Counted once, logged once (naming the table and RocksDB's message), still serving.
        assert data_loss_counter(stub) == 1
        assert data_loss_metric(second.metrics_url()) == 1.0
        (line,) = error_lines(second.stderr())
        assert f"data loss in table '{TABLE}'" in line and "Corruption" in line, line

        # Rows in undamaged blocks keep serving their stored vectors; the damaged ones fail.
        failed = 0
        for i in range(0, ROWS, CHUNK):
            try:
                got = lookup(stub, ids[i : i + CHUNK], train=False)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DATA_LOSS
                failed += 1
            else:
                np.testing.assert_array_equal(got, vectors[i : i + CHUNK])
        assert 1 <= failed < ROWS // CHUNK // 2
        assert data_loss_counter(stub) == 1 + failed
        assert data_loss_metric(second.metrics_url()) == 1.0 + failed
        assert len(error_lines(second.stderr())) == 1 + failed
    second.stop()  # the server stayed up and still shuts down cleanly


def test_the_disk_tier_counts_and_logs_a_failed_check_per_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = DiskTier(tmp_path / "disk", {"a": 32, "b": 32})
    ids = np.arange(1, ROWS + 1, dtype=np.uint64)
    disk.put("a", ids, np.ones((ROWS, 32), dtype=np.float32))
    disk.put("b", ids, np.ones((ROWS, 32), dtype=np.float32))
    disk.close()
    damage_the_middle(max((tmp_path / "disk").glob("*.sst"), key=lambda p: p.stat().st_size))

    disk = DiskTier(tmp_path / "disk", {"a": 32, "b": 32})
    try:
        damaged = [t for t in ("a", "b") if _fails(disk, t, ids)]
        assert len(damaged) == 1
        (table,) = damaged
        other = "b" if table == "a" else "a"
        assert (disk.data_loss(table), disk.data_loss(other)) == (1, 0)
        found, rows = disk.get(other, ids)  # the other table is untouched
        assert found.all() and rows.shape == (ROWS, 32)
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and f"table {table!r}" in errors[0].getMessage()
    finally:
        disk.close()


def _fails(disk: DiskTier, table: str, ids: np.ndarray) -> bool:
    try:
        disk.get(table, ids)
    except CorruptDataError:
        return True
    return False
