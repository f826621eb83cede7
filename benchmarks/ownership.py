"""The cost of the shard-ownership check (every data call checks that the shard owns each id).

Two shards over the same RAM-resident rows, identical but for their topology: ``shard 0 of 1``
(the check is skipped: one shard owns every id) and ``shard 0 of 2`` (every id goes through the
compiled check), the ids being ones shard 0 of 2 owns. Training lookups of 65,536 ids are timed
in alternating rounds, in-process (``storage``: ``Shard.lookup``) and over gRPC on loopback
(``rpc``: a raw ``Lookup`` stub against two in-process servers), so both see the same machine
state. ``ownership_*_ratio`` = checked / unchecked throughput (target >= 0.95); the check's own
cost per id is timed on the kernel alone.

Run alone (``python benchmarks/ownership.py [--quick]``); ``benchmarks/storage.py`` and
``benchmarks/rpc.py`` run it as their last phase and report its keys.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, fmt_rate, say, verdict

from embeddb.common.routing import first_foreign, shard_of
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.shard import Shard
from embeddb.server.app import ServerConfig, build_server
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

TARGET_RATIO = 0.95
BATCH = 65536
DIM = 16
ROWS = 1 << 18


def _config() -> EmbeddingConfig:
    return EmbeddingConfig.single_table(
        "t", DIM, capacity=2 * ROWS, optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    )


def _owned(rng: np.random.Generator) -> np.ndarray:
    """``ROWS`` ids that shard 0 of 2 owns."""
    candidates = rng.integers(1, 1 << 62, 3 * ROWS, dtype=np.uint64)
    owned = np.unique(candidates[shard_of(candidates, 2) == 0])
    return owned[:ROWS]


def _interleaved(
    works: dict[str, Callable[[int], object]], rounds: int, seconds: float
) -> dict[str, float]:
    """Median calls/s of each work over ``rounds`` alternating rounds of ``seconds`` each."""
    rates: dict[str, list[float]] = {name: [] for name in works}
    call = 0
    for _ in range(rounds):
        for name, work in works.items():
            began = time.perf_counter()
            n = 0
            while n < 3 or time.perf_counter() - began < seconds:
                work(call)
                call += 1
                n += 1
            rates[name].append(n / (time.perf_counter() - began))
    return {name: statistics.median(r) for name, r in rates.items()}


def run(quick: bool, seed: int = 0) -> dict[str, Any]:
    """Measure the check in-process and over gRPC; the JSON keys of the module docstring."""
    rng = np.random.default_rng(seed)
    ids = _owned(rng)
    batches = [rng.choice(ids, BATCH, replace=False) for _ in range(8)]
    rounds, seconds = (3, 0.4) if quick else (7, 1.0)
    kernel = _kernel_ns_per_id(batches[0])
    unchecked, checked = (
        Shard(_config(), shard_index=0, num_shards=1),
        Shard(_config(), shard_index=0, num_shards=2),
    )
    try:
        for shard in (unchecked, checked):
            for k in range(0, ids.size, BATCH):
                shard.lookup("t", ids[k : k + BATCH])
        storage = _interleaved(
            {
                "unchecked": lambda i: unchecked.lookup("t", batches[i % 8]),
                "checked": lambda i: checked.lookup("t", batches[i % 8]),
            },
            rounds,
            seconds,
        )
        rpc = _rpc(unchecked, checked, batches, rounds, seconds)
    finally:
        unchecked.close()
        checked.close()
    result = {
        "ownership_check_ns_per_id": kernel,
        "ownership_storage_ratio": storage["checked"] / storage["unchecked"],
        "ownership_storage_ids_per_s": {k: v * BATCH for k, v in storage.items()},
        "ownership_rpc_ratio": rpc["checked"] / rpc["unchecked"],
        "ownership_rpc_ids_per_s": {k: v * BATCH for k, v in rpc.items()},
    }
    say(
        f"ownership check: {kernel:.2f} ns/id (kernel); training lookups of {BATCH:,} ids, dim "
        f"{DIM}: in-process {fmt_rate(storage['checked'] * BATCH)} vs "
        f"{fmt_rate(storage['unchecked'] * BATCH)} ids/s (ratio "
        f"{result['ownership_storage_ratio']:.3f}), over gRPC "
        f"{fmt_rate(rpc['checked'] * BATCH)} vs {fmt_rate(rpc['unchecked'] * BATCH)} ids/s "
        f"(ratio {result['ownership_rpc_ratio']:.3f}) [target >= {TARGET_RATIO}]"
    )
    return result


def _kernel_ns_per_id(ids: np.ndarray) -> float:
    first_foreign(ids, 0, 2)  # compiled (or loaded from the cache) before timing
    began = time.perf_counter()
    calls = 0
    while time.perf_counter() - began < 0.3:
        assert first_foreign(ids, 0, 2) == -1
        calls += 1
    return (time.perf_counter() - began) / (calls * ids.size) * 1e9


def _rpc(
    unchecked: Shard, checked: Shard, batches: list[np.ndarray], rounds: int, seconds: float
) -> dict[str, float]:
    servers = [build_server(s, ServerConfig(workers=2)) for s in (unchecked, checked)]
    options = [("grpc.max_receive_message_length", 64 << 20)]
    channels = [grpc.insecure_channel(f"127.0.0.1:{s.port}", options=options) for s in servers]
    try:
        stubs = [pb_grpc.EmbeddingStoreServiceStub(c) for c in channels]
        requests = [
            pb.LookupRequest(table="t", ids=wire.encode_ids(b), train=True) for b in batches
        ]
        return _interleaved(
            {
                "unchecked": lambda i: stubs[0].Lookup(requests[i % 8]),
                "checked": lambda i: stubs[1].Lookup(requests[i % 8]),
            },
            rounds,
            seconds,
        )
    finally:
        for channel in channels:
            channel.close()
        for server in servers:
            server.stop(0)


def summary(result: dict[str, Any]) -> list[str]:
    worst = min(result["ownership_storage_ratio"], result["ownership_rpc_ratio"])
    return [
        f"ownership_storage_ratio {result['ownership_storage_ratio']:.3f}, ownership_rpc_ratio "
        f"{result['ownership_rpc_ratio']:.3f} [target >= {TARGET_RATIO}: "
        f"{verdict(worst >= TARGET_RATIO)}]"
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds of 0.4 s instead of 7 of 1 s"
    )
    parser.add_argument("--seed", type=int, default=0)
    add_out_dir_argument(parser, "ownership")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = {"bench": "ownership", "quick": args.quick, **run(args.quick, args.seed)}
    return finish(draw(result, args.out_dir), started, summary(result), args.json_out)


if __name__ == "__main__":
    sys.exit(main())
