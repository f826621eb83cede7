"""The embedding stage in a thread of the NN worker process
(:mod:`embeddb.trainer.embedding.in_process`, ``TrainerConfig(embedding_stage="thread")``)
against real shards served in-process on port 0: the process stage's interface, failures and
clean shutdown, and a training context using it within its staleness bound."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, UnavailableError
from embeddb.trainer import TrainCtx, TrainerConfig
from embeddb.trainer.embedding.in_process import SWITCH_INTERVAL_S, EmbeddingWorkerThread
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.errors import (
    EmbeddingWorkerError,
    GradientPushFailedError,
    LookupFailedError,
)
from tests.test_embedding_worker import CONFIG, FAST, features, like, wire
from tests.trainer_harness import Shards, adult, adult_config, adult_model, serve_shards

# Tests that serve shards and train for seconds are marked slow (the full suite's tier); the
# option's validation stays in the fast tier.


@pytest.fixture
def shards() -> Iterator[Shards]:
    with serve_shards(CONFIG, None, 2) as out:
        yield out


@pytest.fixture
def stage(shards: Shards) -> Iterator[EmbeddingWorkerThread]:
    worker = EmbeddingWorkerThread(CONFIG, shards.addresses, FAST, start_timeout=60)
    yield worker
    worker.close(10)


def _stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "embeddb-embedding-stage"]


@pytest.mark.slow
def test_thread_round_trip(stage: EmbeddingWorkerThread) -> None:
    assert stage.pid == os.getpid() and stage.alive
    feats = wire(features(batch_size=512))
    ref, future = stage.lookup(feats, True)
    pooled = future.result(10)
    first = pooled[0]
    assert not isinstance(first, tuple)
    assert first.shape == (512, 4) and first.flags.writeable
    assert isinstance(pooled[3], tuple) and pooled[3][0].shape == (512, 3, 4)
    stage.push_gradients(ref, like(pooled, 1.0))
    stage.flush(10)
    stats = stage.stats()
    assert stats["embeddb_trainer_gradient_pushes_total"] == 1
    assert stats["embeddb_trainer_staleness"] == 0
    _, again = stage.lookup(feats, False)
    moved = again.result(10)[0]
    assert not np.array_equal(moved, first)  # the pushed gradients were applied


@pytest.mark.slow
def test_thread_reports_lookup_and_push_failures(
    stage: EmbeddingWorkerThread, shards: Shards
) -> None:
    feats = wire(features())
    ref, future = stage.lookup(feats, True)
    pooled = future.result(10)
    shards.stop(0)
    shards.stop(1)
    stage.push_gradients(ref, like(pooled, 1.0))
    stage.flush(10)
    with pytest.raises(GradientPushFailedError, match="batch 0") as info:
        stage.raise_failure()
    assert info.value.cause == "UnavailableError"
    stage.raise_failure()  # reported once
    _, future = stage.lookup(feats, True)
    with pytest.raises(LookupFailedError):
        future.result(10)


@pytest.mark.slow
def test_a_stopped_stage_fails_pending_calls_at_once(stage: EmbeddingWorkerThread) -> None:
    _, first = stage.lookup(wire(features()), True)
    first.result(10)
    stage.lookup(wire(features()), True)  # fine: staleness 2
    _, blocked = stage.lookup(wire(features()), True)  # waits for admission
    stage._loop.call_soon_threadsafe(stage._loop.stop)  # the loop dies under it (a bug)
    with pytest.raises(EmbeddingWorkerError, match=r"stage .* stopped"):
        blocked.result(10)
    with pytest.raises(EmbeddingWorkerError):
        stage.lookup(wire(features()), False)
    with pytest.raises(EmbeddingWorkerError):
        stage.raise_failure()
    with pytest.raises(EmbeddingWorkerError):
        stage.flush(10)
    assert not stage.alive
    assert stage.close(10) is None  # already gone: nothing to drain


@pytest.mark.slow
def test_close_drains_pushes_and_ends_the_thread(shards: Shards) -> None:
    before = len(_stage_threads())
    stage = EmbeddingWorkerThread(CONFIG, shards.addresses, FAST, start_timeout=60)
    assert len(_stage_threads()) == before + 1
    ref, future = stage.lookup(wire(features()), True)
    stage.push_gradients(ref, like(future.result(10), 1.0))
    _, waiting = stage.lookup(wire(features()), True)  # buffered, never pushed
    waiting.result(10)
    final = stage.close(10)
    assert final is not None
    assert final["embeddb_trainer_gradient_pushes_total"] == 1  # drained before the exit
    assert final["embeddb_trainer_batches_discarded_total"] == 1
    assert len(_stage_threads()) == before and not stage.alive
    assert stage.close(10) is None  # idempotent
    with pytest.raises(EmbeddingWorkerError):
        stage.lookup(wire(features()), False)


@pytest.mark.slow
def test_thread_start_failures_are_clear(shards: Shards) -> None:
    before = len(_stage_threads())
    other = EmbeddingConfig.from_yaml_text("slots_config: {user: {dim: 8, table: person}}")
    with pytest.raises(ConfigError, match="dim"):
        EmbeddingWorkerThread(other, shards.addresses, FAST, start_timeout=60)
    shards.stop(0)
    with pytest.raises(UnavailableError, match=r"could not start.*shard 0"):
        EmbeddingWorkerThread(CONFIG, shards.addresses, FAST, start_timeout=60)
    assert len(_stage_threads()) == before  # no thread left behind


@pytest.mark.slow
def test_a_training_context_with_a_thread_stage_keeps_its_staleness_bound() -> None:
    staleness, batch = 3, 256
    config = TrainerConfig(
        device="cpu",
        embedding_stage="thread",
        lookup_timeout=30.0,
        worker=EmbeddingWorkerConfig(max_staleness=staleness),
    )
    torch.manual_seed(0)
    model = adult_model()
    loss_fn = nn.BCEWithLogitsLoss()
    seen: list[float] = []
    with serve_shards(adult_config(), None, 2) as shards:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        with TrainCtx(model, optimizer, adult_config(), shards.addresses, config) as ctx:
            assert isinstance(ctx._worker, EmbeddingWorkerThread)
            steps = 0
            for prepared in ctx.prepare(adult("train").batches(batch)):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
                seen.append(ctx.worker_stats()["embeddb_trainer_staleness"])
                steps += 1
                if steps == 40:
                    break
            ctx.flush()
            stats = ctx.worker_stats()
    assert stats["embeddb_trainer_gradient_pushes_total"] == steps
    assert stats["embeddb_trainer_staleness_limit"] == staleness
    assert max(seen) <= staleness and stats["embeddb_trainer_staleness_peak"] <= staleness
    assert stats["embeddb_trainer_staleness_peak"] >= 2  # lookups ran ahead
    assert stats['embeddb_trainer_failures_total{operation="gradient_push"}'] == 0


def test_the_embedding_stage_option_is_validated() -> None:
    assert TrainerConfig().embedding_stage == "process"
    with pytest.raises(ConfigError, match="embedding_stage"):
        TrainerConfig(embedding_stage="fiber")


@pytest.mark.slow
def test_a_running_stage_shortens_the_switch_interval_and_restores_it(shards: Shards) -> None:
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL_S  # Python's default, 5 ms
    stage = EmbeddingWorkerThread(CONFIG, shards.addresses, FAST, start_timeout=60)
    try:
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
    finally:
        stage.close(10)
    assert sys.getswitchinterval() == before
