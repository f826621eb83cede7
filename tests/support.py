"""Test support: waiting for a condition, and real server processes found through port files.

``eventually`` is the one way a test waits for something another thread or process does::

    eventually(lambda: follower.applied_seq >= shard.seq, 10, "the follower to catch up")

``serve_processes`` runs real ``embeddb serve``, ``embeddb serve-model`` and ``embeddb cluster``
processes on port 0 and reads the ports they bound from their port (or address) file, so no test
picks a port and hopes it is still free. Use it as a fixture::

    @pytest.fixture
    def serve(tmp_path):
        yield from serve_processes(tmp_path)

    served = serve("--data-dir", str(tmp_path / "s"), metrics=True)
    model = serve("--model", str(model_dir), "--addresses", served.address, command="serve-model")

stdout and stderr are kept apart in files (the log goes to stderr); every process still running
at teardown is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

START_TIMEOUT_S = 120.0  # a cold numba cache compiles every kernel on the first start
STOP_TIMEOUT_S = 30.0

T = TypeVar("T")
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def eventually(pred: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """Poll ``pred`` until it returns a truthy value, and return that value.

    The first polls follow each other closely (1 ms), then the pause doubles up to 0.1 s. An
    ``Exception`` raised by ``pred`` counts as "not yet"; ``pytest.fail`` (a ``BaseException``)
    inside ``pred`` ends the wait at once.

    Raises:
        AssertionError: ``pred`` was not truthy within ``timeout`` seconds; the message names
            ``what`` and the last value or exception.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            value = pred()
        except Exception as exc:
            last: object = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {last!r}"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


async def eventually_async(
    pred: Callable[[], T], timeout: float = 30.0, what: str = "the condition"
) -> T:
    """:func:`eventually` inside an ``asyncio`` loop: the other tasks run between polls."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {value!r}"
            )
        await asyncio.sleep(0.001)
    return value


def blocked_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is blocked in a ``threading`` wait called from ``function``: a
    signal that it waits, where a ``sleep`` would only make it likely."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_filename != threading.__file__:
        return False
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return function in names


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m embeddb.cli ARGS`` run to the end, without the caller's ``EMBEDDB_*``
    environment (which would set options)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}
    return subprocess.run(
        [sys.executable, "-m", "embeddb.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT_S,
    )


def free_port() -> int:
    """A port that was free a moment ago, for the components that cannot bind port 0 and
    report the port they bound: ``torch.distributed``'s rendezvous (``MASTER_PORT``: every rank
    must know it before the master binds it) and the embedding worker's ``metrics_port``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_range(n: int) -> int:
    """A base port with ``n`` free consecutive ports below the usual ephemeral range (32768+),
    where the port-0 binds of servers and of other tests cannot take them meanwhile.

    Only for components that take a *base* port and bind ``base + i`` (``embeddb cluster``'s
    ``--metrics-base-port``): everything that can bind port 0 and report it does so instead.
    """
    for _ in range(100):
        base = random.randrange(20000, 30000)
        sockets = [socket.socket() for _ in range(n)]
        try:
            for i, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    pytest.fail(f"found no {n} free consecutive ports")


@dataclass
class ServeProcess:
    """One ``embeddb`` server process (running, or exited when started with ``expect_exit``).

    Attributes:
        port: the gRPC port (``embeddb cluster``: shard 0's).
        ports: ``embeddb serve-model``'s port file: ``{"grpc", "http", "metrics"}`` → port or
            ``None``; ``{"grpc": port}`` for ``embeddb serve``.
        addresses: ``embeddb cluster``'s address file, one ``host:port`` per shard.
        port_file: where the port file (or address file) was written.
    """

    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path
    stdout_path: Path
    ports: dict[str, int | None] = field(default_factory=dict)
    addresses: list[str] = field(default_factory=list)
    port_file: Path | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    output = stderr

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def channel(self, **options: int) -> grpc.Channel:
        return grpc.insecure_channel(self.address, options=list(options.items()))

    def metrics_url(self) -> str:
        """The URL the server logged for its metrics endpoint (``--metrics-port``)."""
        found = eventually(
            lambda: re.search(r"metrics on (http://\S+/metrics)", self.stderr()),
            START_TIMEOUT_S,
            "the metrics endpoint's log line",
        )
        return found.group(1)

    def metrics(self) -> Samples:
        """One scrape: sample name → sorted label pairs → value."""
        with urllib.request.urlopen(self.metrics_url(), timeout=10) as reply:
            text = reply.read().decode()
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def rss_bytes(self) -> int:
        """The process's resident set size (Linux ``/proc``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def stop(self) -> int:
        """SIGTERM, and the clean exit (code 0) that must follow; returns the code."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=STOP_TIMEOUT_S)
        assert code == 0, self.stderr()
        return code


StartServe = Callable[..., ServeProcess]


Bound = tuple[int, dict[str, int | None], list[str]]  # port, ports, addresses


def _read_ports(command: str, path: Path) -> Bound | None:
    """The bound ports from a complete port file (written atomically), else ``None``."""
    if not path.exists():
        return None
    text = path.read_text()
    if command == "cluster":
        addresses = text.split()
        return int(addresses[0].rsplit(":", 1)[1]), {}, addresses
    if command == "serve-model":
        ports = json.loads(text)
        return int(ports["grpc"]), ports, []
    return int(text), {"grpc": int(text)}, []


def serve_processes(tmp_path: Path) -> Iterator[StartServe]:
    """Generator behind a fixture: ``start(*args, command="serve", umask=None, expect_exit=False,
    metrics=False)`` runs ``python -m embeddb.cli COMMAND --port 0 --port-file ... *args``
    (``cluster``: ``--base-port 0 --address-file ...``; under ``umask`` when given; with
    ``--metrics-port 0`` when ``metrics``) and waits for its port file, or, with
    ``expect_exit``, for the process to end (a refused start). Every process still running at
    teardown is killed."""
    started: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}

    def start(
        *args: str,
        command: str = "serve",
        umask: int | None = None,
        expect_exit: bool = False,
        metrics: bool = False,
    ) -> ServeProcess:
        n = len(started)
        port_file, stdout_path, stderr_path = (
            tmp_path / f"{command}-{n}.{name}" for name in ("port", "stdout", "stderr")
        )
        if command == "cluster":
            ports = ["--base-port", "0", "--address-file", str(port_file)]
        else:
            ports = ["--port", "0", "--port-file", str(port_file)]
        cmd = [sys.executable, "-m", "embeddb.cli", command, *ports, *args]
        if metrics:
            cmd += ["--metrics-port", "0"]

        def set_umask() -> None:  # runs in the child, before exec
            if umask is not None:
                os.umask(umask)

        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            process = subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=set_umask, env=env)
        started.append(process)
        if expect_exit:
            process.wait(timeout=START_TIMEOUT_S)
            return ServeProcess(process, 0, stderr_path, stdout_path)

        def bound() -> Bound | None:
            if process.poll() is not None:
                pytest.fail(
                    f"{command} exited with {process.returncode}:\n{stderr_path.read_text()}"
                )
            return _read_ports(command, port_file)

        port, ports, addresses = eventually(
            bound, START_TIMEOUT_S, f"{command} to write {port_file.name}"
        )
        return ServeProcess(
            process, port, stderr_path, stdout_path, ports, addresses, port_file=port_file
        )

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
