"""The cluster contract at a real ``embeddb serve`` process's boundary: shard ownership,
topology records, roles and stream slots, malformed input, and resource bounds.

Each test talks to a real server process on 127.0.0.1 over gRPC, as an attacker or a new
user would, and checks that nothing stored changed on every refused call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import lz4.frame
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.common.routing import ROUTING_ALGORITHM, SHARD_SALT, shard_of
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.support import ServeProcess, StartServe, eventually, serve_processes

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

DIM = 8
RW = "rw-token-" + "a" * 24
RO = "ro-token-" + "b" * 24
REPLICA = "replica-token-" + "c" * 24
STORE = "/embeddb.v1.EmbeddingStore"


def config_text(dim: int = DIM, capacity: int = 100_000, **store: object) -> str:
    extra = "".join(f"\n  {k}: {v}" for k, v in store.items())
    return (
        f"slots_config:\n  t: {{dim: {dim}}}\n"
        f"defaults:\n  optimizer: {{type: sgd, lr: 0.5}}\n  capacity: {capacity}\n"
        + (f"store:{extra}\n" if extra else "")
    )


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    """``serve(*args, config=YAML, expect_exit=..., metrics=...)``: a real ``embeddb serve``."""
    starts = serve_processes(tmp_path)
    start = next(starts)
    count = [0]

    def with_config(*args: str, config: str | None = None, **kw: bool) -> ServeProcess:
        path = tmp_path / f"config-{count[0]}.yaml"
        count[0] += 1
        path.write_text(config or config_text())
        return start("--config", str(path), *args, **kw)

    yield with_config
    next(starts, None)


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"rw {RW}\nro {RO}\nreplica {REPLICA}\n")
    path.chmod(0o600)
    return path


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return () if token is None else (("authorization", f"Bearer {token}"),)


def ids_of(values: np.ndarray) -> pb.Tensor:
    return wire.encode_ids(np.asarray(values, dtype=np.uint64))


def error_of(call: Callable[[], object]) -> grpc.RpcError:
    """The error of a call; a server stream is drained (its error comes with the messages)."""
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            for _ in result:
                pass
    return info.value


def rows(stub: pb_grpc.EmbeddingStoreServiceStub, token: str | None = None) -> int:
    stats = stub.Stats(pb.StatsRequest(), metadata=bearer(token))
    return int(stats.tables[0].counters["rows"])


# ------------------------------------------------------------------------- shard ownership
def test_a_shard_refuses_every_data_call_for_ids_it_does_not_own(serve, tmp_path) -> None:
    served = serve("--data-dir", str(tmp_path / "s1"), "--shard-index", "1", "--num-shards", "2")
    universe = np.arange(1, 400, dtype=np.uint64)
    owner = shard_of(universe, 2)
    mine, foreign = universe[owner == 1][:20], universe[owner == 0][:20]
    mixed = np.concatenate([mine[:5], foreign[:1], mine[5:10]])
    vectors = wire.encode_matrix(np.ones((mixed.size, DIM), np.float32))
    part = pb.LookupRequest(table="t", ids=ids_of(mixed), train=True)
    calls: dict[str, Callable[[pb_grpc.EmbeddingStoreServiceStub], object]] = {
        "training lookup": lambda s: s.Lookup(part),
        "evaluation lookup": lambda s: s.Lookup(pb.LookupRequest(table="t", ids=ids_of(mixed))),
        "LookupMany": lambda s: s.LookupMany(pb.LookupManyRequest(lookups=[part])),
        "ApplyGradients": lambda s: s.ApplyGradients(
            pb.ApplyGradientsRequest(table="t", ids=ids_of(mixed), grads=vectors)
        ),
        "ApplyGradientsMany": lambda s: s.ApplyGradientsMany(
            pb.ApplyGradientsManyRequest(
                updates=[pb.ApplyGradientsRequest(table="t", ids=ids_of(mixed), grads=vectors)]
            )
        ),
        "Assign": lambda s: s.Assign(
            pb.AssignRequest(table="t", ids=ids_of(mixed), vectors=vectors)
        ),
        "Delete": lambda s: s.Delete(pb.DeleteRequest(table="t", ids=ids_of(mixed))),
    }
    with served.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        ones = wire.encode_matrix(np.ones((mine.size, DIM), np.float32))
        stub.Assign(pb.AssignRequest(table="t", ids=ids_of(mine), vectors=ones))
        before = stub.Lookup(pb.LookupRequest(table="t", ids=ids_of(mine))).SerializeToString()
        for name, call in calls.items():
            error = error_of(lambda call=call: call(stub))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            details = error.details() or ""
            assert f"[5] = {int(foreign[0])} belongs to shard 0 of 2" in details, (name, details)
            assert "shard 1 of 2" in details and "nothing of the request was applied" in details
        # Nothing changed: the same rows, the same vectors, and the foreign id never stored.
        assert rows(stub) == mine.size
        after = stub.Lookup(pb.LookupRequest(table="t", ids=ids_of(mine))).SerializeToString()
        assert after == before
        described = stub.DescribeShard(pb.DescribeShardRequest())
    assert (described.shard_index, described.num_shards) == (1, 2)
    assert described.routing.algorithm == ROUTING_ALGORITHM
    assert described.routing.salt == int(SHARD_SALT)
    assert described.limits.max_response_bytes == 64 << 20
    assert served.stop() == 0, served.output()


def test_a_data_directory_refuses_to_start_as_another_shard(serve, tmp_path) -> None:
    data = tmp_path / "shard-2"
    first = serve("--data-dir", str(data), "--shard-index", "2", "--num-shards", "4")
    universe = np.arange(1, 200, dtype=np.uint64)
    owned = universe[shard_of(universe, 4) == 2]
    with first.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.Assign(
            pb.AssignRequest(
                table="t",
                ids=ids_of(owned),
                vectors=wire.encode_matrix(np.ones((owned.size, DIM), np.float32)),
            )
        )
    assert first.stop() == 0, first.output()
    for args in ([], ["--fallback-snapshot"], ["--shard-index", "2", "--num-shards", "3"]):
        refused = serve("--data-dir", str(data), *args, expect_exit=True)
        assert refused.process.returncode != 0
        out = refused.output()
        assert "holds shard 2 of 4" in out, out
        assert "--shard-index 2 --num-shards 4" in out and "embeddb reshard" in out
    again = serve("--data-dir", str(data), "--shard-index", "2", "--num-shards", "4")
    with again.channel() as channel:
        assert rows(pb_grpc.EmbeddingStoreServiceStub(channel)) == owned.size
    assert again.stop() == 0


# -------------------------------------------------------------------------- malformed input
def test_malformed_requests_get_precise_statuses_and_no_tracebacks(
    serve, tmp_path, tokens_file
) -> None:
    served = serve(
        "--data-dir", str(tmp_path / "s"), "--tokens-file", str(tokens_file), metrics=True
    )
    garbage = b"\xff\x00\x13 not a protobuf \x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80"
    with served.channel() as channel:
        raw = channel.unary_unary(f"{STORE}/Lookup")  # no serializers: bytes as they are
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.Assign(
            pb.AssignRequest(
                table="t", ids=ids_of([1]), vectors=wire.encode_matrix(np.ones((1, DIM), "f4"))
            ),
            metadata=bearer(RW),
        )
        # Anonymous garbage is never parsed: authentication comes first.
        error = error_of(lambda: raw(garbage))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        for _ in range(50):
            error = error_of(lambda: raw(garbage, metadata=bearer(RW)))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed LookupRequest" in (error.details() or "")
        bad_dtype = pb.LookupRequest(table="t", ids=pb.Tensor(dtype=99, shape=[1], data=b"\0" * 8))
        error = error_of(lambda: stub.Lookup(bad_dtype, metadata=bearer(RO)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ids.dtype: 99 is not a DType" in (error.details() or "")
        bad_many = pb.LookupManyRequest(
            lookups=[
                pb.LookupRequest(table="t", ids=ids_of([1])),
                pb.LookupRequest(table="t", ids=pb.Tensor(dtype=1, compression=7)),
            ]
        )
        error = error_of(lambda: stub.LookupMany(bad_many, metadata=bearer(RO)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "lookups[1].ids.compression: 7 is not a Compression" in (error.details() or "")
        health = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert error_of(lambda: health(garbage)).code() == grpc.StatusCode.INVALID_ARGUMENT
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        assert rows(stub, RO) == 1  # the server is up and nothing changed
    metrics = served.metrics()
    bad = metrics["embeddb_bad_requests_total"]
    assert bad[(("method", "Lookup"), ("reason", "malformed"))] == 50
    assert bad[(("method", "Lookup"), ("reason", "bad_enum"))] == 1
    assert bad[(("method", "Check"), ("reason", "malformed"))] == 1
    requests = metrics["embeddb_requests_total"]
    assert requests[(("method", "Lookup"), ("status", "INVALID_ARGUMENT"))] == 51
    assert requests[(("method", "Lookup"), ("status", "UNAUTHENTICATED"))] == 1
    assert served.stop() == 0
    log = served.output()
    assert "Traceback" not in log and "Exception deserializing" not in log
    assert 1 <= log.count("malformed LookupRequest") <= 2  # rate-limited: not one per request


# -------------------------------------------------------------------------- resource bounds
def test_an_amplifying_lookup_is_refused_before_any_work(serve, tmp_path) -> None:
    """4M copies of one id: a 32 MiB id array that LZ4 packs into ~130 KB, whose answer on a
    dim-8 table would be 128 MiB."""
    served = serve("--data-dir", str(tmp_path / "s"))
    ids = np.full(1 << 22, 7, dtype=np.uint64)
    packed = lz4.frame.compress(ids.tobytes())
    assert len(packed) < 200_000
    tensor = pb.Tensor(
        dtype=pb.D_TYPE_UINT64, shape=[ids.size], data=packed, compression=pb.COMPRESSION_LZ4
    )
    with served.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.Lookup(pb.LookupRequest(table="t", ids=ids_of([1, 2, 3]), train=True))  # warm up
        rss = served.rss_bytes()
        for train in (False, True):
            request = pb.LookupRequest(table="t", ids=tensor, train=train)
            error = error_of(lambda request=request: stub.Lookup(request))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "134217728 bytes" in (error.details() or "")
            assert "max_response_bytes 67108864" in (error.details() or "")
        many = pb.LookupManyRequest(lookups=[pb.LookupRequest(table="t", ids=tensor)])
        error = error_of(lambda: stub.LookupMany(many))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Gradients: a compressed tensor is not decompressed beyond the bound either.
        grads = pb.Tensor(
            dtype=pb.D_TYPE_FLOAT32,
            shape=[1 << 22, DIM],
            data=lz4.frame.compress(bytes(1 << 20)),
            compression=pb.COMPRESSION_LZ4,
        )
        push = pb.ApplyGradientsRequest(table="t", ids=tensor, grads=grads)
        error = error_of(lambda: stub.ApplyGradients(push))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert rows(stub) == 3  # nothing was inserted
        assert served.rss_bytes() < rss + (32 << 20)  # never built an answer or decompressed
    assert served.stop() == 0


def test_resident_memory_returns_after_a_burst_of_large_lookups(serve, tmp_path) -> None:
    """8 concurrent lookups, each answering 60 MiB: the server's resident memory goes back
    within 1.3x of its level before the burst once the burst is over."""
    served = serve("--data-dir", str(tmp_path / "s"), config=config_text(dim=16))
    n = (60 << 20) // (16 * 4)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    request = pb.LookupRequest(table="t", ids=ids_of(ids))  # evaluation: reads zeros
    options = [("grpc.max_receive_message_length", 256 << 20)]
    with grpc.insecure_channel(served.address, options=options) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.Lookup(pb.LookupRequest(table="t", ids=ids_of(ids[:1000])))  # warm up
        before = served.rss_bytes()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: stub.Lookup(request).ByteSize(), range(8)))
        assert all(a > 60 << 20 for a in answers)
        del answers
        peak = served.rss_bytes()
        after = eventually(
            lambda: (rss := served.rss_bytes()) <= 1.3 * before and rss,
            60,
            f"RSS back within 1.3x of {before >> 20} MiB (peak {peak >> 20} MiB)",
        )
    print(f"RSS before {before >> 20} MiB, at the burst's end {peak >> 20}, after {after >> 20}")
    assert served.stop() == 0


# ---------------------------------------------------------------------- roles and streams
def subscribe(channel: grpc.Channel, token: str | None, from_seq: int = 0) -> grpc.Future:
    stub = pb_grpc.EmbeddingStoreServiceStub(channel)
    return stub.Subscribe(pb.SubscribeRequest(from_seq=from_seq), metadata=bearer(token))


def test_read_only_callers_never_stream_and_each_role_has_its_own_stream_slots(
    serve, tmp_path, tokens_file
) -> None:
    served = serve(
        "--data-dir", str(tmp_path / "s"), "--tokens-file", str(tokens_file),
        "--max-streams", "2", metrics=True,
    )  # fmt: skip
    with served.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.Assign(
            pb.AssignRequest(
                table="t", ids=ids_of([1]), vectors=wire.encode_matrix(np.ones((1, DIM), "f4"))
            ),
            metadata=bearer(RW),
        )
        for call in (
            lambda: subscribe(channel, RO),
            lambda: stub.FetchSnapshot(pb.FetchSnapshotRequest(), metadata=bearer(RO)),
        ):
            error = error_of(call)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        listed = stub.ListSnapshots(pb.ListSnapshotsRequest(), metadata=bearer(RO))
        assert list(listed.snapshots) == []  # an ro caller never made it take one
        # rw callers take both rw slots; a third rw stream is refused; replicas are not.
        held = [subscribe(channel, RW) for _ in range(2)]
        assert [next(feed).seq for feed in held] == [1, 1]
        error = error_of(lambda: next(subscribe(channel, RW)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "role rw" in (error.details() or "")
        follower = subscribe(channel, REPLICA)
        assert next(follower).seq == 1
        running = served.metrics()["embeddb_streams"]
        assert running[(("role", "rw"),)] == 2 and running[(("role", "replica"),)] == 1
        for feed in [*held, follower]:
            feed.cancel()
    assert served.stop() == 0


def test_a_subscriber_that_stops_reading_is_dropped(serve, tmp_path, tokens_file) -> None:
    """A caller that opens Subscribe and never reads fills the flow-control windows; the server
    drops the stream after the idle timeout, freeing its thread and slot."""
    served = serve(
        "--data-dir", str(tmp_path / "s"), "--tokens-file", str(tokens_file),
        "--max-streams", "1", "--stream-idle-timeout", "1", metrics=True,
        config=config_text(dim=1024, capacity=2000),
    )  # fmt: skip
    vectors = wire.encode_matrix(np.ones((1000, 1024), np.float32))  # 4 MiB per log record
    with served.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        for k in range(16):
            ids = ids_of(np.arange(k * 1000, (k + 1) * 1000))
            stub.Assign(pb.AssignRequest(table="t", ids=ids, vectors=vectors), metadata=bearer(RW))
        with grpc.insecure_channel(served.address) as lazy:
            stalled = subscribe(lazy, REPLICA)  # never read
            eventually(
                lambda: (
                    served.metrics()
                    .get("embeddb_streams_dropped_total", {})
                    .get((("role", "replica"),))
                ),
                60,
                "the stalled replica stream to be dropped",
            )
            stalled.cancel()
        # The slot is free again: a reading follower gets a stream.
        feed = subscribe(channel, REPLICA, from_seq=15)
        assert next(feed).seq == 16
        feed.cancel()
    assert served.stop() == 0
    assert "dropping a replica stream" in served.output()


def test_health_is_answered_while_every_worker_is_busy(tmp_path) -> None:
    """Every data worker blocked inside a call (the test holds the table's stripe locks), more
    calls queued: a health check is still answered at once, from the health pool."""
    from contextlib import ExitStack

    from embeddb.config import EmbeddingConfig
    from embeddb.engine.shard import Shard
    from embeddb.server import ServerConfig, build_server

    shard = Shard(EmbeddingConfig.from_yaml_text(config_text()), tmp_path / "s")
    served = build_server(shard, ServerConfig(workers=2))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = pb_grpc.EmbeddingStoreServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            health.Check(health_pb2.HealthCheckRequest())  # connected
            request = pb.LookupRequest(table="t", ids=ids_of([1, 2, 3]), train=True)
            with ExitStack() as locked:
                for stripe in shard._tables["t"].stripes:
                    locked.enter_context(stripe.lock)
                blocked = [stub.Lookup.future(request) for _ in range(4)]
                # Every worker holds a call: a data call waits in the queue.
                error = error_of(lambda: stub.DescribeShard(pb.DescribeShardRequest(), timeout=1))
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                # Queued behind the blocked workers it would never be answered.
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                assert not any(f.done() for f in blocked)
            assert all(f.result(timeout=10).vectors.shape == [3, DIM] for f in blocked)
    finally:
        served.stop(0)
        shard.close()


# --------------------------------------------------------------------- files and connections
def test_a_token_file_others_may_read_stops_serve_naming_chmod(serve, tmp_path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"rw {RW}\n")
    tokens.chmod(0o644)
    refused = serve("--ephemeral", "--tokens-file", str(tokens), expect_exit=True)
    assert refused.process.returncode != 0
    assert f"chmod 600 {tokens}" in refused.output() and RW not in refused.output()
    tokens.chmod(0o600)
    served = serve("--ephemeral", "--tokens-file", str(tokens))
    assert served.stop() == 0


def test_an_idle_connection_is_closed_by_the_server(serve) -> None:
    """With --max-idle 1 the server sends GOAWAY to a connection without calls: the client's
    channel leaves READY on its own (it reconnects on the next call)."""
    served = serve("--ephemeral", "--max-idle", "1")
    states: list[grpc.ChannelConnectivity] = []
    with served.channel() as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        stub.DescribeShard(pb.DescribeShardRequest(), timeout=10)
        channel.subscribe(states.append, try_to_connect=False)
        eventually(
            lambda: states and states[-1] is grpc.ChannelConnectivity.IDLE,
            30,
            "the channel to go IDLE",
        )
        assert grpc.ChannelConnectivity.READY in states
        assert stub.DescribeShard(pb.DescribeShardRequest(), timeout=10).num_shards == 1
    assert served.stop() == 0


def test_garbage_to_the_open_services_is_invalid_argument_without_a_traceback(
    serve, tmp_path, tokens_file
) -> None:
    """Health and reflection need no token: their anonymous callers' garbage is decoded at the
    boundary too (gRPC alone answers INTERNAL and logs a traceback per request)."""
    served = serve("--ephemeral", "--tokens-file", str(tokens_file), metrics=True)
    garbage = b"\xff\xff\xff garbage"
    with served.channel() as channel:
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        )
        for _ in range(10):
            error = error_of(lambda: reflect(iter([garbage])))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed ServerReflectionRequest" in (error.details() or "")
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
        assert error_of(lambda: watch(garbage)).code() == grpc.StatusCode.INVALID_ARGUMENT
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    bad = served.metrics()["embeddb_bad_requests_total"]
    assert bad[(("method", "ServerReflectionInfo"), ("reason", "malformed"))] == 10
    assert bad[(("method", "Watch"), ("reason", "malformed"))] == 1
    assert served.stop() == 0
    log = served.output()
    assert "Traceback" not in log and "Exception deserializing" not in log
