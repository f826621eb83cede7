"""Kill -9 a real `embeddb serve` while a client streams updates: every acknowledged update is
there after the restart, under each fsync policy (a process crash loses no write(2)-ed record;
the ``interval`` policy's window only matters for a power loss, which a test cannot cause)."""

from __future__ import annotations

import itertools
import random
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client, ClientOptions
from embeddb.errors import EmbeddbError
from tests.support import START_TIMEOUT_S, StartServe, serve_processes

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

CONFIG = """
slots_config:
  item: {dim: 4}
defaults:
  optimizer: {type: sgd, lr: 0.1}
  capacity: 256           # far fewer RAM rows than ids: rows spill and come back
store: {stripes: 4, eviction_chunk: 0.0625, min_stripe_rows: 16, fsync: %s}
"""
IDS = 2000
BATCH = 64


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_kill_9_under_load_loses_no_acknowledged_update(
    tmp_path: Path, serve: StartServe, fsync: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG % fsync)
    rng = random.Random(fsync)
    # acked[id] = the value of the last acknowledged assign; tried[id] = every value sent
    acked = np.full(IDS, -1.0, dtype=np.float32)
    tried: list[set[float]] = [set() for _ in range(IDS)]
    counter = 0
    args = ("--config", str(config), "--data-dir", str(tmp_path / "data"))
    for round_ in range(3):  # kill at several random points
        served = serve(*args)
        stop, killable = threading.Event(), threading.Event()

        def writer(
            address: str,
            stop: threading.Event,
            seed: int,
            killable: threading.Event,
            kill_after: int,
        ) -> None:
            """Stream writes; set ``killable`` after ``kill_after`` acknowledged batches (or
            when the writer gives up)."""
            nonlocal counter
            gen = np.random.default_rng(seed)
            # The timeout covers the first call's JIT compile when the numba cache is cold: a
            # killed server fails the call at once (the connection drops), not by timing out.
            with Client([address], ClientOptions(timeout=START_TIMEOUT_S, retries=0)) as client:
                for acks in itertools.count():
                    if acks == kill_after:
                        killable.set()
                    if stop.is_set():
                        break
                    ids = gen.choice(IDS, size=BATCH, replace=False).astype(np.uint64)
                    counter += 1
                    value = float(counter)
                    for i in ids:
                        tried[int(i)].add(value)
                    try:
                        client.assign("item", ids, np.full((BATCH, 4), value, np.float32))
                        client.apply_gradients("item", ids, np.zeros((BATCH, 4), np.float32))
                    except EmbeddbError:
                        break  # the server died: this request is unacknowledged
                    acked[ids] = value
            killable.set()

        kill_after = rng.randint(10, 100)  # acknowledged batches: a random point under load
        thread = threading.Thread(
            target=writer, args=(served.address, stop, round_, killable, kill_after)
        )
        thread.start()
        assert killable.wait(START_TIMEOUT_S), f"{kill_after} batches were not acknowledged"
        served.process.send_signal(signal.SIGKILL)
        served.process.wait()
        stop.set()
        thread.join(30)
        assert not thread.is_alive()

    served = serve(*args)
    with Client([served.address]) as client:
        stored = client.lookup("item", np.arange(IDS, dtype=np.uint64), train=False)
    served.stop()
    assert (acked > 0).sum() > 100  # the test did exercise the shard
    for i in np.flatnonzero(acked > 0):
        v = float(stored[i, 0])
        # the last acknowledged value, or a later one whose acknowledgement the kill cut off
        assert v >= acked[i] and v in tried[i], (i, v, acked[i])
        assert (stored[i] == v).all()
    never = np.flatnonzero(acked < 0)
    for i in never:  # never acknowledged: absent, or a value that was sent
        v = float(stored[i, 0])
        assert v == 0.0 or v in tried[i]
    assert "recovered" in served.stderr()
