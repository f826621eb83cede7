"""Freshness: a model served from a read-only follower sees the primary's training, and once
caught up predicts exactly what the primary would (how soon is a figure of
``benchmarks/follower_lag.py``, not asserted here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.engine.shard import Shard
from embeddb.server import build_server
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.serving import InferCtx
from embeddb.trainer import EmbeddingWorkerConfig, TrainCtx, TrainerConfig
from tests.support import eventually
from tests.trainer_harness import adult, adult_config, adult_model

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

FAST = TrainerConfig(
    device="cpu", worker=EmbeddingWorkerConfig(max_staleness=2, retries=1, shard_timeout=5.0)
)
TIMEOUT_S = 30.0


@pytest.fixture
def primary_and_follower(tmp_path: Path) -> Iterator[tuple[str, str, Shard, Follower]]:
    shard = Shard(adult_config(), tmp_path / "primary")
    server = build_server(shard)
    primary = f"127.0.0.1:{server.port}"
    options = FollowerOptions(primary, backoff=0.02, max_backoff=0.2)
    follower = Follower(adult_config(), tmp_path / "follower", options)
    served = build_server(follower.served, serving=False)
    follower.start(on_ready=lambda: served.set_serving(True))
    try:
        assert follower.wait_ready(10)
        yield primary, f"127.0.0.1:{served.port}", shard, follower
    finally:
        served.stop(grace=0)
        follower.stop()
        server.stop(grace=0)
        shard.close()


def test_follower_predictions_follow_training(
    primary_and_follower: tuple[str, str, Shard, Follower], tmp_path: Path
) -> None:
    primary, replica, shard, follower = primary_and_follower
    torch.manual_seed(0)
    model = adult_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    test = next(adult("test").batches(32, requires_grad=False))
    batches = adult("train").batches(256, shuffle_seed=1)
    with TrainCtx(model, optimizer, adult_config(), [primary], FAST) as ctx:

        def train(steps: int) -> None:
            for _, prepared in zip(range(steps), ctx.prepare(batches), strict=False):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
            ctx.flush()

        train(5)
        model_dir = ctx.export_model(tmp_path / "model")
        with InferCtx(model_dir, [replica]) as served, InferCtx(model_dir, [primary]) as direct:

            def caught_up() -> bool:
                return follower.applied_seq >= shard.seq

            eventually(caught_up, TIMEOUT_S, "the first steps to reach the follower")
            before = served.predict(test)
            np.testing.assert_array_equal(before, direct.predict(test))
            train(5)  # embeddings move on the primary only; the dense part is the exported one
            moved = direct.predict(test)
            assert np.abs(moved - before).max() > 1e-4  # training changed the embeddings
            eventually(
                lambda: not np.array_equal(served.predict(test), before),
                TIMEOUT_S,
                "the follower's predictions to change",
            )
            eventually(caught_up, TIMEOUT_S, "the follower to catch up")
            np.testing.assert_array_equal(served.predict(test), direct.predict(test))
            np.testing.assert_array_equal(served.predict(test), moved)
