"""The server side of ``benchmarks/rpc.py``: one shard and a raw gRPC echo, served from a
separate process (see rpc.py's module docstring for the arrangement), and the benchmark's
shared constants."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from typing import Any

import grpc
import numpy as np

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.shard import Shard
from embeddb.server.app import ServerConfig, build_server
from embeddb.transport.rpc import RpcServer

TABLE = "t"
DIM = 16
BATCH = 65_536
POPULATED = 1 << 20  # ids 0..POPULATED-1 exist in the RAM tier before serving
RAM_CAPACITY = 1_100_000  # slack over POPULATED: ids spread unevenly over the lock stripes
VECTOR_BYTES = BATCH * DIM * 4  # float32 payload of one response: 4 MiB
ID_BYTES = BATCH * 8  # uint64 ids of one request: 512 KiB
WORKERS = 8  # server threads, the shard server and the echo server alike
MAX_MESSAGE_BYTES = ServerConfig().max_message_bytes

ECHO_SERVICE = "embeddb.bench.Echo"
ECHO_METHOD = "Echo"
GATHER_METHOD = "Gather"  # raw gRPC around the shard's gather: the floor of a lookup

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0


def server_options() -> list[tuple[str, int]]:
    """The options ``build_server`` gives its gRPC server, for the echo server too."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]


def start_echo(workers: int, shard: Shard) -> tuple[grpc.Server, futures.ThreadPoolExecutor, int]:
    """A raw-bytes gRPC server: ``Echo`` answers every request with one preallocated 4 MiB
    object; ``Gather`` answers the uint64 ids of its request with their vectors from
    ``shard`` (``Shard.lookup(train=False)``, then one copy into ``bytes``), the least any
    lookup over gRPC in Python can cost with this shard: no protobuf, no checks, no client."""
    response = np.random.default_rng(0).random(BATCH * DIM, dtype=np.float32).tobytes()

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return response

    def gather(request: bytes, context: grpc.ServicerContext) -> bytes:
        ids = np.frombuffer(request, dtype=np.uint64)
        return shard.lookup(TABLE, ids, train=False).tobytes()

    methods = {
        ECHO_METHOD: grpc.unary_unary_rpc_method_handler(echo),
        GATHER_METHOD: grpc.unary_unary_rpc_method_handler(gather),
    }
    handler = grpc.method_handlers_generic_handler(ECHO_SERVICE, methods)
    executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-echo")
    server = grpc.server(executor, handlers=[handler], options=server_options())
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        raise OSError("cannot bind the echo server")
    server.start()
    return server, executor, port


def serve(conn: Connection, workers: int) -> None:
    """The server process: populate the shard, serve it and the echo until told to stop."""
    config = EmbeddingConfig.single_table(
        TABLE, DIM, capacity=RAM_CAPACITY, optimizer=OptimizerConfig(kind=OptimizerKind.SGD)
    )
    shard = Shard(config)
    shard_server: RpcServer | None = None
    echo: tuple[grpc.Server, futures.ThreadPoolExecutor, int] | None = None
    try:
        began = time.perf_counter()
        for low in range(0, POPULATED, BATCH):
            shard.lookup(TABLE, np.arange(low, low + BATCH, dtype=np.uint64), train=True)
        populate_s = time.perf_counter() - began
        stats = shard.stats().tables[TABLE]
        shard_server = build_server(shard, ServerConfig(workers=workers))
        echo = start_echo(workers, shard)
        conn.send(
            {
                "lookup_port": shard_server.port,
                "echo_port": echo[2],
                "populate_seconds": populate_s,
                "ram_rows": stats.ram_rows,
                "disk_rows": stats.disk_rows,
                "pid": os.getpid(),
            }
        )
        with suppress(EOFError):
            conn.recv()  # "stop", or EOF when the benchmark process is gone
    except Exception as exc:
        with suppress(OSError):
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        if echo is not None:
            echo[0].stop(1.0).wait()
            echo[1].shutdown(wait=True)
        if shard_server is not None:
            shard_server.stop(1.0)
        shard.close()
        conn.close()


@contextmanager
def server_process(workers: int) -> Iterator[dict[str, Any]]:
    """Start :func:`serve` in a spawned process; yields its ports; always stops it."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(theirs, workers), name="rpc-bench-server", daemon=True)
    proc.start()
    theirs.close()
    try:
        if not ours.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the server process did not start within {START_TIMEOUT_S:g} s")
        info: dict[str, Any] = ours.recv()
        if "error" in info:
            raise RuntimeError(f"the server process failed: {info['error']}")
        yield info
    finally:
        with suppress(OSError):
            ours.send("stop")
        ours.close()
        proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def channel_options() -> list[tuple[str, int]]:
    """The message-size options of the measuring side's channels."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
