"""The .proto files against buf (https://buf.build), a third-party protobuf toolchain: `buf lint`
with the STANDARD rules, `buf breaking` (WIRE rules) against the 0.1.0 files from before the
lint renames, and `buf curl` calling a real shard through server reflection v1 and v1alpha.

Skipped when buf is not installed (scripts/install-buf.sh installs it from npm).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, TableConfig
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import RpcServer

BUF = shutil.which("buf")
pytestmark = [
    pytest.mark.slow,  # runs buf: the full suite's, not the fast tier's
    pytest.mark.skipif(
        BUF is None, reason="buf is not installed (scripts/install-buf.sh installs it from npm)"
    ),
]

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "embeddb" / "proto"  # the buf module root (buf.yaml)
BEFORE_RENAMES = ROOT / "tests" / "data" / "proto-0.1.0"
DIM = 3


def buf(*args: str, cwd: Path = MODULE) -> subprocess.CompletedProcess[str]:
    assert BUF is not None
    return subprocess.run(
        [BUF, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_buf_lint_standard_is_clean() -> None:
    config = (MODULE / "buf.yaml").read_text()
    assert "STANDARD" in config
    result = buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_buf_breaking_wire_against_the_files_before_the_renames() -> None:
    """Binary wire compatibility with 0.1.0; the JSON names did change (WIRE_JSON fails)."""
    result = buf("breaking", "--against", str(BEFORE_RENAMES))
    assert result.returncode == 0, result.stdout + result.stderr
    json_rules = '{"version": "v2", "breaking": {"use": ["WIRE_JSON"]}}'
    strict = buf("breaking", "--against", str(BEFORE_RENAMES), "--config", json_rules)
    assert strict.returncode != 0
    assert 'changed name from "LZ4" to "COMPRESSION_LZ4"' in strict.stdout


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RpcServer]:
    table = TableConfig(
        name="t", dim=DIM, capacity=100, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
    )
    shard = Shard(EmbeddingConfig(tables={"t": table}), tmp_path / "shard")
    served = build_server(shard, ServerConfig(max_ids_per_request=5_000, max_message_bytes=8 << 20))
    try:
        yield served
    finally:
        served.stop(grace=1)
        shard.close()


def curl_args(reflect: str) -> list[str]:
    """`buf curl` over plaintext HTTP/2 (gRPC) with the schema from server reflection."""
    return ["curl", "--protocol", "grpc", "--http2-prior-knowledge", "--reflect-protocol", reflect]


def curl(server: RpcServer, method: str, body: object, reflect: str = "grpc-v1") -> object:
    url = f"http://127.0.0.1:{server.port}/embeddb.v1.EmbeddingStoreService/{method}"
    result = buf(*curl_args(reflect), "--data", json.dumps(body), url)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout or "{}")


@pytest.mark.parametrize("reflect", ["grpc-v1", "grpc-v1alpha"])
def test_buf_curl_through_reflection(server: RpcServer, reflect: str) -> None:
    listed = buf(*curl_args(reflect), "--list-services", f"http://127.0.0.1:{server.port}")
    assert listed.returncode == 0, listed.stderr
    assert "embeddb.v1.EmbeddingStoreService" in listed.stdout.split()

    shard = curl(server, "DescribeShard", {}, reflect)
    assert isinstance(shard, dict)
    assert shard["limits"]["maxIdsPerRequest"] == "5000"
    assert shard["limits"]["maxMessageBytes"] == str(8 << 20)
    assert shard["routing"]["algorithm"] == "splitmix64-lemire-v1"


def test_buf_curl_round_trip_with_the_renamed_enums(server: RpcServer) -> None:
    """JSON written by hand from the .proto alone: ids and vectors as base64 little-endian
    bytes, dtypes by their STANDARD names."""
    ids = np.array([11, 12], "<u8")
    vectors = np.array([[1.5, -2.0, 0.25], [3.0, 4.0, -5.0]], "<f4")

    def tensor(array: np.ndarray, dtype: str) -> dict[str, object]:
        return {
            "dtype": dtype,
            "shape": [str(n) for n in array.shape],
            "data": base64.b64encode(array.tobytes()).decode(),
        }

    written = curl(
        server,
        "Assign",
        {
            "table": "t",
            "ids": tensor(ids, "D_TYPE_UINT64"),
            "vectors": tensor(vectors, "D_TYPE_FLOAT32"),
        },
    )
    assert written == {"written": "2"}
    got = curl(server, "Lookup", {"table": "t", "ids": tensor(ids, "D_TYPE_UINT64")})
    assert isinstance(got, dict)
    answer = got["vectors"]
    assert answer["dtype"] == "D_TYPE_FLOAT32"
    assert answer["shape"] == ["2", str(DIM)]
    decoded = np.frombuffer(base64.b64decode(answer["data"]), "<f4").reshape(2, DIM)
    np.testing.assert_array_equal(decoded, vectors)
