"""The model server warms up before it accepts calls: ``InferCtx.warm_up`` compiles the numba
kernels and scores a dummy record without counting it or writing to the shards;
``build_model_server`` calls it before binding any port (and a failed warm-up binds none);
``embeddb serve-model``'s process freezes start-up's objects out of the collector and runs
torch with the threads it was given while serving."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.client import _kernels as client_kernels
from embeddb.errors import UnavailableError
from embeddb.features import _hash_kernel as hash_kernel
from embeddb.features.batch import Batch
from embeddb.serving import InferCtx, export_model
from embeddb.serving.daemon import ModelDaemonOptions, run_model_server
from embeddb.serving.server import ModelServerConfig, build_model_server
from embeddb.trainer.model_spec import ModelSpec
from tests.support import eventually
from tests.trainer_harness import Shards, adult, adult_config, adult_model, serve_shards


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Shards]]:
    """One shard (port 0) and an untrained Adult model exported against it."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("model") / "adult"
    example = next(adult("train").batches(8))
    export_model(adult_model(), directory, embedding_config=adult_config(), example=example)
    with serve_shards(adult_config(), None, 1) as shards:
        yield directory, shards


@pytest.mark.slow
def test_warm_up_compiles_kernels_and_scores_a_dummy_record_uncounted(
    model: tuple[Path, Shards],
) -> None:
    directory, shards = model
    before = shards.shards[0].stats().totals()
    with InferCtx(directory, shards.addresses) as infer:
        seconds = infer.warm_up()
        assert seconds > 0
        warmed = shards.shards[0].stats().totals()
        assert warmed["lookup_ids"] > before["lookup_ids"]  # the lookup path ran
        assert client_kernels.dedup.signatures  # compiled (or loaded) before any call
        assert hash_kernel.hash_ranges.signatures  # the string hash of raw records too
        assert infer.predictions == 0  # the dummy record is not a prediction
        scores = infer.predict(next(adult("test").batches(4)))
        assert scores.shape == (4,) and np.all((scores > 0) & (scores < 1))
        assert infer.predictions == 4
    # evaluation lookups of the dummy ids inserted nothing
    assert warmed["rows"] == before["rows"]


class _Predictor:
    """A predictor that records its calls; its warm-up may fail."""

    def __init__(self, spec: ModelSpec, fail: bool = False) -> None:
        self.spec = spec
        self.fail = fail
        self.events: list[str] = []

    def warm_up(self) -> float:
        self.events.append("warm_up")
        if self.fail:
            raise UnavailableError("the shards are not reachable")
        return 0.0

    def predict(self, batch: Batch) -> np.ndarray:
        self.events.append("predict")
        return np.zeros(batch.batch_size, np.float32)

    def batch_from_records(self, records: object) -> Batch:
        raise NotImplementedError

    def batch_from_hashed_records(self, records: object) -> Batch:
        raise NotImplementedError


def _serving(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def test_build_model_server_warms_up_before_binding_and_a_failed_warm_up_binds_nothing(
    model: tuple[Path, Shards],
) -> None:
    directory, _ = model
    with InferCtx(directory, model[1].addresses) as infer:
        spec = infer.spec
    predictor = _Predictor(spec)
    server = build_model_server(predictor, ModelServerConfig(http_port=None))
    try:
        assert predictor.events == ["warm_up"]  # before any call could be accepted
        assert _serving(server.port)
    finally:
        server.stop(1.0)
    skipped = _Predictor(spec)
    server = build_model_server(skipped, ModelServerConfig(http_port=None, warm_up=False))
    server.stop(1.0)
    assert skipped.events == []
    failing = _Predictor(spec, fail=True)
    threads_before = {t.name for t in threading.enumerate()}
    with pytest.raises(UnavailableError, match="not reachable"):
        build_model_server(failing, ModelServerConfig(http_port=None))
    assert failing.events == ["warm_up"]
    assert not any(
        t.name.startswith("embeddb-model") and t.name not in threads_before
        for t in threading.enumerate()
    )


def _ports(path: Path) -> dict[str, int] | None:
    if not path.exists():
        return None
    ports: dict[str, int] = json.loads(path.read_text())
    return ports


@pytest.mark.slow
def test_serve_model_freezes_start_up_objects_and_sets_torch_threads(
    model: tuple[Path, Shards], tmp_path: Path
) -> None:
    directory, shards = model
    port_file = tmp_path / "ports.json"
    stop = threading.Event()
    result: list[int] = []
    threads_before = torch.get_num_threads()
    options = ModelDaemonOptions(
        directory, list(shards.addresses), port_file=port_file, handle_signals=False, threads=1
    )
    runner = threading.Thread(
        target=lambda: result.append(
            run_model_server(ModelServerConfig(http_port=None), options, stop)
        )
    )
    runner.start()
    try:
        ports = eventually(lambda: _ports(port_file), what="the port file")
        assert ports is not None
        assert _serving(ports["grpc"])
        assert gc.get_freeze_count() > 0  # start-up's objects left the collector's generations
        seen: list[int] = []  # torch's setting as a thread started now (a gRPC worker) sees it
        probe = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        probe.start()
        probe.join()
        assert seen == [1]
    finally:
        stop.set()
        runner.join(60)
        torch.set_num_threads(threads_before)
    assert result == [0]
    assert gc.get_freeze_count() == 0  # unfrozen at shutdown
