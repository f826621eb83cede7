"""The local cluster supervisor: start, health, address file, restarts, honest refusals, stop,
TLS and metrics options, shards that die with their supervisor, crash loops given up."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.client import Client, ClientOptions
from embeddb.errors import ConfigError, UnauthenticatedError, UnavailableError
from embeddb.server.cluster import Cluster, ClusterConfig, ShardState
from tests.support import StartServe, eventually, free_port_range, serve_processes
from tests.test_server_security import RW, make_cert

TIMEOUT_S = 20.0
TABLE = "item_id"  # a table of the packaged presets/default.yaml (dim 16)


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process; a zombie (exited, not yet reaped) is not."""
    if not Path("/proc/self/stat").exists():  # no procfs: a zombie still counts as running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # the field after "(comm)"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.fixture
def clusters() -> Iterator[Callable[..., Cluster]]:
    """Build clusters that are always stopped (every child reaped) at teardown."""
    made: list[Cluster] = []

    def make(output: Callable[[str], None] = lambda line: None, **kw: object) -> Cluster:
        kw.setdefault("grace", 1.0)
        kw.setdefault("start_timeout", TIMEOUT_S)
        cluster = Cluster(ClusterConfig(**kw), output=output)  # type: ignore[arg-type]
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


@pytest.mark.slow
def test_two_shards_start_healthy_and_a_killed_one_is_restarted(
    clusters: Callable[..., Cluster], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
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
    eventually(
        lambda: cluster.restarts()[1] == 1 and cluster.states()[1] is ShardState.SERVING,
        TIMEOUT_S,
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


@pytest.mark.slow
def test_a_killed_persistent_shard_recovers_every_acknowledged_update(
    clusters: Callable[..., Cluster], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="embeddb.server.cluster")
    cluster = clusters(num_shards=1, data_dir=tmp_path, max_restarts=2, restart_backoff=0.1)
    cluster.start()
    addresses = cluster.wait_healthy()
    thread, codes = supervising(cluster)
    ids = np.arange(500, dtype=np.uint64)
    with Client(addresses) as client:
        client.lookup(TABLE, ids)  # creates the rows (logged)
        client.apply_gradients(TABLE, ids[:300], np.full((300, 16), 0.5, np.float32))
        client.delete(TABLE, ids[450:])
        before = client.lookup(TABLE, ids, train=False)
    victim = cluster.pids()[0]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)  # no flush, no clean-shutdown record
    eventually(
        lambda: cluster.restarts()[0] == 1 and cluster.states()[0] is ShardState.SERVING,
        TIMEOUT_S,
        "shard 0 to be restarted",
    )
    with Client(addresses) as client:
        after = client.lookup(TABLE, ids, train=False)
    np.testing.assert_array_equal(after, before)  # deleted rows read as zeros in both
    assert not after[450:].any() and after[:450].all(axis=1).all()
    assert "shard 0 exited with code -9; restarting" in caplog.text
    cluster.stop()
    thread.join(TIMEOUT_S)
    assert codes == [0]


@pytest.mark.slow
def test_a_shard_that_cannot_start_is_named(
    clusters: Callable[..., Cluster], tmp_path: Path
) -> None:
    (tmp_path / "shard-1").write_text("a file where shard 1's data directory should be")
    cluster = clusters(num_shards=2, data_dir=tmp_path)
    cluster.start()
    with pytest.raises(UnavailableError, match=r"shard 1 failed to start \(exit code 1\)") as err:
        cluster.wait_healthy()
    assert "cannot use data directory" in str(err.value)


def test_config_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_shards"):
        ClusterConfig(num_shards=0)
    with pytest.raises(ConfigError, match="base_port"):
        ClusterConfig(num_shards=4, base_port=65534)
    with pytest.raises(ConfigError, match="restart_window"):
        ClusterConfig(num_shards=1, restart_window=0)
    with pytest.raises(ConfigError, match="both tls_cert and tls_key"):
        ClusterConfig(num_shards=1, tls_cert=tmp_path / "cert.pem")
    with pytest.raises(ConfigError, match="tls_server_name"):
        ClusterConfig(num_shards=1, tls_server_name="shard.example")
    with pytest.raises(ConfigError, match=r"metrics_base_port: .* not all valid"):
        ClusterConfig(num_shards=2, metrics_base_port=65535)
    with pytest.raises(ConfigError, match="overlap the gRPC ports"):
        ClusterConfig(num_shards=2, base_port=7070, metrics_base_port=7071)
    missing = ClusterConfig(num_shards=1, tls_cert=tmp_path / "no.pem", tls_key=tmp_path / "k")
    with pytest.raises(ConfigError, match="tls_cert: cannot read"):
        Cluster(missing)


@pytest.mark.slow
def test_embeddb_cluster_command_serves_and_stops_on_sigterm(serve: StartServe) -> None:
    cluster = serve("--num-shards", "2", "--ephemeral", "--grace", "1", command="cluster")
    addresses = cluster.addresses
    assert len(addresses) == 2 and all(serving(a) for a in addresses), cluster.stderr()
    cluster.stop()
    output = cluster.stdout() + cluster.stderr()
    assert f"shard 0: {addresses[0]}" in output and f"shard 1: {addresses[1]}" in output
    assert output.count("stopped cleanly") == 2, output
    assert "Traceback" not in output


# ---------------------------------------------------------------- TLS, tokens and metrics


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for localhost / 127.0.0.1 and its key, as files."""
    cert, key = make_cert()
    directory = tmp_path_factory.mktemp("tls")
    (directory / "cert.pem").write_bytes(cert)
    (directory / "key.pem").write_bytes(key)
    return directory / "cert.pem", directory / "key.pem"


@pytest.mark.slow
def test_tls_shards_requiring_tokens_are_probed_over_tls_and_serve_tls_clients(
    clusters: Callable[..., Cluster], tmp_path: Path, tls_files: tuple[Path, Path]
) -> None:
    cert, key = tls_files
    tokens = tmp_path / "tokens"
    tokens.write_text(f"rw {RW}\n")
    tokens.chmod(0o600)
    cluster = clusters(
        num_shards=2,
        ephemeral=True,
        tls_cert=cert,
        tls_key=key,
        serve_args=("--tokens-file", str(tokens)),
    )
    cluster.start()
    addresses = cluster.wait_healthy()  # health checks over TLS, without a token
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    ids = np.arange(100, dtype=np.uint64)  # both shards own some of them
    with Client(addresses, ClientOptions(credentials=credentials, token=RW)) as client:
        vectors = client.lookup(TABLE, ids)
        assert vectors.shape == (100, 16) and np.all(np.isfinite(vectors))
        np.testing.assert_array_equal(client.lookup(TABLE, ids, train=False), vectors)
    with (
        Client(addresses, ClientOptions(credentials=credentials)) as client,
        pytest.raises(UnauthenticatedError),
    ):
        client.lookup(TABLE, ids, train=False)
    for address in addresses:  # TLS only: a plaintext channel cannot even check health
        with pytest.raises(grpc.RpcError) as refused:
            serving(address)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
def test_the_health_probe_checks_the_tls_server_name_and_says_why_it_fails(
    clusters: Callable[..., Cluster], tls_files: tuple[Path, Path]
) -> None:
    cert, key = tls_files
    lines: list[str] = []
    cluster = clusters(
        num_shards=1,
        ephemeral=True,
        tls_cert=cert,
        tls_key=key,
        tls_server_name="not-in-the-certificate.example",
        output=lines.append,
    )
    cluster.start()
    eventually(lambda: any("serving shard" in line for line in lines), TIMEOUT_S, "the shard")
    with pytest.raises(UnavailableError, match=r"last health check: UNAVAILABLE: .*Hostname"):
        cluster.wait_healthy(timeout=2)


@pytest.mark.slow
def test_each_shard_serves_metrics_on_the_base_port_plus_its_index(
    clusters: Callable[..., Cluster],
) -> None:
    base = free_port_range(2)
    cluster = clusters(num_shards=2, ephemeral=True, metrics_base_port=base)
    cluster.start()
    addresses = cluster.wait_healthy()
    with Client(addresses) as client:
        client.lookup(TABLE, np.arange(100, dtype=np.uint64))
    for index in range(2):
        url = f"http://127.0.0.1:{base + index}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        rows = re.search(rf'^embeddb_rows{{table="{TABLE}"}} (\S+)$', text, flags=re.M)
        assert rows and float(rows.group(1)) > 0, text  # this shard's own rows


# ---------------------------------------------------------------- shards die with the supervisor


@pytest.mark.slow
def test_shards_shut_down_cleanly_when_the_supervisor_is_killed(
    serve: StartServe, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    supervisor = serve(
        "--num-shards", "2", "--data-dir", str(data), "--grace", "1", command="cluster"
    )
    pids: dict[int, int] = {}
    try:
        # The supervisor logs each shard's pid when it becomes healthy.
        found = re.findall(r"shard (\d+) serving on \S+ \(pid (\d+)\)", supervisor.stderr())
        pids = {int(index): int(pid) for index, pid in found}
        assert sorted(pids) == [0, 1] and all(map(running, pids.values())), supervisor.stderr()
        supervisor.process.kill()
        supervisor.process.wait()
        eventually(lambda: not any(map(running, pids.values())), TIMEOUT_S, "the shards to exit")
    finally:
        for pid in pids.values():
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    for index in range(2):  # a graceful shutdown: rows written back, clean-shutdown record
        assert (data / f"shard-{index}" / "clean-shutdown.json").exists()


@pytest.mark.slow
def test_a_shard_whose_parent_is_already_gone_shuts_down_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process id that is certainly not the shard's parent
    cmd = [sys.executable, "-m", "embeddb.cli", "serve", "--ephemeral", "--port", "0",
           "--parent-pid", str(gone.pid)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert f"parent process {gone.pid} is gone; shutting down" in result.stderr
    assert "stopped cleanly" in result.stderr


# ---------------------------------------------------------------- crash loops


@pytest.mark.slow
def test_a_crash_looping_shard_is_given_up(
    clusters: Callable[..., Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="embeddb.server.cluster")
    cluster = clusters(
        num_shards=1, ephemeral=True, max_restarts=2, restart_backoff=0.1, fail_fast=True
    )
    cluster.start()
    cluster.wait_healthy()
    thread, codes = supervising(cluster)
    killed: list[int] = []

    def kill_when_healthy() -> bool:
        """SIGKILL the shard each time it is healthy again; True once it is given up."""
        before = cluster.pids()[0]
        state = cluster.states()[0]
        if state is ShardState.FAILED:
            return True
        if state is ShardState.SERVING and cluster.pids()[0] == before and before not in killed:
            assert before is not None
            os.kill(before, signal.SIGKILL)
            killed.append(before)
        return False

    eventually(kill_when_healthy, TIMEOUT_S, "shard 0 to be given up")
    thread.join(TIMEOUT_S)
    assert codes == [1]  # fail_fast
    assert cluster.restarts() == [2] and len(killed) == 3
    assert cluster.states() == [ShardState.FAILED]
    log = caplog.text
    assert "shard 0 exited with code -9; restarting\n" in log  # the first: at once
    assert "shard 0 exited with code -9; restarting in 0.1s (restart 2 within 60s" in log
    assert (
        "shard 0 exited with code -9; giving up after 2 restarts in the last" in log
        and "(at most 2 within a restart window of 60s); 127.0.0.1:" in log
    )
