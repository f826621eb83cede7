"""Kill -9 a real `embeddb serve` while a client streams updates: every acknowledged update is
there after the restart, under each fsync policy (a process crash loses no write(2)-ed record;
the ``interval`` policy's window only matters for a power loss, which a test cannot cause)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client
from embeddb.errors import EmbeddbError

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


def start(tmp_path: Path, config: Path, n: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp_path / f"port-{n}"
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "embeddb.cli", "serve", "--config", str(config),
           "--data-dir", str(tmp_path / "data"), "--port", "0",
           "--port-file", str(port_file)]  # fmt: skip
    with open(tmp_path / f"serve-{n}.log", "wb") as log:  # the child keeps its own copy
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp_path / f"serve-{n}.log").read_text())
        time.sleep(0.05)
    return process, f"127.0.0.1:{int(port_file.read_text())}"


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_kill_9_under_load_loses_no_acknowledged_update(tmp_path: Path, fsync: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG % fsync)
    rng = random.Random(fsync)
    # acked[id] = the value of the last acknowledged assign; tried[id] = every value sent
    acked = np.full(IDS, -1.0, dtype=np.float32)
    tried: list[set[float]] = [set() for _ in range(IDS)]
    counter = 0
    for round_ in range(3):  # kill at several random points
        process, address = start(tmp_path, config, round_)
        stop = threading.Event()

        def writer(address: str, stop: threading.Event, seed: int) -> None:
            nonlocal counter
            gen = np.random.default_rng(seed)
            with Client([address], timeout=5, retries=0) as client:
                while not stop.is_set():
                    ids = gen.choice(IDS, size=BATCH, replace=False).astype(np.uint64)
                    counter += 1
                    value = float(counter)
                    for i in ids:
                        tried[int(i)].add(value)
                    try:
                        client.assign("item", ids, np.full((BATCH, 4), value, np.float32))
                        client.apply_gradients("item", ids, np.zeros((BATCH, 4), np.float32))
                    except EmbeddbError:
                        return  # the server died: this request is unacknowledged
                    acked[ids] = value

        thread = threading.Thread(target=writer, args=(address, stop, round_))
        thread.start()
        time.sleep(rng.uniform(0.3, 1.2))
        process.send_signal(signal.SIGKILL)
        process.wait()
        stop.set()
        thread.join(30)
        assert not thread.is_alive()

    process, address = start(tmp_path, config, 99)
    try:
        with Client([address]) as client:
            stored = client.lookup("item", np.arange(IDS, dtype=np.uint64), train=False)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
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
    assert "recovered" in (tmp_path / "serve-99.log").read_text()
