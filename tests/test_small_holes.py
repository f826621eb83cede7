"""Issue 23 item 6, small holes: each test failed before its fix.

* a damaged SST block fails every disk-tier iteration (scan, reshard's read, recovery's count)
  with CorruptDataError (gRPC DATA_LOSS) instead of ending it early as if the table ended;
* an optimizer update that overflows float32 leaves the stored row unchanged and is counted
  like a NaN gradient;
* a data directory keeps its shard identity when ``topology.json`` is deleted, and refuses to
  start when nothing records it but it holds data;
* table names are bounded where the config is read;
* a follower bounds the snapshot it receives and backs off between re-bootstraps;
* ``embeddb scan`` stops on a cursor that does not advance; the inspection commands print
  server-supplied strings escaped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from embeddb.cli import main as cli
from embeddb.cli.common import printable
from embeddb.common.routing import ROUTING_ALGORITHM, Topology, shard_of
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.config._checks import MAX_NAME_CHARS
from embeddb.engine.durability.topology import IDENTITY_FILE, TOPOLOGY_FILE, write_topology
from embeddb.engine.optim import Optimizer
from embeddb.engine.shard import Shard
from embeddb.engine.storage import DiskTier
from embeddb.errors import ConfigError, CorruptDataError, OutOfRangeError
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.server.follower_config import SnapshotLimits
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import eventually
from tests.test_disk_data_loss import damage_the_middle

ROWS = 3000
WIDTH = 32


def _largest_sst(disk_dir: Path) -> Path:
    ssts = list(disk_dir.glob("*.sst"))
    assert ssts, f"no SST file in {disk_dir}"
    return max(ssts, key=lambda p: p.stat().st_size)


# ------------------------------------------------------------------ disk-tier iterations
@pytest.fixture
def damaged_disk(tmp_path: Path) -> Path:
    """A disk tier holding ROWS rows of table ``a``, one SST block damaged."""
    path = tmp_path / "disk"
    disk = DiskTier(path, {"a": WIDTH})
    ids = np.arange(1, ROWS + 1, dtype=np.uint64)
    disk.put("a", ids, np.ones((ROWS, WIDTH), dtype=np.float32))
    disk.close()
    damage_the_middle(_largest_sst(path))
    return path


@pytest.mark.parametrize("read_only", [False, True], ids=["live", "read-only (reshard)"])
def test_every_disk_tier_iteration_fails_on_a_damaged_block(
    damaged_disk: Path, read_only: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: iter_rows/ids_after/count stopped at the damaged block and returned what they
    had read so far, like the end of the table, with no error and no log line."""
    disk = DiskTier(damaged_disk, {"a": WIDTH}, read_only=read_only)
    try:
        with pytest.raises(CorruptDataError, match="Corruption"):
            list(disk.iter_rows("a", chunk=256))
        with pytest.raises(CorruptDataError, match="Corruption"):
            disk.ids_after("a", None, 10 * ROWS)
        with pytest.raises(CorruptDataError, match="Corruption"):
            disk.count("a")
        assert disk.data_loss("a") == 3
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 3 and all("data loss in table 'a'" in r.getMessage() for r in errors)
    finally:
        disk.close()


def test_a_scan_over_a_damaged_block_fails_instead_of_reporting_done(tmp_path: Path) -> None:
    """Before: the scan reported done after the rows in front of the damaged block."""
    data = tmp_path / "shard"
    ids = np.arange(1, ROWS + 1, dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((ROWS, 8)).astype(np.float32)
    cfg = one_table_config(dim=8, capacity=64)
    with Shard(cfg, data) as shard:
        shard.assign("t", ids, rows)  # all but the newest rows are evicted to disk
    damage_the_middle(_largest_sst(data / "disk"))

    with Shard(cfg, data) as shard:
        seen = 0
        after: int | None = None
        with pytest.raises(CorruptDataError, match="Corruption"):
            while True:
                page = shard.scan("t", after, 500)
                seen += page.ids.size
                if page.done:
                    break
                after = int(page.ids[-1])
        assert seen < ROWS


# ------------------------------------------------------------------ optimizer overflow
OVERFLOWING = {
    # lr * g overflows the vector: -inf
    "sgd": (OptimizerConfig(kind=OptimizerKind.SGD, lr=1e30), 1e20),
    # g * g overflows the accumulator: inf (the vector stays finite)
    "adagrad": (OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.1), 1e20),
    # (1 - beta2) * g * g overflows v
    "adam": (OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.1), 1e30),
}


@pytest.mark.parametrize("name", sorted(OVERFLOWING))
def test_an_update_that_overflows_leaves_the_row_unchanged_and_is_counted(name: str) -> None:
    """Before: the finite gradient passed the NaN check and its update stored Inf/NaN."""
    config, huge = OVERFLOWING[name]
    dim = 4
    opt = Optimizer(config, dim)
    rows = np.zeros((3, dim + opt.state_dim), dtype=np.float32)
    rows[:, :dim] = 0.5
    rows[:, dim:] = opt.initial_state(3)
    before = rows.copy()
    grads = np.full((3, dim), 0.25, dtype=np.float32)
    grads[1] = huge  # finite, but its update overflows
    skipped = opt.apply(rows, np.array([0, 1, 2], dtype=np.int64), grads)
    assert skipped == 1
    assert np.isfinite(rows).all()
    np.testing.assert_array_equal(rows[1], before[1])
    assert not np.array_equal(rows[0, :dim], before[0, :dim])  # the others were updated
    assert not np.array_equal(rows[2, :dim], before[2, :dim])


def test_a_shard_counts_overflowing_updates_like_nan_gradients(tmp_path: Path) -> None:
    cfg = one_table_config(dim=4, optimizer=OptimizerConfig(kind=OptimizerKind.SGD, lr=1e30))
    with Shard(cfg, tmp_path / "s") as shard:
        ids = np.array([1, 2], dtype=np.uint64)
        shard.assign("t", ids, np.ones((2, 4), dtype=np.float32))
        grads = np.array([[1e-32] * 4, [1e20] * 4], dtype=np.float32)
        result = shard.apply_gradients("t", ids, grads)
        assert (result.applied, result.nan_skipped) == (1, 1)
        assert shard.stats().tables["t"].nan_skipped == 1
        found, rows = shard.peek("t", ids)
        assert found.all() and np.isfinite(rows).all()
        np.testing.assert_array_equal(rows[1, :4], np.ones(4, dtype=np.float32))


# ------------------------------------------------------------------ shard identity
def _owned(index: int, count: int) -> np.ndarray:
    universe = np.arange(1, 1000, dtype=np.uint64)
    return universe[shard_of(universe, count) == index][:5]


def test_deleting_topology_json_does_not_let_a_directory_start_as_another_shard(
    tmp_path: Path,
) -> None:
    """Before: without topology.json (and no snapshot) the directory adopted whatever place it
    was started with, e.g. the default shard 0 of 1."""
    data = tmp_path / "s"
    owned = _owned(1, 4)
    with Shard(one_table_config(), data, shard_index=1, num_shards=4) as shard:
        shard.assign("t", owned, np.ones((owned.size, 4), np.float32))
    assert json.loads((data / IDENTITY_FILE).read_text())["shard_index"] == 1
    (data / TOPOLOGY_FILE).unlink()

    with pytest.raises(ConfigError, match=rf"holds shard 1 of 4 \({IDENTITY_FILE}\)"):
        Shard(one_table_config(), data)  # shard 0 of 1
    with Shard(one_table_config(), data, shard_index=1, num_shards=4) as shard:
        assert shard.stats().tables["t"].rows == owned.size
    assert (data / TOPOLOGY_FILE).exists()  # written again

    (data / TOPOLOGY_FILE).unlink()
    (data / IDENTITY_FILE).unlink()
    with pytest.raises(ConfigError, match="holds data but neither") as refused:
        Shard(one_table_config(), data, shard_index=1, num_shards=4)
    assert refused.value.key == "shard_index" and ROUTING_ALGORITHM in str(refused.value)
    write_topology(data, Topology(1, 4))  # what the message tells the operator to do
    with Shard(one_table_config(), data, shard_index=1, num_shards=4) as shard:
        assert shard.stats().tables["t"].rows == owned.size
    assert (data / IDENTITY_FILE).exists()


def test_the_two_identity_records_must_agree(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with Shard(one_table_config(), data, shard_index=0, num_shards=2):
        pass
    write_topology(data, Topology(1, 2), IDENTITY_FILE)
    with pytest.raises(CorruptDataError, match="remove the wrong one"):
        Shard(one_table_config(), data, shard_index=0, num_shards=2)


# ------------------------------------------------------------------ table names
def test_a_table_name_longer_than_the_bound_is_a_config_error_naming_the_key() -> None:
    """Before: 300 characters passed, and every snapshot then failed (file name too long)."""
    long = "t" * 300
    with pytest.raises(ConfigError, match=f"at most {MAX_NAME_CHARS} characters") as info:
        EmbeddingConfig.from_dict({"tables": {long: {"dim": 4}}})
    assert "tables" in str(info.value)
    with pytest.raises(ConfigError, match=f"at most {MAX_NAME_CHARS} characters"):
        EmbeddingConfig.from_dict({"slots_config": {"f": {"dim": 4, "table": long}}})


@pytest.mark.slow
def test_a_table_name_at_the_bound_snapshots(tmp_path: Path) -> None:
    name = "n" * MAX_NAME_CHARS
    cfg = EmbeddingConfig.from_dict({"tables": {name: {"dim": 4}}})
    with Shard(cfg, tmp_path / "s") as shard:
        shard.assign(name, np.array([1, 2], dtype=np.uint64), np.ones((2, 4), np.float32))
        shard.snapshot("one")


# ------------------------------------------------------------------ follower
def test_a_snapshot_over_the_followers_limits_is_refused() -> None:
    """Before: a follower wrote whatever file count and sizes its primary streamed."""
    budget = SnapshotLimits(max_files=2, max_file_bytes=100, max_total_bytes=150).budget(Path())
    budget.take("a", 0, 60)
    budget.take("a", 60, 40)
    with pytest.raises(CorruptDataError, match="max_file_bytes"):
        budget.take("a", 100, 1)
    budget.take("b", 0, 50)
    with pytest.raises(CorruptDataError, match="max_files"):
        budget.take("c", 0, 1)
    with pytest.raises(CorruptDataError, match="max_total_bytes"):
        budget.take("b", 50, 1)
    with pytest.raises(ConfigError, match="max_files"):
        SnapshotLimits(max_files=0)
    free = SnapshotLimits(reserve_bytes=0).budget(Path())
    assert free.total_bytes > 0  # by default: the free space of the data directory


def test_a_follower_refuses_a_primary_snapshot_over_its_limits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from embeddb.server import build_server

    shard = Shard(one_table_config(), tmp_path / "primary")
    server = build_server(shard)
    options = FollowerOptions(
        f"127.0.0.1:{server.port}",
        backoff=0.02,
        max_backoff=0.1,
        limits=SnapshotLimits(max_files=2),
    )
    follower = Follower(one_table_config(), tmp_path / "follower", options)
    try:
        with caplog.at_level(logging.ERROR, logger="embeddb.server.follower"):
            follower.start()
            eventually(
                lambda: any("max_files" in r.getMessage() for r in caplog.records),
                30,
                "the follower to refuse the snapshot",
            )
        follower.stop()  # it retries after a refusal: stop it before looking at its files
        assert not follower.bootstrapped
        # No snapshot kept (a retry cut short by the stop may leave its ".tmp-" directory,
        # which is never loaded: engine/durability/snapshot_dirs.py).
        assert not list((tmp_path / "follower").glob("replica-*/snapshots/[!.]*"))
    finally:
        follower.stop()
        server.stop(grace=0)
        shard.close()


class _RecordingStop(threading.Event):
    """The follower's stop event: records each wait instead of sleeping; set after ``n``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.n = n

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0.0))
        if len(self.waits) >= self.n:
            self.set()
        return self.is_set()


def test_re_bootstraps_back_off_exponentially_up_to_the_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a bootstrap counted as progress, so a primary answering OUT_OF_RANGE right after
    each bootstrap was copied from every ``backoff`` seconds (206 times in 30 s)."""
    options = FollowerOptions(
        "127.0.0.1:1", backoff=0.1, max_backoff=0.2, max_bootstrap_backoff=3.0
    )
    follower = Follower(one_table_config(), tmp_path / "f", options)
    stop = _RecordingStop(8)
    follower._stop = stop

    def bootstrap(take_new: bool) -> None:
        follower.bootstraps += 1
        follower._progress = True

    def follow() -> None:
        raise OutOfRangeError("the records after seq 5 were truncated")

    follower._bootstrap = bootstrap  # type: ignore[method-assign]
    follower._follow = follow  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="embeddb.server.follower"):
        follower._run()
    # jittered: each wait is 50-100% of 0.1, 0.2, 0.4, ... capped at 3.0
    expected = [min(3.0, 0.1 * 2**k) for k in range(8)]
    for got, want in zip(stop.waits, expected, strict=True):
        assert 0.5 * want <= got <= want, (stop.waits, expected)
    assert follower.bootstraps == 8
    logged = [r for r in caplog.records if "bootstraps so far" in r.getMessage()]
    assert len(logged) == 8


# ------------------------------------------------------------------ CLI
EVIL = "\x1b[2J\x1b[31mred\x07\u202e"


class _FakeShard(pb_grpc.EmbeddingStoreServiceServicer):
    """A server that answers with terminal escape codes and a Scan cursor that never moves."""

    def DescribeShard(self, request: Any, context: Any) -> Any:
        return pb.DescribeShardResponse(
            shard_index=0,
            num_shards=1,
            routing=pb.Routing(algorithm=ROUTING_ALGORITHM),
            limits=pb.ServerLimits(
                max_message_bytes=4 << 20, max_ids_per_request=1 << 16, max_response_bytes=4 << 20
            ),
        )

    def ListTables(self, request: Any, context: Any) -> Any:
        return pb.ListTablesResponse(
            tables=[pb.TableInfo(name="t" + EVIL, dim=2, optimizer="sgd" + EVIL, capacity=8)]
        )

    def DescribeTable(self, request: Any, context: Any) -> Any:
        return pb.DescribeTableResponse(name="t", dim=2, optimizer="sgd", capacity=8)

    def Stats(self, request: Any, context: Any) -> Any:
        table = pb.TableStats(table="t" + EVIL, counters={"rows": 1})
        return pb.StatsResponse(shard_index=0, num_shards=1, tables=[table])

    def Scan(self, request: Any, context: Any) -> Any:
        ids = np.array([5], dtype=np.uint64)
        return pb.ScanResponse(
            ids=wire.encode_ids(ids),
            vectors=wire.encode_matrix(np.ones((1, 2), dtype=np.float32)),
            last_id=5,
            done=False,
        )


@pytest.fixture
def fake_shard() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_EmbeddingStoreServiceServicer_to_server(_FakeShard(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=0)


def test_scan_stops_with_an_error_on_a_cursor_that_does_not_advance(fake_shard: str) -> None:
    """Before: embeddb scan asked for the same page forever."""
    result = CliRunner().invoke(cli, ["scan", "--addresses", fake_shard, "--table", "t"])
    assert result.exit_code == 1, result.output
    assert "does not advance" in result.output and "Error:" in result.output
    assert result.output.count("5,1,1") == 2  # the first page, then the same page once more


@pytest.mark.parametrize("command", ["tables", "stats"])
def test_inspection_commands_print_server_strings_escaped(fake_shard: str, command: str) -> None:
    """Before: the table name went to the terminal raw (clear screen, red, bell, RTL)."""
    result = CliRunner().invoke(cli, [command, "--addresses", fake_shard])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\u202e" not in result.output
    assert "t\\x1b[2J\\x1b[31mred\\x07\\u202e" in result.output


def test_printable_escapes_controls_only() -> None:
    assert printable("plain table_1.x-y é") == "plain table_1.x-y é"
    assert printable("a\nb\x00\x9b\u2066") == "a\\x0ab\\x00\\x9b\\u2066"
