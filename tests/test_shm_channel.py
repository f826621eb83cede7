"""The NN worker / embedding worker transport: pickled messages through a real pipe, their
large buffers through shared-memory rings (:mod:`embeddb.trainer.embedding.channel`)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest

from embeddb.errors import ConfigError
from embeddb.trainer.embedding.channel import (
    MIN_RING_BYTES,
    RING_BYTES,
    RING_BYTES_ENV,
    Ring,
    RingChannel,
    RingFiles,
    ring_bytes,
)

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm here")


@dataclass(frozen=True)
class Message:
    ref: int
    arrays: list[np.ndarray]


@pytest.fixture
def pair() -> Iterator[tuple[RingChannel, RingChannel, RingFiles]]:
    """(NN side, worker side, files) over a real duplex pipe, small rings (1 MiB)."""
    files = RingFiles(capacity=1 << 20)
    assert files.paths is not None
    a, b = multiprocessing.Pipe(duplex=True)
    nn = RingChannel.open(a, files.paths, worker_side=False)
    worker = RingChannel.open(b, files.paths, worker_side=True)
    yield nn, worker, files
    files.unlink()
    nn.close()
    worker.close()


def arrays(seed: int, sizes: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for n in sizes]


def received_while(send: Callable[[], None], receiver: RingChannel) -> Message:
    """The message ``receiver`` gets while ``send`` runs (a large one fills the pipe's socket
    buffer: its sender returns only once the other side reads)."""
    got: list[Message] = []
    reader = threading.Thread(target=lambda: got.append(receiver.recv()))
    reader.start()
    send()
    reader.join(60)
    return got[0]


def test_large_buffers_go_through_the_ring_and_arrive_equal(pair: tuple) -> None:
    nn, worker, _ = pair
    sent = Message(7, arrays(0, [100_000, 10, 50_000]))  # 400 kB, 40 B, 200 kB

    nn.send(sent)
    got = worker.recv()

    assert got.ref == 7
    for a, b in zip(got.arrays, sent.arrays, strict=True):
        np.testing.assert_array_equal(a, b)
    assert nn.ring_bytes == (100_000 + 50_000) * 4  # the 40-byte array stayed in the pickle
    got.arrays[0][:] = 0  # a private, writable copy: the sender's array is untouched
    assert sent.arrays[0].any()


def test_both_directions_have_their_own_ring(pair: tuple) -> None:
    nn, worker, _ = pair
    worker.send(Message(1, arrays(1, [200_000])))
    nn.send(Message(2, arrays(2, [200_000])))

    back, there = nn.recv(), worker.recv()

    np.testing.assert_array_equal(back.arrays[0], arrays(1, [200_000])[0])
    np.testing.assert_array_equal(there.arrays[0], arrays(2, [200_000])[0])
    assert nn.ring_bytes == worker.ring_bytes == 800_000


def test_a_full_ring_falls_back_to_the_pipe_and_loses_nothing(pair: tuple) -> None:
    nn, worker, _ = pair
    # 4 x 250 kB fill the unread 1 MiB ring; the fifth (60 kB) cannot fit and goes in the
    # pickle stream (small enough for the pipe's socket buffer: the send does not block).
    messages = [Message(i, arrays(i, [62_500])) for i in range(4)]
    messages.append(Message(4, arrays(4, [15_000])))

    for m in messages:
        nn.send(m)
    in_ring = nn.ring_bytes
    received = [worker.recv() for _ in messages]

    assert in_ring == 4 * 250_000
    assert [m.ref for m in received] == list(range(5))
    for m in received:
        np.testing.assert_array_equal(m.arrays[0], messages[m.ref].arrays[0])
    nn.send(messages[4])  # read: the space is free again
    assert nn.ring_bytes == in_ring + 60_000
    np.testing.assert_array_equal(worker.recv().arrays[0], messages[4].arrays[0])


def test_wrapping_around_the_ring_keeps_every_byte(pair: tuple) -> None:
    nn, worker, _ = pair
    rng = np.random.default_rng(3)
    for i in range(60):  # sizes that never divide the ring: buffers skip its tail
        n = int(rng.integers(MIN_RING_BYTES // 4, 90_000))
        sent = Message(i, [rng.standard_normal(n).astype(np.float32), np.arange(i)])
        nn.send(sent)
        got = worker.recv()
        np.testing.assert_array_equal(got.arrays[0], sent.arrays[0])
        np.testing.assert_array_equal(got.arrays[1], sent.arrays[1])
    assert nn.ring_bytes > 4 * (1 << 20)  # went round several times


def test_a_buffer_larger_than_the_ring_travels_in_the_pipe(pair: tuple) -> None:
    nn, worker, _ = pair
    sent = Message(0, arrays(4, [400_000]))  # 1.6 MB > 1 MiB

    got = received_while(lambda: nn.send(sent), worker)

    np.testing.assert_array_equal(got.arrays[0], sent.arrays[0])
    assert nn.ring_bytes == 0


def test_a_frame_naming_a_place_outside_the_ring_is_refused(pair: tuple) -> None:
    files = pair[2]
    ring = Ring(files.paths[0])

    with pytest.raises(ValueError, match="outside the ring"):
        ring.take(ring.capacity - 10, 100, 0)


def test_without_shared_memory_everything_goes_through_the_pipe() -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    nn, worker = (
        RingChannel.open(a, None, worker_side=False),
        RingChannel.open(b, None, worker_side=True),
    )
    sent = Message(5, arrays(5, [300_000]))

    got = received_while(lambda: nn.send(sent), worker)

    np.testing.assert_array_equal(got.arrays[0], sent.arrays[0])
    assert nn.ring_bytes == 0
    nn.close()
    worker.close()


def test_unlinked_files_leave_the_mappings_working(pair: tuple) -> None:
    nn, worker, files = pair
    paths = files.paths
    files.unlink()
    files.unlink()  # idempotent

    assert paths is not None and not any(Path(p).exists() for p in paths)
    nn.send(Message(9, arrays(9, [100_000])))
    assert worker.recv().ref == 9 and nn.ring_bytes == 400_000


def _echo(conn: Connection, paths: tuple[str, str]) -> None:
    channel = RingChannel.open(conn, paths, worker_side=True)
    while (message := channel.recv()) is not None:
        channel.send(Message(message.ref + 1, [a * 2 for a in message.arrays]))
    channel.close()


@pytest.mark.slow
def test_a_spawned_process_maps_the_rings() -> None:
    ctx = multiprocessing.get_context("spawn")
    files = RingFiles(capacity=1 << 20)
    assert files.paths is not None
    a, b = ctx.Pipe(duplex=True)
    child = ctx.Process(target=_echo, args=(b, files.paths), daemon=True)
    child.start()
    nn = RingChannel.open(a, files.paths, worker_side=False)
    try:
        for i in range(5):
            sent = Message(i, arrays(i, [120_000]))
            nn.send(sent)
            got = nn.recv()
            assert got.ref == i + 1
            np.testing.assert_array_equal(got.arrays[0], sent.arrays[0] * 2)
            if i == 0:
                files.unlink()  # the child has mapped them: the files can go
        nn.send(None)
    finally:
        child.join(30)
        files.unlink()
    assert child.exitcode == 0
    assert nn.ring_bytes == 5 * 480_000


def test_the_ring_size_comes_from_the_environment() -> None:
    assert ring_bytes({}) == RING_BYTES
    assert ring_bytes({RING_BYTES_ENV: "1048576"}) == 1 << 20
    assert RingFiles(capacity=0).paths is None  # 0: everything through the pipe
    for bad in ("-1", "8M", "1.5"):
        with pytest.raises(ConfigError, match=RING_BYTES_ENV):
            ring_bytes({RING_BYTES_ENV: bad})
