"""Memory under hostile or greedy callers: the peak resident size of a server process.

Each attack runs against a fresh server process (a real ``embeddb serve``, or a model server
in a subprocess), with bearer tokens on; the peak is the process's ``VmHWM`` (reset just
before the attack through ``/proc/PID/clear_refs``), idle its ``VmRSS`` before it:

(a) **anonymous uploads**: 8 concurrent callers without a token each send one 200 MB
    ``Lookup`` (raw bytes) to a shard: every one must be UNAUTHENTICATED.
(b) **ro lookups**: 16 concurrent ``ro`` callers, each sending ``--calls`` evaluation lookups
    of 16,384 ids (130 KB requests) of a dim-1024 table: 64 MiB answers, each within every
    per-request bound (``--max-response-mb 64``); each call is OK or RESOURCE_EXHAUSTED (the
    memory budget).
(c) **model server uploads**: (a) against ``ModelService/Predict`` of a model server (a stub
    predictor: the port, not the model, is measured), with 60 MB uploads: within its 64 MiB
    message limit, so gRPC would receive them whole.

The target (docs/operations.md, "Memory bounds"): peak < 1.3 x idle + the memory budget
(``--max-inflight-mb``, default 512). The last line is one JSON object. Usage::

    PYTHONPATH=. python benchmarks/memory.py              # all three, budget 512 MiB
    PYTHONPATH=. python benchmarks/memory.py --attack ro --budget-mb 256
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb

RW = "rw-token-" + "a" * 24
RO = "ro-token-" + "b" * 24
STORE_LOOKUP = "/embeddb.v1.EmbeddingStoreService/Lookup"
PREDICT = "/embeddb.v1.ModelService/Predict"
UPLOAD_BYTES = 200_000_000
START_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- processes
def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def rss(pid: int) -> int:
    """Resident bytes now."""
    return _status(pid, "VmRSS")


def reset_peak(pid: int) -> None:
    """Reset the process's peak resident size (``VmHWM``) to its current one."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak(pid: int) -> int:
    """Peak resident bytes since the last :func:`reset_peak`."""
    return _status(pid, "VmHWM")


def wait_for_port(process: subprocess.Popen[bytes], port_file: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        if port_file.exists() and port_file.read_text().strip():
            text = port_file.read_text()
            return int(json.loads(text)["grpc"]) if text.startswith("{") else int(text)
        time.sleep(0.1)
    raise RuntimeError("the server did not write its port file")


def tokens_file(directory: Path) -> Path:
    path = directory / "tokens"
    path.write_text(f"rw {RW}\nro {RO}\n")
    path.chmod(0o600)
    return path


def start_shard(directory: Path, dim: int, budget_mb: int) -> tuple[subprocess.Popen[bytes], int]:
    """``embeddb serve`` of one table of ``dim``, tokens on; returns the process and port."""
    config = directory / "config.yaml"
    config.write_text(
        f"slots_config:\n  t: {{dim: {dim}}}\n"
        "defaults:\n  optimizer: {type: sgd, lr: 0.5}\n  capacity: 100000\n"
    )
    port_file = directory / "port"
    command = [
        sys.executable, "-m", "embeddb.cli", "serve", "--port", "0",
        "--port-file", str(port_file), "--config", str(config),
        "--data-dir", str(directory / "data"), "--tokens-file", str(tokens_file(directory)),
        "--max-response-mb", "64", "--max-inflight-mb", str(budget_mb), "--quiet",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    return process, wait_for_port(process, port_file)


_MODEL_CHILD = """
import sys, threading
from types import SimpleNamespace
from embeddb.transport.rpc import ListenConfig, Tokens
from embeddb.transport.rpc.lifecycle import write_atomically
from embeddb.serving.server import ModelServerConfig, build_model_server
from pathlib import Path

class Stub:
    spec = SimpleNamespace(id_features=(), non_id=(), snapshot_id="")
    def predict(self, batch): raise RuntimeError("not a model")
    def batch_from_records(self, records): raise RuntimeError("not a model")
    def batch_from_hashed_records(self, records): raise RuntimeError("not a model")

tokens = Tokens.from_file(sys.argv[2])
server = build_model_server(Stub(), ModelServerConfig(
    ListenConfig(tokens=tokens), http_port=None, warm_up=False,
    max_inflight_bytes=int(sys.argv[3]) << 20))
write_atomically(Path(sys.argv[1]), str(server.port))
threading.Event().wait()
"""


def start_model_server(directory: Path, budget_mb: int) -> tuple[subprocess.Popen[bytes], int]:
    """A model server of a stub predictor (default gRPC limits), tokens on."""
    port_file = directory / "model-port"
    process = subprocess.Popen(
        [sys.executable, "-c", _MODEL_CHILD, str(port_file), str(tokens_file(directory)),
         str(budget_mb)],
    )  # fmt: skip
    return process, wait_for_port(process, port_file)


# ----------------------------------------------------------------------------- attacks
def _raw_call(address: str, method: str) -> Callable[[bytes, tuple[tuple[str, str], ...]], str]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def call(data: bytes, metadata: tuple[tuple[str, str], ...]) -> str:
        with grpc.insecure_channel(address, options=options) as channel:
            stub = channel.unary_unary(method)
            try:
                stub(data, metadata=metadata, timeout=120)
                return "OK"
            except grpc.RpcError as exc:
                return str(exc.code().name)

    return call


def anonymous_uploads(
    address: str, method: str, callers: int = 8, size: int = UPLOAD_BYTES
) -> Counter[str]:
    """``callers`` concurrent tokenless calls of ``size`` bytes each."""
    data = b"\x0a" * size
    call = _raw_call(address, method)
    with ThreadPoolExecutor(callers) as pool:
        return Counter(pool.map(lambda _: call(data, ()), range(callers)))


def ro_lookups(address: str, callers: int = 16, calls: int = 4) -> Counter[str]:
    """``callers`` concurrent ``ro`` callers, ``calls`` lookups of 16,384 ids each."""
    ids = np.arange(1, 16_385, dtype=np.uint64)
    data = pb.LookupRequest(table="t", ids=wire.encode_ids(ids)).SerializeToString()
    call = _raw_call(address, STORE_LOOKUP)
    metadata = (("authorization", f"Bearer {RO}"),)
    with ThreadPoolExecutor(callers) as pool:
        return Counter(pool.map(lambda _: call(data, metadata), range(callers * calls)))


def measure(pid: int, attack: Callable[[], Counter[str]], budget_mb: int) -> dict[str, object]:
    time.sleep(1.0)  # let start-up settle
    idle = rss(pid)
    reset_peak(pid)
    started = time.perf_counter()
    outcomes = attack()
    seconds = time.perf_counter() - started
    top = peak(pid)
    time.sleep(12.0)  # the trimmer's second pass (5 x its 2 s quiet time)
    after = rss(pid)
    bound = 1.3 * idle + (budget_mb << 20)
    return {
        "idle_mib": idle >> 20,
        "peak_mib": top >> 20,
        "after_mib": after >> 20,
        "bound_mib": int(bound) >> 20,
        "within_bound": top < bound,
        "outcomes": dict(outcomes),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", choices=("anonymous", "ro", "model", "all"), default="all")
    parser.add_argument("--budget-mb", type=int, default=512)
    parser.add_argument("--calls", type=int, default=4, help="lookups per ro caller")
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="embeddb-memory-") as tmp:
        root = Path(tmp)
        plan: list[tuple[str, Callable[[Path], tuple[subprocess.Popen[bytes], int]], Any]] = []
        if args.attack in ("anonymous", "all"):
            plan.append(
                ("anonymous_uploads", lambda d: start_shard(d, 16, args.budget_mb),
                 lambda a: anonymous_uploads(a, STORE_LOOKUP))
            )  # fmt: skip
        if args.attack in ("ro", "all"):
            plan.append(
                ("ro_lookups", lambda d: start_shard(d, 1024, args.budget_mb),
                 lambda a: ro_lookups(a, calls=args.calls))
            )  # fmt: skip
        if args.attack in ("model", "all"):
            plan.append(
                ("model_uploads", lambda d: start_model_server(d, args.budget_mb),
                 lambda a: anonymous_uploads(a, PREDICT, size=60_000_000))
            )  # fmt: skip
        for name, start, attack in plan:
            directory = root / name
            directory.mkdir()
            process, port = start(directory)
            try:
                address = f"127.0.0.1:{port}"
                run = functools.partial(attack, address)
                results[name] = measure(process.pid, run, args.budget_mb)
                print(name, results[name], flush=True)
            finally:
                process.terminate()
                process.wait(timeout=60)
    print(json.dumps({"budget_mib": args.budget_mb, "pid": os.getpid(), **results}))


if __name__ == "__main__":
    main()
