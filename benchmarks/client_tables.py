"""Client and embedding-worker cost per table: one shared table against one table per feature.

Measures, in one process and without a server, what the embedding worker and its
:class:`~embeddb.client.AsyncClient` do per training step of a Criteo-shaped batch (26 ID
features of one id per sample, dim 16): the lookup plan (encode, dedup per table), the client's
``LookupMany`` request building and serialization, the parsing of the answer and its scatter
into each table's vectors, pooling, then the gradient un-pooling and per-id summing, and the
``ApplyGradientsMany`` request building and serialization. The shards are replaced by an
in-process stub that answers each request with bytes prepared ahead (so the shards' work is not
counted; the client's parsing of the answer is).

Two embedding layouts (as ``benchmarks/train.py --layout``): ``shared`` (the 26 features in one
feature group, one table) and ``per-feature`` (26 tables). Runs alternate between the layouts
(``--rounds`` rounds of ``--steps`` steps each) and the best round of each counts. Printed:
steps/s of each layout and batch size, ``client_table_layout_ratio_b128`` / ``_b512``
(per-feature steps/s divided by shared steps/s: 1.0 means the table count costs nothing; the
features' ids never collide, so both layouts look up the same number of distinct rows),
the parsing of one ``LookupMany`` answer alone (``parse_us_1part``: 1 part of 65536 rows,
``parse_us_26parts``: 26 parts of 60 rows, dim 16, µs each, best of ``--rounds``; the shards'
layout walk that the client uses, the general walk, and protobuf's C parser with the
conversion of its parts, interleaved in one run; ``parse_speedup_26parts`` = general walk /
layout walk), and a cProfile top-20 (cumulative time) of the per-feature layout at batch 128.

    PYTHONPATH=. python benchmarks/client_tables.py [--quick] [--shards 1] [--no-profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import pstats
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import embeddb
from embeddb.client import AsyncClient, ClientOptions
from embeddb.client.topology import DEFAULT_LIMITS, budget
from embeddb.config import EmbeddingConfig
from embeddb.trainer.embedding.worker import EmbeddingWorker, EmbeddingWorkerConfig
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb

DIM = 16
FEATURES = 26
# Distinct values per feature, shaped like Criteo's categorical columns (small to very large).
CARDINALITY = [
    1460,
    583,
    10_131_227,
    2_202_608,
    305,
    24,
    12_517,
    633,
    3,
    93_145,
    5_683,
    8_351_593,
    3_194,
    27,
    14_992,
    5_461_306,
    10,
    5_652,
    2_173,
    4,
    7_046_547,
    18,
    15,
    286_181,
    105,
    142_572,
]


def embedding_yaml(layout: str) -> str:
    names = [f"C{i}" for i in range(1, FEATURES + 1)]
    lines = ["feature_index_prefix_bit: 8", "slots_config:"]
    lines += [f"  {n}: {{dim: {DIM}}}" for n in names]
    if layout == "shared":
        lines += ["feature_groups:", f"  criteo: [{', '.join(names)}]"]
    lines += ["defaults:", "  capacity: 1000000"]
    return "\n".join(lines) + "\n"


def batches(batch: int, count: int, seed: int = 0) -> list[list[tuple[str, Any, None]]]:
    """``count`` batches of 26 features, ids drawn Zipf-like within each cardinality, each
    feature's in its own range (as hashed Criteo values are), so that both layouts hold the same
    distinct rows and the ratio measures the table count alone."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        features = []
        for i, card in enumerate(CARDINALITY):
            ranks = rng.zipf(1.2, batch).astype(np.uint64) % np.uint64(card)
            ranks += np.uint64(i << 40)
            features.append((f"C{i + 1}", ranks, None))
        out.append(features)
    return out


class _Stub:
    """A shard's stub: answers from a cache of prepared answers (the shard's work not counted);
    the client's serialization of each request and parsing of each answer are counted."""

    def __init__(self) -> None:
        self._answers: dict[bytes, bytes] = {}

    async def LookupMany(self, request: Any, timeout: float, metadata: Any) -> Any:
        data = request.SerializeToString()
        answer = self._answers.get(data)
        if answer is None:
            answer = self._answer(request)
            self._answers[data] = answer
        return wire.parse_lookup_many_response(answer)

    async def ApplyGradientsMany(self, request: Any, timeout: float, metadata: Any) -> Any:
        request.SerializeToString()
        return pb.ApplyGradientsManyResponse(
            results=[pb.ApplyGradientsResponse(applied=u.ids.shape[0]) for u in request.updates]
        )

    @staticmethod
    def _answer(request: Any) -> bytes:
        parts = []
        for part in request.lookups:
            ids = wire.decode_ids(part.ids, "ids")
            vectors = (ids[:, None] % np.uint64(97)).astype(np.float32) * np.ones(DIM, np.float32)
            parts.append(wire.encode_lookup_response(vectors))
        return wire.encode_lookup_many_response(parts).SerializeToString()


def make_worker(layout: str, shards: int) -> EmbeddingWorker:
    config = EmbeddingConfig.from_yaml_text(embedding_yaml(layout))
    options = ClientOptions(tune_allocator=False)
    client = AsyncClient([f"127.0.0.1:{9000 + k}" for k in range(shards)], options)
    client._stubs = [_Stub() for _ in range(shards)]
    client._budgets = tuple(budget(DEFAULT_LIMITS, options) for _ in range(shards))
    client._dims = {name: t.dim for name, t in config.tables.items()}
    return EmbeddingWorker(client, config, EmbeddingWorkerConfig(max_staleness=1))


async def run_steps(
    worker: EmbeddingWorker, data: list[list[tuple[str, Any, None]]], grads: list[Any], ref: int
) -> int:
    for features in data:
        ref += 1
        await worker.lookup(ref, features, True)
        task = worker.push_gradients(ref, grads)
        assert task is not None
        await task
    return ref


def measure(batch: int, steps: int, rounds: int, shards: int) -> dict[str, float]:
    data = batches(batch, steps)
    grads = [np.full((batch, DIM), 0.01, np.float32) for _ in range(FEATURES)]
    workers = {layout: make_worker(layout, shards) for layout in ("shared", "per-feature")}
    best = {layout: float("inf") for layout in workers}
    loop = asyncio.new_event_loop()
    ref = 0
    try:
        for worker in workers.values():  # warm-up: compile kernels, fill answer caches
            ref = loop.run_until_complete(run_steps(worker, data, grads, ref))
        for _ in range(rounds):
            for layout, worker in workers.items():
                started = time.perf_counter()
                ref = loop.run_until_complete(run_steps(worker, data, grads, ref))
                best[layout] = min(best[layout], time.perf_counter() - started)
    finally:
        loop.close()
    return {layout: steps / seconds for layout, seconds in best.items()}


def parse_parsers() -> dict[str, Callable[[bytes], Any]]:
    """The parsers compared: the client's, and the ones it may hand over to (where present)."""
    parsers: dict[str, Callable[[bytes], Any]] = {"client": wire.parse_lookup_many_response}
    try:
        from embeddb.transport import wire_decode
    except ImportError:  # before issue 25: the client's parser was the general walk
        return parsers
    parsers["general"] = wire_decode._walk_lookup_many
    parsers["protobuf"] = wire_decode._parse_small_lookup_many  # many small parts only
    return parsers


def measure_parse(rounds: int) -> dict[str, dict[str, float]]:
    """µs to parse one answer, per parser and answer shape (best of ``rounds``, interleaved)."""
    answers = {
        "1part": (1, 65536),
        "26parts": (26, 60),
    }
    data = {
        key: wire.encode_lookup_many_response(
            [wire.encode_lookup_response(np.ones((rows, DIM), np.float32)) for _ in range(parts)]
        ).SerializeToString()
        for key, (parts, rows) in answers.items()
    }
    parsers = parse_parsers()
    best: dict[str, dict[str, float]] = {key: {} for key in answers}
    for _ in range(rounds):
        for key, answer in data.items():
            for name, parse in parsers.items():
                if name == "protobuf" and key == "1part":  # copies 4 MiB twice: not a contender
                    continue
                number = 200
                seconds = timeit.timeit(functools.partial(parse, answer), number=number)
                micros = seconds / number * 1e6
                best[key][name] = min(best[key].get(name, float("inf")), micros)
    return best


def profile(batch: int, steps: int, shards: int) -> str:
    data = batches(batch, steps)
    grads = [np.full((batch, DIM), 0.01, np.float32) for _ in range(FEATURES)]
    worker = make_worker("per-feature", shards)
    loop = asyncio.new_event_loop()
    try:
        ref = loop.run_until_complete(run_steps(worker, data, grads, 0))
        profiler = cProfile.Profile()
        profiler.enable()
        loop.run_until_complete(run_steps(worker, data, grads, ref))
        profiler.disable()
    finally:
        loop.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(20)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 100)
    rounds = args.rounds or (3 if args.quick else 7)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0:3]
    print(f"embeddb {Path(embeddb.__file__).parent}  loadavg {load}  shards {args.shards}")
    print(f"steps {steps} x {rounds} rounds (best round counts)")
    for batch in (128, 512):
        rate = measure(batch, steps, rounds, args.shards)
        ratio = rate["per-feature"] / rate["shared"]
        print(
            f"batch {batch}: shared {rate['shared']:.0f} steps/s, per-feature "
            f"{rate['per-feature']:.0f} steps/s"
        )
        print(f"client_table_layout_ratio_b{batch} = {ratio:.3f}")
    parse = measure_parse(rounds)
    for key, timings in parse.items():
        line = ", ".join(f"{name} {micros:.1f}" for name, micros in timings.items())
        print(f"parse_us_{key} = {timings['client']:.1f}  ({line} µs)")
    if "general" in parse["26parts"]:
        speedup = parse["26parts"]["general"] / parse["26parts"]["client"]
        print(f"parse_speedup_26parts = {speedup:.2f}")
    with open("/proc/loadavg") as f:
        print(f"loadavg after {f.read().split()[0:3]}")
    if not args.no_profile:
        print("cProfile, per-feature layout (26 tables), batch 128, cumulative top 20:")
        print(profile(128, steps, args.shards))


if __name__ == "__main__":
    main()
