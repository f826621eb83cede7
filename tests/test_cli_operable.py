"""The command line as an operator runs it: ``python -m embeddb``, options from ``EMBEDDB_*``
variables, JSON logs, ``--quiet``, and a busy port or a missing file as one ``Error:`` line with
exit code 1. What is about the process (exit codes, stderr) runs real subprocesses."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from embeddb.cli import main
from embeddb.cli.common import reported_errors
from embeddb.cli.envvars import envvar_name
from embeddb.cli.logs import JsonFormatter, json_shard_line
from tests.support import START_TIMEOUT_S, STOP_TIMEOUT_S, eventually

SERVER_COMMANDS = ("serve", "serve-model", "cluster")
RECORD_KEYS = {"time", "level", "logger", "message"}


# ------------------------------------------------------------------------------ helpers
class Processes:
    """``python -m embeddb ...`` subprocesses with a clean ``EMBEDDB_*`` environment; any still
    running at teardown is killed."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[bytes]] = []

    def env(self, **variables: str) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}
        return {**clean, **variables}

    def run(self, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
        """Run to completion (a refused start)."""
        return subprocess.run(
            [sys.executable, "-m", "embeddb", *args],
            capture_output=True,
            text=True,
            env=self.env(**variables),
            timeout=START_TIMEOUT_S,
            check=False,
        )

    def start(self, *args: str, **variables: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start in the background; returns the process and its stderr file."""
        n = len(self.started)
        stderr = self.tmp_path / f"run-{n}.stderr"
        with stderr.open("wb") as err, (self.tmp_path / f"run-{n}.stdout").open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "embeddb", *args],
                stdout=out,
                stderr=err,
                env=self.env(**variables),
            )
        self.started.append(process)
        return process, stderr

    def wait_for(self, process: subprocess.Popen[bytes], stderr: Path, path: Path) -> str:
        """The text of ``path`` once the process has written it."""

        def written() -> str | None:
            if process.poll() is not None:
                pytest.fail(f"exited with {process.returncode}:\n{stderr.read_text()}")
            text = path.read_text() if path.exists() else ""
            return text or None

        text = eventually(written, START_TIMEOUT_S, f"{path.name} to be written")
        assert text is not None
        return text

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    runner = Processes(tmp_path)
    yield runner
    runner.close()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port held by a listening socket on 127.0.0.1 for the test's duration."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def _records(stderr: str) -> list[dict[str, object]]:
    """Every stderr line parsed as one JSON object (fails on a line that is not)."""
    records = []
    for line in stderr.splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict), line
        records.append(doc)
    return records


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------- python -m embeddb
@pytest.mark.slow
def test_python_dash_m_embeddb_is_the_embeddb_command(processes: Processes) -> None:
    from embeddb import __version__

    result = processes.run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"embeddb, version {__version__}"
    listed = processes.run("--help")
    assert listed.returncode == 0 and "Usage: embeddb " in listed.stdout
    assert all(command in listed.stdout for command in SERVER_COMMANDS)


# ------------------------------------------------------------------- the environment rule
def _options(command: str) -> list[click.Option]:
    ctx = click.Context(main)
    found = main.get_command(ctx, command)
    assert found is not None
    return [p for p in found.params if isinstance(p, click.Option) and not p.hidden]


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_every_server_option_reads_its_variable_by_the_rule(command: str) -> None:
    help_text = CliRunner().invoke(main, [command, "--help"], terminal_width=400).output
    options = _options(command)
    assert len(options) > 10
    for option in options:
        long_name = next(o for o in option.opts if o.startswith("--"))
        expected = "EMBEDDB_" + f"{command}_{long_name[2:]}".upper().replace("-", "_")
        assert envvar_name(command, option) == expected
        variables = [option.envvar] if isinstance(option.envvar, str) else option.envvar
        assert variables is not None and variables[0] == expected, long_name
        assert option.show_envvar and expected in help_text, long_name


def test_the_group_options_drop_the_command() -> None:
    names = {envvar_name("", p) for p in main.params if isinstance(p, click.Option)}
    assert {"EMBEDDB_LOG_LEVEL", "EMBEDDB_LOG_FORMAT", "EMBEDDB_QUIET"} <= names


def test_the_command_line_wins_over_the_variables_and_the_old_name_still_works() -> None:
    runner = CliRunner()
    env = {"EMBEDDB_SERVE_NUM_SHARDS": "2", "EMBEDDB_SHARD_INDEX": "3"}
    result = runner.invoke(main, ["serve", "--ephemeral"], env=env)
    assert result.exit_code == 2 and "must be less than --num-shards (2), got 3" in result.output
    env["EMBEDDB_SERVE_SHARD_INDEX"] = "4"  # the rule's name wins over the older one
    result = runner.invoke(main, ["serve", "--ephemeral"], env=env)
    assert "must be less than --num-shards (2), got 4" in result.output
    result = runner.invoke(main, ["serve", "--ephemeral", "--num-shards=3"], env=env)
    assert "must be less than --num-shards (3), got 4" in result.output


@pytest.mark.slow
def test_a_shard_configured_only_by_the_environment_serves_and_logs_json(
    processes: Processes, tmp_path: Path
) -> None:
    port_file = tmp_path / "port"
    process, stderr = processes.start(
        "serve",
        EMBEDDB_SERVE_EPHEMERAL="1",
        EMBEDDB_SERVE_PORT="0",
        EMBEDDB_SERVE_PORT_FILE=str(port_file),
        EMBEDDB_LOG_FORMAT="json",
    )
    port = int(processes.wait_for(process, stderr, port_file))
    assert port > 0
    assert processes.stop(process) == 0, stderr.read_text()
    records = _records(stderr.read_text())
    assert records and all(set(r) >= RECORD_KEYS for r in records)
    assert any(r["level"] == "INFO" and str(r["logger"]).startswith("embeddb.") for r in records)
    assert all(str(r["time"]).endswith("Z") for r in records)


@pytest.mark.slow
def test_the_limits_set_on_the_command_line_are_the_ones_describe_shard_reports(
    processes: Processes, tmp_path: Path
) -> None:
    import grpc

    from embeddb.v1 import embeddb_pb2 as pb
    from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

    port_file = tmp_path / "port"
    process, stderr = processes.start(
        "serve",
        "--ephemeral",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--max-message-mb",
        "3",
        "--max-response-mb",
        "2",
        EMBEDDB_SERVE_MAX_IDS_PER_REQUEST="1234",
    )
    port = int(processes.wait_for(process, stderr, port_file))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)  # type: ignore[no-untyped-call]
        limits = stub.DescribeShard(pb.DescribeShardRequest(), timeout=30).limits
    assert (limits.max_message_bytes, limits.max_response_bytes) == (3 << 20, 2 << 20)
    assert limits.max_ids_per_request == 1234
    assert processes.stop(process) == 0, stderr.read_text()


@pytest.mark.slow
def test_tokens_from_env_still_reads_the_token_variables(
    processes: Processes, tmp_path: Path
) -> None:
    refused = processes.run(
        "serve", "--ephemeral", "--port", "0", EMBEDDB_SERVE_TOKENS_FROM_ENV="1"
    )
    assert "EMBEDDB_RW_TOKEN" in _one_error_line(refused)
    port_file = tmp_path / "port"
    process, stderr = processes.start(
        "serve",
        "--ephemeral",
        "--port=0",
        f"--port-file={port_file}",
        EMBEDDB_SERVE_TOKENS_FROM_ENV="true",
        EMBEDDB_RW_TOKEN="a-long-enough-rw-token-0123456789",
    )
    assert int(processes.wait_for(process, stderr, port_file)) > 0
    assert processes.stop(process) == 0


# ------------------------------------------------------------------------------ logs
def test_the_json_formatter_writes_one_object_per_line_with_the_exception() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord(
            "embeddb.x", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "ERROR" and doc["logger"] == "embeddb.x"
    assert doc["message"] == "failed: a\nb"
    assert "ValueError: bad" in doc["exception"] and "Traceback" in doc["exception"]


def test_json_shard_line_adds_the_shard_and_wraps_plain_text() -> None:
    inner = json.dumps({"time": "t", "level": "INFO", "logger": "l", "message": "m"})
    assert json.loads(json_shard_line(f"[shard 2] {inner}\n")) == {
        **json.loads(inner),
        "shard": 2,
    }
    wrapped = json.loads(json_shard_line("[shard 0] E1124 grpc said something\n"))
    assert wrapped["shard"] == 0 and wrapped["message"] == "E1124 grpc said something"
    assert set(wrapped) >= RECORD_KEYS


@pytest.mark.slow
def test_quiet_logs_only_warnings_and_errors(processes: Processes, tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process, stderr = processes.start(
        "serve", "--ephemeral", "--port=0", f"--port-file={port_file}", "--quiet",
        "--log-level=debug", "--log-format=json",
    )  # fmt: skip
    processes.wait_for(process, stderr, port_file)
    assert processes.stop(process) == 0
    levels = {r["level"] for r in _records(stderr.read_text())}
    assert levels <= {"WARNING", "ERROR", "CRITICAL"}, levels


@pytest.mark.slow
def test_a_cluster_relays_its_shards_logs_as_json(processes: Processes, tmp_path: Path) -> None:
    address_file = tmp_path / "addresses.txt"
    process, stderr = processes.start(
        "--log-format=json", "cluster", "--num-shards=1", "--ephemeral", "--base-port=0",
        f"--address-file={address_file}",
    )  # fmt: skip
    processes.wait_for(process, stderr, address_file)
    assert processes.stop(process) == 0, stderr.read_text()
    records = _records(stderr.read_text())
    assert any(r.get("shard") == 0 and r["level"] == "INFO" for r in records), records
    assert any(r["message"] == "stopping shards ..." for r in records)


# ------------------------------------------------------------------ one-line errors
@pytest.mark.slow
def test_a_busy_port_is_one_error_line(processes: Processes, busy_port: int) -> None:
    line = _one_error_line(processes.run("serve", "--ephemeral", "--port", str(busy_port)))
    assert line == f"Error: cannot bind 127.0.0.1:{busy_port}: the port is in use"
    metrics = processes.run("serve", "--ephemeral", "--port=0", f"--metrics-port={busy_port}")
    assert f"127.0.0.1:{busy_port}" in _one_error_line(metrics)
    from_env = processes.run("serve", "--ephemeral", EMBEDDB_SERVE_PORT=str(busy_port))
    assert f"127.0.0.1:{busy_port}" in _one_error_line(from_env)


@pytest.mark.slow
def test_a_busy_port_stops_a_cluster_and_a_model_server(
    processes: Processes, busy_port: int, tmp_path: Path
) -> None:
    cluster = processes.run(
        "cluster", "--num-shards=2", "--ephemeral", f"--base-port={busy_port - 1}"
    )
    assert f"127.0.0.1:{busy_port}: the port is in use" in _one_error_line(cluster)
    model = processes.run(
        "serve-model", "--model", str(tmp_path), "--addresses=127.0.0.1:1", "--port=0",
        f"--http-port={busy_port}",
    )  # fmt: skip
    if "trainer extra" in model.stderr:
        pytest.skip("serve-model needs the trainer extra (torch)")
    assert f"127.0.0.1:{busy_port}: the port is in use" in _one_error_line(model)


@pytest.mark.slow
def test_a_host_that_is_not_this_machine_is_one_error_line(processes: Processes) -> None:
    line = _one_error_line(processes.run("serve", "--ephemeral", "--host=192.0.2.1", "--port=1"))
    assert line.startswith("Error: cannot bind 192.0.2.1:1: ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["serve", "--ephemeral", "--config", "{missing}"], "--config"),
        (["serve", "--ephemeral", "--tls-cert", "{dir}", "--tls-key", "{dir}"], "--tls-cert"),
        (["cluster", "--num-shards=1", "--tokens-file", "{missing}"], "--tokens-file"),
        (["serve-model", "--model", "{missing}", "--addresses=x:1"], "--model"),
    ],
)
def test_a_missing_or_unreadable_file_is_one_error_line(
    processes: Processes, tmp_path: Path, args: list[str], option: str
) -> None:
    missing = tmp_path / "missing.yaml"
    filled = [a.format(missing=missing, dir=tmp_path) for a in args]
    line = _one_error_line(processes.run(*filled))
    assert f"'{option}'" in line
    assert str(missing) in line or str(tmp_path) in line


def test_reported_errors_maps_grpc_bind_failures_and_keeps_other_runtime_errors() -> None:
    bind_failed = RuntimeError("Failed to bind to address 10.0.0.1:70; set GRPC_VERBOSITY=debug")
    expected = r"cannot bind 10\.0\.0\.1:70"
    with pytest.raises(click.ClickException, match=expected), reported_errors():
        raise bind_failed
    with pytest.raises(click.ClickException, match="no space"), reported_errors():
        raise OSError("no space")
    with pytest.raises(RuntimeError, match="something else"), reported_errors():
        raise RuntimeError("something else")
