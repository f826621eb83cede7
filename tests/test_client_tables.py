"""Several tables as one concatenated batch (issue 25): ``TableBatches``, the client's
``lookup_tables`` / ``apply_gradients_tables`` plans, the wire's part encoders and the embedding
worker's plan, pooling and un-pooling over concatenated arrays, each against the per-table path
it replaces (same requests byte for byte, same results). No server."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from embeddb.client import AsyncClient, ClientOptions, plans, table_plans
from embeddb.client.batching import Budget, IdBatch, TableBatches, split_many
from embeddb.config import EmbeddingConfig
from embeddb.errors import InvalidArgumentError
from embeddb.trainer.embedding.plan import plan_lookup, pool_lookup, pooling_specs
from embeddb.trainer.embedding.worker import EmbeddingWorker
from embeddb.trainer.pooling import Pooling
from embeddb.transport import wire
from embeddb.v1 import embeddb_pb2 as pb

CONFIG = EmbeddingConfig.from_yaml_text(
    """
feature_index_prefix_bit: 8
slots_config:
  user: {dim: 4}
  city: {dim: 4}
  tags: {dim: 4, sqrt_scaling: true}
  history: {dim: 4, embedding_summation: false, sample_fixed_size: 3}
  item: {dim: 4, hash_stack_config: {hash_stack_rounds: 2, embedding_size: 50}}
  word: {dim: 4, table: words}
  title: {dim: 4, table: words}
feature_groups:
  person: [user, city]
defaults:
  capacity: 1000
"""
)


def random_tables(rng: np.random.Generator) -> tuple[list[str], list[npt.NDArray[np.uint64]]]:
    names = ["a", "empty", "b", "c"]
    ids = [rng.integers(0, n, size=s).astype(np.uint64) for n, s in [(9, 40), (5, 0), (50, 30)]]
    ids.append(np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64))
    return names, ids


def concatenated(names: list[str], ids: list[npt.NDArray[np.uint64]]) -> TableBatches:
    bounds = np.concatenate([[0], np.cumsum([i.size for i in ids])])
    return TableBatches.of(names, np.concatenate(ids), bounds)


def test_table_batches_equal_one_id_batch_per_table() -> None:
    rng = np.random.default_rng(0)
    names, ids = random_tables(rng)
    batches = concatenated(names, ids)
    assert list(batches) == names and len(batches) == 4 and "b" in batches
    for name, table_ids in zip(names, ids, strict=True):
        want, got = IdBatch.of(table_ids), batches[name]
        np.testing.assert_array_equal(got.unique, want.unique)
        np.testing.assert_array_equal(got.inverse, want.inverse)
        np.testing.assert_array_equal(got.counts, want.counts)
    vectors = rng.normal(size=(batches.unique.size, 3)).astype(np.float32)
    expanded = batches.expand(vectors)
    grads = rng.normal(size=(batches.size, 3)).astype(np.float32)
    summed = batches.sum_rows(grads)
    for t, name in enumerate(names):
        u0, u1 = batches.unique_bounds[t], batches.unique_bounds[t + 1]
        i0, i1 = batches.id_bounds[t], batches.id_bounds[t + 1]
        np.testing.assert_array_equal(expanded[i0:i1], batches[name].expand(vectors[u0:u1]))
        np.testing.assert_allclose(summed[u0:u1], batches[name].sum_rows(grads[i0:i1]), 1e-6)
    with pytest.raises(KeyError):
        batches["nope"]


def test_table_batches_refuse_bad_bounds_and_twice_named_tables() -> None:
    ids = np.arange(4, dtype=np.uint64)
    with pytest.raises(InvalidArgumentError, match="cut 4 ids into 2 slices"):
        TableBatches.of(["a", "b"], ids, [0, 3, 5])
    with pytest.raises(InvalidArgumentError, match="cut 4 ids"):
        TableBatches.of(["a", "b"], ids, [0, 3, 2, 4][:3])
    with pytest.raises(InvalidArgumentError, match="named twice"):
        TableBatches.of(["a", "a"], ids, [0, 2, 4])


def layout(requests: list[list[tuple[str, Any]]]) -> list[list[tuple[str, list[int]]]]:
    return [[(t, part.rows.tolist()) for t, part in r] for r in requests]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("budget", [Budget(1 << 20), Budget(7), Budget(5, (64,)), Budget(1)])
def test_split_tables_makes_the_requests_of_split_many(shards: int, budget: Budget) -> None:
    rng = np.random.default_rng(shards)
    names, ids = random_tables(rng)
    batches = concatenated(names, ids)
    cost = (16,) if budget.bytes else ()
    want = split_many(dict(batches), [budget] * shards, dict.fromkeys(names, cost))
    got = []
    for part in table_plans.split_tables(batches, [budget] * shards, cost):
        for pieces in part.requests:
            request = []
            for t, start, stop in pieces:
                rows = np.arange(start, stop) if part.rows is None else part.rows[start:stop]
                local = rows - batches.unique_bounds[t]  # rows of the table's own unique ids
                request.append((names[t], local.tolist()))
            got.append(request)
    assert got == layout(want)


def serialized(plan: Any) -> list[tuple[int, str, bytes]]:
    return [(c.shard, c.method, c.request.SerializeToString()) for c in plan.calls]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize(
    "options",
    [ClientOptions(), ClientOptions(fp16=True), ClientOptions(lz4_min_bytes=64)],
)
def test_table_plans_send_the_bytes_of_the_per_table_plans(
    shards: int, options: ClientOptions
) -> None:
    rng = np.random.default_rng(7)
    names, ids = random_tables(rng)
    batches = concatenated(names, ids)
    budgets = [Budget(9, (400, 400))] * shards
    dims = dict.fromkeys(names, 4)
    per_table = {n: IdBatch.distinct(batches[n].unique) for n in names}
    lookup = table_plans.lookup_tables(batches, 4, True, options, budgets)
    assert serialized(lookup) == serialized(
        plans.lookup_many(per_table, dims, True, options, budgets)
    )
    grads = rng.normal(size=(batches.unique.size, 4)).astype(np.float32)
    bounds = batches.unique_bounds
    updates = {n: (per_table[n], grads[bounds[t] : bounds[t + 1]]) for t, n in enumerate(names)}
    push = table_plans.apply_gradients_tables(batches, grads, options, budgets)
    assert serialized(push) == serialized(plans.apply_gradients_many(updates, options, budgets))
    # Answers: each part's vectors land at its unique ids' rows.
    answers = []
    for call in lookup.calls:
        parts = []
        for part in call.request.lookups:
            part_ids = wire.decode_ids(part.ids, "ids").astype(np.float32)
            parts.append(wire.encode_lookup_response(part_ids[:, None] * np.ones(4, np.float32)))
        answers.append(
            wire.parse_lookup_many_response(
                wire.encode_lookup_many_response(parts).SerializeToString()
            )
        )
    vectors = lookup.merge(answers)
    np.testing.assert_allclose(vectors, batches.unique.astype(np.float32)[:, None] * np.ones(4))
    results = push.merge(
        [
            pb.ApplyGradientsManyResponse(
                results=[
                    pb.ApplyGradientsResponse(applied=u.ids.shape[0]) for u in c.request.updates
                ]
            )
            for c in push.calls
        ]
    )
    assert {n: r.applied for n, r in results.items()} == {
        n: per_table[n].unique.size for n in names
    }


def test_an_answer_of_the_wrong_shape_is_refused() -> None:
    batches = concatenated(["a"], [np.arange(3, dtype=np.uint64)])
    plan = table_plans.lookup_tables(
        batches, 4, False, ClientOptions(), [Budget(100, (1 << 20, 1 << 20))]
    )
    bad = pb.LookupManyResponse(
        results=[pb.LookupResponse(vectors=wire.encode_matrix(np.ones((2, 4), np.float32)))]
    )
    with pytest.raises(InvalidArgumentError, match="shape"):
        plan.merge([bad])


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("lz4", [0, 40])
def test_part_encoders_make_the_messages_of_the_whole_encoders(fp16: bool, lz4: int) -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 2**63, size=20).astype(np.uint64)
    values = rng.normal(size=(20, 3)).astype(np.float32)
    values[4] = 0.0
    bounds = [0, 1, 7, 7, 20]
    for i, fields in enumerate(wire.encode_id_parts(ids, bounds, lz4)):
        want = wire.encode_ids(ids[bounds[i] : bounds[i + 1]], lz4)
        assert pb.Tensor(**fields).SerializeToString() == want.SerializeToString()
    for i, fields in enumerate(wire.encode_matrix_parts(values, bounds, fp16, lz4)):
        want = wire.encode_matrix(values[bounds[i] : bounds[i + 1]], fp16, lz4)
        assert pb.Tensor(**fields).SerializeToString() == want.SerializeToString()


def id_features(seed: int, batch: int = 6) -> list[tuple[str, Any, Any]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[str, Any, Any]] = []
    for name in ["word", "user", "item", "tags", "city", "history", "title"]:
        if name in ("tags", "history"):
            counts = rng.integers(0, 5, size=batch)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            out.append((name, rng.integers(0, 8, offsets[-1]).astype(np.uint64), offsets))
        else:
            out.append((name, rng.integers(0, 2**62, batch).astype(np.uint64) % np.uint64(7), None))
    return out


def test_plan_encodes_and_deduplicates_each_table_as_the_features_do() -> None:
    specs = pooling_specs(CONFIG, {"tags": Pooling.MEAN})
    features = id_features(1)
    plan = plan_lookup(CONFIG, specs, features)
    assert list(plan.tables) == ["words", "person", "item", "tags", "history"]  # first read
    assert [fp.name for fp in plan.features] == [f[0] for f in features]
    for table in plan.tables:
        chunks = []
        for name, values, offsets in features:
            feature = CONFIG.features[name]
            if feature.table == table:
                if name == "history":  # truncated to sample_fixed_size 3
                    keep = np.concatenate(
                        [values[a : min(b, a + 3)] for a, b in itertools.pairwise(offsets)]
                    )
                    values = keep.astype(np.uint64)
                chunks.append(feature.encode(values).reshape(-1))
        want = IdBatch.of(np.concatenate(chunks))
        np.testing.assert_array_equal(plan.tables[table].unique, want.unique)
        np.testing.assert_array_equal(plan.tables[table].inverse, want.inverse)


def test_plan_names_a_feature_whose_ids_are_bad() -> None:
    specs = pooling_specs(CONFIG, {})
    with pytest.raises(InvalidArgumentError, match="feature 'user'"):
        plan_lookup(CONFIG, specs, [("user", np.array([1, -2]), None)])


def test_pooling_and_unpooling_over_one_array_equal_the_per_table_path() -> None:
    specs = pooling_specs(CONFIG, {"tags": Pooling.MEAN})
    plan = plan_lookup(CONFIG, specs, id_features(2))
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(plan.tables.unique.size, 4)).astype(np.float32)
    bounds = plan.tables.unique_bounds
    per_table = {t: vectors[bounds[i] : bounds[i + 1]] for i, t in enumerate(plan.tables)}
    for got, want in zip(pool_lookup(plan, vectors), pool_lookup(plan, per_table), strict=True):
        for g, w in zip(
            got if isinstance(got, tuple) else (got,),
            want if isinstance(want, tuple) else (want,),
            strict=True,
        ):
            np.testing.assert_allclose(g, w, rtol=1e-6)
    grads: list[Any] = []
    for fp in plan.features:
        shape = (6, 3, 4) if fp.spec.sequence else (6, 4)
        grads.append(rng.normal(size=shape).astype(np.float32))
    summed = EmbeddingWorker._unpool_tables(plan, grads)
    assert summed is not None
    want = EmbeddingWorker._unpool(plan, grads)
    for i, t in enumerate(plan.tables):
        np.testing.assert_allclose(summed[bounds[i] : bounds[i + 1]], want[t], rtol=1e-5)
    # a feature without gradient counts as zeros; a table without any is left to the old path
    grads[0] = None
    summed = EmbeddingWorker._unpool_tables(plan, grads)
    want = EmbeddingWorker._unpool(plan, grads)
    assert summed is not None
    np.testing.assert_allclose(summed[: bounds[1]], want["words"], rtol=1e-5)
    grads[6] = None  # word and title: the table "words" gets nothing
    assert EmbeddingWorker._unpool_tables(plan, grads) is None


def test_the_async_client_refuses_tables_of_different_dims_before_sending() -> None:
    async def main() -> None:
        client = AsyncClient(["127.0.0.1:1"], ClientOptions(tune_allocator=False))
        client._dims = {"a": 4, "b": 8}
        batches = concatenated(["a", "b"], [np.arange(2, dtype=np.uint64)] * 2)
        with pytest.raises(InvalidArgumentError, match="share one dim"):
            await client.lookup_tables(batches)
        with pytest.raises(InvalidArgumentError, match="share one dim"):
            await client.apply_gradients_tables(batches, np.zeros((4, 4), np.float32))
        client._dims = {"a": 4, "b": 4}
        with pytest.raises(InvalidArgumentError, match=r"grads must have shape \(4, 4\)"):
            await client.apply_gradients_tables(batches, np.zeros((4, 3), np.float32))
        await client.close()

    asyncio.run(main())
