"""The simulated network (``ClientOptions.network``, :mod:`embeddb.client.netsim`).

No wall clock: the delay arithmetic is checked directly, and the clients' links are replaced by
a recording link whose sleeps are fakes, so a test sees which crossings a call made and with how
many bytes, against real shards on 127.0.0.1 (port 0).
"""

from __future__ import annotations

import asyncio
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embeddb.client import AsyncClient, Client, ClientOptions, SimulatedNetwork, netsim
from embeddb.common.routing import shard_of
from embeddb.errors import ConfigError, UnavailableError
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.launcher.job import JobConfig
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from tests.support import free_port
from tests.test_client import serve_cluster, sgd_tables

DIM = 64  # 256 bytes a row: more than any message's framing, so rows can be counted from bytes
ROW = 4 * DIM
MODEL = Path(__file__).resolve().parents[1] / "examples" / "adult" / "model.py"


class RecordingLink(netsim.Link):
    """A link that records its waits instead of sleeping, and the bytes of every crossing."""

    def __init__(self, network: SimulatedNetwork) -> None:
        self.waits: list[float] = []
        self.sent: list[int] = []  # request bytes, one per attempt
        self.received: list[int] = []  # response bytes, one per answered attempt
        super().__init__(network, sleep=self.waits.append, async_sleep=self._wait)

    async def _wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def outbound(self, request_bytes: int) -> float:
        self.sent.append(request_bytes)
        return super().outbound(request_bytes)

    def inbound(self, response_bytes: int) -> float:
        self.received.append(response_bytes)
        return super().inbound(response_bytes)

    def clear(self) -> None:
        self.waits.clear()
        self.sent.clear()
        self.received.clear()


def recording(client: Client | AsyncClient, network: SimulatedNetwork) -> RecordingLink:
    link = RecordingLink(network)
    client._link = link  # the spy replaces the link the client built from its options
    return link


# ---------------------------------------------------------------------------- arithmetic


def test_the_delay_is_rtt_plus_bytes_over_bandwidth() -> None:
    network = SimulatedNetwork(rtt=0.02)
    assert network.bandwidth == 1.25e9  # 10 Gbit/s
    assert network.delay(1000, 249_000) == pytest.approx(0.02 + 250_000 / 1.25e9)
    link = netsim.Link(network)
    assert link.outbound(1000) + link.inbound(249_000) == pytest.approx(
        network.delay(1000, 249_000)
    )
    assert link.outbound(0) == link.inbound(0) == pytest.approx(0.01)


class _Message:
    def __init__(self, size: int) -> None:
        self.size = size

    def ByteSize(self) -> int:
        return self.size


def test_one_attempt_waits_before_and_after_and_its_deadline_shrinks() -> None:
    events: list[Any] = []
    link = netsim.Link(SimulatedNetwork(rtt=0.01, bandwidth=1000.0), sleep=events.append)

    def method(request: _Message, *, timeout: float, metadata: tuple[Any, ...]) -> _Message:
        events.append(("call", request.size, timeout, metadata))
        return _Message(500)

    answer = link.call(method, _Message(2000), timeout=5.0, metadata=())
    assert answer.size == 500
    assert events[0] == pytest.approx(0.005 + 2.0)  # rtt/2 + 2000 B at 1000 B/s
    assert events[1][:2] == ("call", 2000) and events[1][2] == pytest.approx(5.0 - 2.005)
    assert events[2] == pytest.approx(0.005 + 0.5)
    assert len(events) == 3


def test_a_failed_attempt_waits_half_the_rtt_back_and_raises() -> None:
    waits: list[float] = []
    link = netsim.Link(SimulatedNetwork(rtt=0.01, bandwidth=1e6), sleep=waits.append)

    def method(request: _Message, *, timeout: float) -> _Message:
        raise RuntimeError("unavailable")

    with pytest.raises(RuntimeError, match="unavailable"):
        link.call(method, _Message(1000), timeout=1.0)
    assert waits == pytest.approx([0.005 + 0.001, 0.005])


def test_the_async_attempt_awaits_its_waits() -> None:
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    async def method(request: _Message, *, timeout: float) -> _Message:
        waits.append(-1.0)  # marks the call between the two waits
        return _Message(100)

    link = netsim.Link(SimulatedNetwork(rtt=0.0, bandwidth=1.0), async_sleep=wait)
    answer = asyncio.run(link.call_async(method, _Message(30), timeout=1e6))
    assert answer.size == 100
    assert waits == [30.0, -1.0, 100.0]  # at 1 B/s and no rtt, seconds are bytes


def test_message_bytes_of_messages_and_of_zero_copy_views() -> None:
    request = pb.LookupRequest(table="t", ids=wire.encode_ids(np.arange(100, dtype=np.uint64)))
    assert netsim.message_bytes(request) == request.ByteSize()
    vectors = np.ones((50, DIM), dtype=np.float32)
    encoded = wire.encode_lookup_response(vectors)
    view = wire.parse_lookup_response(encoded.SerializeToString())
    assert 50 * ROW <= netsim.message_bytes(view) <= 50 * ROW + 64
    many = wire.parse_lookup_many_response(
        wire.encode_lookup_many_response([encoded, encoded]).SerializeToString(), small_bytes=0
    )
    assert netsim.message_bytes(many) == 2 * netsim.message_bytes(view)
    assert netsim.message_bytes(object()) == 0


# ---------------------------------------------------------------------------- the clients


def _split(ids: np.ndarray, shards: int) -> list[int]:
    owner = shard_of(ids, shards)
    return [int(np.count_nonzero(owner == k)) for k in range(shards)]


def test_the_sync_client_crosses_once_per_shard_call_with_its_bytes(tmp_path: Path) -> None:
    network = SimulatedNetwork(rtt=0.02)
    ids = np.arange(1, 401, dtype=np.uint64)
    with (
        serve_cluster(tmp_path, 2, sgd_tables(t=DIM)) as cluster,
        Client(cluster.addresses, ClientOptions(network=network)) as client,
    ):
        link = recording(client, network)
        client.list_tables()  # DescribeShard on both shards, then ListTables on shard 0
        assert len(link.sent) == 3 and len(link.received) == 3
        link.clear()

        vectors = client.lookup_many({"t": ids})
        assert vectors["t"].shape == (400, DIM)
        assert len(link.sent) == len(link.received) == 2  # one call per shard
        assert sorted(b // ROW for b in link.received) == sorted(_split(ids, 2))
        assert all(
            b >= 8 * k for b, k in zip(sorted(link.sent), sorted(_split(ids, 2)), strict=True)
        )
        assert len(link.waits) == 4 and sum(link.waits) == pytest.approx(
            2 * network.rtt + (sum(link.sent) + sum(link.received)) / network.bandwidth
        )
        link.clear()

        client.apply_gradients_many({"t": (ids, np.ones((400, DIM), dtype=np.float32))})
        assert len(link.sent) == 2
        assert sorted(b // (ROW + 8) for b in link.sent) == sorted(_split(ids, 2))


def test_every_retry_crosses_the_network_again(tmp_path: Path) -> None:
    network = SimulatedNetwork(rtt=0.02)
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens: every attempt is UNAVAILABLE
    options = ClientOptions(network=network, retries=2, backoff=0.001, max_backoff=0.001)
    with Client([nobody], options) as client:
        link = recording(client, network)
        with pytest.raises(UnavailableError):
            client.list_tables()  # the DescribeShard round is idempotent: retried twice
    assert len(link.sent) == 3  # three attempts, each across the link
    assert link.received == [0, 0, 0]  # each failed attempt waited for an empty answer


def test_the_async_client_awaits_one_crossing_per_shard_call(tmp_path: Path) -> None:
    network = SimulatedNetwork(rtt=0.05, bandwidth=1e9)
    ids = np.arange(1, 301, dtype=np.uint64)

    async def scenario(addresses: list[str]) -> RecordingLink:
        async with AsyncClient(addresses, ClientOptions(network=network)) as client:
            link = recording(client, network)
            await client.list_tables()
            link.clear()
            vectors = await client.lookup("t", ids)
            assert vectors.shape == (300, DIM)
            return link

    with serve_cluster(tmp_path, 2, sgd_tables(t=DIM)) as cluster:
        link = asyncio.run(scenario(cluster.addresses))
    assert len(link.sent) == len(link.received) == 2
    assert sorted(b // ROW for b in link.received) == sorted(_split(ids, 2))
    assert len(link.waits) == 4 and min(link.waits) >= network.rtt / 2


def test_without_a_network_the_clients_build_no_link(tmp_path: Path) -> None:
    with serve_cluster(tmp_path, 1) as cluster, Client(cluster.addresses) as client:
        assert client._link is None
    assert AsyncClient(["127.0.0.1:1"])._link is None
    assert isinstance(
        AsyncClient(["127.0.0.1:1"], ClientOptions(network=SimulatedNetwork(0.0)))._link,
        netsim.Link,
    )


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"rtt": -0.001}, "rtt"),
        ({"rtt": math.nan}, "rtt"),
        ({"rtt": True}, "rtt"),
        ({"rtt": "5ms"}, "rtt"),
        ({"rtt": 0.0, "bandwidth": 0.0}, "bandwidth"),
        ({"rtt": 0.0, "bandwidth": math.inf}, "bandwidth"),
        ({"rtt": 0.0, "bandwidth": -1.0}, "bandwidth"),
    ],
)
def test_bad_networks_are_refused_naming_the_attribute(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        SimulatedNetwork(**kwargs)
    assert info.value.key == key


def test_the_options_and_the_worker_config_take_only_a_network() -> None:
    with pytest.raises(ConfigError) as info:
        ClientOptions(network=0.02)  # type: ignore[arg-type]
    assert info.value.key == "network"
    with pytest.raises(ConfigError) as info:
        EmbeddingWorkerConfig(network={"rtt_ms": 20})  # type: ignore[arg-type]
    assert info.value.key == "network"
    config = EmbeddingWorkerConfig(network=SimulatedNetwork(0.005))
    assert pickle.loads(pickle.dumps(config)).network == SimulatedNetwork(0.005)  # to its process


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("20", "simulated_network"),
        ({"bandwidth_gbit": 10}, "simulated_network.rtt_ms"),
        ({"rtt_ms": -1}, "simulated_network.rtt_ms"),
        ({"rtt_ms": "20ms"}, "simulated_network.rtt_ms"),
        ({"rtt_ms": 20, "bandwidth_gbit": 0}, "simulated_network.bandwidth_gbit"),
        ({"rtt_ms": 20, "latency": 1}, "simulated_network.latency"),
    ],
)
def test_bad_mappings_are_refused_naming_the_key(value: object, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        SimulatedNetwork.from_mapping(value)
    assert info.value.key == key


def _job(tmp_path: Path, network: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {MODEL}:AdultModel\nepochs: 1\nsimulated_network: {network}\n")
    return path


def test_the_job_file_key(tmp_path: Path) -> None:
    job = JobConfig.from_yaml(_job(tmp_path, "{rtt_ms: 20, bandwidth_gbit: 1}"))
    assert job.network() == SimulatedNetwork(rtt=0.02, bandwidth=1.25e8)
    assert JobConfig.from_yaml(_job(tmp_path, "{rtt_ms: 5}")).network() == SimulatedNetwork(0.005)
    assert JobConfig.from_yaml(_job(tmp_path, "null")).network() is None
    with pytest.raises(ConfigError, match=r"simulated_network\.rtt_ms: .*>= 0.*job\.yaml:3"):
        JobConfig.from_yaml(_job(tmp_path, "{rtt_ms: -5}"))
