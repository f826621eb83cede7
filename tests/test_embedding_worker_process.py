"""The embedding worker's process facade (:mod:`embeddb.trainer.embedding.process`) against real
shards served in-process on port 0, and the design rules of the trainer's imports."""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embeddb.client import Client
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, UnavailableError
from embeddb.features.batch import IDTypeFeatureWithSingleID
from embeddb.trainer.embedding.process import EmbeddingWorkerProcess
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.errors import (
    EmbeddingWorkerError,
    GradientPushFailedError,
    LookupFailedError,
)
from tests.support import eventually, free_port
from tests.test_embedding_worker import (
    CONFIG,
    FAST,
    features,
    like,
    table_ids,
    wire,
)
from tests.trainer_harness import Shards, serve_shards

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Shards]:
    with serve_shards(CONFIG, None, 2) as out:
        yield out


# ---------------------------------------------------------------------- the process facade
@pytest.fixture
def process(shards: Shards) -> Iterator[EmbeddingWorkerProcess]:
    worker = EmbeddingWorkerProcess(CONFIG, shards.addresses, FAST, start_timeout=60)
    yield worker
    worker.close(10)


def test_process_round_trip(process: EmbeddingWorkerProcess, shards: Shards) -> None:
    feats = wire(features(batch_size=512))
    ref, future = process.lookup(feats, True)
    pooled = future.result(10)
    assert pooled[0].shape == (512, 4) and pooled[0].flags.writeable
    assert isinstance(pooled[3], tuple) and pooled[3][0].shape == (512, 3, 4)
    process.push_gradients(ref, like(pooled))
    process.flush(10)
    rounds = 30
    before = process.stats()
    for _ in range(rounds):
        ref, again = process.lookup(feats, False)
        np.testing.assert_array_equal(again.result(10)[0], pooled[0])
    after = process.stats()
    # The transport's cost per batch is a figure for benchmarks, not a test's assertion.
    for kind in ("lookup", "pooling"):
        count = f"embeddb_trainer_{kind}_seconds_count"
        assert after[count] - before[count] == rounds, kind


def test_process_reports_lookup_and_push_failures(
    process: EmbeddingWorkerProcess, shards: Shards
) -> None:
    feats = wire(features())
    ref, future = process.lookup(feats, True)
    pooled = future.result(10)
    shards.stop(0)
    shards.stop(1)
    process.push_gradients(ref, like(pooled, 1.0))
    process.flush(10)
    with pytest.raises(GradientPushFailedError, match="batch 0") as info:
        process.raise_failure()
    assert info.value.cause == "UnavailableError"
    process.raise_failure()  # reported once
    _, future = process.lookup(feats, True)
    with pytest.raises(LookupFailedError):
        future.result(10)


def test_a_dead_worker_fails_pending_calls_at_once(process: EmbeddingWorkerProcess) -> None:
    _, future = process.lookup(wire(features()), True)
    future.result(10)
    _, blocked = process.lookup(wire(features()), True)  # fine: staleness 2
    _, blocked = process.lookup(wire(features()), True)  # waits for admission
    os.kill(process.pid, signal.SIGKILL)
    with pytest.raises(EmbeddingWorkerError, match="exited with code -9"):
        blocked.result(10)
    with pytest.raises(EmbeddingWorkerError):
        process.lookup(wire(features()), False)
    with pytest.raises(EmbeddingWorkerError):
        process.raise_failure()
    assert not process.alive


def _nn_worker_that_dies(addresses: list[str], pids: Any) -> None:
    """An NN worker process: starts its embedding worker, pushes a gradient, dies at once."""
    worker = EmbeddingWorkerProcess(CONFIG, addresses, FAST, start_timeout=60)
    ref, future = worker.lookup(wire([IDTypeFeatureWithSingleID("user", [4])]), True)
    future.result(10)
    worker.push_gradients(ref, [np.ones((1, 4), np.float32)])
    pids.send(worker.pid)  # synchronous, unlike a Queue's feeder thread
    os._exit(3)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_the_worker_exits_when_the_nn_worker_dies(shards: Shards) -> None:
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    nn = ctx.Process(target=_nn_worker_that_dies, args=(shards.addresses, sender))
    nn.start()
    assert receiver.poll(60)
    worker_pid = receiver.recv()
    nn.join(30)
    assert nn.exitcode == 3
    eventually(lambda: _gone(worker_pid), 30, f"the embedding worker {worker_pid} to exit")
    with Client(shards.addresses) as client:  # the pending push was drained before exiting
        row = client.lookup("person", table_ids("user", [4]), train=False)
        assert (
            shards.shards[0].stats().tables["person"].rows
            + shards.shards[1].stats().tables["person"].rows
            == 1
        )
    assert row.any()


def test_the_worker_serves_its_metrics_when_asked(shards: Shards) -> None:
    port = free_port()  # the worker reports no port it bound
    config = EmbeddingWorkerConfig(max_staleness=3, metrics_port=port)
    worker = EmbeddingWorkerProcess(CONFIG, shards.addresses, config, start_timeout=60)
    try:
        worker.lookup(wire(features()), True)[1].result(10)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        worker.close(10)
    assert "embeddb_trainer_staleness 1.0" in text
    assert "embeddb_trainer_staleness_limit 3.0" in text
    assert 'embeddb_trainer_lookups_total{train="true"} 1.0' in text


def test_start_failures_are_clear(shards: Shards) -> None:
    other = EmbeddingConfig.from_yaml_text("slots_config: {user: {dim: 8, table: person}}")
    with pytest.raises(ConfigError, match="dim"):
        EmbeddingWorkerProcess(other, shards.addresses, FAST, start_timeout=60)
    shards.stop(0)
    with pytest.raises(UnavailableError, match=r"could not start.*shard 0"):
        EmbeddingWorkerProcess(CONFIG, shards.addresses, FAST, start_timeout=60)


# ---------------------------------------------------------------------- design rules
TRAINER = Path(__file__).resolve().parents[1] / "trainer"
SERVING = Path(__file__).resolve().parents[1] / "embeddb" / "serving"
OFF_LIMITS = (
    "embeddb.server",
    "embeddb.engine.shard",
    "embeddb.engine.storage",
    "embeddb.engine.durability",
)
OFF_LIMITS += (
    "embeddb.engine.optim",
    "embeddb.cli",
    "embeddb.transport.wire",
    "embeddb.v1",
    "grpc",
)
OFF_LIMITS += ("embeddb.engine.recovery", "embeddb.engine.journal", "embeddb.engine.snapshots")
OFF_LIMITS += ("embeddb.engine.feed",)  # the Shard facade's parts (embeddb/engine/shard.py)


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# The model server (embeddb/serving/, issue 6) is itself a gRPC server: it may use grpc, its
# own ModelService stubs and the shared RPC layer (embeddb.transport.rpc: listen config, auth,
# boundary,
# interceptors, metrics, assembly, process lifecycle), never embeddb.server; it still reaches
# the shards only through the client (InferCtx).
MODEL_SERVER = ("batcher.py", "client.py", "codec.py", "daemon.py", "http.py", "metrics.py")
MODEL_SERVER += ("server.py", "http_app.py", "http_protocol.py", "predictor.py")
MODEL_SERVER_ALLOWED = ("grpc", "embeddb.v1.model_pb2", "embeddb.v1.model_pb2_grpc")
MODEL_SERVER_ALLOWED += (
    "embeddb.transport.rpc.listen",
    "embeddb.transport.rpc.auth",
    "embeddb.transport.rpc.boundary",
)
MODEL_SERVER_ALLOWED += ("embeddb.transport.rpc.interceptors", "embeddb.transport.rpc.metrics")
MODEL_SERVER_ALLOWED += ("embeddb.transport.rpc.assembly", "embeddb.transport.rpc.lifecycle")


# The one deliberate exception (issue 13): `serve-model --from-checkpoint` opens a checkpoint's
# shard snapshots in-process, read-only (a private copy, a follower Shard refusing every
# mutation), for a one-command local demo. It imports the Shard facade and nothing else of the
# server side; everything else in the trainer still reaches shards through the client.
IN_PROCESS_SHARDS = ("local_shards.py", "embeddb.engine.shard")


def test_the_trainer_reaches_the_shards_only_through_the_client() -> None:
    """docs/architecture.md §2, module by module: the trainer reaches shards through the client."""
    checked = 0
    for path in sorted([*TRAINER.rglob("*.py"), *SERVING.rglob("*.py")]):
        server_side = path.parent.name == "serving" and path.name in MODEL_SERVER
        for name in imported(path):
            if server_side and (
                name in MODEL_SERVER_ALLOWED
                or name.startswith(("grpc.", "grpc_"))
                or (name == "embeddb.v1" and "embeddb_pb2" not in path.read_text())
            ):
                continue
            if (path.name, name) == IN_PROCESS_SHARDS and path.parent.name == "serving":
                continue
            bad = [m for m in OFF_LIMITS if name == m or name.startswith(m + ".")]
            assert not bad, f"{path} imports {name}"
            checked += 1
    assert checked > 100
    infer = imported(SERVING / "infer.py")
    assert "embeddb.client" in infer and not any(n.startswith("grpc") for n in infer)


def test_the_embedding_worker_process_never_imports_torch() -> None:
    code = (
        "import sys, embeddb.trainer, embeddb.trainer.embedding.process, embeddb.trainer.config;"
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
