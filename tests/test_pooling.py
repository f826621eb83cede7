"""Pooling (embeddb.trainer.pooling): forward against a per-sample torch reference, backward
against torch autograd (the exact adjoint), and the documented layout."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from embeddb.config import FeatureConfig
from embeddb.errors import InvalidArgumentError
from embeddb.trainer.pooling import Pooling, PoolingSpec, Segments, pool, truncate, unpool

ALL = [PoolingSpec(Pooling.SUM), PoolingSpec(Pooling.MEAN), PoolingSpec(Pooling.SQRT_N)]
ALL += [PoolingSpec(Pooling.SEQUENCE, 1), PoolingSpec(Pooling.SEQUENCE, 3)]


def offsets_of(counts: list[int]) -> npt.NDArray[np.int64]:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def reference(vectors: torch.Tensor, counts: list[int], spec: PoolingSpec) -> torch.Tensor:
    """Pooling written the slow, obvious way: one sample at a time."""
    out, start = [], 0
    for n in counts:
        rows = vectors[start : start + n]
        start += n
        if spec.pooling is Pooling.SEQUENCE:
            kept = rows[: spec.fixed_size]
            pad = vectors.new_zeros((spec.fixed_size - kept.shape[0], vectors.shape[1]))
            out.append(torch.cat([kept, pad]))
            continue
        total = rows.sum(0)
        if spec.pooling is Pooling.MEAN and n:
            total = total / n
        elif spec.pooling is Pooling.SQRT_N and n:
            total = total / n**0.5
        out.append(total)
    if out:
        return torch.stack(out)
    shape = (0, spec.fixed_size, vectors.shape[1]) if spec.sequence else (0, vectors.shape[1])
    return vectors.sum() * 0 + vectors.new_zeros(shape)  # keeps the graph for autograd


def check_against_autograd(counts: list[int], dim: int, spec: PoolingSpec, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(sum(counts), dim))
    segments = Segments.of(offsets_of(counts))
    pooled = pool(vectors, segments, spec)
    out = pooled[0] if isinstance(pooled, tuple) else pooled
    leaf = torch.tensor(vectors, requires_grad=True)
    expected = reference(leaf, counts, spec)
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    upstream = rng.normal(size=out.shape)
    (expected * torch.tensor(upstream)).sum().backward()
    assert leaf.grad is not None
    np.testing.assert_allclose(
        unpool(upstream, segments, spec), leaf.grad.numpy(), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("spec", ALL, ids=lambda s: f"{s.pooling.value}-{s.fixed_size}")
@pytest.mark.parametrize(
    "counts",
    [[2, 0, 3], [1, 1, 1, 1], [0, 0], [], [5], [0, 4, 0, 0, 1, 7, 0]],
    ids=["ragged", "single", "all-empty", "no-samples", "one", "mixed"],
)
def test_pool_and_unpool_match_torch_autograd(counts: list[int], spec: PoolingSpec) -> None:
    check_against_autograd(counts, dim=3, spec=spec, seed=len(counts))


@pytest.mark.slow
@given(
    counts=st.lists(st.integers(0, 6), max_size=12),
    dim=st.integers(1, 4),
    spec=st.sampled_from(ALL),
    seed=st.integers(0, 2**16),
)
def test_unpool_is_the_adjoint_of_pool(
    counts: list[int], dim: int, spec: PoolingSpec, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(sum(counts), dim))
    segments = Segments.of(offsets_of(counts))
    pooled = pool(vectors, segments, spec)
    out = pooled[0] if isinstance(pooled, tuple) else pooled
    upstream = rng.normal(size=out.shape)
    # <pool(v), g> == <v, unpool(g)> for every v and g: unpool is pool's transpose.
    lhs = float(np.sum(out * upstream))
    rhs = float(np.sum(vectors * unpool(upstream, segments, spec)))
    assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-9)
    if sum(counts) <= 6:
        check_against_autograd(counts, dim, spec, seed)


def test_the_documented_example() -> None:
    vectors = np.array([[1, 0], [3, 2], [1, 1], [0, 2], [2, 0]], dtype=np.float32)
    segments = Segments.of([0, 2, 2, 5])
    assert segments.counts.tolist() == [2, 0, 3]
    assert segments.sample.tolist() == [0, 0, 2, 2, 2]
    assert segments.position.tolist() == [0, 1, 0, 1, 2]
    total = pool(vectors, segments, PoolingSpec(Pooling.SUM))
    assert isinstance(total, np.ndarray) and total.dtype == np.float32
    assert total.tolist() == [[4, 2], [0, 0], [3, 3]]
    assert pool(vectors, segments, PoolingSpec(Pooling.MEAN)).tolist() == [[2, 1], [0, 0], [1, 1]]
    scaled = pool(vectors, segments, PoolingSpec(Pooling.SQRT_N))
    assert isinstance(scaled, np.ndarray)
    np.testing.assert_allclose(scaled, [[4 / 2**0.5, 2 / 2**0.5], [0, 0], [3 / 3**0.5] * 2])
    sequence = pool(vectors, segments, PoolingSpec(Pooling.SEQUENCE, 2))
    assert isinstance(sequence, tuple)
    padded, mask = sequence
    assert padded.shape == (3, 2, 2) and mask.dtype == np.bool_
    assert padded.tolist() == [[[1, 0], [3, 2]], [[0, 0], [0, 0]], [[1, 1], [0, 2]]]
    assert mask.tolist() == [[True, True], [False, False], [True, True]]
    # The truncated id (v4) gets no gradient.
    grad = np.ones((3, 2, 2), np.float32)
    assert unpool(grad, segments, PoolingSpec(Pooling.SEQUENCE, 2))[:, 0].tolist() == [
        1,
        1,
        1,
        1,
        0,
    ]


def test_single_ids_pass_through_and_copy() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    segments = Segments.single_ids(3)
    assert segments.single
    for spec in ALL[:3]:
        out = pool(vectors, segments, spec)
        assert isinstance(out, np.ndarray)
        np.testing.assert_array_equal(out, vectors)
        assert not np.shares_memory(out, vectors)
        np.testing.assert_array_equal(unpool(vectors, segments, spec), vectors)
    assert not Segments.of([0, 1, 1, 3]).single


def test_truncate_keeps_the_first_ids_of_each_sample() -> None:
    values = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.uint64)
    kept, offsets = truncate(values, [0, 3, 3, 4, 7], 2)
    assert kept.tolist() == [1, 2, 4, 5, 6] and offsets.tolist() == [0, 2, 2, 3, 5]
    same, offs = truncate(values, [0, 3, 7], 4)
    assert same is values and offs.tolist() == [0, 3, 7]
    empty, offs = truncate(np.zeros(0, np.uint64), [0], 3)
    assert empty.size == 0 and offs.tolist() == [0]


def test_pooling_follows_the_feature_config() -> None:
    base = dict(name="f", table="t", dim=4, group="f", group_index=0)
    assert PoolingSpec.of(FeatureConfig(**base)).pooling is Pooling.SUM
    assert PoolingSpec.of(FeatureConfig(**base, sqrt_scaling=True)).pooling is Pooling.SQRT_N
    seq = PoolingSpec.of(FeatureConfig(**base, embedding_summation=False, sample_fixed_size=7))
    assert seq == PoolingSpec(Pooling.SEQUENCE, 7) and seq.sequence
    assert PoolingSpec.of(FeatureConfig(**base), Pooling.MEAN).pooling is Pooling.MEAN
    assert PoolingSpec("mean").pooling is Pooling.MEAN  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        PoolingSpec(Pooling.SEQUENCE, 0)


def test_pooling_a_large_batch_is_vectorized() -> None:
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 20, size=4096)
    segments = Segments.of(offsets_of(counts.tolist()))
    vectors = rng.normal(size=(segments.size, 16)).astype(np.float32)
    out = pool(vectors, segments, PoolingSpec(Pooling.MEAN))
    assert isinstance(out, np.ndarray)
    sums = np.zeros((4096, 16), np.float64)
    np.add.at(sums, segments.sample, vectors)
    np.testing.assert_allclose(out, sums / np.maximum(counts, 1)[:, None], rtol=1e-4, atol=1e-5)
