"""Durability over gRPC on real ports: Snapshot, ListSnapshots, the job checkpoint of the client
and the CLI, FetchSnapshot, and Subscribe (a follower's feed: catch-up, tailing latency,
heartbeats, cancellation, server shutdown, truncated records)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from embeddb.cli import main
from embeddb.client import AsyncClient, Client, ClientOptions
from embeddb.config import EmbeddingConfig
from embeddb.config.schema import store_from_keys
from embeddb.engine.durability import records
from embeddb.engine.durability.manifest import verify
from embeddb.engine.durability.snapshot_transfer import Chunk, SnapshotReceiver
from embeddb.engine.shard import Shard
from embeddb.errors import CorruptDataError, InvalidArgumentError, PermissionDeniedError
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import ListenConfig, RpcServer
from embeddb.transport.rpc.auth import Tokens
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import eventually

DIM = 4
RW = "rw-token-" + "a" * 20
RO = "ro-token-" + "b" * 20
REPLICA = "replica-token-" + "c" * 20


def config(dim: int = DIM, **store: object) -> EmbeddingConfig:
    cfg = one_table_config(dim=dim, capacity=1000, stripes=2)
    return replace(cfg, store=store_from_keys(store, cfg.store))


@dataclass
class Node:
    shard: Shard
    server: RpcServer
    channel: grpc.Channel

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def stub(self) -> pb_grpc.EmbeddingStoreServiceStub:
        return pb_grpc.EmbeddingStoreServiceStub(self.channel)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """Start shards (index k of n) served on port 0; everything is stopped at teardown."""
    nodes: list[Node] = []

    def go(
        k: int = 0,
        n: int = 1,
        cfg: EmbeddingConfig | None = None,
        tokens: Tokens | None = None,
        **server: object,
    ) -> Node:
        shard = Shard(
            cfg or config(), tmp_path / f"shard-{len(nodes)}", shard_index=k, num_shards=n
        )
        served = build_server(shard, ServerConfig(ListenConfig(tokens=tokens), k, n, **server))  # type: ignore[arg-type]
        node = Node(shard, served, grpc.insecure_channel(f"127.0.0.1:{served.port}"))
        nodes.append(node)
        return node

    yield go
    for node in nodes:
        node.channel.close()
        node.server.stop(grace=0)
        node.shard.close()


def assign(shard: Shard, ids: list[int], value: float) -> None:
    dim = shard.config.tables["t"].dim
    shard.assign("t", np.array(ids, np.uint64), np.full((len(ids), dim), value, np.float32))


# ------------------------------------------------------------------ Snapshot, ListSnapshots
@pytest.mark.slow
def test_snapshot_rpc_takes_lists_and_refuses_an_existing_id(start) -> None:
    node = start()
    assign(node.shard, [1, 2, 3], 1.0)
    reply = node.stub.Snapshot(pb.SnapshotRequest(snapshot_id="first"))
    assert (reply.snapshot_id, reply.seq, reply.shard_index) == ("first", node.shard.seq, 0)
    assert reply.bytes > 0 and reply.seconds >= reply.pause_ms / 1000 >= 0
    manifest = verify(node.shard.data_dir / "snapshots" / "first")
    assert manifest["seq"] == reply.seq
    named = node.stub.Snapshot(pb.SnapshotRequest())  # the shard names it
    assert named.snapshot_id.startswith("snap-")
    listed = node.stub.ListSnapshots(pb.ListSnapshotsRequest()).snapshots
    assert [s.snapshot_id for s in listed] == ["first", named.snapshot_id]
    assert listed[0].seq == reply.seq and listed[0].bytes > 0 and listed[0].created > 0
    for bad, message in (("first", "already exists"), ("../x", "snapshot id must be")):
        with pytest.raises(grpc.RpcError) as info:
            node.stub.Snapshot(pb.SnapshotRequest(snapshot_id=bad))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in info.value.details()


@pytest.mark.slow
def test_client_snapshot_is_one_id_on_every_shard(start) -> None:
    nodes = [start(k, 2) for k in range(2)]
    addresses = [n.address for n in nodes]
    with Client(addresses) as client:
        client.assign("t", np.arange(100), np.ones((100, DIM), np.float32))
        results = client.snapshot()
        assert [r.shard for r in results] == [0, 1]
        assert [r.address for r in results] == addresses
        (name,) = {r.snapshot_id for r in results}
        assert name.startswith("job-") and name.endswith("Z")
        for node, r in zip(nodes, results, strict=True):
            manifest = verify(node.shard.data_dir / "snapshots" / name)
            assert (manifest["shard_index"], manifest["num_shards"]) == (r.shard, 2)
            assert manifest["seq"] == r.seq == node.shard.seq > 0
        listed = client.list_snapshots()
        assert [[s.snapshot_id for s in shard] for shard in listed] == [[name], [name]]
        with pytest.raises(InvalidArgumentError, match="already exists"):
            client.snapshot(name)  # not retried: an existing id is an error on every shard

    async def checkpoint() -> list[str]:
        async with AsyncClient(addresses) as aio:
            return [r.snapshot_id for r in await aio.snapshot("from-asyncio")]

    assert asyncio.run(checkpoint()) == ["from-asyncio"] * 2
    for node in nodes:
        verify(node.shard.data_dir / "snapshots" / "from-asyncio")


@pytest.mark.slow
def test_a_failed_checkpoint_names_the_shard_and_the_others_keep_theirs(start) -> None:
    nodes = [start(k, 2) for k in range(2)]
    nodes[1].shard.snapshot("taken")  # shard 1 already has the id
    with Client([n.address for n in nodes]) as client, pytest.raises(InvalidArgumentError) as info:
        client.snapshot("taken")
    message = str(info.value)
    assert f"failed on shard(s) 1 ({nodes[1].address})" in message
    assert "shards 0 took snapshot 'taken' and keep it" in message
    assert [s.snapshot_id for s in nodes[0].shard.snapshots()] == ["taken"]


def test_read_only_tokens_list_snapshots_but_never_stream_the_log_or_snapshots(start) -> None:
    """ro: evaluation reads and metadata only. Subscribe (every logged row, deleted ones too)
    and FetchSnapshot (every row with its optimizer state) are PERMISSION_DENIED, and an ro
    token can never make the primary take a snapshot."""
    node = start(tokens=Tokens(frozenset({RW}), frozenset({RO}), frozenset({REPLICA})))
    assign(node.shard, [1], 1.0)
    with Client([node.address], ClientOptions(token=RO)) as ro:
        with pytest.raises(PermissionDeniedError, match="may not call Snapshot"):
            ro.snapshot("nope")
        assert ro.list_snapshots() == [[]]
    metadata = (("authorization", f"Bearer {RO}"),)
    for request in (pb.FetchSnapshotRequest(take_new=True), pb.FetchSnapshotRequest()):
        with pytest.raises(grpc.RpcError) as info:
            list(node.stub.FetchSnapshot(request, metadata=metadata))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "replica token is needed" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        list(node.stub.Subscribe(pb.SubscribeRequest(from_seq=0), metadata=metadata))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert node.shard.snapshots() == []  # no snapshot was taken for an ro caller


def test_replica_tokens_stream_the_log_and_snapshots_but_never_write(start) -> None:
    node = start(tokens=Tokens(frozenset({RW}), frozenset({RO}), frozenset({REPLICA})))
    assign(node.shard, [1], 1.0)
    metadata = (("authorization", f"Bearer {REPLICA}"),)
    chunks = list(node.stub.FetchSnapshot(pb.FetchSnapshotRequest(), metadata=metadata))
    assert chunks[-1].path == "manifest.json"  # the first snapshot was taken for it
    feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=0), metadata=metadata)
    assert next(feed).seq == 1
    feed.cancel()
    _, before = node.shard.peek("t", [1, 2])
    with Client([node.address], ClientOptions(token=REPLICA)) as replica:
        with pytest.raises(PermissionDeniedError, match="may not call Snapshot"):
            replica.snapshot("nope")
        with pytest.raises(PermissionDeniedError, match="may not call Assign"):
            replica.assign("t", [2], np.ones((1, DIM), np.float32))
        with pytest.raises(PermissionDeniedError, match="training lookup"):
            replica.lookup("t", [2])
        assert replica.lookup("t", [1], train=False).any()
    _, after = node.shard.peek("t", [1, 2])
    assert after.tobytes() == before.tobytes()
    with Client([node.address], ClientOptions(token=RW)) as rw:
        assert rw.snapshot("by-rw")[0].snapshot_id == "by-rw"


def test_cli_snapshot_prints_every_shard_and_exits_1_naming_a_failed_one(start, tmp_path) -> None:
    nodes = [start(k, 2) for k in range(2)]
    addresses = tmp_path / "addresses.txt"
    addresses.write_text("".join(f"{n.address}\n" for n in nodes))
    result = CliRunner().invoke(main, ["snapshot", "--addresses", f"@{addresses}", "--id", "c1"])
    assert result.exit_code == 0, result.output
    assert "checkpoint c1 taken on 2 shards" in result.output
    for node in nodes:
        assert node.address in result.output
        verify(node.shard.data_dir / "snapshots" / "c1")
    again = CliRunner().invoke(
        main, ["snapshot", "--addresses", ",".join(n.address for n in nodes), "--id", "c1"]
    )
    assert again.exit_code == 1 and "already exists" in again.output
    assert "shard(s) 0" in again.output and "Traceback" not in again.output
    usage = CliRunner().invoke(main, ["snapshot"])
    assert usage.exit_code == 2 and "give the shards' addresses: --addresses" in usage.output


# ------------------------------------------------------------------------------ FetchSnapshot
def receive(chunks: Iterator[pb.FetchSnapshotResponse], root: Path) -> Path:
    receiver: SnapshotReceiver | None = None
    for c in chunks:
        if receiver is None:
            receiver = SnapshotReceiver(root, c.snapshot_id)
        receiver.write(Chunk(c.path, c.offset, c.data))
    assert receiver is not None
    return receiver.commit().path


def test_fetch_snapshot_sends_a_complete_verifiable_snapshot(start, tmp_path, monkeypatch) -> None:
    import embeddb.server.servicer as servicer

    monkeypatch.setattr(servicer, "SNAPSHOT_CHUNK_BYTES", 1000)  # several chunks per file
    node = start()
    rng = np.random.default_rng(0)
    node.shard.assign("t", np.arange(500), rng.standard_normal((500, DIM)).astype(np.float32))
    chunks = list(node.stub.FetchSnapshot(pb.FetchSnapshotRequest()))  # none yet: takes one
    assert chunks[-1].path == "manifest.json" and len({c.path for c in chunks}) >= 4
    assert max(len(c.data) for c in chunks) == 1000
    first = receive(iter(chunks), tmp_path / "got")
    assert verify(first)["seq"] == node.shard.seq
    node.shard.assign("t", np.arange(3), np.zeros((3, DIM), np.float32))
    same = list(node.stub.FetchSnapshot(pb.FetchSnapshotRequest()))  # the newest: no new one
    assert same[0].snapshot_id == first.name and len(node.shard.snapshots()) == 1
    fresh = node.stub.FetchSnapshot(pb.FetchSnapshotRequest(snapshot_id="new", take_new=True))
    assert verify(receive(fresh, tmp_path / "got"))["seq"] == node.shard.seq
    with pytest.raises(grpc.RpcError) as info:
        list(node.stub.FetchSnapshot(pb.FetchSnapshotRequest(snapshot_id="missing")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_received_snapshot_is_verified_and_paths_are_confined(tmp_path) -> None:
    receiver = SnapshotReceiver(tmp_path / "snapshots", "s")
    for bad in ("../escape", "/abs", "a/../../b", ""):
        with pytest.raises(CorruptDataError, match="not a relative path"):
            receiver.write(Chunk(bad, 0, b"x"))
    receiver.write(Chunk("ram/t.ids", 0, b"12345678"))
    with pytest.raises(CorruptDataError, match="expected 8"):
        receiver.write(Chunk("ram/t.ids", 16, b"x"))
    with pytest.raises(CorruptDataError, match="manifest"):
        receiver.commit()  # no manifest: not a snapshot
    assert not (tmp_path / "snapshots" / "s").exists()
    assert list((tmp_path / "snapshots").iterdir()) == []  # the temporary directory is gone


# ------------------------------------------------------------------------------ Subscribe
def test_subscribe_sends_the_records_after_from_seq_then_tails(start) -> None:
    node = start()
    before = time.time()
    for value in range(5):
        assign(node.shard, [value], float(value))
    after = time.time()
    logged = list(node.shard.read_log(2))
    feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=2))
    got = [next(feed) for _ in logged]
    assert [m.seq for m in got] == [r.seq for r in logged] == [3, 4, 5]
    assert [m.payload for m in got] == [r.payload for r in logged]
    assert all(m.primary_seq == 5 for m in got)
    assert all(before <= m.appended_at <= after for m in got)
    changes = records.decode(got[-1].payload)
    assert changes[0].ids.tolist() == [4]

    for value in range(5, 10):  # tailing: each new record arrives (how soon: a benchmark)
        assign(node.shard, [value], float(value))
        message = next(feed)
        assert message.seq == node.shard.seq == value + 1
        assert message.primary_seq == message.seq
    feed.cancel()


@pytest.mark.slow
def test_an_idle_feed_sends_heartbeats(start) -> None:
    node = start()
    assign(node.shard, [1], 1.0)
    feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=1))
    beat = next(feed)
    assert (beat.seq, beat.payload, beat.primary_seq) == (0, b"", 1)
    feed.cancel()


def test_cancel_ends_the_feed_and_frees_its_stream_slot(start) -> None:
    node = start(max_streams=1)
    assign(node.shard, [1], 1.0)
    feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=0))
    assert next(feed).seq == 1
    with pytest.raises(grpc.RpcError) as busy:
        next(node.stub.Subscribe(pb.SubscribeRequest(from_seq=0)))
    assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    feed.cancel()
    with pytest.raises(grpc.RpcError) as info:
        next(feed)
    assert info.value.code() == grpc.StatusCode.CANCELLED

    def subscribed() -> bool:  # RESOURCE_EXHAUSTED (an RpcError) until the slot is free
        again = node.stub.Subscribe(pb.SubscribeRequest(from_seq=0))
        try:
            return next(again).seq == 1
        finally:
            again.cancel()

    # the server notices within its poll interval and frees the slot
    eventually(subscribed, 30, "the cancelled stream's slot")


def test_server_stop_ends_open_feeds_promptly(start) -> None:
    node = start()
    assign(node.shard, [1], 1.0)
    feeds = [node.stub.Subscribe(pb.SubscribeRequest(from_seq=0)) for _ in range(3)]
    assert [next(feed).seq for feed in feeds] == [1, 1, 1]  # open, and idle from now on
    ended: list[grpc.StatusCode] = []

    def drain(feed: Iterator[pb.SubscribeResponse]) -> None:
        try:
            for _ in feed:
                pass
        except grpc.RpcError as exc:
            ended.append(exc.code())

    threads = [threading.Thread(target=drain, args=(f,)) for f in feeds]
    for t in threads:
        t.start()
    # Waiting out the grace period would take an hour: the stop must end the feeds instead.
    stopper = threading.Thread(target=node.server.stop, args=(3600,), daemon=True)
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive(), "stop waited for the open feeds"
    for t in threads:
        t.join(30)
    assert ended == [grpc.StatusCode.UNAVAILABLE] * 3


@contextmanager
def truncated_log(start) -> Iterator[Node]:
    """A primary whose log no longer holds its first records (1 MiB segments, records of
    about 1.3 MiB each, then a snapshot)."""
    node = start(cfg=config(dim=64, log_segment_mb=1, log_lz4_min_bytes=0))
    rng = np.random.default_rng(1)
    for _ in range(3):
        ids = rng.choice(1 << 30, size=5000, replace=False).astype(np.uint64)
        node.shard.assign("t", ids, rng.standard_normal((5000, 64)).astype(np.float32))
    node.shard.snapshot("cut")
    yield node


@pytest.mark.slow
def test_truncated_records_are_out_of_range_telling_to_bootstrap_again(start) -> None:
    with truncated_log(start) as node:
        with pytest.raises(grpc.RpcError) as info:
            next(node.stub.Subscribe(pb.SubscribeRequest(from_seq=0)))
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "truncated away" in info.value.details()
        assert "must bootstrap again from a snapshot" in info.value.details()
        seq = node.shard.seq
        with pytest.raises(grpc.RpcError) as ahead:
            next(node.stub.Subscribe(pb.SubscribeRequest(from_seq=seq + 5)))
        assert ahead.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "bootstrap again" in ahead.value.details()
        feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=seq))  # from the snapshot: fine
        assign(node.shard, [1], 1.0)
        assert next(feed).seq == seq + 1
        feed.cancel()


def test_an_open_feed_pins_the_log_against_truncation(start) -> None:
    node = start(cfg=config(dim=64, log_segment_mb=1, log_lz4_min_bytes=0))
    rng = np.random.default_rng(2)
    assign(node.shard, [1], 1.0)
    feed = node.stub.Subscribe(pb.SubscribeRequest(from_seq=0))
    assert next(feed).seq == 1  # the reader is at seq 1 now
    for _ in range(3):
        ids = rng.choice(1 << 30, size=5000, replace=False).astype(np.uint64)
        node.shard.assign("t", ids, rng.standard_normal((5000, 64)).astype(np.float32))
    node.shard.snapshot("while-reading")  # would truncate the log, but the reader pins it
    assert [next(feed).seq for _ in range(3)] == [2, 3, 4]
    feed.cancel()


def test_subscribe_needs_an_update_log(tmp_path) -> None:
    shard = Shard(config())  # ephemeral: no log
    served = build_server(shard)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                next(stub.Subscribe(pb.SubscribeRequest(from_seq=0)))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        served.stop(grace=0)
        shard.close()


# ------------------------------------------------------------------ the core the feed relies on
def test_shard_tail_log_waits_for_new_records_and_ends_when_the_shard_closes(tmp_path) -> None:
    from embeddb.errors import OutOfRangeError, UnavailableError

    shard = Shard(config(), tmp_path / "s")
    assign(shard, [1], 1.0)
    assert shard.wait_for_seq(0, timeout=0) and not shard.wait_for_seq(1, timeout=0.01)
    tail = shard.tail_log(0, idle_s=0.01)
    assert next(tail).seq == 1
    assert next(tail) is None  # idle: the consumer gets control back
    waker = threading.Timer(0.05, lambda: assign(shard, [2], 2.0))
    waker.start()
    record = eventually(lambda: next(tail), 30, "record 2")  # None while idle
    assert record.seq == 2
    waker.join()
    with pytest.raises(OutOfRangeError, match="beyond this shard's last seq 2"):
        shard.tail_log(3)
    threading.Timer(0.05, shard.close).start()
    with pytest.raises(UnavailableError):
        while True:
            next(tail)
    tail.close()
