"""Real ``embeddb serve`` processes for tests: started on port 0, found by their port file,
stopped with SIGTERM; stdout and stderr kept apart (the log goes to stderr).

Use it as a fixture::

    @pytest.fixture
    def serve(tmp_path):
        yield from serve_processes(tmp_path)

    served = serve("--data-dir", str(tmp_path / "s"), metrics=True)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


@dataclass
class ServeProcess:
    """One ``embeddb serve`` (running, or exited when started with ``expect_exit``)."""

    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    output = stderr

    def channel(self, **options: int) -> grpc.Channel:
        return grpc.insecure_channel(self.address, options=list(options.items()))

    def metrics_url(self) -> str:
        """The URL the server logged for its metrics endpoint (``--metrics-port``)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while (found := re.search(r"metrics on (http://\S+/metrics)", self.stderr())) is None:
            assert time.monotonic() < deadline, self.stderr()
            time.sleep(0.05)
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


def serve_processes(tmp_path: Path) -> Iterator[StartServe]:
    """Generator behind a fixture: ``start(*args, umask=None, expect_exit=False,
    metrics=False)`` runs ``python -m embeddb.cli serve --port 0 --port-file ... *args`` (under
    ``umask`` when given; with ``--metrics-port 0`` when ``metrics``) and waits for its port
    file, or, with ``expect_exit``, for the process to end (a refused start). Every process
    still running at teardown is killed."""
    started: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}

    def start(
        *args: str, umask: int | None = None, expect_exit: bool = False, metrics: bool = False
    ) -> ServeProcess:
        n = len(started)
        port_file, stderr_path = tmp_path / f"serve-{n}.port", tmp_path / f"serve-{n}.stderr"
        cmd = [sys.executable, "-m", "embeddb.cli", "serve", "--port", "0",
               "--port-file", str(port_file), *args]  # fmt: skip
        if metrics:
            cmd += ["--metrics-port", "0"]

        def set_umask() -> None:  # runs in the child, before exec
            if umask is not None:
                os.umask(umask)

        with stderr_path.open("wb") as err:
            process = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=set_umask, env=env
            )
        started.append(process)
        if expect_exit:
            process.wait(timeout=START_TIMEOUT_S)
            return ServeProcess(process, 0, stderr_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip().isdigit()):
            if process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}:\n{stderr_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"serve did not write its port file:\n{stderr_path.read_text()}")
            time.sleep(0.05)
        return ServeProcess(process, int(port_file.read_text()), stderr_path)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
