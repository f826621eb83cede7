"""``embeddb serve`` as real processes: --restore, --fallback-snapshot, and --follow (a follower
process of a primary process, with tokens and metrics; the primary's shutdown with the
follower's feed open)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from embeddb.client import Client, ClientOptions
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError, FailedPreconditionError
from tests.support import START_TIMEOUT_S, ServeProcess, eventually, serve_processes

DIM = 4
CONFIG = """
slots_config:
  t: {dim: 4}
defaults:
  optimizer: {type: sgd, lr: 0.5}
  capacity: 1000
"""
IDS = np.arange(1, 21, dtype=np.uint64)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def serve(tmp_path: Path, config_file: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Start ``embeddb serve --port 0 --config CONFIG ...``; killed at teardown if still up."""
    starts = serve_processes(tmp_path)
    start = next(starts)
    yield lambda *args, **kw: start("--config", str(config_file), *args, **kw)
    next(starts, None)


def vectors(value: float, n: int = IDS.size) -> np.ndarray:
    return np.full((n, DIM), value, np.float32)


@pytest.mark.slow
def test_serve_restore_starts_at_that_snapshot(serve, tmp_path, config_file) -> None:
    data = tmp_path / "shard"
    with Shard(EmbeddingConfig.from_yaml(config_file), data) as shard:
        shard.assign("t", IDS, vectors(1.0))
        shard.snapshot("s1")
        shard.assign("t", IDS, vectors(2.0))  # after s1: set aside by the restore
    served = serve("--data-dir", str(data), "--restore", "s1")
    with Client([served.address]) as client:
        np.testing.assert_array_equal(client.lookup("t", IDS, train=False), vectors(1.0))
    assert served.stop() == 0, served.output()
    assert "opened from snapshot s1 at seq 1" in served.output()
    assert list(data.glob("log.before-restore-*")), "the old log is kept aside"
    missing = serve("--data-dir", str(data), "--restore", "nope", expect_exit=True)
    assert missing.process.returncode == 1
    assert "no complete snapshot 'nope'" in missing.output()
    assert "Traceback" not in missing.output()


@pytest.mark.slow
def test_serve_fallback_snapshot_recovers_past_a_corrupt_snapshot(
    serve, tmp_path, config_file
) -> None:
    data = tmp_path / "shard"
    shard = Shard(EmbeddingConfig.from_yaml(config_file), data)
    shard.assign("t", IDS, vectors(1.0))
    shard.snapshot("a")
    shard.assign("t", IDS, vectors(2.0))
    shard.snapshot("b")
    shard.assign("t", IDS, vectors(3.0))  # only in the update log
    shard.discard()  # a crash: no clean-shutdown record, recovery starts from a snapshot
    rows = data / "snapshots" / "b" / "ram" / "t.rows"  # never a file under disk/: hard links
    raw = bytearray(rows.read_bytes())
    raw[5] ^= 0x5A
    rows.write_bytes(bytes(raw))

    refused = serve("--data-dir", str(data), expect_exit=True)
    assert refused.process.returncode == 1, refused.output()
    assert "fails its CRC32 checksum" in refused.output()
    assert "--fallback-snapshot" in refused.output() and "Traceback" not in refused.output()

    served = serve("--data-dir", str(data), "--fallback-snapshot")
    with Client([served.address]) as client:  # snapshot a + the log after it
        np.testing.assert_array_equal(client.lookup("t", IDS, train=False), vectors(3.0))
    assert served.stop() == 0, served.output()
    assert "falling back to an older one" in served.output()
    assert "opened from snapshot a" in served.output()


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


@pytest.mark.slow
def test_serve_follow_replicates_a_primary_process(serve, tmp_path) -> None:
    rw, ro, rep = "rw-token-" + "r" * 20, "ro-token-" + "o" * 20, "replica-token-" + "p" * 20
    tokens = tmp_path / "tokens"
    tokens.write_text(f"rw {rw}\nro {ro}\nreplica {rep}\n")
    tokens.chmod(0o600)
    replica_file = tmp_path / "replica-token"
    replica_file.write_text(f"{rep}\n")
    replica_file.chmod(0o600)
    primary = serve("--data-dir", str(tmp_path / "primary"), "--tokens-file", str(tokens),
                    "--grace", "600")  # fmt: skip
    follower = serve("--follow", primary.address, "--primary-token-file", str(replica_file),
                     "--data-dir", str(tmp_path / "follower"), "--tokens-file", str(tokens),
                     "--metrics-port", "0")  # fmt: skip
    eventually(
        lambda: health(follower.address) == health_pb2.HealthCheckResponse.SERVING,
        START_TIMEOUT_S,
        "the follower to serve",
    )
    with (
        Client([primary.address], ClientOptions(token=rw)) as writer,
        Client([follower.address], ClientOptions(token=rw)) as reader,
    ):
        writer.assign("t", IDS, vectors(1.0))
        writer.delete("t", IDS[:5])
        expected = writer.lookup("t", IDS, train=False)
        eventually(
            lambda: np.array_equal(reader.lookup("t", IDS, train=False), expected),
            30,
            "the follower to apply the writes",
        )
        assert not expected[:5].any()  # the delete reached the follower too
        with pytest.raises(FailedPreconditionError, match="read-only follower"):
            reader.assign("t", IDS, vectors(2.0))
    url = re.search(r"metrics on (http://\S+/metrics)", follower.output())
    assert url, follower.output()
    metrics = scrape(url.group(1))
    assert metrics["embeddb_follower_bootstrapped"] == 1
    assert metrics["embeddb_follower_applied_seq"] == metrics["embeddb_follower_primary_seq"] > 0
    assert metrics["embeddb_follower_lag_seq"] == 0

    # The follower's feed is open: the primary must not wait for it (the 600 s grace would
    # outlast stop()'s 30 s wait).
    assert primary.stop() == 0, primary.output()
    assert "stopped cleanly" in primary.output()
    assert follower.stop() == 0, follower.output()
    out = follower.output()
    assert "follower bootstrapped from snapshot" in out and "stopped cleanly" in out
    assert ro not in out and rw not in out and "Traceback" not in out


def test_durability_options_that_exclude_each_other_are_usage_errors(tmp_path) -> None:
    from click.testing import CliRunner

    from embeddb.cli import main
    from embeddb.common.secrets import read_token_file

    cases = [
        (["--follow", "127.0.0.1:1", "--restore", "x"], "--follow excludes --restore"),
        (["--follow", "127.0.0.1:1", "--fallback-snapshot"], "--follow excludes"),
        (["--primary-tls-server-name", "x"], "the --primary-* options need --follow"),
        (["--ephemeral", "--restore", "x"], "--restore needs a data directory"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["serve", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    tokens = tmp_path / "tokens"
    tokens.write_text("# a server's tokens file\nrw first-token-0123456789\nro other\n")
    with pytest.raises(ConfigError, match="chmod 600"):
        read_token_file(tokens)  # a token file others may read is refused
    tokens.chmod(0o600)
    assert read_token_file(tokens) == "first-token-0123456789"
    tokens.write_text("replica replica-token-0123456789\n")
    assert read_token_file(tokens) == "replica-token-0123456789"
    tokens.write_text("  only-a-token-0123456789  # comment\n")
    assert read_token_file(tokens) == "only-a-token-0123456789"
    tokens.write_text("three words here\n")
    with pytest.raises(ConfigError, match="line is not shown"):
        read_token_file(tokens)
