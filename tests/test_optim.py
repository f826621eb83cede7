"""Server-side optimizers against independent references (numpy float64 and torch.optim)."""

from __future__ import annotations

import numpy as np
import pytest

from embeddb.config import OptimizerConfig, OptimizerKind
from embeddb.engine.optim import Optimizer
from tests.conftest import MakeShard, ids, one_table_config

DIM = 5

OPTIMIZERS = {
    "sgd": OptimizerConfig(kind=OptimizerKind.SGD, lr=0.05, weight_decay=0.01),
    "adagrad": OptimizerConfig(
        kind=OptimizerKind.ADAGRAD, lr=0.05, weight_decay=0.01, initial_accumulator=0.1, eps=1e-8
    ),
    "adagrad_shared": OptimizerConfig(
        kind=OptimizerKind.ADAGRAD, lr=0.05, initial_accumulator=0.1, vectorwise_shared=True
    ),
    "adam": OptimizerConfig(
        kind=OptimizerKind.ADAM, lr=0.01, weight_decay=0.01, beta1=0.8, beta2=0.99, eps=1e-8
    ),
}


class Reference:
    """Per-row optimizer in float64, written from the torch.optim formulas (not our kernels)."""

    def __init__(self, config: OptimizerConfig, bound: float | None = None) -> None:
        self.c = config
        self.bound = bound
        self.rows: dict[int, dict[str, np.ndarray | float]] = {}

    def add(self, key: int, vector: np.ndarray) -> None:
        c = self.c
        acc0 = c.initial_accumulator
        self.rows[key] = {
            "w": vector.astype(np.float64),
            "acc": np.full(1 if c.vectorwise_shared else DIM, acc0, np.float64),
            "m": np.zeros(DIM),
            "v": np.zeros(DIM),
            "t": 0.0,
        }

    def step(self, keys: np.ndarray, grads: np.ndarray) -> None:
        summed: dict[int, np.ndarray] = {}
        for k, g in zip(keys.tolist(), grads.astype(np.float64), strict=True):
            summed[k] = summed.get(k, 0.0) + g
        for k, g0 in summed.items():
            if not np.isfinite(g0).all():
                continue
            r, c = self.rows[k], self.c
            w = r["w"]
            g = g0 + c.weight_decay * w
            if c.kind is OptimizerKind.SGD:
                w = w - c.lr * g
            elif c.kind is OptimizerKind.ADAGRAD:
                r["acc"] = r["acc"] + (np.mean(g * g) if c.vectorwise_shared else g * g)
                w = w - c.lr * g / (np.sqrt(r["acc"]) + c.eps)
            else:
                r["t"] += 1
                t = r["t"]
                r["m"] = c.beta1 * r["m"] + (1 - c.beta1) * g
                r["v"] = c.beta2 * r["v"] + (1 - c.beta2) * g * g
                denom = np.sqrt(r["v"]) / np.sqrt(1 - c.beta2**t) + c.eps
                w = w - (c.lr / (1 - c.beta1**t)) * r["m"] / denom
            if self.bound is not None:
                w = np.clip(w, -self.bound, self.bound)
            r["w"] = w

    def row(self, key: int) -> np.ndarray:
        r, c = self.rows[key], self.c
        if c.kind is OptimizerKind.SGD:
            return r["w"]
        if c.kind is OptimizerKind.ADAGRAD:
            return np.concatenate([r["w"], r["acc"]])
        return np.concatenate([r["w"], r["m"], r["v"], [r["t"]]])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("capacity", [1000, 6])
def test_optimizer_matches_reference_through_spills(
    make_shard: MakeShard, name: str, capacity: int
) -> None:
    """Random sparse steps with duplicates; with capacity 6 the 20 rows keep spilling to disk
    and coming back, and their state must survive every round trip."""
    config = OPTIMIZERS[name]
    shard = make_shard(dim=DIM, capacity=capacity, optimizer=config, stripes=2)
    universe = np.arange(20, dtype=np.uint64)
    ref = Reference(config)
    for key, vec in zip(universe.tolist(), shard.lookup("t", universe), strict=True):
        ref.add(key, vec)
    rng = np.random.default_rng(7)
    for _ in range(25):
        batch = rng.choice(universe, size=12, replace=True)
        grads = rng.normal(size=(12, DIM)).astype(np.float32)
        shard.lookup("t", batch)
        result = shard.apply_gradients("t", batch, grads)
        ref.step(batch, grads)
        assert result.applied == np.unique(batch).size and result.nan_skipped == 0
    found, rows = shard.peek("t", universe)
    assert found.all()
    want = np.stack([ref.row(k) for k in universe.tolist()])
    np.testing.assert_allclose(rows, want, rtol=1e-6, atol=1e-6)
    if capacity == 6:
        stats = shard.stats().tables["t"]
        assert stats.promoted > 20 and stats.evicted > 20


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_optimizer_matches_torch_optim(make_shard: MakeShard, name: str) -> None:
    """When every row receives a gradient at every step, per-row state equals torch's dense
    optimizer state, so torch.optim on a dense tensor is an exact reference."""
    torch = pytest.importorskip("torch", reason="torch (the trainer extra) is not installed")
    config = OPTIMIZERS[name]
    shard = make_shard(dim=DIM, capacity=100, optimizer=config)
    n = 9
    universe = np.arange(n, dtype=np.uint64)
    param = torch.nn.Parameter(torch.from_numpy(shard.lookup("t", universe).copy()))
    if name == "sgd":
        opt = torch.optim.SGD([param], lr=config.lr, weight_decay=config.weight_decay)
    elif name == "adagrad":
        opt = torch.optim.Adagrad(
            [param],
            lr=config.lr,
            weight_decay=config.weight_decay,
            initial_accumulator_value=config.initial_accumulator,
            eps=config.eps,
        )
    else:
        opt = torch.optim.Adam(
            [param],
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
    rng = np.random.default_rng(3)
    for _ in range(30):
        batch = np.concatenate([universe, rng.choice(universe, size=4)])  # all rows + dups
        grads = rng.normal(size=(batch.size, DIM)).astype(np.float32)
        shard.apply_gradients("t", batch, grads)
        dense = np.zeros((n, DIM), np.float32)
        np.add.at(dense, batch.astype(np.int64), grads)
        param.grad = torch.from_numpy(dense)
        opt.step()
    _, rows = shard.peek("t", universe)
    np.testing.assert_allclose(rows[:, :DIM], param.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_nan_and_inf_gradient_rows_are_skipped_and_counted(make_shard: MakeShard) -> None:
    shard = make_shard(dim=3, capacity=10)
    keys = ids(1, 2, 3, 2)
    shard.lookup("t", keys)
    _, before = shard.peek("t", ids(1, 2, 3))
    grads = np.ones((4, 3), np.float32)
    grads[0, 1] = np.nan  # id 1
    grads[3, 2] = np.inf  # second occurrence of id 2: its summed gradient is not finite
    result = shard.apply_gradients("t", keys, grads)
    assert (result.applied, result.nan_skipped, result.missing) == (1, 2, 0)
    _, after = shard.peek("t", ids(1, 2, 3))
    np.testing.assert_array_equal(after[:2], before[:2])  # vector and state untouched
    assert np.all(after[2, :3] < before[2, :3])
    assert shard.stats().tables["t"].nan_skipped == 2


def test_gradients_for_unknown_ids_are_counted_not_created(make_shard: MakeShard) -> None:
    shard = make_shard(capacity=10)
    shard.lookup("t", ids(1))
    result = shard.apply_gradients("t", ids(1, 99), np.ones((2, 4), np.float32))
    assert (result.applied, result.missing) == (1, 1)
    found, _ = shard.peek("t", ids(99))
    assert not found.any()
    assert shard.stats().tables["t"].missing_updates == 1


def test_weight_bound_clamps_after_update(make_shard: MakeShard) -> None:
    cfg = one_table_config(
        dim=2, optimizer=OptimizerConfig(kind=OptimizerKind.SGD, lr=1.0), weight_bound=0.5
    )
    shard = make_shard(cfg)
    shard.assign("t", ids(1, 2), np.array([[0.4, -0.4], [0.1, 0.0]], np.float32))
    shard.apply_gradients("t", ids(1, 2), np.array([[-1, 1], [0.2, -0.3]], np.float32))
    _, rows = shard.peek("t", ids(1, 2))
    np.testing.assert_allclose(rows, [[0.5, -0.5], [-0.1, 0.3]], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_layout_and_initial_state(name: str) -> None:
    config = OPTIMIZERS[name]
    opt = Optimizer(config, DIM)
    expected_width = {"sgd": 0, "adagrad": DIM, "adagrad_shared": 1, "adam": 2 * DIM + 1}[name]
    assert opt.state_dim == expected_width == config.state_dim(DIM)
    state = opt.initial_state(3)
    assert state.shape == (3, expected_width) and state.dtype == np.float32
    fill = config.initial_accumulator if config.kind is OptimizerKind.ADAGRAD else 0.0
    assert np.all(state == np.float32(fill))
