"""``embeddb serve`` as a real process: serving, the shutdown order, durability, clean errors."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.cli import main
from embeddb.server import ServerConfig
from embeddb.server.daemon import DaemonOptions, run_daemon
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import START_TIMEOUT_S, StartServe, eventually, serve_processes

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TABLE = "item_id"  # a table of the packaged presets/default.yaml (dim 16)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    """Start ``python -m embeddb.cli serve --port 0 ...``; every process is killed at teardown."""
    yield from serve_processes(tmp_path)


def lookup(channel: grpc.Channel, ids: np.ndarray, train: bool, timeout: float = 10.0):
    stub = pb_grpc.EmbeddingStoreServiceStub(channel)
    reply = stub.Lookup(
        pb.LookupRequest(table=TABLE, ids=wire.encode_ids(ids), train=train), timeout=timeout
    )
    return wire.decode_matrix(reply.vectors, "vectors")


def health_status(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


@pytest.mark.slow
def test_serve_answers_then_shuts_down_in_order_and_its_rows_survive(serve, tmp_path) -> None:
    data_dir = tmp_path / "shard"
    ids = np.arange(1, 51, dtype=np.uint64)
    first = serve("--data-dir", str(data_dir), "--grace", "2")
    with grpc.insecure_channel(first.address) as channel:
        assert health_status(channel) == SERVING
        trained = lookup(channel, ids, train=True)  # admits the rows
        assert trained.shape == (50, 16) and np.abs(trained).max() > 0

        # Watch health across the shutdown: NOT_SERVING must come before the server goes away.
        seen: list[int] = []
        watching = threading.Event()
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="")
        )

        def watch() -> None:
            try:
                for reply in stream:
                    seen.append(reply.status)
                    watching.set()
                    if reply.status == NOT_SERVING:
                        stream.cancel()  # an open stream would hold the server for the grace
            except grpc.RpcError:
                pass

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(5)
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=2 + 5) == 0, first.output()
        watcher.join(5)
    assert seen[:2] == [SERVING, NOT_SERVING]
    out = first.output()
    assert f"serving shard 0/1 on 127.0.0.1:{first.port} (data dir {data_dir})" in out
    assert "stopped cleanly" in out and "Traceback" not in out
    assert (data_dir / "clean-shutdown.json").exists()

    second = serve("--data-dir", str(data_dir))
    with grpc.insecure_channel(second.address) as channel:
        np.testing.assert_array_equal(lookup(channel, ids, train=False), trained)
    second.process.send_signal(signal.SIGINT)
    assert second.process.wait(timeout=10) == 0, second.output()


@pytest.mark.slow
def test_calls_in_flight_at_sigterm_finish_or_fail_unavailable(serve, tmp_path) -> None:
    served = serve("--data-dir", str(tmp_path / "shard"), "--grace", "3", "--workers", "4")
    ok = [0]
    errors: list[grpc.StatusCode] = []
    done = threading.Event()
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with grpc.insecure_channel(served.address) as channel:
            while not done.is_set():
                ids = rng.integers(0, 1 << 20, size=5000, dtype=np.uint64)
                try:
                    lookup(channel, ids, train=True, timeout=10)
                    with lock:
                        ok[0] += 1
                except grpc.RpcError as exc:
                    with lock:
                        errors.append(exc.code())
                    done.wait(0.01)  # no busy loop against a stopping server

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: ok[0] >= 20, 60, "20 lookups to succeed")
        served.process.send_signal(signal.SIGTERM)
        code = served.process.wait(timeout=3 + 10)
    finally:
        done.set()
        for t in threads:
            t.join(15)
    assert code == 0, served.output()
    assert set(errors) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}, errors
    assert (tmp_path / "shard" / "clean-shutdown.json").exists()


@pytest.mark.slow
def test_bad_config_exits_nonzero_naming_the_key(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("slots_config:\n  a: {dims: 4}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", "serve", "--config", str(bad), "--port", "0",
         "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "slots_config.a" in proc.stderr and "dims" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "d").exists()  # nothing opened


@pytest.mark.slow
def test_a_dirty_data_dir_is_refused_with_the_shards_reason(tmp_path) -> None:
    disk = tmp_path / "d" / "disk"
    disk.mkdir(parents=True)
    (disk / "CURRENT").write_text("left by a crashed shard\n")
    # the shard's place, as its first start recorded it (a directory holding data without one
    # is refused for that reason first: tests/test_small_holes.py)
    (tmp_path / "d" / "topology.json").write_text(
        '{"format_version": 1, "shard_index": 0, "num_shards": 1,'
        ' "routing": "splitmix64-lemire-v1"}'
    )
    result = CliRunner().invoke(main, ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"])
    assert result.exit_code == 1
    assert "not shut down cleanly" in result.output and "Traceback" not in result.output


def test_shard_index_must_be_below_num_shards() -> None:
    result = CliRunner().invoke(main, ["serve", "--shard-index", "2", "--num-shards", "2"])
    assert result.exit_code == 2 and "--shard-index" in result.output


@pytest.mark.slow
def test_serve_wires_tokens_and_metrics_and_never_logs_the_token(serve, tmp_path) -> None:
    token = "s3cret-token-" + "x" * 20
    tokens = tmp_path / "tokens"
    tokens.write_text(f"rw {token}\n")
    tokens.chmod(0o600)
    served = serve("--ephemeral", "--tokens-file", str(tokens), "--metrics-port", "0")
    with grpc.insecure_channel(served.address) as channel:
        assert health_status(channel) == SERVING  # health needs no token
        with pytest.raises(grpc.RpcError) as refused:
            lookup(channel, np.arange(3, dtype=np.uint64), train=False)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    url = re.search(r"metrics on (http://\S+/metrics)", served.output())
    assert url, served.output()
    with urllib.request.urlopen(url.group(1), timeout=5) as reply:
        assert reply.status == 200
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=10) == 0
    assert "bearer tokens required" in served.output()
    assert token not in served.output()


def test_tls_cert_without_key_is_refused_naming_the_option(tmp_path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    # --port 0: the default port (7070) is checked for being free first, and may be taken.
    result = CliRunner().invoke(
        main, ["serve", "--ephemeral", "--port", "0", "--tls-cert", str(cert)]
    )
    assert result.exit_code == 1 and "tls_cert" in result.output
    assert "Traceback" not in result.output


def test_run_daemon_in_process_writes_and_removes_the_port_file(tmp_path) -> None:
    stop = threading.Event()
    port_file = tmp_path / "run" / "port"
    options = DaemonOptions(
        data_dir=tmp_path / "shard", grace=1, port_file=port_file, handle_signals=False
    )
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(run_daemon(one_table_config(), ServerConfig(), options, stop))
    )
    thread.start()
    try:
        port = eventually(
            lambda: thread.is_alive() and port_file.exists() and int(port_file.read_text()),
            START_TIMEOUT_S,
            "the port file",
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert health_status(channel) == SERVING
        assert [p.name for p in port_file.parent.iterdir()] == ["port"]  # no temp file left
    finally:
        stop.set()
        thread.join(15)
    assert codes == [0]
    assert not port_file.exists()
    assert (tmp_path / "shard" / "clean-shutdown.json").exists()


@pytest.mark.slow
def test_python_dash_m_embeddb_cli_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.returncode == 0
    assert "serve" in proc.stdout and "cluster" in proc.stdout
    assert "Usage: embeddb" in proc.stdout


# ----------------------------------------------------------------------- restart on the port
def time_wait_on(port: int) -> bool:
    """Whether a TCP connection of local ``port`` is in TIME_WAIT (Linux ``/proc/net/tcp``)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "06":
                return True
    return False


def test_the_port_check_binds_like_grpc_despite_a_time_wait() -> None:
    """A connection the server side closed leaves a TIME_WAIT on the server's port for a
    minute; the pre-bind check must pass as gRPC's own bind does (before: "cannot bind ...:
    the port is in use" for about 60 s)."""
    from embeddb.cli.common import check_bindable

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server side closes first: its end goes to TIME_WAIT
            assert client.recv(1) == b""  # the close reached the client
    assert time_wait_on(port)
    check_bindable("127.0.0.1", port)  # raised click.ClickException before


@pytest.mark.slow
def test_a_primary_restarts_on_its_port_right_after_a_clean_stop(serve, tmp_path) -> None:
    """The documented rolling restart: a primary whose port holds a TIME_WAIT (a connection
    the server closed: here one that sent no HTTP/2 preface) starts again on the same port at
    once after a clean stop (before: "cannot bind ...: the port is in use" for about 60 s)."""
    data_dir = tmp_path / "shard"
    first = serve("--data-dir", str(data_dir), "--grace", "1")
    port = first.port
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"not http/2\r\n\r\n" * 4)
        while raw.recv(4096):  # the server answers (GOAWAY) and closes first
            pass
    with grpc.insecure_channel(first.address) as channel:
        assert health_status(channel) == SERVING
    assert first.stop() == 0
    assert time_wait_on(port)
    second = serve("--data-dir", str(data_dir), "--port", str(port))
    assert second.port == port
    with grpc.insecure_channel(second.address) as channel:
        assert health_status(channel) == SERVING
    assert second.stop() == 0
