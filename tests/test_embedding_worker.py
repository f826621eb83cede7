"""The embedding worker: its core (driven directly on an asyncio loop) and its process facade,
against real shards served in-process on port 0."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from embeddb.client import AsyncClient, Client, ClientOptions
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError
from embeddb.features.batch import IDTypeFeature, IDTypeFeatureWithSingleID
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.embedding.worker import EmbeddingWorker, EmbeddingWorkerConfig
from embeddb.trainer.errors import (
    EmbeddingWorkerError,
    GradientPushFailedError,
    LookupFailedError,
    TrainerError,
)
from embeddb.trainer.pooling import Pooling
from tests.support import eventually_async
from tests.trainer_harness import Shards, serve_shards

LR = 0.5
CONFIG = EmbeddingConfig.from_yaml_text(
    f"""
feature_index_prefix_bit: 8
slots_config:
  user: {{dim: 4}}
  city: {{dim: 4}}
  tags: {{dim: 4, sqrt_scaling: true}}
  history: {{dim: 4, embedding_summation: false, sample_fixed_size: 3}}
  item: {{dim: 4, hash_stack_config: {{hash_stack_rounds: 2, embedding_size: 50}}}}
feature_groups:
  person: [user, city]
defaults:
  optimizer: {{type: sgd, lr: {LR}}}
  initializer: {{type: uniform, low: -1.0, high: 1.0}}
  capacity: 1000
"""
)
FAST = EmbeddingWorkerConfig(max_staleness=2, retries=1, retry_backoff=0.01, shard_timeout=2.0)


def features(seed: int = 0, batch_size: int = 6) -> list[IDTypeFeature]:
    """One batch of every kind: single ids, ragged with empty samples, long sequences, a
    hash-stacked feature with duplicates; ``user`` and ``city`` share ids (one table)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=batch_size)
    counts[0] = 0
    long = rng.integers(0, 6, size=batch_size)
    long[1] = 5
    return [
        IDTypeFeatureWithSingleID("user", rng.integers(0, 5, size=batch_size)),
        IDTypeFeature("city", [rng.integers(0, 5, size=n) for n in counts]),
        IDTypeFeature("tags", [rng.integers(0, 30, size=n) for n in counts[::-1]]),
        IDTypeFeature("history", [rng.integers(0, 40, size=n) for n in long]),
        IDTypeFeatureWithSingleID("item", rng.integers(0, 3, size=batch_size)),
    ]


def like(pooled: list[Any], value: float = 0.0) -> list[npt.NDArray[np.float32]]:
    """Gradients of the shape of each pooled output, all ``value``."""
    return [np.full_like(p[0] if isinstance(p, tuple) else p, value) for p in pooled]


def wire(feats: list[IDTypeFeature]) -> list[IdFeature]:
    return [(f.name, f.values, None if f.single_id else f.offsets) for f in feats]


def table_ids(name: str, raw: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """The table ids of raw ids: ``(n,)``, or ``(n, rounds)`` with a hash stack."""
    return CONFIG.features[name].encode(np.asarray(raw, dtype=np.uint64))


def expected_pooled(client: Client, feats: list[IDTypeFeature]) -> list[Any]:
    """Pooling the slow way: a loop over samples, vectors read with train=False."""
    out: list[Any] = []
    for f in feats:
        spec = CONFIG.features[f.name]

        def vector(raw: int, name: str = f.name, table: str = spec.table) -> Any:
            keys = np.atleast_1d(table_ids(name, [raw])[0])
            return client.lookup(table, keys, train=False).sum(axis=0)

        if not spec.embedding_summation:
            L = spec.sample_fixed_size
            padded = np.zeros((f.batch_size, L, 4), np.float32)
            mask = np.zeros((f.batch_size, L), bool)
            for i in range(f.batch_size):
                for p, raw in enumerate(f.sample(i)[:L]):
                    padded[i, p], mask[i, p] = vector(int(raw)), True
            out.append((padded, mask))
            continue
        pooled = np.zeros((f.batch_size, 4), np.float32)
        for i in range(f.batch_size):
            ids = f.sample(i)
            if ids.size:
                pooled[i] = sum(vector(int(raw)) for raw in ids)
                if spec.sqrt_scaling:
                    pooled[i] /= np.sqrt(ids.size)
        out.append(pooled)
    return out


def expected_gradients(
    feats: list[IDTypeFeature], grads: list[npt.NDArray[np.float32]]
) -> dict[tuple[str, int], npt.NDArray[np.float64]]:
    """(table, table id) -> summed gradient, the slow way."""
    sums: dict[tuple[str, int], Any] = defaultdict(lambda: np.zeros(4))
    for f, g in zip(feats, grads, strict=True):
        spec = CONFIG.features[f.name]
        for i in range(f.batch_size):
            ids = f.sample(i)
            for p, raw in enumerate(ids):
                if not spec.embedding_summation:
                    if p >= spec.sample_fixed_size:
                        continue
                    row = g[i, p]
                elif spec.sqrt_scaling:
                    row = g[i] / np.sqrt(ids.size)
                else:
                    row = g[i]
                for key in np.atleast_1d(table_ids(f.name, [raw])[0]):
                    sums[(spec.table, int(key))] += row
    return sums


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Shards]:
    with serve_shards(CONFIG, None, 2) as out:
        yield out


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_worker(shards: Shards, config: EmbeddingWorkerConfig = FAST, **kw: Any) -> EmbeddingWorker:
    client = AsyncClient(
        shards.addresses, ClientOptions(timeout=config.shard_timeout, retries=config.retries)
    )
    return EmbeddingWorker(client, CONFIG, config, **kw)


# ---------------------------------------------------------------------- the core
def test_lookup_pools_every_kind_of_feature_like_the_slow_reference(shards: Shards) -> None:
    feats = features()

    async def main() -> list[Any]:
        worker = make_worker(shards)
        await worker.start()
        pooled = await worker.lookup(7, wire(feats), train=True)
        assert worker.staleness == 1
        worker.discard(7)
        assert worker.staleness == 0
        await worker.close()
        return pooled

    pooled = run(main())
    with Client(shards.addresses) as client:
        want = expected_pooled(client, feats)
        # Ids beyond sample_fixed_size were never looked up, so they have no row.
        history = feats[3]
        dropped = [int(r) for i in range(6) for r in history.sample(i)[3:]]
        kept = {int(r) for i in range(6) for r in history.sample(i)[:3]}
        lonely = [r for r in dropped if r not in kept]
        assert lonely, "the batch should truncate some ids"
        assert not client.lookup("history", table_ids("history", lonely), train=False).any()
    assert len(pooled) == len(want)
    for got, exp in zip(pooled, want, strict=True):
        if isinstance(exp, tuple):
            np.testing.assert_allclose(got[0], exp[0], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(got[1], exp[1])
            assert got[0].dtype == np.float32
        else:
            assert got.dtype == np.float32 and got.shape == exp.shape
            np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)


def test_gradients_are_unpooled_summed_per_id_and_applied(shards: Shards) -> None:
    feats = features(seed=3)
    rng = np.random.default_rng(1)

    async def main() -> list[Any]:
        worker = make_worker(shards)
        pooled = await worker.lookup(0, wire(feats), train=True)
        return pooled

    # Look up (creating the rows), read them, push, read again: SGD moved each row by
    # -lr * (its summed gradient), with shared rows (user/city) summed across features.
    async def push(grads: list[Any]) -> None:
        worker = make_worker(shards)
        await worker.lookup(0, wire(feats), train=True)
        task = worker.push_gradients(0, grads)
        assert task is not None
        await worker.flush()
        assert worker.staleness == 0
        assert worker.stats()["embeddb_trainer_gradient_pushes_total"] == 1
        await worker.close()

    pooled = run(main())
    grads = [
        (rng.normal(size=p[0].shape) if isinstance(p, tuple) else rng.normal(size=p.shape)).astype(
            np.float32
        )
        for p in pooled
    ]
    want = expected_gradients(feats, grads)
    with Client(shards.addresses) as client:
        before = {k: client.lookup(k[0], [k[1]], train=False)[0] for k in want}
        run(push(grads))
        for key, grad in want.items():
            after = client.lookup(key[0], [key[1]], train=False)[0]
            np.testing.assert_allclose(after, before[key] - LR * grad, rtol=1e-5, atol=1e-5)


def test_a_feature_without_gradient_leaves_its_table_alone(shards: Shards) -> None:
    feats = features(seed=4)[:1] + features(seed=4)[4:]  # user (table person) and item

    async def main() -> None:
        worker = make_worker(shards)
        pooled = await worker.lookup(0, wire(feats), train=True)
        before = await worker._client.lookup("item", table_ids("item", [0, 1, 2]).ravel(), False)
        worker.push_gradients(0, [np.ones_like(pooled[0]), None])
        await worker.flush()
        after = await worker._client.lookup("item", table_ids("item", [0, 1, 2]).ravel(), False)
        np.testing.assert_array_equal(before, after)
        await worker.close()

    run(main())


def test_the_staleness_bound_holds_and_admits_in_order(shards: Shards) -> None:
    feats = wire(features())

    async def main() -> None:
        worker = make_worker(shards)
        tasks = [asyncio.create_task(worker.lookup(ref, feats, True)) for ref in range(5)]
        await asyncio.wait_for(asyncio.gather(tasks[0], tasks[1]), 10)
        await eventually_async(lambda: worker.waiting == 3, 10, "3 lookups held back")
        done = [t.done() for t in tasks]
        assert done == [True, True, False, False, False]
        assert worker.staleness == 2
        # An evaluation lookup is never held back by the bound.
        await asyncio.wait_for(worker.lookup(99, feats, False), 5)
        for ref in range(5):
            pooled = await tasks[ref]
            assert worker.staleness <= 2
            worker.push_gradients(ref, like(pooled))
            await asyncio.sleep(0)
        await worker.flush()
        stats = worker.stats()
        assert stats["embeddb_trainer_staleness_peak"] == 2
        assert stats["embeddb_trainer_staleness"] == 0
        assert stats['embeddb_trainer_lookups_total{train="true"}'] == 5
        assert stats['embeddb_trainer_lookups_total{train="false"}'] == 1
        assert stats["embeddb_trainer_gradient_pushes_total"] == 5
        await worker.close()

    run(main())


def test_sync_staleness_one_sees_the_previous_update(shards: Shards) -> None:
    """max_staleness=1 (the sync mode): the lookup of batch 1, sent before batch 0's gradients,
    returns only after they were applied, and sees the updated vector."""
    feats = [IDTypeFeatureWithSingleID("user", [3])]

    async def main() -> None:
        worker = make_worker(shards, EmbeddingWorkerConfig(max_staleness=1))
        first = await worker.lookup(0, wire(feats), True)
        second = asyncio.create_task(worker.lookup(1, wire(feats), True))
        await eventually_async(lambda: worker.waiting == 1, 10, "batch 1 held back")
        assert not second.done()
        grad = np.full((1, 4), 0.25, np.float32)
        worker.push_gradients(0, [grad])
        pooled = await asyncio.wait_for(second, 5)
        np.testing.assert_allclose(pooled[0], first[0] - LR * grad, rtol=1e-6)
        worker.discard(1)
        await worker.close()

    run(main())


def test_batches_without_gradients_expire_and_free_the_window(shards: Shards) -> None:
    now = [0.0]
    feats = wire(features())

    async def main() -> None:
        config = EmbeddingWorkerConfig(max_staleness=1, batch_timeout=10.0)
        worker = make_worker(shards, config, clock=lambda: now[0])
        await worker.lookup(0, feats, True)
        blocked = asyncio.create_task(worker.lookup(1, feats, True))
        await eventually_async(lambda: worker.waiting == 1, 10, "batch 1 held back")
        assert worker.expire() == [] and not blocked.done()
        now[0] = 10.5
        assert worker.expire() == [0]
        pooled = await asyncio.wait_for(blocked, 5)  # admitted once batch 0 expired
        assert worker.staleness == 1
        # Gradients of the expired batch arrive late: dropped and counted, never applied.
        assert worker.push_gradients(0, like(pooled, 1.0)) is None
        stats = worker.stats()
        assert stats["embeddb_trainer_batches_expired_total"] == 1
        assert stats["embeddb_trainer_gradients_dropped_total"] == 1
        await worker.close()
        assert worker.stats()["embeddb_trainer_batches_discarded_total"] == 1  # batch 1

    run(main())


@pytest.mark.slow
def test_expiry_runs_by_itself(shards: Shards, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        worker = make_worker(shards, EmbeddingWorkerConfig(max_staleness=1, batch_timeout=0.2))
        expiry = asyncio.create_task(worker.run_expiry())
        await worker.lookup(0, wire(features()), True)
        await asyncio.wait_for(worker.lookup(1, wire(features()), True), 5)
        assert worker.stats()["embeddb_trainer_batches_expired_total"] == 1
        expiry.cancel()
        await worker.close()

    with caplog.at_level("WARNING", logger="embeddb.trainer"):
        run(main())
    assert any("expired" in r.getMessage() for r in caplog.records)


def test_discard_during_lookup_releases_the_batch_when_it_lands(shards: Shards) -> None:
    async def main() -> None:
        worker = make_worker(shards, EmbeddingWorkerConfig(max_staleness=1))
        await worker.lookup(0, wire(features()), True)
        waiting = asyncio.create_task(worker.lookup(1, wire(features()), True))
        await eventually_async(lambda: worker.waiting == 1, 10, "batch 1 held back")
        worker.discard(1)  # still waiting for admission
        worker.discard(0)
        await asyncio.wait_for(waiting, 5)
        assert worker.staleness == 0
        assert worker.stats()["embeddb_trainer_batches_discarded_total"] == 2
        await worker.close()

    run(main())


def test_evaluation_lookups_insert_nothing(shards: Shards) -> None:
    async def main() -> None:
        worker = make_worker(shards)
        pooled = await worker.lookup(0, wire(features()), False)
        assert worker.staleness == 0
        assert all(not (p[0] if isinstance(p, tuple) else p).any() for p in pooled)
        await worker.close()

    run(main())
    assert all(shard.stats().totals()["rows"] == 0 for shard in shards.shards)


def test_a_shard_down_fails_the_lookup_after_retries(shards: Shards) -> None:
    async def main() -> None:
        worker = make_worker(shards)
        await worker.lookup(0, wire(features()), True)
        shards.stop(1)
        with pytest.raises(LookupFailedError, match="Unavailable") as info:
            await worker.lookup(1, wire(features()), True)
        assert info.value.cause == "UnavailableError"
        # One LookupMany per shard for every table; the message names the batch's tables.
        assert "LookupMany failed" in str(info.value) and "'person'" in str(info.value)
        assert worker.staleness == 1  # batch 1 released, batch 0 still buffered
        stats = worker.stats()
        assert stats['embeddb_trainer_failures_total{operation="lookup"}'] == 1
        assert stats['embeddb_trainer_retries_total{operation="lookup"}'] >= 1
        await worker.close()

    run(main())


def test_a_failed_push_is_reported_and_counted(shards: Shards) -> None:
    failures: list[TrainerError] = []

    async def main() -> None:
        worker = make_worker(shards, on_failure=failures.append)
        pooled = await worker.lookup(0, wire(features()), True)
        shards.stop(0)
        shards.stop(1)
        worker.push_gradients(0, like(pooled, 1.0))
        await worker.flush()
        assert worker.staleness == 0
        stats = worker.stats()
        assert stats['embeddb_trainer_failures_total{operation="gradient_push"}'] == 1
        await worker.close()

    run(main())
    assert len(failures) == 1 and isinstance(failures[0], GradientPushFailedError)
    assert "batch 0" in str(failures[0])
    assert "ApplyGradientsMany failed" in str(failures[0]) and "'person'" in str(failures[0])


def test_close_drains_pending_pushes(shards: Shards) -> None:
    feats = [IDTypeFeatureWithSingleID("user", [1, 2])]

    async def main() -> None:
        worker = make_worker(shards)
        await worker.lookup(0, wire(feats), True)
        worker.push_gradients(0, [np.ones((2, 4), np.float32)])
        await worker.close()  # no flush: close waits for the push
        with pytest.raises(EmbeddingWorkerError, match="closing"):
            await worker.lookup(1, wire(feats), True)

    with Client(shards.addresses) as client:
        keys = table_ids("user", [1, 2])
        run(main())
        after = client.lookup("person", keys, train=False)
    assert after.any()
    assert sum(shard.stats().tables["person"].rows for shard in shards.shards) == 2


def test_start_checks_tables_and_dims(shards: Shards) -> None:
    wider = EmbeddingConfig.from_yaml_text("slots_config: {user: {dim: 8, table: person}}")
    unknown = EmbeddingConfig.from_yaml_text("slots_config: {user: {dim: 4}}")

    async def main() -> None:
        for config, error in ((wider, "has dim 4, the config says 8"), (unknown, "no table")):
            client = AsyncClient(shards.addresses)
            with pytest.raises(ConfigError, match=error):
                await EmbeddingWorker(client, config, FAST).start()
            await client.close()

    run(main())


def test_worker_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        EmbeddingWorkerConfig(max_staleness=0)
    with pytest.raises(ConfigError, match="batch_timeout"):
        EmbeddingWorkerConfig(batch_timeout=0)
    with pytest.raises(ConfigError, match="pooling"):
        EmbeddingWorkerConfig(pooling={"f": "median"})  # type: ignore[dict-item]
    assert EmbeddingWorkerConfig(pooling={"f": "mean"}).pooling == {"f": Pooling.MEAN}  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="log_level"):
        EmbeddingWorkerConfig(log_level="chatty")
