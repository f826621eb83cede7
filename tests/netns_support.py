"""Test support: real processes on separate network "hosts" joined by a switch, with links that
can be cut and healed (Linux network namespaces; needs root and iproute2).

A :class:`Lab` builds, under names unique to the run (``edb<6 hex>-<host>``)::

    hub namespace:  bridge br0 ── v-<host> ─┐ (one veth pair per host)
    host namespace:                 eth0 ───┘ 10.231.57.<n>/24, lo up, optional tbf qdisc

Each host has one address in the private /24 ``10.231.57.0``, assigned inside its own namespace
only: traffic flows between the lab's namespaces and nowhere else (no namespace has a route
out, and the root namespace gets no address or link). :meth:`Lab.cut` takes the hub's end of a
host's link down: the host keeps its address and routes but every packet it sends or should
receive is dropped, as when a cable or a switch port dies (no RST, no ICMP: peers only see
silence until their timeouts). :meth:`Lab.heal` brings it back. :meth:`Lab.shape` puts a
``tbf`` qdisc (rate, burst, latency) on both directions of a host's link; this kernel has no
``netem``, so delay and loss are not simulated.

Processes run as ``ip netns exec NS python -m ...`` (:meth:`Lab.spawn`); the test process
itself stays in the root namespace and reaches the lab only through files and the pipes of an
:class:`Agent`: ``python -m tests.netns_support agent`` started on a host, which answers JSON
requests (shard statistics, a table's rows as a digest, lookups) and runs a writer that
records every acknowledged write in a JSON-lines file (:func:`write_loop`).

:meth:`Lab.close` kills every process left in the lab's namespaces (by pid, from
``ip netns pids``) and deletes the namespaces; use the lab through a fixture so that happens
even when the test fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.231.57"  # the lab's private /24; .1 is never used (no gateway: nothing routes out)
_IP_TIMEOUT_S = 20.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=check
    )


def _tc(ns: str, *args: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, "tc", *args],
        capture_output=True,
        text=True,
        timeout=_IP_TIMEOUT_S,
        check=True,
    )


def netns_unavailable() -> str | None:
    """Why this machine cannot run a lab (``None``: it can): not root, no ``ip`` or ``tc``
    (iproute2), namespaces, veth pairs, bridges or the ``tbf`` qdisc refused."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install iproute2)"
    probe = f"edbprobe{secrets.token_hex(3)}"
    steps = [
        ("netns add", ["netns", "add", probe]),
        ("bridge", ["-n", probe, "link", "add", "br0", "type", "bridge"]),
        ("veth", ["-n", probe, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"]),
    ]
    try:
        for what, args in steps:
            done = _ip(*args, check=False)
            if done.returncode != 0:
                return f"`ip {what}` is not allowed here: {done.stderr.strip()}"
        try:
            tbf = ["tbf", "rate", "10mbit", "burst", "32kb", "latency", "50ms"]
            _tc(probe, "qdisc", "add", "dev", "va", "root", *tbf)
            _tc(probe, "qdisc", "del", "dev", "va", "root")
        except subprocess.CalledProcessError as exc:
            return f"the tbf qdisc is not available: {exc.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


@dataclass
class Host:
    """One namespace of a lab: its name, its address, and the hub's end of its link."""

    name: str
    ns: str
    ip: str
    hub_end: str


@dataclass
class Lab:
    """Namespaces joined by a bridge; see the module docstring. Build with :func:`lab`."""

    tag: str
    hub: str
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)  # after the kills

    def add_host(self, name: str) -> Host:
        """A new namespace ``name`` with ``eth0`` on the bridge and the next address."""
        ns = f"{self.tag}-{name}"
        host = Host(name, ns, f"{SUBNET}.{10 + len(self.hosts)}", f"v-{name}"[:15])
        _ip("netns", "add", ns)
        self.hosts[name] = host
        _ip(
            "link", "add", "name", "eth0", "netns", ns, "type", "veth",
            "peer", "name", host.hub_end, "netns", self.hub,
        )  # fmt: skip
        _ip("-n", self.hub, "link", "set", host.hub_end, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def shape(self, name: str, rate: str, burst: str = "64kb", latency: str = "200ms") -> None:
        """A ``tbf`` qdisc of ``rate`` on both directions of host ``name``'s link."""
        host = self.hosts[name]
        for ns, dev in ((host.ns, "eth0"), (self.hub, host.hub_end)):
            _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                "burst", burst, "latency", latency)  # fmt: skip

    def cut(self, name: str) -> None:
        """Drop every packet to and from host ``name`` (its switch port goes down)."""
        _ip("-n", self.hub, "link", "set", self.hosts[name].hub_end, "down")

    def heal(self, name: str) -> None:
        """Undo :meth:`cut`."""
        _ip("-n", self.hub, "link", "set", self.hosts[name].hub_end, "up")

    def pids(self, name: str) -> list[int]:
        """The processes in host ``name``'s namespace, sorted."""
        return sorted(int(pid) for pid in _ip("netns", "pids", self.hosts[name].ns).stdout.split())

    def spawn(
        self, name: str, argv: Sequence[str], log: Path, **popen: Any
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` in host ``name``'s namespace (cwd: the repository), stdout and stderr
        into ``log``, without the caller's ``EMBEDDB_*`` variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}
        env.update(popen.pop("env", {}))
        command = ["ip", "netns", "exec", self.hosts[name].ns, *argv]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, cwd=ROOT, stdout=popen.pop("stdout", out), stderr=out, env=env, **popen
            )
        self.processes.append(process)
        return process

    def close(self) -> None:
        """Kill every process in the lab's namespaces and delete them (errors ignored)."""
        namespaces = [h.ns for h in self.hosts.values()] + [self.hub]
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for ns in namespaces:  # descendants started in new sessions (torchrun, its ranks)
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for close in self.closers:
            close()
        for ns in namespaces:
            _ip("netns", "del", ns, check=False)


def lab() -> Iterator[Lab]:
    """Generator behind a fixture: an empty lab (the hub and its bridge), closed at teardown."""
    tag = f"edb{secrets.token_hex(3)}"
    out = Lab(tag, f"{tag}-hub")
    try:
        _ip("netns", "add", out.hub)
        _ip("-n", out.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", out.hub, "link", "set", "br0", "up")
        yield out
    finally:
        out.close()


# ---------------------------------------------------------------------- the agent
class Agent:
    """The test's end of ``python -m tests.netns_support agent`` on one host of a lab."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True, name="agent-reader")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self) -> None:
        """Close the pipes once the agent has exited (the lab kills it first)."""
        self._reader.join(timeout=10)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(json.loads(line))
        self._answers.put(None)

    def call(self, op: str, timeout: float = 30.0, **args: Any) -> Any:
        """One request; returns its ``result``.

        Raises:
            RuntimeError: the request failed in the agent (its message: the exception).
            AssertionError: no answer within ``timeout`` seconds, or the agent exited.
        """
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self._process.stdin.flush()
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the agent did not answer {op} in {timeout:g} s") from None
        if answer is None:
            raise AssertionError(f"the agent exited (code {self._process.poll()})")
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["result"]


def start_agent(lab_: Lab, host: str, log: Path) -> Agent:
    process = lab_.spawn(
        host,
        [sys.executable, "-m", "tests.netns_support", "agent"],
        log,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    out = Agent(process)
    lab_.closers.append(out.close)
    return out


def read_writes(path: Path) -> list[dict[str, Any]]:
    """The writer's records so far (a last line still being written is left out)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1] if line]


def write_value(n: int) -> float:
    """The value every element of write ``n``'s vectors holds."""
    return float(n + 1)


def write_ids(n: int, batch: int, base: int) -> list[int]:
    """The ids of write ``n``: ``batch`` ids never written by another write."""
    return [base + n * batch + i for i in range(batch)]


def write_loop(
    addresses: list[str],
    table: str,
    dim: int,
    log: Path,
    *,
    count: int,
    batch: int,
    base: int,
    deadline_s: float,
    pace_s: float,
    timeout_s: float,
    stop: threading.Event,
) -> None:
    """Up to ``count`` assigns (fewer if ``stop`` is set or ``deadline_s`` passes), each of
    :func:`write_ids` with every element :func:`write_value`; after each call returns one JSON
    line ``{"n", "ok", "error", "t"}`` goes to ``log`` (``ok``: acknowledged by every shard)."""
    import numpy as np

    from embeddb.client import Client, ClientOptions

    end = time.monotonic() + deadline_s
    options = ClientOptions(timeout=timeout_s, retries=1, backoff=0.05)
    with Client(addresses, options) as client, log.open("a") as out:
        for n in range(count):
            if stop.is_set() or time.monotonic() >= end:
                break
            ids = np.array(write_ids(n, batch, base), dtype=np.uint64)
            vectors = np.full((batch, dim), write_value(n), dtype=np.float32)
            error = ""
            try:
                client.assign(table, ids, vectors)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            out.write(json.dumps({"n": n, "ok": not error, "error": error, "t": time.time()}))
            out.write("\n")
            out.flush()
            stop.wait(pace_s)  # pacing (not synchronisation): a modest write rate


def _digest(addresses: list[str], timeout_s: float) -> dict[str, list[Any]]:
    """Every table of the (single-address) shard: [rows, sha256 of its ids and vectors]."""
    import numpy as np

    from embeddb.client import Client, ClientOptions

    options = ClientOptions(timeout=timeout_s, verify_topology=False)
    out: dict[str, list[Any]] = {}
    with Client(addresses, options) as client:
        for table in sorted(t.name for t in client.list_tables()):
            sha = hashlib.sha256()
            rows = 0
            for ids, vectors in client.scan(table):
                sha.update(np.ascontiguousarray(ids).tobytes())
                sha.update(np.ascontiguousarray(vectors).tobytes())
                rows += int(ids.size)
            out[table] = [rows, sha.hexdigest()]
    return out


def _lookup(addresses: list[str], table: str, ids: list[int], timeout_s: float) -> list[Any]:
    import numpy as np

    from embeddb.client import Client, ClientOptions

    with Client(addresses, ClientOptions(timeout=timeout_s)) as client:
        vectors = client.lookup(table, np.array(ids, dtype=np.uint64), train=False)
    return [list(map(float, row)) for row in vectors]


def _stats(addresses: list[str], timeout_s: float) -> Any:
    from embeddb.client import Client, ClientOptions

    options = ClientOptions(timeout=timeout_s, verify_topology=False)
    with Client(addresses, options) as client:
        return client.stats()


def agent(stdin: TextIO, stdout: TextIO) -> None:
    """Answer one JSON request per line of ``stdin`` with one JSON line on ``stdout``:
    ``stats``, ``digest``, ``lookup``, ``write`` (starts :func:`write_loop` in a thread),
    ``write_stop`` (stops it and waits), ``quit``."""
    writer: threading.Thread | None = None
    stop = threading.Event()
    for line in stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "quit":
                break
            if op == "stats":
                result: Any = _stats(**request)
            elif op == "digest":
                result = _digest(**request)
            elif op == "lookup":
                result = _lookup(**request)
            elif op == "write":
                request["log"] = Path(request["log"])
                stop = threading.Event()  # a fresh one: the previous writer's may be set
                writer = threading.Thread(
                    target=write_loop, kwargs={**request, "stop": stop}, daemon=True
                )
                writer.start()
                result = True
            elif op == "write_stop":
                stop.set()
                if writer is not None:
                    writer.join(timeout=request.get("timeout_s", 30.0))
                result = writer is None or not writer.is_alive()
            else:
                raise ValueError(f"unknown op {op!r}")
            stdout.write(json.dumps({"result": result}) + "\n")
        except Exception as exc:
            stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        stdout.flush()
    stop.set()


if __name__ == "__main__":
    if sys.argv[1:] == ["agent"]:
        agent(sys.stdin, sys.stdout)
    else:
        sys.exit("usage: python -m tests.netns_support agent")
