"""The ``Scan`` RPC, ``Client.scan`` and the read-only CLI commands ``embeddb tables``,
``stats``, ``peek`` and ``scan``, against real shards served on 127.0.0.1 (port 0)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner, Result

from embeddb.cli.app import main
from embeddb.client import AsyncClient, Client, ClientOptions
from embeddb.engine.shard import Shard
from embeddb.errors import InvalidArgumentError, NotFoundError
from embeddb.server import ServerConfig, build_server
from embeddb.transport import wire
from embeddb.transport.rpc.auth import Tokens
from embeddb.transport.rpc.listen import ListenConfig
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.test_client import DIM, Cluster, serve_cluster, sgd_tables

RW = "rw-token-0123456789abcdef"
RO = "ro-token-fedcba9876543210"
REPLICA = "replica-token-00112233445566"
TOKENS = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}), replica=frozenset({REPLICA}))
CAPACITY = 64  # per shard: most of the rows below live only in the disk tier


def rows(n: int = 400, seed: int = 0) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
    """``n`` distinct ids (0 and 2^64 - 1 included) and random vectors."""
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(1, 1 << 62, size=n, dtype=np.uint64))
    ids[0], ids[-1] = 0, (1 << 64) - 1  # still ascending
    vectors = rng.standard_normal((ids.size, DIM)).astype(np.float32)
    return ids, vectors


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Two shards holding ``rows()`` (some resident, most evicted to disk)."""
    with serve_cluster(tmp_path, 2, sgd_tables(capacity=CAPACITY)) as c:
        ids, vectors = rows()
        with Client(c.addresses) as client:
            client.assign("t", ids, vectors)
        yield c


def addresses(c: Cluster) -> list[str]:
    return ["--addresses", ",".join(c.addresses)]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def stored_rows(c: Cluster) -> int:
    return sum(s.stats().tables["t"].rows for s in c.shards)


# ------------------------------------------------------------------------- the RPC and client
def test_scan_returns_every_row_once_with_exact_vectors(cluster: Cluster) -> None:
    ids, vectors = rows()
    tiers = [s.stats().tables["t"] for s in cluster.shards]
    assert all(t.ram_rows > 0 for t in tiers) and sum(t.disk_rows for t in tiers) > ids.size // 2
    with Client(cluster.addresses) as client:
        pages = list(client.scan("t", limit=37))
    assert all(0 < p.size <= 37 for p, _ in pages)
    got_ids = np.concatenate([p for p, _ in pages])
    got = np.concatenate([v for _, v in pages])
    assert got_ids.size == ids.size == np.unique(got_ids).size
    order = np.searchsorted(ids, got_ids)
    np.testing.assert_array_equal(ids[order], got_ids)
    np.testing.assert_array_equal(got, vectors[order])
    per_shard = [cluster.owned(got_ids, k) for k in range(2)]
    assert np.array_equal(np.concatenate(per_shard), got_ids)  # shard 0's rows, then shard 1's
    assert all(np.all(np.diff(s.astype(np.float64)) > 0) for s in per_shard)


def test_scan_sees_deletes_and_new_values(cluster: Cluster) -> None:
    ids, _ = rows()
    with Client(cluster.addresses) as client:
        client.delete("t", ids[::3])
        client.assign("t", ids[1:2], np.full((1, DIM), 7.0, dtype=np.float32))
        got = {
            int(i): v for p, vs in client.scan("t", limit=50) for i, v in zip(p, vs, strict=True)
        }
    assert set(got) == set(np.delete(ids, np.s_[::3]).tolist())
    np.testing.assert_array_equal(got[int(ids[1])], np.full(DIM, 7.0, dtype=np.float32))


def test_a_page_resumes_after_its_last_id(tmp_path: Path) -> None:
    shard = Shard(sgd_tables(capacity=8), tmp_path / "shard")
    try:
        ids = np.array([3, 9, 12, 40, 41], dtype=np.uint64)
        shard.assign("t", ids, np.arange(5 * DIM, dtype=np.float32).reshape(5, DIM))
        first = shard.scan("t", None, 2)
        second = shard.scan("t", int(first.ids[-1]), 3)
        assert first.ids.tolist() == [3, 9] and not first.done
        assert second.ids.tolist() == [12, 40, 41] and second.done
        np.testing.assert_array_equal(second.vectors[0], np.arange(8, 12, dtype=np.float32))
        assert shard.scan("t", 41, 10).ids.size == 0 and shard.scan("t", 41, 10).done
        assert shard.stats().tables["t"].lookup_ids == 0  # a scan is not a lookup
    finally:
        shard.close()


def test_scan_limit_beyond_the_server_limits_is_refused(tmp_path: Path) -> None:
    with serve_cluster(tmp_path, 1, max_ids_per_request=100) as c, Client(c.addresses) as client:
        client.assign("t", [1, 2], np.ones((2, DIM), dtype=np.float32))
        with pytest.raises(InvalidArgumentError, match=r"limit 101 is too large.*at most 100"):
            list(client.scan("t", limit=101))
        with pytest.raises(InvalidArgumentError, match="limit must be a row count"):
            list(client.scan("t", limit=0))
        assert [p.tolist() for p, _ in client.scan("t", limit=100)] == [[1, 2]]
        with grpc.insecure_channel(c.addresses[0]) as channel:  # 0: the largest page allowed
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)  # type: ignore[no-untyped-call]
            r = stub.Scan(pb.ScanRequest(table="t"))
        assert wire.decode_ids(r.ids, "ids").tolist() == [1, 2] and r.done and r.last_id == 2


def test_async_scan_pages_equal_the_blocking_scan(cluster: Cluster) -> None:
    with Client(cluster.addresses) as client:
        expected = [(p.tolist(), v.tobytes()) for p, v in client.scan("t", limit=41)]

    async def pages() -> list[tuple[list[int], bytes]]:
        async with AsyncClient(cluster.addresses) as client:
            got = [(p.tolist(), v.tobytes()) async for p, v in client.scan("t", limit=41)]
            with pytest.raises(NotFoundError, match="unknown table"):
                _ = [page async for page in client.scan("nope")]
            with pytest.raises(InvalidArgumentError, match="limit must be a row count"):
                _ = [page async for page in client.scan("t", limit=0)]
            after = int(expected[0][0][-1])  # a cursor: above it on every shard
            resumed = [p.tolist() async for p, _ in client.scan("t", limit=1000, after=after)]
        assert all(i > after for page in resumed for i in page)
        return got

    got = asyncio.run(pages())
    assert got == expected and sum(len(p) for p, _ in got) == rows()[0].size


def test_scan_of_an_unknown_table_is_not_found(cluster: Cluster) -> None:
    with Client(cluster.addresses) as client, pytest.raises(NotFoundError, match="unknown table"):
        list(client.scan("nope"))


# ------------------------------------------------------------------------- the commands
@pytest.mark.slow
def test_scan_command_prints_every_row_as_csv_or_jsonl(cluster: Cluster) -> None:
    ids, vectors = rows()
    expected = dict(zip(ids.tolist(), vectors, strict=True))
    result = invoke("scan", *addresses(cluster), "--table", "t", "--page-rows", "50")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == ids.size
    for line in lines:
        first, *values = line.split(",")
        np.testing.assert_array_equal(np.array(values, dtype=np.float32), expected[int(first)])
    assert {int(line.split(",")[0]) for line in lines} == set(expected)

    result = invoke("scan", *addresses(cluster), "--table", "t", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["id"] for r in records} == set(expected)
    for r in records:
        np.testing.assert_array_equal(np.array(r["vector"], dtype=np.float32), expected[r["id"]])


def test_scan_command_stops_at_limit(cluster: Cluster) -> None:
    result = invoke("scan", *addresses(cluster), "--table", "t", "--limit", "7", "--page-rows", "3")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 7


def test_scan_command_refuses_a_bad_limit(cluster: Cluster) -> None:
    result = invoke("scan", *addresses(cluster), "--table", "t", "--limit", "0")
    assert result.exit_code == 2 and "--limit" in result.output
    result = invoke("scan", *addresses(cluster), "--table", "t", "--page-rows", str(1 << 30))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "is too large" in result.stderr


def test_unknown_table_is_one_error_line(cluster: Cluster) -> None:
    for command in ("scan", "peek"):
        extra = ["5"] if command == "peek" else []
        result = invoke(command, *addresses(cluster), "--table", "nope", *extra)
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "unknown table" in lines[0]


def test_tables_and_stats_commands(cluster: Cluster, tmp_path: Path) -> None:
    ids, _ = rows()
    address_file = tmp_path / "addresses.txt"
    address_file.write_text("\n".join(cluster.addresses) + "\n")
    result = invoke("tables", "--addresses", f"@{address_file}")
    assert result.exit_code == 0, result.output
    header, line = result.stdout.splitlines()
    assert header.split() == ["table", "dim", "optimizer", "capacity", "rows"]
    assert line.split() == ["t", str(DIM), "sgd", str(CAPACITY), str(ids.size)]

    result = invoke("stats", *addresses(cluster))
    assert result.exit_code == 0, result.output
    table = [line.split() for line in result.stdout.splitlines()]
    assert table[0][:4] == ["shard", "address", "table", "rows"]
    assert [r[:3] for r in table[1:]] == [
        ["0", cluster.addresses[0], "t"],
        ["1", cluster.addresses[1], "t"],
    ]
    assert sum(int(r[3]) for r in table[1:]) == ids.size
    column = table[0].index("ram_bytes")  # each shard's RAM tier in bytes (ram_budget)
    ram_bytes = [s.stats().tables["t"].ram_bytes for s in cluster.shards]
    assert [int(r[column]) for r in table[1:]] == ram_bytes and min(ram_bytes) > 0

    result = invoke("stats", *addresses(cluster), "--format", "json")
    shards = json.loads(result.stdout)
    assert [s["shard_index"] for s in shards] == [0, 1]
    assert sum(s["tables"]["t"]["rows"] for s in shards) == ids.size


def test_peek_prints_vectors_and_inserts_nothing(cluster: Cluster) -> None:
    ids, vectors = rows()
    before = stored_rows(cluster)
    unknown = 12345  # stored nowhere (checked just below)
    assert unknown not in set(ids.tolist())
    result = invoke("peek", *addresses(cluster), "--table", "t", str(ids[5]), str(unknown))
    assert result.exit_code == 0, result.output
    known_line, unknown_line = result.stdout.splitlines()
    assert int(known_line.split(",")[0]) == int(ids[5])
    np.testing.assert_array_equal(np.array(known_line.split(",")[1:], dtype=np.float32), vectors[5])
    assert unknown_line == f"{unknown}," + ",".join(["0"] * DIM)
    assert stored_rows(cluster) == before


# ------------------------------------------------------------------------- tokens
def test_scan_needs_a_replica_token_and_ro_or_no_token_is_refused(tmp_path: Path) -> None:
    """An ro token reads only the ids it names: ``Scan`` (every row) needs replica or rw
    (before: an ro token scanned every table)."""
    shard = Shard(sgd_tables(), tmp_path / "shard")
    server = build_server(shard, ServerConfig(ListenConfig(tokens=TOKENS)))
    address = f"127.0.0.1:{server.port}"
    try:
        with Client([address], ClientOptions(token=RW)) as client:
            client.assign("t", [4, 8], np.ones((2, DIM), dtype=np.float32))
        for role, token in (("ro", RO), ("replica", REPLICA)):
            token_file = tmp_path / f"{role}-token"
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
        result = invoke(
            "scan", "--addresses", address, "--table", "t", "--token-file",
            str(tmp_path / "ro-token"),
        )  # fmt: skip
        assert result.exit_code == 1
        assert "PERMISSION_DENIED" in result.stderr and "replica" in result.stderr
        result = invoke(
            "scan", "--addresses", address, "--table", "t", "--token-file",
            str(tmp_path / "replica-token"),
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["4", "8"]

        result = invoke("scan", "--addresses", address, "--table", "t")
        assert result.exit_code == 1
        assert result.stderr.startswith("Error: ") and "UNAUTHENTICATED" in result.stderr
    finally:
        server.stop(grace=0)
        shard.close()


# ------------------------------------------------------------------------- one shard alone
def test_one_address_of_a_cluster_inspects_that_shard_alone(cluster: Cluster) -> None:
    """One shard's address of a two-shard cluster: each command says which shard it is on
    stderr and shows that shard's part (before: a ConfigError, "serves shard 1 of 2, but the
    client lists it as shard 0 of 1")."""
    ids, vectors = rows()
    address = cluster.addresses[1]
    mine = cluster.owned(ids, 1)
    note = f"{address} is shard 1 of 2: showing that shard's part only"

    result = invoke("tables", "--addresses", address, "--format", "json")
    assert result.exit_code == 0, result.output
    assert note in result.stderr
    assert [(t["table"], t["rows"]) for t in json.loads(result.stdout)] == [("t", mine.size)]

    result = invoke("stats", "--addresses", address, "--format", "json")
    assert result.exit_code == 0, result.output
    [shard] = json.loads(result.stdout)
    assert (shard["shard_index"], shard["num_shards"]) == (1, 2)
    assert shard["tables"]["t"]["rows"] == mine.size

    result = invoke("scan", "--addresses", address, "--table", "t")
    assert result.exit_code == 0, result.output
    assert note in result.stderr
    scanned = [int(line.split(",")[0]) for line in result.stdout.splitlines()]
    assert scanned == sorted(mine.tolist())

    theirs = cluster.owned(ids, 0)[:2]
    result = invoke("peek", "--addresses", address, "--table", "t", str(mine[0]), *map(str, theirs))
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert int(line.split(",")[0]) == int(mine[0])
    row = vectors[np.searchsorted(ids, mine[0])]
    np.testing.assert_array_equal(np.array(line.split(",")[1:], dtype=np.float32), row)
    assert f"not on this shard (owned by others): {theirs[0]}, {theirs[1]}" in result.stderr

    # populate and snapshot write: one address must still be the whole cluster
    result = invoke("snapshot", "--addresses", address, "--id", "alone")
    assert result.exit_code == 1 and "serves shard 1 of 2" in result.stderr
