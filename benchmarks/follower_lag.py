"""Part (d) of benchmarks/durability.py: the lag of a gRPC follower under a sustained load.

The primary runs in a **separate process** (multiprocessing spawn): a dim-16 Adagrad shard with
``fsync: interval``, populated with ``rows`` ids, served by ``build_server`` on loopback, and
pushing gradients of 8,192 random ids back to back from a thread of its own (a trainer's push
rate on this machine) for ``seconds``. The follower (:class:`embeddb.server.follower.Follower`)
runs in the measuring process: it bootstraps from the primary's snapshot, then applies the
``Subscribe`` stream. A watcher thread polls ``follower.applied_seq`` every 0.1 ms and stamps
the first time each seq is seen applied; the primary reports when each seq was logged
(``Shard.append_time``). Lag of a record = applied time - logged time (one machine, one clock;
the 0.1 ms polling adds at most that much).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.config import (
    EmbeddingConfig,
    FsyncPolicy,
    OptimizerConfig,
    OptimizerKind,
    StoreConfig,
    TableConfig,
    UpdateLogConfig,
)
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions

TABLE = "t"
DIM = 16
PUSH_IDS = 8192
POLL_S = 0.0001


def _config(rows: int) -> EmbeddingConfig:
    table = TableConfig(
        name=TABLE,
        dim=DIM,
        capacity=int(rows * 1.05),
        optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.01),
    )
    return EmbeddingConfig(
        tables={TABLE: table}, store=StoreConfig(log=UpdateLogConfig(fsync=FsyncPolicy.INTERVAL))
    )


def _primary(conn: Connection, rows: int, data_dir: str) -> None:
    shard = Shard(_config(rows), data_dir)
    server = None
    try:
        for low in range(0, rows, 65536):
            shard.lookup(TABLE, np.arange(low, min(low + 65536, rows), dtype=np.uint64))
        shard.snapshot("bootstrap")
        server = build_server(shard, ServerConfig(workers=8))
        conn.send({"port": server.port})
        seconds = conn.recv()
        rng = np.random.default_rng(1)
        grads = (rng.standard_normal((PUSH_IDS, DIM)) * 0.01).astype(np.float32)
        first = shard.seq + 1
        end = time.perf_counter() + seconds
        pushes = 0
        while time.perf_counter() < end:
            ids = rng.choice(rows, PUSH_IDS, replace=False).astype(np.uint64)
            shard.apply_gradients(TABLE, ids, grads)
            pushes += 1
        last = shard.seq
        times = {s: shard.append_time(s) for s in range(first, last + 1)}
        conn.send({"first": first, "last": last, "times": times, "pushes": pushes})
        with suppress(EOFError):
            conn.recv()
    finally:
        if server is not None:
            server.stop(0.5)
        shard.close()
        conn.close()


def measure(rows: int, seconds: float, root: Path) -> dict[str, Any]:
    """Run the primary process and a follower; the lag percentiles and counts."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    primary_dir = Path(tempfile.mkdtemp(prefix="primary-", dir=root))
    proc = ctx.Process(target=_primary, args=(theirs, rows, str(primary_dir)), daemon=True)
    proc.start()
    theirs.close()
    follower: Follower | None = None
    try:
        if not ours.poll(300):
            raise RuntimeError("the primary process did not start")
        address = f"127.0.0.1:{ours.recv()['port']}"
        began = time.perf_counter()
        follower = Follower(_config(rows), root / "follower", FollowerOptions(address))
        follower.start()
        if not follower.wait_ready(300):
            raise RuntimeError(f"the follower did not bootstrap: {follower.error}")
        bootstrap_s = time.perf_counter() - began
        seen: dict[int, float] = {}
        stop = threading.Event()

        def watch() -> None:
            assert follower is not None
            last = follower.applied_seq
            while not stop.is_set():
                now_seq = follower.applied_seq
                if now_seq != last:
                    stamp = time.time()
                    for s in range(last + 1, now_seq + 1):
                        seen[s] = stamp
                    last = now_seq
                time.sleep(POLL_S)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ours.send(seconds)
        report = ours.recv()
        deadline = time.perf_counter() + 30
        while follower.applied_seq < report["last"] and time.perf_counter() < deadline:
            time.sleep(0.01)
        stop.set()
        watcher.join()
        lags = np.array(
            [(seen[s] - t) * 1e3 for s, t in report["times"].items() if t is not None and s in seen]
        )
        return {
            "lag_p50_ms": float(np.percentile(lags, 50)),
            "lag_p99_ms": float(np.percentile(lags, 99)),
            "lag_max_ms": float(lags.max()),
            "records": int(lags.size),
            "pushes": report["pushes"],
            "push_ids": PUSH_IDS,
            "pushes_per_s": report["pushes"] / seconds,
            "seconds": seconds,
            "bootstrap_s": bootstrap_s,
            "rows": rows,
            "primary_pid": proc.pid,
            "follower_pid": os.getpid(),
        }
    finally:
        if follower is not None:
            follower.stop()
        with suppress(OSError):
            ours.send("stop")
        ours.close()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
