"""The Node.js client example (``examples/clients/node``) against real shards on 127.0.0.1.

A client written from the .proto alone must learn its limits from ``DescribeShard``: the
shards here accept at most 1 MiB per message and 5,000 ids per request, and an 80,000 x 16
round trip succeeds only if the Node client split its requests by what it learned. Its
vectors are then read back from Python, bit for bit (cross-language exactness).

Skipped, with the reason, when ``node``/``npm`` are absent or ``npm ci`` cannot install the
two locked packages (no registry and no npm cache).
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from embeddb.cli.proto import proto_root
from embeddb.client import Client
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import ListenConfig
from embeddb.transport.rpc.auth import Tokens

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "clients" / "node"
DIM = 16
ROWS = 80_000
MIB = 1 << 20
RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"
NPM_TIMEOUT_S = 180
NODE_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def node_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example (without node_modules) with its locked packages installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the Node client example (not on PATH)")
    target = tmp_path_factory.mktemp("node") / "client"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("node_modules"))
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
            cwd=target,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm ci took over {NPM_TIMEOUT_S} s (no registry reachable?)")
    if done.returncode != 0:
        pytest.skip(f"npm ci failed (no registry and no cache?):\n{done.stderr[-2000:]}")
    return target


@contextmanager
def two_shards(
    data_dir: Path, max_ids_per_request: int, tokens: Tokens | None = None
) -> Iterator[list[str]]:
    """Two shards of one table ``t`` of dim ``DIM``, served in process with 1 MiB messages and
    ``max_ids_per_request``; yields their addresses in shard order."""
    config = EmbeddingConfig.single_table("t", DIM, capacity=200_000)
    shards, servers, addresses = [], [], []
    try:
        for k in range(2):
            shard = Shard(config, data_dir / f"shard-{k}", shard_index=k, num_shards=2)
            shards.append(shard)
            served = ServerConfig(
                ListenConfig(tokens=tokens),
                shard_index=k,
                num_shards=2,
                max_message_bytes=MIB,
                max_ids_per_request=max_ids_per_request,
            )
            server = build_server(shard, served)
            servers.append(server)
            addresses.append(f"127.0.0.1:{server.port}")
        yield addresses
    finally:
        for server in servers:
            server.stop(grace=0)
        for shard in shards:
            shard.close()


def run_example(example: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``node example.js ARGS`` with the ``embeddb`` command of this interpreter on PATH (the
    client finds the .proto files with ``embeddb proto-path`` unless given --proto-path)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(
        ["node", "example.js", *args],
        cwd=example,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        env=env,
    )


def address_args(addresses: list[str]) -> list[str]:
    return ["--addresses", ",".join(addresses)]


@pytest.mark.parametrize(
    ("max_ids_per_request", "min_requests"),
    [
        # ids bound: assign + lookup, each at least ROWS / 5,000 requests over the shards
        (5_000, 2 * ROWS // 5_000),
        # bytes bound: 80,000 x 16 x 4 bytes is 5 MiB each way, so at least 5 requests each
        (1_000_000, 2 * math.ceil(ROWS * DIM * 4 / MIB)),
    ],
    ids=["ids-per-request", "message-bytes"],
)
def test_node_round_trip_splits_by_learned_limits_and_matches_python(
    node_example: Path, tmp_path: Path, max_ids_per_request: int, min_requests: int
) -> None:
    dump = tmp_path / "dump.json"
    with two_shards(tmp_path, max_ids_per_request) as addresses:
        done = run_example(
            node_example, *address_args(addresses), "--rows", str(ROWS), "--dump", str(dump)
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        vectors_json = json.loads(dump.read_text())
        ids = np.array([int(i) for i in vectors_json["ids"]], dtype=np.uint64)
        node_vectors = np.frombuffer(
            base64.b64decode(vectors_json["vectors_f32le_base64"]), dtype="<f4"
        ).reshape(ROWS, DIM)
        picked = np.random.default_rng(0).choice(ROWS, size=64, replace=False)
        with Client(addresses) as client:
            python_vectors = client.lookup("t", ids[picked], train=False)
    assert summary["ok"] is True
    assert summary["rows"] == ROWS
    assert summary["max_message_bytes"] == MIB
    vectors = json.loads(
        (proto_root() / "embeddb" / "v1" / "routing_test_vectors.json").read_text()
    )
    assert summary["routing_vectors"] == len(vectors["vectors"]) > 0
    assert summary["requests"] >= min_requests > 4  # more than one call per shard and method
    assert vectors_json["dim"] == DIM and np.unique(ids).size == ROWS
    assert python_vectors.view(np.uint32).tolist() == node_vectors[picked].view(np.uint32).tolist()


def test_node_client_refuses_addresses_out_of_shard_order(
    node_example: Path, tmp_path: Path
) -> None:
    with two_shards(tmp_path, 5_000) as addresses:
        done = run_example(
            node_example,
            *address_args(addresses[::-1]),
            "--rows",
            "10",
            "--proto-path",
            str(proto_root()),
        )
    assert done.returncode == 1
    assert done.stdout == ""  # nothing was sent, no summary
    assert "topology mismatch" in done.stderr
    assert f"address {addresses[1]} (position 0 of 2) is shard 1" in done.stderr
    assert "list the addresses in shard order" in done.stderr


def test_node_client_sends_the_bearer_token(node_example: Path, tmp_path: Path) -> None:
    tokens = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}))
    ro_file, rw_file = tmp_path / "ro.token", tmp_path / "rw.token"
    ro_file.write_text(RO + "\n")
    rw_file.write_text(RW + "\n")
    with two_shards(tmp_path, 5_000, tokens) as addresses:
        read_only = run_example(
            node_example, *address_args(addresses), "--rows", "100", "--token-file", str(ro_file)
        )
        read_write = run_example(
            node_example, *address_args(addresses), "--rows", "100", "--token-file", str(rw_file)
        )
        anonymous = run_example(node_example, *address_args(addresses), "--rows", "100")
    assert read_only.returncode == 1
    assert "Assign to shard" in read_only.stderr
    assert "failed: PERMISSION_DENIED:" in read_only.stderr
    assert read_write.returncode == 0, read_write.stderr
    assert json.loads(read_write.stdout)["ok"] is True
    assert anonymous.returncode == 1
    assert "UNAUTHENTICATED" in anonymous.stderr
