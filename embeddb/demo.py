"""The engine demo: a factorization machine on UCI Adult with its embeddings in one shard.

Every categorical column (and a few bucketed numeric ones) is a feature whose ids are looked up
in the shard; the model is a factorization machine over the pooled feature embeddings ``e_f``
with a small dense part (``u``, ``b``) kept in numpy::

    S     = sum_f e_f
    logit = b + <S, u> + 1/2 (|S|^2 - sum_f |e_f|^2)      (linear term + pairwise interactions)
    dL/de_f = (p - y) (u + S - e_f)

Embedding gradients go back to the shard, which sums them per id and applies the table's
optimizer server-side (Adagrad by default) — the split that hybrid training (embeddb.trainer)
scales out. Test rows are scored with evaluation lookups, which insert nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32
from embeddb.common.evaluation import auc  # re-exported: embeddb.demo.auc is public
from embeddb.config import EmbeddingConfig, FeatureConfig
from embeddb.datasets.adult import AdultTable, load_adult
from embeddb.engine.shard import Shard

__all__ = ["DemoResult", "auc", "feature_ids", "run_demo"]


@dataclass
class DemoResult:
    """What the demo measured."""

    test_auc: float
    train_samples_per_s: float
    epochs: int
    losses: list[float] = field(default_factory=list)
    predictions: list[tuple[str, float, int]] = field(default_factory=list)


def _raw_columns(data: AdultTable) -> dict[str, npt.NDArray[np.str_]]:
    """String value of every demo feature per row (numeric columns bucketed)."""
    cols = dict(data.categorical)
    num = data.numeric
    cols["age_bucket"] = (num["age"] // 10).astype(np.int64).astype(np.str_)
    cols["hours_bucket"] = np.digitize(num["hours_per_week"], [20, 35, 40, 41, 50, 60]).astype(
        np.str_
    )
    gain = num["capital_gain"] - num["capital_loss"]
    cols["capital_bucket"] = np.digitize(gain, [-2000, -1, 1, 3000, 7000, 15000]).astype(np.str_)
    return cols


def feature_ids(values: npt.NDArray[np.str_]) -> npt.NDArray[np.uint64]:
    """Stable 64-bit ids of string values (blake2b of each distinct value, mapped back)."""
    uniq, inverse = np.unique(values, return_inverse=True)
    hashed = np.array(
        [
            int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little")
            for v in uniq
        ],
        dtype=np.uint64,
    )  # one hash per distinct value (a few dozen), then a vectorised gather
    return hashed[inverse]


class _FactorizationMachine:
    """Forward/backward of the demo model over one batch of table ids."""

    def __init__(self, shard: Shard, features: list[FeatureConfig], dim: int, seed: int) -> None:
        self.shard = shard
        self.features = features
        self.by_table: dict[str, list[FeatureConfig]] = {}
        for f in features:
            self.by_table.setdefault(f.table, []).append(f)
        rng = np.random.default_rng(seed)
        self.u = (rng.normal(size=dim) * 0.01).astype(np.float32)
        self.b = np.float32(0.0)

    def _lookup(self, ids: dict[str, npt.NDArray[np.uint64]], train: bool) -> dict[str, F32]:
        """Pooled (sum over hash-stack rounds) embedding of every feature, shape (B, dim)."""
        pooled: dict[str, F32] = {}
        for table, feats in self.by_table.items():
            flat = np.concatenate([ids[f.name].reshape(-1) for f in feats])
            vecs = self.shard.lookup(table, flat, train=train)
            start = 0
            for f in feats:
                n = ids[f.name].size
                block = vecs[start : start + n].reshape(*ids[f.name].shape, -1)
                pooled[f.name] = block.sum(axis=1) if block.ndim == 3 else block
                start += n
        return pooled

    def predict(self, ids: dict[str, npt.NDArray[np.uint64]]) -> F32:
        e = self._lookup(ids, train=False)
        return _sigmoid(self._logit(e)[0])

    def _logit(self, e: dict[str, F32]) -> tuple[F32, F32]:
        s = np.sum(list(e.values()), axis=0)
        sq = np.sum([np.einsum("ij,ij->i", v, v) for v in e.values()], axis=0)
        logit = self.b + s @ self.u + 0.5 * (np.einsum("ij,ij->i", s, s) - sq)
        return logit.astype(np.float32), s

    def train_step(self, ids: dict[str, npt.NDArray[np.uint64]], y: F32, lr: float) -> float:
        e = self._lookup(ids, train=True)
        logit, s = self._logit(e)
        p = _sigmoid(logit)
        eps = 1e-7
        loss = float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))
        g = ((p - y) / y.size).astype(np.float32)
        for table, feats in self.by_table.items():
            grads = []
            for f in feats:
                grad = g[:, None] * (self.u + s - e[f.name])
                rounds = ids[f.name].shape[1] if ids[f.name].ndim == 2 else 1
                grads.append(np.repeat(grad, rounds, axis=0) if rounds > 1 else grad)
            flat = np.concatenate([ids[f.name].reshape(-1) for f in feats])
            self.shard.apply_gradients(table, flat, np.concatenate(grads).astype(np.float32))
        self.u -= lr * (g @ s)
        self.b -= np.float32(lr * g.sum())
        return loss


def _sigmoid(x: F32) -> F32:
    return (1.0 / (1.0 + np.exp(-np.clip(x, -30, 30)))).astype(np.float32)


def _encode(config: EmbeddingConfig, data: AdultTable) -> dict[str, npt.NDArray[np.uint64]]:
    raw = _raw_columns(data)
    return {name: f.encode(feature_ids(raw[name])) for name, f in config.features.items()}


def run_demo(
    config: EmbeddingConfig,
    shard: Shard,
    epochs: int = 3,
    batch_size: int = 256,
    lr: float = 0.05,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Train the demo model for ``epochs`` over Adult's training split, then score the test split.

    Args:
        config: embedding config whose features name Adult columns (see presets/adult.yaml).
        shard: an open shard built from ``config``.
        epochs, batch_size, lr, seed: training settings (``lr`` is the dense part's SGD rate;
            the embeddings use each table's own optimizer).
        log: where progress lines go.
    """
    train, test = load_adult("train"), load_adult("test")
    train_ids, test_ids = _encode(config, train), _encode(config, test)
    dims = {f.dim for f in config.features.values()}
    if len(dims) != 1:
        raise ValueError(f"the demo model needs one dim for all features, got {sorted(dims)}")
    model = _FactorizationMachine(shard, list(config.features.values()), dims.pop(), seed)
    rng = np.random.default_rng(seed)
    result = DemoResult(test_auc=0.0, train_samples_per_s=0.0, epochs=epochs)
    trained, train_time = 0, 0.0
    for epoch in range(epochs):
        order = rng.permutation(len(train))
        start = time.perf_counter()
        losses = []
        for i in range(0, order.size, batch_size):
            rows = order[i : i + batch_size]
            batch = {name: v[rows] for name, v in train_ids.items()}
            losses.append(model.train_step(batch, train.label[rows], lr))
        train_time += time.perf_counter() - start
        trained += order.size
        result.losses.append(float(np.mean(losses)))
        scores = model.predict(test_ids)
        result.test_auc = auc(labels=test.label, scores=scores)
        log(
            f"epoch {epoch + 1}/{epochs}  loss {result.losses[-1]:.4f}  "
            f"test AUC {result.test_auc:.4f}  {trained / train_time:,.0f} samples/s"
        )
    result.train_samples_per_s = trained / train_time if train_time else 0.0
    scores = model.predict({name: v[:5] for name, v in test_ids.items()})
    for k in range(5):
        who = (
            f"{int(test.numeric['age'][k])}y {test.categorical['gender'][k]}, "
            f"{test.categorical['occupation'][k]}, {test.categorical['education'][k]}"
        )
        result.predictions.append((who, float(scores[k]), int(test.label[k])))
    return result
