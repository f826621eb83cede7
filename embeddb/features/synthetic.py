"""Criteo-shaped synthetic data with a known best AUC: Zipf ids, a hidden teacher, Bernoulli labels.

Samples look like :class:`~embeddb.features.CriteoReader`'s batches (ID features ``C1``..,
a ``dense`` non-ID feature, a ``label``), any number of them, generated on the fly a chunk at a
time with whole-array numpy operations.

* **Ids.** Feature ``f`` draws a rank ``k`` in ``1..cardinality[f]`` with probability
  proportional to ``k ** -exponent[f]`` (Zipf) and uses ``mix64(k ^ salt_f)`` as the id, so ids
  spread over 64 bits while their popularity follows the rank. Ranks up to 1024 are drawn
  exactly (Walker's alias table); rarer ranks from the continuous power law on
  ``[k - 1/2, k + 1/2)``, whose mass differs from ``k ** -s`` by a relative ``s(s+1)/(24 k²)``
  (below 1e-7 there). Nothing of size ``cardinality`` is materialised: 10**9 is fine.
* **Teacher.** Each ``(feature, id)`` has a fixed embedding of ``teacher_dim`` floats in
  [-1, 1) taken from the bits of ``mix64(id ^ salt)`` (a table computed on demand, never stored).
  The logit is a linear term over the embeddings, a one-hidden-layer ReLU MLP over the
  embeddings and the dense features, and a linear term over the dense features, then scaled to
  ``logit_std`` and shifted so that the mean click rate is ``ctr`` (both calibrated once on a
  reserved stream). The label is Bernoulli(sigmoid(logit)).
* **Best AUC.** The teacher's probability is the best possible score, so the AUC of the true
  probabilities against the sampled labels (:meth:`SyntheticCriteo.best_auc`) is what no model
  can beat on those samples (up to sampling noise).
* **Streams.** A stream (``"train"`` = 0, ``"test"`` = 1, or any int in [0, 2**32)) is an
  endless sequence of samples, cut into chunks of ``chunk_size``; chunk ``c`` of stream ``s`` is
  generated from ``SeedSequence(seed, spawn_key=(s, c))``. The samples of a stream do not
  depend on the batch size, and every stream shares one teacher.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, F64, I64, U64
from embeddb.common.evaluation import auc
from embeddb.common.routing import mix64
from embeddb.errors import ConfigError, InvalidArgumentError
from embeddb.features._block import Block, Ids
from embeddb.features._reader import Reader
from embeddb.features.criteo import CATEGORICAL_COLUMNS, DENSE_FEATURE, LABEL

__all__ = ["SyntheticCriteo", "SyntheticCriteoConfig", "SyntheticSamples", "ZipfSampler"]


_STREAMS = {"train": 0, "test": 1}
_CALIBRATION_STREAM = 1 << 32
_CALIBRATION_SAMPLES = 1 << 15


class ZipfSampler:
    """Ranks ``1..cardinality`` with probability proportional to ``rank ** -exponent``.

    Args:
        cardinality: number of ranks, >= 1 (10**9 and more is fine: nothing is materialised).
        exponent: the power, > 0.
        head: ranks drawn exactly with an alias table (the rest from the continuous law).
    """

    def __init__(self, cardinality: int, exponent: float, head: int = 1 << 14) -> None:
        if cardinality < 1 or exponent <= 0:
            raise InvalidArgumentError(
                f"Zipf needs cardinality >= 1 and exponent > 0, got {cardinality}, {exponent}"
            )
        self.cardinality = int(cardinality)
        self.exponent = float(exponent)
        self.head = min(self.cardinality, head)
        weights = np.arange(1, self.head + 1, dtype=np.float64) ** -self.exponent
        head_mass = float(weights.sum())
        self._a = self.head + 0.5
        self._b = self.cardinality + 0.5
        tail_mass = self._integral(self._a, self._b) if self.cardinality > self.head else 0.0
        self.normaliser = head_mass + tail_mass
        self.head_probability = head_mass / self.normaliser
        self._alias_prob, self._alias = _alias_table(weights / head_mass)

    def _integral(self, a: float | F64, b: float | F64) -> F64:
        """``∫_a^b x^-s dx``."""
        s = self.exponent
        if abs(s - 1.0) < 1e-9:
            return np.asarray(np.log(np.asarray(b) / a))
        return np.asarray((np.power(b, 1 - s) - np.power(a, 1 - s)) / (1 - s))

    def probability(self, ranks: npt.ArrayLike) -> F64:
        """The probability that a draw is each of ``ranks`` (what :meth:`sample` draws)."""
        k = np.asarray(ranks, dtype=np.float64)
        tail = self._integral(k - 0.5, k + 0.5) / self.normaliser
        head = k**-self.exponent / self.normaliser
        out: F64 = np.where(k <= self.head, head, tail)
        return out

    def ranks(self, u: F64) -> I64:
        """Ranks for uniforms ``u`` in [0, 1) (any shape)."""
        v = u * (self.head / self.head_probability)  # the head's alias slot and coin, if < head
        j = np.minimum(v.astype(np.int64), self.head - 1)
        ranks: I64 = np.where(v - j < self._alias_prob[j], j, self._alias[j]) + 1
        tail = np.flatnonzero(u >= self.head_probability)
        if tail.size:
            t = (u.ravel()[tail] - self.head_probability) / (1.0 - self.head_probability)
            s, a, b = self.exponent, self._a, self._b
            if abs(s - 1.0) < 1e-9:
                x = a * np.power(b / a, t)
            else:
                lo, hi = a ** (1 - s), b ** (1 - s)
                x = np.power(lo + t * (hi - lo), 1.0 / (1 - s))
            flat = ranks.reshape(-1)
            flat[tail] = np.clip(
                np.floor(x + 0.5).astype(np.int64), self.head + 1, self.cardinality
            )
        return ranks

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> I64:
        return self.ranks(rng.random(size))


def _alias_table(p: F64) -> tuple[F64, I64]:
    """Walker/Vose alias table of a distribution (a loop over its few entries, once)."""
    n = p.size
    prob = p * n
    alias = np.arange(n, dtype=np.int64)
    small = [i for i in range(n) if prob[i] < 1.0]
    large = [i for i in range(n) if prob[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        alias[s] = g
        prob[g] -= 1.0 - prob[s]
        (small if prob[g] < 1.0 else large).append(g)
    for i in small + large:
        prob[i] = 1.0
    return prob, alias


@dataclass(frozen=True)
class SyntheticCriteoConfig:
    """The shape of the synthetic data and of its teacher.

    Attributes:
        num_id_features: ID features (``C1``, ``C2``, ...).
        num_dense: columns of the ``dense`` feature.
        cardinality: distinct ids per feature: one int for all, or one per feature (<= 2**53).
        exponent: Zipf exponent: one for all, or one per feature (> 0; ~1 is web-like).
        teacher_dim: floats per (feature, id) embedding of the teacher (a multiple of 4).
        teacher_hidden: hidden units of the teacher's MLP.
        logit_std: standard deviation of the teacher's logit (higher: a higher best AUC).
        ctr: mean click rate (positive fraction).
        seed: the teacher and every stream derive from it.
        chunk_size: samples generated at a time; a stream's samples depend on it (each chunk
            has its own seed), not on the batch size.
    """

    num_id_features: int = 26
    num_dense: int = 13
    cardinality: int | tuple[int, ...] = 1_000_000
    exponent: float | tuple[float, ...] = 1.05
    teacher_dim: int = 4
    teacher_hidden: int = 16
    logit_std: float = 1.5
    ctr: float = 0.25
    seed: int = 0
    chunk_size: int = 1 << 16

    def __post_init__(self) -> None:
        f = self.num_id_features
        if f < 1 or self.num_dense < 0:
            raise ConfigError("num_id_features", "needs >= 1 ID feature and >= 0 dense columns")
        for key in ("cardinality", "exponent"):
            value = getattr(self, key)
            values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * f
            if len(values) != f:
                raise ConfigError(key, f"needs one value or {f}, got {len(values)}")
            object.__setattr__(self, key, values)
        if any(not 1 <= int(c) <= 1 << 53 for c in self.cardinalities):
            raise ConfigError("cardinality", "every cardinality must be in [1, 2**53]")
        if any(not e > 0 for e in self.exponents):
            raise ConfigError("exponent", "every exponent must be > 0")
        if self.teacher_dim < 4 or self.teacher_dim % 4:
            raise ConfigError(
                "teacher_dim", f"must be a positive multiple of 4, got {self.teacher_dim}"
            )
        if self.teacher_hidden < 1 or not self.logit_std > 0 or not 0 < self.ctr < 1:
            raise ConfigError("logit_std", "needs teacher_hidden >= 1, logit_std > 0, 0 < ctr < 1")
        if self.chunk_size < 1:
            raise ConfigError("chunk_size", f"must be >= 1, got {self.chunk_size}")

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.cardinality)  # type: ignore[union-attr]

    @property
    def exponents(self) -> tuple[float, ...]:
        return tuple(float(e) for e in self.exponent)  # type: ignore[union-attr]

    @property
    def feature_names(self) -> tuple[str, ...]:
        f = self.num_id_features
        return CATEGORICAL_COLUMNS[:f] + tuple(f"C{i}" for i in range(27, f + 1))


@dataclass(frozen=True)
class SyntheticSamples:
    """Samples as arrays: ``ids[i, f]`` is the id of feature ``f`` of sample ``i``."""

    ids: U64
    dense: F32
    probability: F64
    label: F32

    def __len__(self) -> int:
        return int(self.label.size)


class SyntheticCriteo:
    """The generator (see the module docstring).

    Args:
        config: shape and teacher (:class:`SyntheticCriteoConfig`); the default is Criteo's
            26 ID features of 10**6 ids each and 13 dense columns.

    Example:
        >>> data = SyntheticCriteo(SyntheticCriteoConfig(cardinality=1000, chunk_size=256))
        >>> [b.batch_size for b in data.batches(600, batch_size=256)]
        [256, 256, 88]
    """

    def __init__(self, config: SyntheticCriteoConfig | None = None) -> None:
        self.config = cfg = config or SyntheticCriteoConfig()
        f, d = cfg.num_id_features, cfg.teacher_dim
        rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(1 << 33,)))
        self._id_salts = rng.integers(0, 2**63, size=f, dtype=np.uint64) * np.uint64(2) + np.uint64(
            1
        )
        self._emb_salts = rng.integers(0, 2**63, size=(d // 4, f), dtype=np.uint64)
        shapes = {(c, e) for c, e in zip(cfg.cardinalities, cfg.exponents, strict=True)}
        samplers = {shape: ZipfSampler(*shape) for shape in shapes}
        self.samplers = [
            samplers[(c, e)] for c, e in zip(cfg.cardinalities, cfg.exponents, strict=True)
        ]
        importance = rng.random(f) ** 2
        self._linear = (rng.normal(size=(f, d)) * importance[:, None] / math.sqrt(f * d)).astype(
            np.float32
        )
        width = f * d + cfg.num_dense
        self._w1 = (rng.normal(size=(width, cfg.teacher_hidden)) / math.sqrt(width)).astype(
            np.float32
        )
        self._b1 = (rng.normal(size=cfg.teacher_hidden) * 0.5).astype(np.float32)
        self._w2 = (rng.normal(size=cfg.teacher_hidden) / math.sqrt(cfg.teacher_hidden)).astype(
            np.float32
        )
        self._dense_mu = rng.uniform(0.0, 4.0, size=cfg.num_dense)
        self._dense_sigma = rng.uniform(0.5, 1.5, size=cfg.num_dense)
        self._dense_w = (
            rng.normal(size=cfg.num_dense) * 0.3 / max(cfg.num_dense, 1) ** 0.5
        ).astype(np.float32)
        linear = np.concatenate([self._linear.ravel(), self._dense_w])[:, None]
        self._weights = np.ascontiguousarray(np.concatenate([self._w1, linear], axis=1))
        self._scale, self._shift = 1.0, 0.0
        raw = self._chunk(_CALIBRATION_STREAM, 0, _CALIBRATION_SAMPLES, raw=True).probability
        self._scale = cfg.logit_std / float(raw.std())
        centred = (raw - raw.mean()) * self._scale
        self._shift = _solve_bias(centred, cfg.ctr) - float(raw.mean()) * self._scale

    # ---------------------------------------------------------------------------------------

    def id_of_rank(self, feature: int, ranks: npt.ArrayLike) -> U64:
        """The ids of feature ``feature`` (0-based) with popularity ranks ``ranks`` (1 = top)."""
        return mix64(np.asarray(ranks, dtype=np.uint64) ^ self._id_salts[feature])

    def generate(
        self, num_samples: int, split: str | int = "train", start: int = 0
    ) -> SyntheticSamples:
        """Samples ``start .. start + num_samples - 1`` of a stream, as arrays."""
        stream = _stream(split)
        chunk = self.config.chunk_size
        parts = []
        first, end = start // chunk, start + num_samples
        for c in range(first, (end + chunk - 1) // chunk):
            lo, hi = max(start, c * chunk) - c * chunk, min(end, (c + 1) * chunk) - c * chunk
            parts.append(self._chunk(stream, c, chunk, raw=False, rows=slice(lo, hi)))
        if not parts:
            f, nd = self.config.num_id_features, self.config.num_dense
            return SyntheticSamples(
                np.zeros((0, f), np.uint64),
                np.zeros((0, nd), np.float32),
                np.zeros(0),
                np.zeros(0, np.float32),
            )
        return SyntheticSamples(
            np.concatenate([p.ids for p in parts]),
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.probability for p in parts]),
            np.concatenate([p.label for p in parts]),
        )

    def batches(
        self,
        num_samples: int,
        batch_size: int,
        split: str | int = "train",
        *,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> Reader:
        """A reader of the first ``num_samples`` samples of a stream, in batches.

        Each iteration generates the same samples again (one epoch).
        """
        return _SyntheticReader(
            self, num_samples, _stream(split), batch_size, requires_grad, drop_last
        )

    def best_auc(self, num_samples: int = 200_000, split: str | int = "test") -> float:
        """AUC of the teacher's true probabilities against the sampled labels of the first
        ``num_samples`` samples of a stream: the best any model can score on those samples."""
        s = self.generate(num_samples, split)
        return auc(labels=s.label, scores=s.probability)

    # ---------------------------------------------------------------------------------------

    def _chunk(
        self, stream: int, index: int, size: int, raw: bool, rows: slice = slice(None)
    ) -> SyntheticSamples:
        cfg = self.config
        rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(stream, index)))
        f = cfg.num_id_features
        u = rng.random((size, f))
        dense_z = rng.standard_normal((size, cfg.num_dense))
        coin = rng.random(size)
        u, dense_z, coin = u[rows], dense_z[rows], coin[rows]
        ranks = np.empty(u.shape, dtype=np.int64)
        if len({id(s) for s in self.samplers}) == 1:
            ranks[:] = self.samplers[0].ranks(u)
        else:
            for j, sampler in enumerate(self.samplers):
                ranks[:, j] = sampler.ranks(u[:, j])
        ids = mix64(ranks.astype(np.uint64) ^ self._id_salts)
        counts = np.floor(np.exp(self._dense_mu + self._dense_sigma * dense_z))
        dense = np.log1p(counts).astype(np.float32)
        logit = self._logit(ids, dense)
        if raw:
            return SyntheticSamples(ids, dense, logit.astype(np.float64), np.zeros(0, np.float32))
        p = 1.0 / (1.0 + np.exp(-(logit.astype(np.float64) * self._scale + self._shift)))
        label = (coin < p).astype(np.float32)
        return SyntheticSamples(ids, dense, p, label)

    def _embeddings(self, ids: U64) -> F32:
        """Teacher embeddings, shape ``(n, features * teacher_dim)``, values in [-1, 1).

        Each hash gives 4 floats: its four 16-bit lanes (a ``uint16`` view, no shifting).
        """
        n, f = ids.shape
        rounds = self._emb_salts.shape[0]
        out = np.empty((n, f, rounds, 4), dtype=np.float32)
        for r, salts in enumerate(self._emb_salts):
            out[:, :, r, :] = mix64(ids ^ salts).view("<u2").reshape(n, f, 4)
        flat = out.reshape(n, f * rounds * 4)
        flat *= np.float32(1.0 / 32768.0)
        flat -= np.float32(1.0)
        return flat

    def _logit(self, ids: U64, dense: F32) -> F32:
        """``linear(embeddings) + dense . w_d + w2 . relu(W1 [embeddings, dense] + b1)``.

        One matrix product: the linear terms ride along as one extra column of ``W1``. Rows go
        in blocks of 4096 so the embeddings of a block stay in cache, and each block's product
        is a stack of small products: BLAS runs those on one thread, which on a small, busy
        machine is several times faster than threading one tall product.
        """
        logit = np.empty(ids.shape[0], dtype=np.float32)
        width, outputs = self._weights.shape
        stack = 1 << max(4, min(12, ((1 << 18) // (width * outputs)).bit_length() - 1))
        for lo in range(0, ids.shape[0], 4096):
            rows = slice(lo, lo + 4096)
            x = np.concatenate([self._embeddings(ids[rows]), dense[rows] - np.float32(2.0)], axis=1)
            if x.shape[0] % stack == 0:
                out = (x.reshape(-1, stack, width) @ self._weights).reshape(-1, outputs)
            else:
                out = x @ self._weights
            hidden = np.maximum(out[:, :-1] + self._b1, np.float32(0.0))
            logit[rows] = out[:, -1] + hidden @ self._w2
        return logit


class _SyntheticReader(Reader):
    def __init__(
        self,
        data: SyntheticCriteo,
        num_samples: int,
        stream: int,
        batch_size: int,
        requires_grad: bool,
        drop_last: bool,
    ) -> None:
        super().__init__(batch_size, requires_grad=requires_grad, drop_last=drop_last)
        if num_samples < 0:
            raise InvalidArgumentError(f"num_samples must be >= 0, got {num_samples}")
        self.data = data
        self.num_samples = num_samples
        self.stream = stream

    def _blocks(self) -> Iterator[Block]:
        data, chunk = self.data, self.data.config.chunk_size
        names = data.config.feature_names
        for c in range((self.num_samples + chunk - 1) // chunk):
            n = min(chunk, self.num_samples - c * chunk)
            s = data._chunk(self.stream, c, chunk, raw=False, rows=slice(0, n))
            ids = {
                name: Ids(np.ascontiguousarray(s.ids[:, j]), None, True)
                for j, name in enumerate(names)
            }
            yield Block(n, ids, {DENSE_FEATURE: s.dense}, {LABEL: s.label.reshape(-1, 1)})


def _stream(split: str | int) -> int:
    if isinstance(split, str):
        if split not in _STREAMS:
            raise InvalidArgumentError(f"split must be 'train', 'test' or an int, got {split!r}")
        return _STREAMS[split]
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split < 1 << 32:
        raise InvalidArgumentError(f"a stream is an int in [0, 2**32), got {split!r}")
    return split


def _solve_bias(centred: F64, ctr: float) -> float:
    """The shift ``b`` with ``mean(sigmoid(centred + b)) == ctr`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if float(np.mean(1.0 / (1.0 + np.exp(-(centred + mid))))) < ctr:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
