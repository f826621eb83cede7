"""Bounded memory for every caller, on real server processes: anonymous uploads are refused
before they are received, and the answers of admitted callers share one memory budget.

The bound checked is the one docs/operations.md promises: the server's peak resident size
during an attack (``VmHWM``, reset just before it) stays below 1.3 x its idle size plus its
memory budget (``--max-inflight-mb``). Not timed: each test waits for its calls to end.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from embeddb.transport import wire
from embeddb.transport.rpc.budget import MemoryBudget
from embeddb.v1 import embeddb_pb2 as pb
from tests.support import (
    START_TIMEOUT_S,
    ServeProcess,
    StartServe,
    eventually,
    serve_processes,
)

RW = "rw-token-" + "a" * 24
RO = "ro-token-" + "b" * 24
LOOKUP = "/embeddb.v1.EmbeddingStoreService/Lookup"
PREDICT = "/embeddb.v1.ModelService/Predict"
BUDGET_MB = 100
RAW = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"rw {RW}\nro {RO}\n")
    path.chmod(0o600)
    return path


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} line")


def peak_during(pid: int, attack: Callable[[], Counter[str]]) -> tuple[int, int, Counter[str]]:
    """``(idle, peak, outcomes)``: resident bytes before ``attack`` and at most during it."""
    idle = status(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    outcomes = attack()
    return idle, status(pid, "VmHWM"), outcomes


def concurrent_calls(
    address: str,
    method: str,
    data: bytes,
    metadata: tuple[tuple[str, str], ...],
    n: int,
    details: list[str] | None = None,
) -> Counter[str]:
    """``n`` calls of ``data`` at once, each on a connection of its own; their status names
    (the details of RESOURCE_EXHAUSTED ones appended to ``details``)."""

    def call(_: int) -> str:
        with grpc.insecure_channel(address, options=RAW) as channel:
            try:
                channel.unary_unary(method)(data, metadata=metadata, timeout=120)
                return "OK"
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and details is not None:
                    details.append(exc.details() or "")
                return str(exc.code().name)

    with ThreadPoolExecutor(min(n, 16)) as pool:
        return Counter(pool.map(call, range(n)))


def shard(serve: StartServe, tmp_path: Path, tokens_file: Path, dim: int) -> ServeProcess:
    config = tmp_path / f"config-{dim}.yaml"
    config.write_text(
        f"slots_config:\n  t: {{dim: {dim}}}\n"
        "defaults:\n  optimizer: {type: sgd, lr: 0.5}\n  capacity: 100000\n"
    )
    return serve(
        "--config", str(config), "--data-dir", str(tmp_path / f"data-{dim}"),
        "--tokens-file", str(tokens_file), "--max-inflight-mb", str(BUDGET_MB),
    )  # fmt: skip


@pytest.mark.slow
def test_anonymous_uploads_are_refused_before_the_server_receives_them(
    serve, tmp_path, tokens_file
) -> None:
    """8 concurrent tokenless 200 MB lookups: all UNAUTHENTICATED, and the server never holds
    them (before: gRPC received each whole, 190 MB -> 2.5-3.0 GB, and kept it)."""
    served = shard(serve, tmp_path, tokens_file, dim=16)
    data = b"\x0a" * 200_000_000
    idle, peak, outcomes = peak_during(
        served.process.pid, lambda: concurrent_calls(served.address, LOOKUP, data, (), 8)
    )
    assert outcomes == Counter({"UNAUTHENTICATED": 8})
    print(f"anonymous uploads: idle {idle >> 20} MiB, peak {peak >> 20} MiB")
    assert peak < 1.3 * idle + (BUDGET_MB << 20), (idle >> 20, peak >> 20, outcomes)
    assert served.stop() == 0


@pytest.mark.slow
def test_ro_lookups_within_every_bound_share_the_memory_budget(
    serve, tmp_path, tokens_file
) -> None:
    """16 ro callers, 130 KB lookups answering 16 MiB each (within every per-request bound):
    every call is answered or RESOURCE_EXHAUSTED naming the budget, and the peak stays within
    the budget (before: no aggregate bound; 8 workers building answers at once)."""
    served = shard(serve, tmp_path, tokens_file, dim=256)
    ids = np.arange(1, 16_385, dtype=np.uint64)
    data = pb.LookupRequest(table="t", ids=wire.encode_ids(ids)).SerializeToString()
    ro = (("authorization", f"Bearer {RO}"),)
    assert concurrent_calls(served.address, LOOKUP, data, ro, 1) == Counter({"OK": 1})
    details: list[str] = []
    idle, peak, outcomes = peak_during(
        served.process.pid,
        lambda: concurrent_calls(served.address, LOOKUP, data, ro, 32, details),
    )
    assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED"} and outcomes["OK"] >= 1, outcomes
    print(f"ro lookups: idle {idle >> 20} MiB, peak {peak >> 20} MiB, {dict(outcomes)}")
    assert peak < 1.3 * idle + (BUDGET_MB << 20), (idle >> 20, peak >> 20, outcomes)
    assert all("memory budget" in d for d in details), details
    assert served.stop() == 0


_MODEL_SERVER = """
import sys, threading
from pathlib import Path
from types import SimpleNamespace
from embeddb.transport.rpc import ListenConfig, Tokens
from embeddb.transport.rpc.lifecycle import write_atomically
from embeddb.serving.server import ModelServerConfig, build_model_server

class Stub:
    spec = SimpleNamespace(id_features=(), non_id=(), snapshot_id="")
    def predict(self, batch): raise RuntimeError("not a model")
    def batch_from_records(self, records): raise RuntimeError("not a model")
    def batch_from_hashed_records(self, records): raise RuntimeError("not a model")

server = build_model_server(Stub(), ModelServerConfig(
    ListenConfig(tokens=Tokens.from_file(sys.argv[2])), http_port=None, warm_up=False,
    max_inflight_bytes=int(sys.argv[3]) << 20))
write_atomically(Path(sys.argv[1]), str(server.port))
threading.Event().wait()
"""


@pytest.mark.slow
def test_the_model_servers_grpc_port_refuses_anonymous_uploads_unread(
    tmp_path, tokens_file
) -> None:
    """serve-model's gRPC port: 8 tokenless 60 MB predictions (within its 64 MiB message
    limit) are UNAUTHENTICATED without being received (before: 381 MB -> 884 MB)."""
    port_file = tmp_path / "model-port"
    command = [sys.executable, "-c", _MODEL_SERVER, str(port_file), str(tokens_file)]
    process = subprocess.Popen([*command, str(BUDGET_MB)], stderr=subprocess.PIPE)
    try:
        port = eventually(
            lambda: process.poll() is None and port_file.exists() and port_file.read_text(),
            START_TIMEOUT_S,
            "the model server's port file",
        )
        data = b"\x0a" * 60_000_000
        address = f"127.0.0.1:{port}"
        idle, peak, outcomes = peak_during(
            process.pid, lambda: concurrent_calls(address, PREDICT, data, (), 8)
        )
        assert outcomes == Counter({"UNAUTHENTICATED": 8})
        print(f"model server uploads: idle {idle >> 20} MiB, peak {peak >> 20} MiB")
        assert peak < 1.3 * idle + (BUDGET_MB << 20), (idle >> 20, peak >> 20, outcomes)
    finally:
        process.kill()
        process.communicate(timeout=30)


# --------------------------------------------------------------------------- the budget
def test_a_budget_charges_clamps_refuses_and_gives_back() -> None:
    budget = MemoryBudget(100)
    first = budget.acquire(60)
    assert first == 60 and budget.in_use == 60
    assert budget.acquire(50) == 0 and budget.refused == 1  # no room, no wait
    assert budget.in_use == 60
    budget.release(first)
    big = budget.acquire(10_000)  # larger than the budget: runs alone, charged the whole
    assert big == 100 and budget.acquire(1) == 0
    budget.release(big)
    assert budget.wait_idle(0) and budget.acquire(0) == 1
    with pytest.raises(ValueError):
        MemoryBudget(0)


@pytest.mark.slow
def test_a_call_that_finds_no_room_is_resource_exhausted_and_charges_are_given_back(
    tmp_path,
) -> None:
    """In-process: with the budget taken, a lookup is refused before any work, naming the
    budget; once given back, it is answered, and every charge of a finished call returns."""
    from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
    from embeddb.engine.shard import Shard
    from embeddb.server import ServerConfig, build_server
    from embeddb.transport.rpc import ListenConfig
    from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

    table = TableConfig(
        name="t", dim=64, capacity=1000, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
    )
    shard = Shard(EmbeddingConfig(tables={"t": table}), tmp_path / "shard")
    config = ServerConfig(ListenConfig(), max_inflight_bytes=1 << 20, budget_wait_s=0)
    server = build_server(shard, config)
    try:
        budget = server.budget
        assert budget is not None and budget.limit == 1 << 20
        request = pb.LookupRequest(table="t", ids=wire.encode_ids(np.arange(1, 1001, dtype="u8")))
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            held = budget.acquire(budget.limit)
            with pytest.raises(grpc.RpcError) as info:
                stub.Lookup(request)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "memory budget" in (info.value.details() or "")
            assert shard.stats().tables["t"].lookup_ids == 0  # refused before any work
            budget.release(held)
            for _ in range(3):
                assert stub.Lookup(request).vectors.shape == [1000, 64]
        assert budget.wait_idle(START_TIMEOUT_S)  # every finished call gave its charge back
    finally:
        server.stop(grace=0)
        shard.close()
