"""RPC benchmark of one embeddb shard over gRPC on loopback: throughput against a raw gRPC echo,
online latency at a fixed request rate, and the wire cost of the fp16 and LZ4 encodings.

Arrangement: one shard server runs in a **separate process** (``multiprocessing`` spawn) from
the measuring client, so that on a 2-core machine the client and the server each get roughly a
core (nothing is pinned; gRPC's own threads are scheduled by the OS). The server process holds
the shard (one table ``t`` of dim 16, SGD, 1.1M RAM rows, ids 0..2**20-1 pre-populated with
training lookups before serving, so every measured id is RAM-resident) served by
``build_server(shard, ServerConfig(workers=8))`` and, on another port of the same
process, a raw gRPC **echo** server with the same worker count and message-size options. The
process is stopped in ``finally`` (and exits by itself if the benchmark dies: its end of the
control pipe closes).

(a) **Throughput against the transport ceiling.** ``Client.lookup`` of batches of 65,536 unique
    ids (a pool of 8 slices of a random permutation of the populated ids) of dim 16: each
    response carries 4 MiB of float32 vectors. These are evaluation lookups (``train=False``),
    which change nothing on the shard, so the measurement is the RPC path: client dedup and
    routing, id encoding, the gRPC call, the shard's RAM-tier gather, response encoding and
    decoding into a float32 array. Plain float32 (``fp16=False, lz4_min_bytes=0``, the
    client's default) is the measured encoding. Both processes run with the allocator tuning
    that the server and the client apply by default (``embeddb.common.allocator``), the echo
    server's
    process included. The baseline is the least any gRPC-in-Python RPC of
    these sizes can cost: a generic handler (``grpc.method_handlers_generic_handler``, identity
    (de)serializers, raw bytes, no protobuf) that answers a 512 KiB request (the batch's 65,536
    ids as uint64 bytes) with a preallocated 4 MiB bytes object, called through a raw
    ``channel.unary_unary`` with no (de)serializers. ``lookup_ratio`` = lookup bytes/s / echo
    bytes/s, where bytes/s counts the 4 MiB float32 vector payload per call (target >= 0.5).
    **The floor**: the same echo server's ``Gather`` method answers the ids of its request
    with ``Shard.lookup(train=False)`` of the benchmark's own shard (same process, same
    threads), as raw bytes: gRPC in Python plus the shard's gather and nothing of embeddb's
    protocol, checks or client. ``lookup_floor_ratio`` = its bytes/s / echo bytes/s, the best
    ``lookup_ratio`` that gather allows on this machine; ``lookup_vs_floor`` = lookup bytes/s
    / its bytes/s, what embeddb's own layers keep of it.
    One line of training lookups (``train=True`` over the same resident ids: recency refresh,
    no new rows; never retried by the client) is printed for reference.
(b) **Online latency.** Requests of one sample (26 ids, drawn uniformly from the populated ids;
    the sync ``Client`` with one shard, so dedup and routing are included, ``train=False``) at a
    fixed rate of 500/s for 10 s (``--quick``: 3 s) after 0.5 s of warm-up at the same rate,
    sent by the measuring process (separate from the server's). The schedule is open-loop:
    send times ``t0 + i / rate`` are fixed in advance and one thread sends each request at its
    time (it sleeps, then spins the last 0.2 ms), or at once if the previous answer came late.
    Two latencies are reported: the **scheduled latency** (answer time minus scheduled send
    time, so a slow answer also delays the requests queued behind it: no coordinated
    omission) -- the headline ``p50_ms`` / ``p99_ms`` -- and the **service time** (answer time
    minus actual send time). The send lag (actual minus scheduled send time) and the achieved
    rate are reported too.
(c) **Encodings.** For one 65,536-id batch, the serialized ``LookupResponse.ByteSize()`` of each
    encoding -- float32, fp16 (per-row scaled float16), lz4 (``lz4_min_bytes=65536``) and
    fp16+lz4 -- from a raw stub call with exactly the request the client would send (its
    unique ids, LZ4-framed ids with LZ4 on), and the client lookup throughput of each encoding.
    ``fp16_bytes_ratio`` = fp16 bytes / float32 bytes (about 0.5: 2 bytes per value plus a
    4-byte scale per row). LZ4 barely compresses random float32 values (the table's uniform
    +-0.01 initial vectors); its ratio is reported as measured. The largest fp16 error against
    float32 on that batch is reported as well.
(d) **Cold start.** ``cold_first_lookup_ms``: a fresh ``embeddb serve`` process's first lookup,
    from process start to answer, minus the time until SERVING (median of 3 fresh processes,
    ``--quick``: 1 and no empty-numba-cache start), measured by ``benchmarks/cold_start.py``
    (``measure_cold_first_lookup``,
    called through ``_rpc_cold.py``: if it is missing or fails, the key is ``null`` and
    ``cold_start.note`` says why). Target <= 100 ms.

The server process and the constants live in ``_rpc_server.py``, the timing in
``_rpc_timing.py``.

Timing: the operations of (a) and (c) -- echo, float32 eval lookup, training lookup, fp16, lz4,
fp16+lz4 -- each run 2 untimed warm-up calls, then are timed with ``time.perf_counter`` in 5
alternating rounds (``--quick``: 3) of at least 1 s and 10 calls each (``--quick``: 0.4 s and 5
calls), so that other load on the shared machine skews them alike. Rates are total payload /
total time; the median call time is kept too.

Output: a table printed as the run goes, then, as the last line, one JSON object (keys described
in ``benchmarks/README.md``). The issue's targets (``lookup_ratio`` >= 0.5, ``p99_ms`` <= 2 at
500 requests/s, ``cold_first_lookup_ms`` <= 100) are printed next to the figures and never
enforced.

Usage::

    PYTHONPATH=. python benchmarks/rpc.py --quick
    PYTHONPATH=. python benchmarks/rpc.py --json-out rpc.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import ownership
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, fmt_rate, say, verdict
from _rpc_cold import cold_first_lookup
from _rpc_server import (
    BATCH,
    DIM,
    ECHO_METHOD,
    ECHO_SERVICE,
    GATHER_METHOD,
    ID_BYTES,
    POPULATED,
    RAM_CAPACITY,
    TABLE,
    VECTOR_BYTES,
    WORKERS,
    channel_options,
    server_process,
)
from _rpc_timing import (
    ROUND_SECONDS_QUICK,
    ROUNDS_QUICK,
    Schedule,
    Throughput,
    time_interleaved,
)

from embeddb.client import Client, ClientOptions
from embeddb.client.batching import IdBatch
from embeddb.common.allocator import tune_allocator
from embeddb.common.arrays import U64
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

POOL_BATCHES = 8
LZ4_MIN_BYTES = 1 << 16  # the client's default threshold

SAMPLE_IDS = 26
RATE = 500.0  # requests/s
LATENCY_SECONDS = 10.0
LATENCY_SECONDS_QUICK = 3.0
LATENCY_WARMUP_SECONDS = 0.5
SPIN_SECONDS = 0.0002  # the sender sleeps until this long before a send time, then spins

CALL_TIMEOUT_S = 30.0

TARGET_LOOKUP_RATIO = 0.5
TARGET_P99_MS = 2.0
TARGET_COLD_FIRST_LOOKUP_MS = 100.0
COLD_REPEATS, COLD_REPEATS_QUICK = 3, 1


@dataclass(frozen=True)
class Encoding:
    """One response encoding of (c): the client options that select it."""

    fp16: bool
    lz4_min_bytes: int


ENCODINGS: dict[str, Encoding] = {
    "float32": Encoding(fp16=False, lz4_min_bytes=0),
    "fp16": Encoding(fp16=True, lz4_min_bytes=0),
    "lz4": Encoding(fp16=False, lz4_min_bytes=LZ4_MIN_BYTES),
    "fp16_lz4": Encoding(fp16=True, lz4_min_bytes=LZ4_MIN_BYTES),
}


# ------------------------------------------------------------------------------------ printing


def mib_s(value: float) -> str:
    return f"{value / (1 << 20):,.0f} MiB/s"


# ------------------------------------------------------------------------------------ (a), (c)


def id_batches(rng: np.random.Generator) -> list[U64]:
    """``POOL_BATCHES`` batches of ``BATCH`` unique populated ids, in random order."""
    order = rng.permutation(POPULATED).astype(np.uint64)
    return [order[i * BATCH : (i + 1) * BATCH] for i in range(POOL_BATCHES)]


def wire_sizes(address: str, ids: U64) -> dict[str, dict[str, Any]]:
    """Serialized request and response size of each encoding, from raw stub calls."""
    unique = IdBatch.of(ids).unique  # what the client sends: its unique ids
    out: dict[str, dict[str, Any]] = {}
    reference: npt.NDArray[np.float32] | None = None
    with grpc.insecure_channel(address, options=channel_options()) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)  # type: ignore[no-untyped-call]
        for name, enc in ENCODINGS.items():
            request = pb.LookupRequest(
                table=TABLE,
                ids=wire.encode_ids(unique, enc.lz4_min_bytes),
                train=False,
                encoding=pb.Encoding(fp16=enc.fp16, lz4_min_bytes=enc.lz4_min_bytes),
            )
            response = stub.Lookup(request, timeout=CALL_TIMEOUT_S)
            vectors = wire.decode_matrix(response.vectors, "vectors", unique.size, DIM)
            if reference is None:
                reference = vectors
            out[name] = {
                "response_bytes": response.ByteSize(),
                "request_bytes": request.ByteSize(),
                "max_abs_error": float(np.max(np.abs(vectors - reference))),
            }
    base = out["float32"]["response_bytes"]
    for sizes in out.values():
        sizes["bytes_ratio"] = sizes["response_bytes"] / base
    return out


def run_throughput(
    info: dict[str, Any], batches: Sequence[U64], schedule: Schedule
) -> dict[str, Throughput]:
    """Echo, training lookups and the four encodings' eval lookups, interleaved."""
    address = f"127.0.0.1:{info['lookup_port']}"
    clients = {
        name: Client(
            [address], ClientOptions(fp16=enc.fp16, lz4_min_bytes=enc.lz4_min_bytes, timeout=30.0)
        )
        for name, enc in ENCODINGS.items()
    }
    echo_channel = grpc.insecure_channel(
        f"127.0.0.1:{info['echo_port']}", options=channel_options()
    )
    try:
        echo = echo_channel.unary_unary(
            f"/{ECHO_SERVICE}/{ECHO_METHOD}",
            request_serializer=None,
            response_deserializer=None,
        )
        requests = [b.tobytes() for b in batches]

        def call_echo(i: int) -> object:
            answer = echo(requests[i % len(requests)], timeout=CALL_TIMEOUT_S)
            if len(answer) != VECTOR_BYTES:
                raise RuntimeError(f"echo answered {len(answer)} bytes, not {VECTOR_BYTES}")
            return answer

        gather = echo_channel.unary_unary(
            f"/{ECHO_SERVICE}/{GATHER_METHOD}",
            request_serializer=None,
            response_deserializer=None,
        )

        def call_gather(i: int) -> object:
            answer = gather(requests[i % len(requests)], timeout=CALL_TIMEOUT_S)
            if len(answer) != VECTOR_BYTES:
                raise RuntimeError(f"gather answered {len(answer)} bytes, not {VECTOR_BYTES}")
            return answer

        def lookup(client: Client, train: bool) -> Callable[[int], object]:
            def work(i: int) -> object:
                return client.lookup(TABLE, batches[i % len(batches)], train=train)

            return work

        first = clients["float32"].lookup(TABLE, batches[0], train=False)
        if first.shape != (BATCH, DIM) or first.dtype != np.float32:
            raise RuntimeError(f"lookup returned {first.shape} {first.dtype}")
        works: dict[str, Callable[[int], object]] = {"echo": call_echo, "gather": call_gather}
        works["float32"] = lookup(clients["float32"], train=False)
        works["train"] = lookup(clients["float32"], train=True)
        for name in ENCODINGS:
            if name != "float32":
                works[name] = lookup(clients[name], train=False)
        return time_interleaved(works, schedule)
    finally:
        echo_channel.close()
        for client in clients.values():
            client.close()


# ------------------------------------------------------------------------------------ (b)


def percentile_ms(values: npt.NDArray[np.float64], q: float) -> float:
    return float(np.percentile(values, q) * 1e3)


def run_latency(address: str, seconds: float, rng: np.random.Generator) -> dict[str, Any]:
    """One-sample eval lookups at ``RATE``/s on an open-loop schedule."""
    warm = int(LATENCY_WARMUP_SECONDS * RATE)
    n = warm + int(seconds * RATE)
    samples = rng.integers(0, POPULATED, size=(n, SAMPLE_IDS), dtype=np.uint64)
    due = np.empty(n)
    sent = np.empty(n)
    done = np.empty(n)
    period = 1.0 / RATE
    with Client([address]) as client:
        client.lookup(TABLE, samples[0], train=False)  # connect; learns nothing else
        t0 = time.perf_counter() + 0.01
        for i in range(n):
            when = t0 + i * period
            wait = when - time.perf_counter() - SPIN_SECONDS
            if wait > 0:
                time.sleep(wait)
            while time.perf_counter() < when:
                pass
            sent[i] = time.perf_counter()
            client.lookup(TABLE, samples[i], train=False)
            done[i] = time.perf_counter()
            due[i] = when
    due, sent, done = due[warm:], sent[warm:], done[warm:]
    scheduled = done - due
    service = done - sent
    lag = sent - due
    return {
        "rate": RATE,
        "achieved_rate": (len(due) - 1) / (sent[-1] - sent[0]),
        "requests": len(due),
        "seconds": seconds,
        "warmup_seconds": LATENCY_WARMUP_SECONDS,
        "ids_per_request": SAMPLE_IDS,
        "p50_ms": percentile_ms(scheduled, 50),
        "p90_ms": percentile_ms(scheduled, 90),
        "p99_ms": percentile_ms(scheduled, 99),
        "p999_ms": percentile_ms(scheduled, 99.9),
        "max_ms": float(scheduled.max() * 1e3),
        "service_p50_ms": percentile_ms(service, 50),
        "service_p99_ms": percentile_ms(service, 99),
        "send_lag_p50_ms": percentile_ms(lag, 50),
        "send_lag_p99_ms": percentile_ms(lag, 99),
        "late_share": float(np.mean(lag > period)),
    }


# ------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="RPC benchmark of one embeddb shard over gRPC on loopback "
        "(throughput vs a raw gRPC echo, latency at 500 requests/s, fp16 and LZ4 encodings).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"short run (< 60 s): {ROUNDS_QUICK} rounds of >= {ROUND_SECONDS_QUICK:g} s per "
        f"throughput operation, {LATENCY_SECONDS_QUICK:g} s of latency requests",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every id batch and sample")
    add_out_dir_argument(parser, "rpc")
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write the final JSON object to this file"
    )
    return parser.parse_args(argv)


def encoding_rows(
    sizes: Mapping[str, Mapping[str, Any]], rates: Mapping[str, Throughput]
) -> dict[str, dict[str, Any]]:
    """Per encoding: wire sizes and client throughput, with the wire bytes/s."""
    out: dict[str, dict[str, Any]] = {}
    for name in ENCODINGS:
        row = {**sizes[name], **rates[name].as_dict()}
        row["wire_bytes_per_s"] = sizes[name]["response_bytes"] * rates[name].calls_per_s
        out[name] = row
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    schedule = Schedule.of(args.quick)
    latency_seconds = LATENCY_SECONDS_QUICK if args.quick else LATENCY_SECONDS
    began = time.perf_counter()
    with server_process(WORKERS) as info:
        say(
            f"server process {info['pid']}: shard on port {info['lookup_port']} "
            f"({info['ram_rows']:,} RAM rows, {info['disk_rows']:,} disk rows, populated in "
            f"{info['populate_seconds']:.1f} s), echo on port {info['echo_port']}, "
            f"{WORKERS} workers each ({time.perf_counter() - began:.1f} s to start)"
        )
        address = f"127.0.0.1:{info['lookup_port']}"
        batches = id_batches(rng)

        say(f"\n(c) wire sizes of one {BATCH:,}-id lookup (LookupResponse.ByteSize(), raw stub)")
        sizes = wire_sizes(address, batches[0])
        say(f"{'encoding':>9} {'response B':>11} {'ratio':>6} {'request B':>10} {'max err':>9}")
        for name, s in sizes.items():
            say(
                f"{name:>9} {s['response_bytes']:>11,} {s['bytes_ratio']:>6.3f} "
                f"{s['request_bytes']:>10,} {s['max_abs_error']:>9.2e}"
            )

        phase = time.perf_counter()
        say(
            f"\n(a)+(c) throughput: {BATCH:,} unique ids x dim {DIM} per call "
            f"({VECTOR_BYTES / (1 << 20):g} MiB float32 out, {ID_BYTES >> 10} KiB ids in); "
            f"eval lookups (train=False) over RAM-resident ids = the RPC path; "
            f"{schedule.rounds} interleaved rounds of >= {schedule.round_seconds:g} s and "
            f">= {schedule.round_calls} calls each"
        )
        rates = run_throughput(info, batches, schedule)
        say(
            f"{'operation':>20} {'float32 bytes/s':>16} {'ids/s':>7} {'calls/s':>7} "
            f"{'median ms':>9} {'calls':>5}"
        )
        labels = {
            "echo": "raw gRPC echo",
            "gather": "raw gRPC + gather",
            "float32": "lookup float32",
            "train": "lookup train=True",
            "fp16": "lookup fp16",
            "lz4": "lookup lz4",
            "fp16_lz4": "lookup fp16+lz4",
        }
        for name, label in labels.items():
            r = rates[name]
            say(
                f"{label:>20} {mib_s(r.bytes_per_s):>16} {fmt_rate(r.ids_per_s):>7} "
                f"{r.calls_per_s:>7.1f} {r.median_call_s * 1e3:>9.2f} {r.calls:>5}"
            )
        say(f"  ({time.perf_counter() - phase:.1f} s)")

        phase = time.perf_counter()
        scaled = f" (--quick: {latency_seconds:g} s instead of {LATENCY_SECONDS:g} s)"
        say(
            f"\n(b) latency: {SAMPLE_IDS}-id eval lookups at {RATE:g}/s for "
            f"{latency_seconds:g} s{scaled if args.quick else ''}, open-loop schedule, after "
            f"{LATENCY_WARMUP_SECONDS:g} s of warm-up"
        )
        latency = run_latency(address, latency_seconds, rng)
        say(
            f"  scheduled latency p50 {latency['p50_ms']:.3f} ms, p90 {latency['p90_ms']:.3f}, "
            f"p99 {latency['p99_ms']:.3f}, p99.9 {latency['p999_ms']:.3f}, max "
            f"{latency['max_ms']:.2f}; service time p50 {latency['service_p50_ms']:.3f} ms, "
            f"p99 {latency['service_p99_ms']:.3f}; send lag p99 "
            f"{latency['send_lag_p99_ms']:.3f} ms; achieved {latency['achieved_rate']:.1f}/s "
            f"over {latency['requests']:,} requests ({time.perf_counter() - phase:.1f} s)"
        )
    return {"server": info, "sizes": sizes, "rates": rates, "latency": latency}


def build_result(args: argparse.Namespace, phases: dict[str, Any]) -> dict[str, Any]:
    rates: dict[str, Throughput] = phases["rates"]
    sizes = phases["sizes"]
    latency = phases["latency"]
    encodings = encoding_rows(sizes, rates)
    lookup, echo, train = rates["float32"], rates["echo"], rates["train"]
    result: dict[str, Any] = {
        "bench": "rpc",
        "quick": args.quick,
        "lookup_bytes_per_s": lookup.bytes_per_s,
        "lookup_ids_per_s": lookup.ids_per_s,
        "echo_bytes_per_s": echo.bytes_per_s,
        "echo_calls_per_s": echo.calls_per_s,
        "lookup_ratio": lookup.bytes_per_s / echo.bytes_per_s,
        "gather_echo_bytes_per_s": rates["gather"].bytes_per_s,
        "lookup_floor_ratio": rates["gather"].bytes_per_s / echo.bytes_per_s,
        "lookup_vs_floor": lookup.bytes_per_s / rates["gather"].bytes_per_s,
        "train_lookup_bytes_per_s": train.bytes_per_s,
        "train_lookup_ids_per_s": train.ids_per_s,
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "service_p50_ms": latency["service_p50_ms"],
        "service_p99_ms": latency["service_p99_ms"],
        "rate": latency["rate"],
        "achieved_rate": latency["achieved_rate"],
        "fp16_bytes_ratio": sizes["fp16"]["bytes_ratio"],
        "lz4_bytes_ratio": sizes["lz4"]["bytes_ratio"],
        "fp16_lz4_bytes_ratio": sizes["fp16_lz4"]["bytes_ratio"],
        **{f"{name}_bytes_per_s": encodings[name]["bytes_per_s"] for name in ENCODINGS},
        "encodings": encodings,
        "echo": echo.as_dict(),
        "gather_echo": rates["gather"].as_dict(),
        "train_lookup": train.as_dict(),
        "latency": latency,
        "server": phases["server"],
        "targets": {
            "lookup_ratio": TARGET_LOOKUP_RATIO,
            "p99_ms": TARGET_P99_MS,
            "cold_first_lookup_ms": TARGET_COLD_FIRST_LOOKUP_MS,
        },
        "settings": {
            "batch": BATCH,
            "dim": DIM,
            "populated_ids": POPULATED,
            "ram_capacity": RAM_CAPACITY,
            "vector_bytes_per_call": VECTOR_BYTES,
            "id_bytes_per_call": ID_BYTES,
            "workers": WORKERS,
            "lz4_min_bytes": LZ4_MIN_BYTES,
            "rounds": Schedule.of(args.quick).rounds,
            "round_seconds": Schedule.of(args.quick).round_seconds,
            "round_calls": Schedule.of(args.quick).round_calls,
            "seed": args.seed,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
            "numpy": np.__version__,
        },
    }
    result["ownership_storage_ratio"] = phases["ownership"]["ownership_storage_ratio"]
    result["ownership_rpc_ratio"] = phases["ownership"]["ownership_rpc_ratio"]
    cold = phases["cold"]
    result["cold_first_lookup_ms"] = cold["cold_first_lookup_ms"]
    result["cold_start"] = cold
    result["targets_met"] = {
        "cold_first_lookup_ms": cold["cold_first_lookup_ms"] is not None
        and cold["cold_first_lookup_ms"] <= TARGET_COLD_FIRST_LOOKUP_MS,
        "lookup_ratio": result["lookup_ratio"] >= TARGET_LOOKUP_RATIO,
        "p99_ms": result["p99_ms"] <= TARGET_P99_MS,
    }
    return result


def summary(result: dict[str, Any]) -> list[str]:
    """Headline figures next to the issue's targets (informational only)."""
    return [
        "== headline (targets are informational) ==",
        f"lookup {mib_s(result['lookup_bytes_per_s'])} ({fmt_rate(result['lookup_ids_per_s'])} "
        f"ids/s) vs raw gRPC echo {mib_s(result['echo_bytes_per_s'])}: lookup_ratio "
        f"{result['lookup_ratio']:.2f} [target >= {TARGET_LOOKUP_RATIO}: "
        f"{verdict(result['targets_met']['lookup_ratio'])}]",
        f"floor: raw gRPC + the shard's gather {mib_s(result['gather_echo_bytes_per_s'])}, "
        f"lookup_floor_ratio {result['lookup_floor_ratio']:.2f} (the best lookup_ratio this "
        f"gather allows); the lookup keeps {result['lookup_vs_floor']:.2f} of it",
        f"latency at {result['rate']:g}/s: p50 {result['p50_ms']:.3f} ms, p99 "
        f"{result['p99_ms']:.3f} ms [target p99 <= {TARGET_P99_MS:g} ms: "
        f"{verdict(result['targets_met']['p99_ms'])}]",
        f"fp16_bytes_ratio {result['fp16_bytes_ratio']:.3f}, lz4_bytes_ratio "
        f"{result['lz4_bytes_ratio']:.3f}, fp16+lz4 {result['fp16_lz4_bytes_ratio']:.3f}",
        f"{cold_line(result['cold_start'])} [target <= {TARGET_COLD_FIRST_LOOKUP_MS:g} ms: "
        f"{verdict(result['targets_met']['cold_first_lookup_ms'])}]",
    ]


def cold_line(cold: Mapping[str, Any]) -> str:
    """The cold-start figures in words (or why there are none)."""
    ms = cold["cold_first_lookup_ms"]
    if ms is None:
        return f"cold_first_lookup_ms: not measured ({cold.get('note', 'no figure')})"
    serving = cold.get("cold_serving_ms")
    to_serving = f", {serving:.0f} ms to SERVING" if isinstance(serving, (int, float)) else ""
    return f"cold_first_lookup_ms {ms:.1f} (median of {cold['repeats']}{to_serving})"


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    tune_allocator()  # as every Client does; done first so the echo calls run under it too
    say(
        f"embeddb rpc benchmark: {'quick' if args.quick else 'full'} mode, 1 shard on loopback "
        f"in a separate process, seed {args.seed}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}, grpcio "
        f"{grpc.__version__}, numpy {np.__version__}"
    )
    phases = run_all(args)
    say("\n(ownership) the cost of the shard-ownership check (benchmarks/ownership.py)")
    phases["ownership"] = ownership.run(args.quick, args.seed)
    repeats = COLD_REPEATS_QUICK if args.quick else COLD_REPEATS
    say(f"\n(cold) a fresh `embeddb serve`'s first lookup, {repeats} process(es) (cold_start.py)")
    phases["cold"] = cold_first_lookup(repeats, empty_cache=not args.quick)
    say(f"  {cold_line(phases['cold'])}")
    result = build_result(args, phases)
    return finish(draw(result, args.out_dir), started, summary(result), args.json_out)


if __name__ == "__main__":
    sys.exit(main())
