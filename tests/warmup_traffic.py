"""Real shard and client traffic, run in a fresh process by tests/test_warmup.py.

``python -m tests.warmup_traffic MODE DIR`` (MODE ``core``, ``client`` or ``none``: which
warm-up runs first) imports every embeddb module outside the trainer, finds every numba
dispatcher in them, runs the warm-up, records each dispatcher's signatures, then drives real
traffic: shards of every optimizer (dims the warm-up never used, one stripe and several,
eviction, disk overflow, admission, NaN gradients, assign, delete, snapshot, crash recovery's
log replay) in process and over gRPC through the sync and async clients. It prints one JSON
object: the signatures each dispatcher had after the warm-up (``warm``) and those the traffic
added (``added``), keyed ``module.function``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import numpy as np
from numba.core.registry import CPUDispatcher

import embeddb
from embeddb.config import (
    EmbeddingConfig,
    InitializerConfig,
    InitializerKind,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.shard import Shard

Signatures = dict[str, list[str]]


def dispatchers() -> dict[str, CPUDispatcher]:
    """Every compiled kernel called from Python, in every embeddb module outside the trainer
    (torch); ``inline="always"`` helpers are compiled only into their callers."""
    found: dict[str, CPUDispatcher] = {}
    for info in pkgutil.walk_packages(embeddb.__path__, "embeddb."):
        if info.name.startswith("embeddb.trainer") or info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                isinstance(value, CPUDispatcher)
                and value.__module__ == info.name
                and value.targetoptions.get("inline") != "always"
            ):
                found[f"{info.name}.{name}"] = value
    return found


def signatures(kernels: dict[str, CPUDispatcher]) -> Signatures:
    return {name: sorted(map(str, d.signatures)) for name, d in kernels.items()}


def _config() -> EmbeddingConfig:
    tables = {
        "sgd": TableConfig(
            name="sgd",
            dim=5,
            capacity=400,
            optimizer=OptimizerConfig(kind=OptimizerKind.SGD),
            weight_bound=1.0,
        ),
        "adagrad": TableConfig(
            name="adagrad",
            dim=13,
            capacity=400,
            initializer=InitializerConfig(kind=InitializerKind.NORMAL),
            admit_probability=0.7,
        ),
        "shared": TableConfig(
            name="shared",
            dim=3,
            capacity=40,  # fewer rows than one stripe's minimum: one stripe
            optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD, vectorwise_shared=True),
            initializer=InitializerConfig(kind=InitializerKind.ZEROS),
        ),
        "adam": TableConfig(
            name="adam", dim=16, capacity=400, optimizer=OptimizerConfig(kind=OptimizerKind.ADAM)
        ),
    }
    ram = RamTierConfig(stripes=4, min_stripe_rows=64, eviction_chunk=0.05)
    return EmbeddingConfig(tables=tables, store=StoreConfig(ram=ram))


def _in_process(config: EmbeddingConfig, root: Path) -> None:
    rng = np.random.default_rng(1)
    shard = Shard(config, root / "in-process")
    for table in config.tables.values():
        for _ in range(3):  # more distinct ids than RAM holds: eviction, then overflow
            ids = rng.integers(0, 3000, 1500).astype(np.uint64)
            vectors = shard.lookup(table.name, ids)
            shard.lookup(table.name, ids[:50], train=False)
            grads = np.ones_like(vectors)
            grads[3] = np.nan
            shard.apply_gradients(table.name, ids, grads)
            readonly = ids[:64].copy()
            readonly.flags.writeable = False
            frozen = np.ones((64, table.dim), dtype=np.float32)
            frozen.flags.writeable = False
            shard.apply_gradients(table.name, readonly, frozen)
            shard.lookup(table.name, readonly)
            shard.assign(table.name, ids[:20], np.ones((20, table.dim), dtype=np.float32))
            shard.delete(table.name, ids[20:30])
            shard.peek(table.name, ids[:10])
    shard.lookup_many([("sgd", [1, 2, 3], True), ("adam", [4, 5], False)])
    shard.apply_gradients_many(
        [("sgd", [1, 2], np.ones((2, 5), np.float32)), ("adam", [4], np.ones((1, 16), np.float32))]
    )
    shard.snapshot()
    shard.assign("adam", [9, 10], np.ones((2, 16), dtype=np.float32))
    shard.delete("sgd", [1, 2])
    shard.discard()  # as a crash: the next open replays the update log
    with Shard(config, root / "in-process") as reopened:
        reopened.lookup("adam", [9, 10, 11])


def _over_grpc(config: EmbeddingConfig, root: Path) -> None:
    from embeddb.client import AsyncClient, Client
    from embeddb.server import ServerConfig, build_server

    shards = [Shard(config, root / f"served-{i}", shard_index=i, num_shards=2) for i in range(2)]
    servers = [
        build_server(shard, ServerConfig(shard_index=i, num_shards=2))
        for i, shard in enumerate(shards)
    ]
    addresses = [f"127.0.0.1:{server.port}" for server in servers]
    rng = np.random.default_rng(2)
    try:
        with Client(addresses) as client:
            for table in config.tables.values():
                ids = rng.integers(0, 3000, 1200).astype(np.uint64)
                vectors = client.lookup(table.name, ids)
                client.lookup(table.name, ids, train=False)
                client.apply_gradients(table.name, ids, np.ones_like(vectors))
                repeated = np.repeat(ids[:15], 2)  # the last vector of an id wins
                client.assign(table.name, repeated, np.ones((30, table.dim), np.float32))
                readonly = ids[:100].copy()
                readonly.flags.writeable = False
                client.lookup(table.name, readonly)
                client.delete(table.name, ids[:5])
            both = {"sgd": ids[:40], "adam": ids[:40]}
            client.lookup_many(both)
            client.apply_gradients_many(
                {name: (part, np.ones((40, config.tables[name].dim), np.float32))
                 for name, part in both.items()}
            )  # fmt: skip

        async def use_async() -> None:
            async with AsyncClient(addresses) as client:
                got = await client.lookup("adagrad", ids)
                await client.apply_gradients("adagrad", ids, np.ones_like(got))

        asyncio.run(use_async())
    finally:
        for server in servers:
            server.stop(1)
        for shard in shards:
            shard.close()


def main(mode: str, root: Path) -> None:
    kernels = dispatchers()
    if mode == "core":
        from embeddb.engine.warmup import warm_up_core

        warm_up_core()
    elif mode == "client":
        from embeddb.client import warm_up_client

        warm_up_client()
    warm = signatures(kernels)
    config = _config()
    _in_process(config, root)
    _over_grpc(config, root)
    after = signatures(kernels)
    added = {k: sorted(set(after[k]) - set(warm[k])) for k in kernels}
    print(json.dumps({"warm": warm, "added": {k: v for k, v in added.items() if v}}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
