"""Per-stage breakdown of ``benchmarks/rpc.py``'s float32 eval lookup (65,536 ids, dim 16).

The same server process as rpc.py (``_rpc_server.serve``) with timers wrapped around each
stage of the lookup path, in both processes: the client's validation and dedup
(``IdBatch.of``), request planning and encoding (``plans.lookup``), the stub call (request
serialization, transport both ways, the server), the answer's parse and merge; on the server the
boundary's decode and checks, ``StoreServicer.Lookup`` with ``Shard.lookup`` inside, and the
response's serialization. Also the CPU time per call of each process (``/proc``), for the
lookup and for rpc.py's raw echo. Prints medians per call and their share of the whole call.

Usage (a diagnostic, not a benchmark: no JSON line)::

    PYTHONPATH=. python benchmarks/_rpc_profile.py [calls]
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import grpc
import numpy as np
from _rpc_server import (
    ECHO_METHOD,
    ECHO_SERVICE,
    TABLE,
    WORKERS,
    channel_options,
    serve,
)

TIMES: defaultdict[str, list[float]] = defaultdict(list)


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, appending each call's wall time to ``TIMES[name]``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name].append(time.perf_counter() - began)

    return wrapper


def replace(owner: object, attribute: str, value: object) -> None:
    """Set ``owner.attribute`` (a module function or a method) to ``value``."""
    setattr(owner, attribute, value)


def patch(owner: object, attribute: str, name: str) -> None:
    """Replace ``owner.attribute`` by its :func:`timed` version."""
    replace(owner, attribute, timed(name, getattr(owner, attribute)))


def patch_classmethod(owner: type, attribute: str, name: str) -> None:
    """Replace the classmethod ``owner.attribute`` by its :func:`timed` version."""
    replace(owner, attribute, classmethod(timed(name, owner.__dict__[attribute].__func__)))


class _Reporting:
    """The control pipe of :func:`serve`; sends the server's timings when told to stop."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, obj: Any) -> None:
        self._conn.send(obj)

    def recv(self) -> Any:
        try:
            return self._conn.recv()
        finally:
            self._conn.send(dict(TIMES))

    def close(self) -> None:
        self._conn.close()


def serve_timed(conn: Connection, workers: int) -> None:
    """:func:`serve` with the server's stages timed (patched before the server is built)."""
    from embeddb.engine import shard
    from embeddb.server import servicer
    from embeddb.transport import wire
    from embeddb.transport.rpc import boundary

    patch(boundary._Call, "admit", "srv  boundary: decode + checks")
    patch(servicer.StoreServicer, "Lookup", "srv  StoreServicer.Lookup")
    patch(shard.Shard, "lookup", "srv    of which Shard.lookup")
    patch(wire, "encode_lookup_response", "srv    of which encode_lookup_response")
    patch(servicer, "_serialize", "srv  response serialization (join)")
    serve(_Reporting(conn), workers)  # type: ignore[arg-type]  # a Connection look-alike


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def async_calls(port: int, batches: list[Any], calls: int) -> list[float]:
    """Seconds of each of ``calls`` sequential ``AsyncClient.lookup`` calls (after 10 untimed
    ones); its stages land in ``TIMES``."""
    from embeddb.client import AsyncClient, ClientOptions

    call = AsyncClient._call

    async def timed_call(self: AsyncClient, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return await call(self, *args)
        finally:
            TIMES["cli  aio call: serialize, transport, server"].append(time.perf_counter() - began)

    replace(AsyncClient, "_call", timed_call)
    seconds: list[float] = []
    async with AsyncClient([f"127.0.0.1:{port}"], ClientOptions(timeout=30.0)) as client:
        for i in range(calls + 10):
            if i == 10:
                TIMES.clear()
            began = time.perf_counter()
            await client.lookup(TABLE, batches[i % 8], train=False)
            if i >= 10:
                seconds.append(time.perf_counter() - began)
    return seconds


def main(calls: int) -> None:
    from embeddb.client import Client, ClientOptions, batching, plans
    from embeddb.common.allocator import tune_allocator

    tune_allocator()
    patch_classmethod(batching.IdBatch, "of", "cli  IdBatch.of: validate + dedup")
    plan = plans.lookup

    def timed_plan(*args: Any, **kwargs: Any) -> Any:
        made = timed("cli  plans.lookup: plan + encode request", plan)(*args, **kwargs)
        return plans.Plan(made.calls, timed("cli  merge: decode + copy", made.merge))

    replace(plans, "lookup", timed_plan)  # the client calls plans.lookup through the module
    patch(Client, "_call", "cli  stub call: serialize, transport, server")
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve_timed, args=(theirs, WORKERS), daemon=True)
    proc.start()
    theirs.close()
    info = ours.recv()
    order = np.random.default_rng(0).permutation(1 << 20).astype(np.uint64)
    batches = [order[i * 65_536 : (i + 1) * 65_536] for i in range(8)]
    client = Client([f"127.0.0.1:{info['lookup_port']}"], ClientOptions(timeout=30.0))
    channel = grpc.insecure_channel(f"127.0.0.1:{info['echo_port']}", options=channel_options())
    echo = channel.unary_unary(f"/{ECHO_SERVICE}/{ECHO_METHOD}")
    requests = [b.tobytes() for b in batches]
    try:
        works: dict[str, Callable[[int], object]] = {
            "echo": lambda i: echo(requests[i % 8], timeout=30.0),
            "lookup": lambda i: client.lookup(TABLE, batches[i % 8], train=False),
        }
        for work in works.values():
            for i in range(10):
                work(i)
        TIMES.clear()
        whole: dict[str, list[float]] = {name: [] for name in works}
        cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in works}
        for name, work in works.items():
            server0, client0 = cpu_seconds(info["pid"]), cpu_seconds(os.getpid())
            for i in range(calls):
                began = time.perf_counter()
                work(i)
                whole[name].append(time.perf_counter() - began)
            cpu[name].append(
                (
                    (cpu_seconds(os.getpid()) - client0) / calls,
                    (cpu_seconds(info["pid"]) - server0) / calls,
                )
            )
        client_times = dict(TIMES)
        TIMES.clear()
        whole["async"] = asyncio.run(async_calls(info["lookup_port"], batches, calls))
        async_times = dict(TIMES)
        ours.send("stop")
        server_times: dict[str, list[float]] = ours.recv()
    finally:
        client.close()
        channel.close()
        proc.join(20.0)
    total = statistics.median(whole["lookup"])
    print(f"{'stage (median per call)':48} {'ms':>7} {'share':>6}")
    print(f"{'client.lookup, whole call':48} {total * 1e3:7.3f} {1:6.1%}")
    for name, values in [*client_times.items(), *server_times.items()]:
        ms = statistics.median(values[-calls:])
        print(f"{name:48} {ms * 1e3:7.3f} {ms / total:6.1%}")
    print(f"{'raw echo, whole call':48} {statistics.median(whole['echo']) * 1e3:7.3f}")
    total = statistics.median(whole["async"])
    print(f"{'AsyncClient.lookup, whole call':48} {total * 1e3:7.3f} {1:6.1%}")
    for name, values in async_times.items():
        ms = statistics.median(values)
        print(f"{name:48} {ms * 1e3:7.3f} {ms / total:6.1%}")
    for name in works:
        c, s = cpu[name][0]
        print(f"CPU per {name} call: client {c * 1e3:.2f} ms, server {s * 1e3:.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
