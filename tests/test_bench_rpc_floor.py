"""benchmarks/_rpc_server.py: the raw ``Gather`` method that gives rpc.py's lookup its floor
(``lookup_floor_ratio``) answers exactly what the shard's lookup does, and ``Echo`` stays."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.shard import Shard

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("_rpc_server")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow  # a gRPC server and a 4 MiB answer: ~0.8 s
def test_gather_answers_the_shards_vectors_as_raw_bytes(bench: ModuleType) -> None:
    config = EmbeddingConfig.single_table(
        bench.TABLE, bench.DIM, capacity=1024, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
    )
    shard = Shard(config)
    server, executor, port = bench.start_echo(2, shard)
    try:
        ids = np.array([5, 900, 17, 5], dtype=np.uint64)
        expected = shard.lookup(bench.TABLE, ids, train=True)  # creates the rows
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            gather = channel.unary_unary(f"/{bench.ECHO_SERVICE}/{bench.GATHER_METHOD}")
            answer = gather(ids.tobytes(), timeout=30)
            echo = channel.unary_unary(f"/{bench.ECHO_SERVICE}/{bench.ECHO_METHOD}")
            echoed = echo(b"ignored", timeout=30)
        got = np.frombuffer(answer, dtype=np.float32).reshape(ids.size, bench.DIM)
        np.testing.assert_array_equal(got, expected)
        assert len(echoed) == bench.VECTOR_BYTES
    finally:
        server.stop(None).wait()
        executor.shutdown(wait=True)
        shard.close()
