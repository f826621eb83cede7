"""Pool the vectors of a feature's ids per sample, and the exact adjoint of it. numpy only.

A feature's ids arrive as CSR (``values``, ``offsets``; see :mod:`embeddb.features.batch`); the
embedding worker looks up one vector per id and pools them per sample. Worked example: a batch
of 3 samples, dim 2, ``offsets = [0, 2, 2, 5]`` (sample 1 is empty)::

    vectors (one row per id)       segments
      v0 = [1, 0]   sample 0        counts   = [2, 0, 3]
      v1 = [3, 2]   sample 0        sample   = [0, 0, 2, 2, 2]   (sample of each id)
      v2 = [1, 1]   sample 2        position = [0, 1, 0, 1, 2]   (place within its sample)
      v3 = [0, 2]   sample 2
      v4 = [2, 0]   sample 2

    SUM       [[4, 2], [0, 0], [3, 3]]                  empty samples pool to zeros
    MEAN      [[2, 1], [0, 0], [1, 1]]                  sum / count
    SQRT_N    [[4, 2] / sqrt 2, [0, 0], [3, 3] / sqrt 3]   sum / sqrt(count) (``sqrt_scaling``)
    SEQUENCE  (fixed_size 2): vectors (3, 2, 2) and mask (3, 2)
              [[v0, v1], [0, 0], [v2, v3]]    mask [[1, 1], [0, 0], [1, 1]]
              (ids beyond ``fixed_size`` are truncated: v4 is dropped)

:func:`unpool` is the adjoint (the gradient with respect to every id's vector): a pooled
gradient ``(B, dim)`` (or ``(B, L, dim)``) becomes ``(N, dim)`` gradients in the order of the
feature's values; for SUM each id gets its sample's row, for MEAN the row over ``count``, for
SEQUENCE the row at its position (zeros for truncated ids). Everything is index arithmetic and
:func:`numpy.add.reduceat`; there is no per-sample Python loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import I64, Bool, Floats, IntP
from embeddb.config import FeatureConfig
from embeddb.errors import InvalidArgumentError

__all__ = [
    "Pooled",
    "Pooling",
    "PoolingSpec",
    "Segments",
    "pool",
    "truncate",
    "unpool",
]

Pooled = Floats | tuple[Floats, Bool]  # (B, dim), or (B, L, dim) with a (B, L) mask


class Pooling(str, enum.Enum):
    """How the vectors of one sample's ids combine."""

    SUM = "sum"
    MEAN = "mean"
    SQRT_N = "sqrt_n"  # sum / sqrt(count): the config's ``sqrt_scaling``
    SEQUENCE = "sequence"  # no pooling: padded to ``fixed_size`` with a mask


@dataclass(frozen=True)
class PoolingSpec:
    """The pooling of one feature.

    Attributes:
        pooling: how the vectors combine.
        fixed_size: ids kept per sample in ``SEQUENCE`` mode (the config's
            ``sample_fixed_size``); unused otherwise.
    """

    pooling: Pooling = Pooling.SUM
    fixed_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "pooling", Pooling(self.pooling))
        if self.fixed_size < 1:
            raise InvalidArgumentError(f"fixed_size must be >= 1, got {self.fixed_size}")

    @classmethod
    def of(cls, feature: FeatureConfig, pooling: Pooling | None = None) -> PoolingSpec:
        """The feature's pooling from its config: ``embedding_summation: false`` is SEQUENCE,
        ``sqrt_scaling`` is SQRT_N, otherwise SUM; ``pooling`` overrides (e.g. MEAN, which the
        YAML schema does not name)."""
        if pooling is None:
            if not feature.embedding_summation:
                pooling = Pooling.SEQUENCE
            elif feature.sqrt_scaling:
                pooling = Pooling.SQRT_N
            else:
                pooling = Pooling.SUM
        return cls(pooling, feature.sample_fixed_size)

    @property
    def sequence(self) -> bool:
        return self.pooling is Pooling.SEQUENCE


@dataclass(frozen=True)
class Segments:
    """Where each id of a feature sits: its sample and its position in the sample.

    Built once per feature per batch and kept for the backward pass.

    Attributes:
        offsets: ``(B + 1,)``; sample ``i`` owns ids ``offsets[i]:offsets[i + 1]``.
        counts: ``(B,)`` ids per sample.
        sample: ``(N,)`` the sample of each id.
        position: ``(N,)`` the place of each id within its sample.
        single: every sample has exactly one id (pooling is then the identity).
    """

    offsets: I64
    counts: I64
    sample: IntP
    position: IntP
    single: bool

    @classmethod
    def of(cls, offsets: npt.ArrayLike) -> Segments:
        """The segments of CSR ``offsets`` (validated by the batch; trusted here)."""
        offs = np.asarray(offsets, dtype=np.int64)
        counts = np.diff(offs)
        batch_size = counts.size
        size = int(offs[-1])
        if size == batch_size and (batch_size == 0 or int(counts.min()) == 1):
            ramp = np.arange(batch_size, dtype=np.intp)
            return cls(offs, counts, ramp, np.zeros(batch_size, np.intp), True)
        sample = np.repeat(np.arange(batch_size, dtype=np.intp), counts)
        position = np.arange(size, dtype=np.intp) - offs[:-1].astype(np.intp)[sample]
        return cls(offs, counts, sample, position, False)

    @classmethod
    def single_ids(cls, batch_size: int) -> Segments:
        """The segments of a feature with exactly one id per sample."""
        return cls.of(np.arange(batch_size + 1, dtype=np.int64))

    @property
    def batch_size(self) -> int:
        return int(self.counts.size)

    @property
    def size(self) -> int:
        """Ids of the feature, all samples together."""
        return int(self.sample.size)


def truncate(
    values: npt.NDArray[np.uint64], offsets: npt.ArrayLike, max_len: int
) -> tuple[npt.NDArray[np.uint64], I64]:
    """Keep the first ``max_len`` ids of every sample (CSR in, CSR out).

    Sequence features are truncated before their ids are looked up, so that ids beyond
    ``fixed_size`` never create rows nor receive (zero) gradients.
    """
    offs = np.asarray(offsets, dtype=np.int64)
    counts = np.diff(offs)
    if counts.size == 0 or int(counts.max()) <= max_len:
        return values, offs
    segments = Segments.of(offs)
    keep = segments.position < max_len
    new_offsets = np.zeros_like(offs)
    np.cumsum(np.minimum(counts, max_len), out=new_offsets[1:])
    return values[keep], new_offsets


def pool(vectors: Floats, segments: Segments, spec: PoolingSpec) -> Pooled:
    """Pool ``vectors`` (one row per id, ``(N, dim)``) per sample.

    Returns:
        ``(B, dim)`` pooled rows, or for SEQUENCE a ``(B, fixed_size, dim)`` array and a
        ``(B, fixed_size)`` bool mask (True where an id is present). Same dtype as ``vectors``.
    """
    if spec.sequence:
        return _to_sequence(vectors, segments, spec.fixed_size)
    if segments.single:
        same: Floats = vectors.copy()
        return same
    summed = _segment_sum(vectors, segments)
    scale = _scale(segments.counts, spec.pooling, vectors.dtype)
    if scale is not None:
        summed *= scale[:, None]
    return summed


def unpool(grad: Floats, segments: Segments, spec: PoolingSpec) -> Floats:
    """The gradient of every id's vector, ``(N, dim)`` in the order of the feature's values,
    given the gradient of the pooled output (``(B, dim)``, or ``(B, fixed_size, dim)`` for
    SEQUENCE). The exact adjoint of :func:`pool`."""
    if spec.sequence:
        keep = segments.position < spec.fixed_size
        per_id = np.zeros((segments.size, grad.shape[-1]), dtype=grad.dtype)
        if keep.all():
            per_id[:] = grad[segments.sample, segments.position]
        else:
            per_id[keep] = grad[segments.sample[keep], segments.position[keep]]
        return per_id
    if segments.single:
        same: Floats = grad.copy()
        return same
    scale = _scale(segments.counts, spec.pooling, grad.dtype)
    rows = grad * scale[:, None] if scale is not None else grad
    out: Floats = rows[segments.sample]
    return out


def _segment_sum(vectors: Floats, segments: Segments) -> Floats:
    """Row sums per sample; empty samples get zeros."""
    out = np.zeros((segments.batch_size, vectors.shape[1]), dtype=vectors.dtype)
    if segments.size == 0:
        return out
    nonempty = segments.counts > 0
    starts = segments.offsets[:-1][nonempty]
    # reduceat sums from each start to the next one; empty samples between two starts share
    # the next start, so only the non-empty samples' starts are passed.
    out[nonempty] = np.add.reduceat(vectors, starts, axis=0)
    return out


def _scale(counts: I64, pooling: Pooling, dtype: np.dtype[np.floating]) -> Floats | None:
    if pooling is Pooling.SUM:
        return None
    n = np.maximum(counts, 1).astype(dtype)
    return (1.0 / n if pooling is Pooling.MEAN else 1.0 / np.sqrt(n)).astype(dtype)


def _to_sequence(vectors: Floats, segments: Segments, fixed_size: int) -> tuple[Floats, Bool]:
    batch_size, dim = segments.batch_size, vectors.shape[1]
    out = np.zeros((batch_size, fixed_size, dim), dtype=vectors.dtype)
    mask = np.zeros((batch_size, fixed_size), dtype=np.bool_)
    keep = segments.position < fixed_size
    if keep.all():
        out[segments.sample, segments.position] = vectors
        mask[segments.sample, segments.position] = True
    else:
        sample, position = segments.sample[keep], segments.position[keep]
        out[sample, position] = vectors[keep]
        mask[sample, position] = True
    return out, mask
