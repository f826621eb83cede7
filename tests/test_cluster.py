"""The local cluster supervisor: start, health, address file, restarts, honest refusals, stop."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.errors import ConfigError, UnavailableError
from embeddb.server.cluster import Cluster, ClusterConfig, ShardState

TIMEOUT_S = 20.0


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def clusters() -> Iterator[Callable[..., Cluster]]:
    """Build clusters that are always stopped (every child reaped) at teardown."""
    made: list[Cluster] = []

    def make(**kw: object) -> Cluster:
        kw.setdefault("grace", 1.0)
        kw.setdefault("start_timeout", TIMEOUT_S)
        cluster = Cluster(ClusterConfig(**kw), output=lambda line: None)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


def supervising(cluster: Cluster) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(cluster.supervise()), daemon=True)
    thread.start()
    return thread, codes


def test_two_shards_start_healthy_and_a_killed_one_is_restarted(clusters, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="embeddb.server.cluster")
    address_file = tmp_path / "addresses"
    cluster = clusters(num_shards=2, ephemeral=True, address_file=address_file)
    cluster.start()
    addresses = cluster.wait_healthy()
    assert address_file.read_text().splitlines() == addresses and len(addresses) == 2
    assert len(set(addresses)) == 2 and all(serving(a) for a in addresses)

    thread, codes = supervising(cluster)
    victim = cluster.pids()[1]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: cluster.restarts()[1] == 1 and cluster.states()[1] is ShardState.SERVING,
        "shard 1 to be restarted",
    )
    assert cluster.pids()[1] != victim
    assert cluster.addresses == addresses and serving(addresses[1])  # same port again
    assert "shard 1 exited with code -9; restarting" in caplog.text
    assert cluster.restarts()[0] == 0

    pids = cluster.pids()
    cluster.stop()
    thread.join(TIMEOUT_S)
    assert codes == [0]
    assert cluster.states() == [ShardState.STOPPED] * 2
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped


def test_a_killed_persistent_shard_is_refused_not_silently_reset(clusters, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="embeddb.server.cluster")
    cluster = clusters(
        num_shards=1, data_dir=tmp_path, max_restarts=2, restart_backoff=0.1, fail_fast=True
    )
    cluster.start()
    cluster.wait_healthy()
    victim = cluster.pids()[0]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    watchdog = threading.Timer(TIMEOUT_S, cluster.request_stop)  # supervise() must not hang
    watchdog.start()
    try:
        code = cluster.supervise()
    finally:
        watchdog.cancel()
    assert code == 1
    assert cluster.states() == [ShardState.FAILED]
    log = caplog.text
    assert "shard 0 exited with code -9; restarting" in log
    assert "not shut down cleanly" in log  # the shard's own reason, quoted
    assert "shard 0: giving up after 2 failed restarts" in log
    assert any((tmp_path / "shard-0" / "disk").iterdir())  # the data was left alone


def test_a_shard_that_cannot_start_is_named(clusters, tmp_path) -> None:
    (tmp_path / "shard-1").write_text("a file where shard 1's data directory should be")
    cluster = clusters(num_shards=2, data_dir=tmp_path)
    cluster.start()
    with pytest.raises(UnavailableError, match=r"shard 1 failed to start \(exit code 1\)") as err:
        cluster.wait_healthy()
    assert "cannot use data directory" in str(err.value)


def test_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="num_shards"):
        ClusterConfig(num_shards=0)
    with pytest.raises(ConfigError, match="base_port"):
        ClusterConfig(num_shards=4, base_port=65534)


def test_embeddb_cluster_command_serves_and_stops_on_sigterm(tmp_path) -> None:
    address_file = tmp_path / "addresses"
    cmd = [sys.executable, "-m", "embeddb.cli", "cluster", "--num-shards", "2", "--base-port",
           "0", "--ephemeral", "--grace", "1", "--address-file", str(address_file)]  # fmt: skip
    log = tmp_path / "cluster.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: address_file.exists() or process.poll() is not None, "the address file")
        addresses = address_file.read_text().splitlines()
        assert len(addresses) == 2 and all(serving(a) for a in addresses), log.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT_S) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert f"shard 0: {addresses[0]}" in output and f"shard 1: {addresses[1]}" in output
    assert output.count("stopped cleanly") == 2, output
    assert "Traceback" not in output
