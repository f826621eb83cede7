"""TrainCtx / EvalCtx end to end: Adult on real shards per mode, the staleness bound, DDP with
gloo in two processes, failures that surface as errors, and the contexts' edge cases."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp
from torch import nn

from embeddb.client import Client
from embeddb.common.evaluation import auc
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, InvalidArgumentError
from embeddb.trainer import (
    Batch,
    DistEnv,
    EmbeddingWorkerConfig,
    EvalCtx,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    Mode,
    TrainCtx,
    TrainerConfig,
)
from embeddb.trainer import ctx as ctx_module
from embeddb.trainer.dense import DelayedDense
from embeddb.trainer.embedding_ctx import embedding_gradients
from embeddb.trainer.errors import EmbeddingWorkerError, TrainerError
from tests.support import eventually, free_port
from tests.trainer_harness import (
    Shards,
    adult,
    adult_config,
    adult_model,
    random_adult_batches,
    serve_shards,
)

BATCH = 512
STALENESS = 4


@dataclass
class Run:
    mode: str
    auc: float
    stats: dict[str, float]
    staleness_seen: list[float]


def train_adult(addresses: list[str], mode: str, epochs: int = 1, batch_size: int = BATCH) -> Run:
    torch.manual_seed(0)
    model = adult_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    train, test = adult("train"), adult("test")
    config = TrainerConfig(
        mode=mode, device="cpu", worker=EmbeddingWorkerConfig(max_staleness=STALENESS)
    )
    seen: list[float] = []
    with TrainCtx(model, optimizer, adult_config(), addresses, config) as ctx:
        for epoch in range(epochs):
            for step, prepared in enumerate(
                ctx.prepare(train.batches(batch_size, shuffle_seed=epoch))
            ):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
                if step % 8 == 0:  # the exported gauge, sampled while training
                    seen.append(ctx.worker_stats()["embeddb_trainer_staleness"])
        ctx.flush()
        with ctx.eval_ctx() as ev:
            scores = [
                ev.forward(p)[0].numpy().ravel()
                for p in ev.prepare(test.batches(4096, requires_grad=False))
            ]
        stats = ctx.worker_stats()
    score = auc(labels=test.label.ravel(), scores=np.concatenate(scores))
    return Run(mode, score, stats, seen)


@pytest.fixture(scope="module")
def adult_runs() -> Iterator[dict[str, Run]]:
    """One epoch of Adult per mode, each on fresh shards (in this process, port 0)."""
    torch.set_num_threads(1)
    runs: dict[str, Run] = {}
    for mode in ("hybrid", "sync", "async"):
        with serve_shards(adult_config(), None, 1) as shards:
            runs[mode] = train_adult(shards.addresses, mode)
        r = runs[mode]
        print(
            f"\n{mode}: test AUC {r.auc:.4f}, peak staleness "
            f"{r.stats['embeddb_trainer_staleness_peak']:.0f}"
        )
    yield runs


@pytest.mark.slow
def test_hybrid_training_on_adult_reaches_the_target_auc(adult_runs: dict[str, Run]) -> None:
    run = adult_runs["hybrid"]
    assert run.auc >= 0.88
    stats = run.stats
    steps = (len(adult("train")) + BATCH - 1) // BATCH
    assert stats['embeddb_trainer_lookups_total{train="true"}'] == steps
    assert stats["embeddb_trainer_gradient_pushes_total"] == steps
    assert stats['embeddb_trainer_failures_total{operation="lookup"}'] == 0
    assert stats['embeddb_trainer_failures_total{operation="gradient_push"}'] == 0
    assert stats["embeddb_trainer_batches_expired_total"] == 0
    assert stats["embeddb_trainer_batches_discarded_total"] == 0


@pytest.mark.slow
def test_the_staleness_bound_is_respected_in_every_mode(adult_runs: dict[str, Run]) -> None:
    for mode, run in adult_runs.items():
        bound = 1 if mode == "sync" else STALENESS
        assert run.stats["embeddb_trainer_staleness_limit"] == bound
        assert max(run.staleness_seen) <= bound
        assert run.stats["embeddb_trainer_staleness_peak"] <= bound
    # Lookups really ran ahead in hybrid: more than one batch was in flight at some point.
    assert adult_runs["hybrid"].stats["embeddb_trainer_staleness_peak"] >= 2


@pytest.mark.slow
def test_sync_and_hybrid_reach_close_auc_and_async_learns(adult_runs: dict[str, Run]) -> None:
    hybrid, sync, async_ = adult_runs["hybrid"], adult_runs["sync"], adult_runs["async"]
    assert sync.auc >= 0.88
    assert abs(hybrid.auc - sync.auc) <= 0.01
    assert async_.auc >= 0.85


# ---------------------------------------------------------------------- DDP with gloo
def _ddp_rank(rank: int, addresses: list[str], ports: list[int], out: str) -> None:
    torch.set_num_threads(1)
    for mode, port in zip(("hybrid", "async"), ports, strict=True):
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        model = adult_model(seed=rank)  # different on each rank: rank 0's must win
        initial = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        config = TrainerConfig(
            mode=mode, device="cpu", worker=EmbeddingWorkerConfig(max_staleness=2)
        )
        with TrainCtx(model, optimizer, adult_config(), addresses, config) as ctx:
            assert ctx.dist_env == DistEnv(rank, 2, rank, "127.0.0.1", port)
            assert torch.distributed.get_world_size() == 2
            batches = random_adult_batches(6, 128, seed=rank)  # each rank its own data
            for prepared in ctx.prepare(batches):
                output, labels = ctx.forward(prepared)
                ctx.backward(nn.functional.binary_cross_entropy_with_logits(output, labels[0]))
        assert not torch.distributed.is_initialized()  # the context left the group
        moved = any(not torch.equal(a, b) for a, b in zip(initial, model.parameters(), strict=True))
        torch.save({"state": model.state_dict(), "moved": moved}, f"{out}/{mode}-{rank}.pt")


@pytest.mark.slow
def test_two_ddp_ranks_with_gloo_keep_identical_dense_parameters(tmp_path: Path) -> None:
    with serve_shards(adult_config(), None, 2) as shards:
        tmp.spawn(
            _ddp_rank,
            args=(shards.addresses, [free_port(), free_port()], str(tmp_path)),
            nprocs=2,
            join=True,
        )
    for mode in ("hybrid", "async"):
        ranks = [torch.load(tmp_path / f"{mode}-{r}.pt") for r in range(2)]
        assert ranks[0]["moved"] and ranks[1]["moved"]
        for name, tensor in ranks[0]["state"].items():
            assert torch.equal(tensor, ranks[1]["state"][name]), f"{mode}: {name} differs"


# ---------------------------------------------------------------------- failures
@pytest.fixture
def two_shards() -> Iterator[Shards]:
    with serve_shards(adult_config(), None, 2) as shards:
        yield shards


FAST = TrainerConfig(
    device="cpu",
    lookup_timeout=20.0,
    close_timeout=20.0,
    worker=EmbeddingWorkerConfig(max_staleness=2, retries=1, retry_backoff=0.01, shard_timeout=2.0),
)


def new_ctx(addresses: list[str], config: TrainerConfig = FAST) -> TrainCtx:
    model = adult_model()
    return TrainCtx(
        model, torch.optim.SGD(model.parameters(), lr=0.1), adult_config(), addresses, config
    )


def step(ctx: TrainCtx, prepared: Any) -> None:
    output, labels = ctx.forward(prepared)
    ctx.backward(nn.functional.binary_cross_entropy_with_logits(output, labels[0]))


@pytest.mark.slow
def test_a_shard_going_down_surfaces_as_an_error_not_a_hang(two_shards: Shards) -> None:
    with new_ctx(two_shards.addresses) as ctx:
        batches = ctx.prepare(adult("train").batches(128))
        step(ctx, next(batches))
        two_shards.stop(1)
        with pytest.raises(TrainerError, match="shard 1") as info:  # a hang: pytest-timeout
            for prepared in batches:
                step(ctx, prepared)
        assert info.value.cause == "UnavailableError"


@pytest.mark.slow
def test_a_dead_embedding_worker_surfaces_at_the_next_call(two_shards: Shards) -> None:
    with new_ctx(two_shards.addresses) as ctx:
        batches = ctx.prepare(adult("train").batches(128))
        step(ctx, next(batches))
        os.kill(ctx._worker.pid, signal.SIGKILL)
        with pytest.raises(EmbeddingWorkerError, match="exited with code -9"):
            for prepared in batches:
                step(ctx, prepared)


@pytest.mark.slow
def test_training_batches_without_backward_never_clog_the_window(two_shards: Shards) -> None:
    with new_ctx(two_shards.addresses) as ctx:
        # forward() only, as if evaluating with the training context: each forward releases
        # the previous batch; skipped prepared batches are released too.
        batches = ctx.prepare(adult("train").batches(64))
        for i, prepared in enumerate(itertools.islice(batches, 12)):
            if i % 3 != 2:
                ctx.forward(prepared)
        step(ctx, next(batches))
        batches.close()  # the rest, looked up ahead, is released (once its lookup lands)
        ctx.flush()
        stats = eventually(
            lambda: (got := ctx.worker_stats())["embeddb_trainer_staleness"] == 0 and got,
            30,
            "every batch to be released",
        )
        assert stats["embeddb_trainer_batches_discarded_total"] >= 12
        assert stats["embeddb_trainer_batches_expired_total"] == 0
        with pytest.raises(TrainerError, match="forward"):
            ctx.backward(torch.zeros((), requires_grad=True))


@pytest.mark.slow
def test_evaluation_inserts_no_rows(two_shards: Shards) -> None:
    model = adult_model()
    with EvalCtx(model, adult_config(), two_shards.addresses, FAST) as ev:
        outputs = [ev.forward(p)[0] for p in ev.prepare(adult("test").batches(2048))]
    assert model.training  # restored after each forward
    assert all(torch.isfinite(o).all() for o in outputs)
    assert all(shard.stats().totals()["rows"] == 0 for shard in two_shards.shards)


SEQUENCE_CONFIG = EmbeddingConfig.from_yaml_text(
    """
slots_config:
  user: {dim: 4}
  clicks: {dim: 4, embedding_summation: false, sample_fixed_size: 3}
defaults:
  optimizer: {type: sgd, lr: 0.5}
  initializer: {type: normal, std: 0.1}
"""
)


class SequenceModel(nn.Module):
    """Masked mean of a raw sequence feature, concatenated with a pooled one."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(8, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[Any]) -> torch.Tensor:
        user, (clicks, mask) = embeddings
        assert clicks.shape[1:] == (3, 4) and mask.dtype == torch.bool and not non_id
        weights = mask.float().unsqueeze(-1)
        mean = (clicks * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.out(torch.cat([user, mean], dim=1))  # type: ignore[no-any-return]


@pytest.mark.slow
def test_sequence_features_get_embeddings_with_a_mask_and_gradients() -> None:
    batch = Batch(
        [
            IDTypeFeatureWithSingleID("user", [1, 2, 3]),
            IDTypeFeature("clicks", [[10, 11, 12, 13], [], [11]]),
        ],
        labels=[Label(np.array([[1.0], [0.0], [1.0]], np.float32))],
    )
    with serve_shards(SEQUENCE_CONFIG, None, 1) as shards:
        model = SequenceModel()
        config = TrainerConfig(device="cpu", worker=EmbeddingWorkerConfig(max_staleness=1))
        with TrainCtx(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            SEQUENCE_CONFIG,
            shards.addresses,
            config,
        ) as ctx:
            for prepared in ctx.prepare([batch, batch]):
                step(ctx, prepared)
            ctx.flush()
        with Client(shards.addresses) as client:
            clicks = SEQUENCE_CONFIG.features["clicks"].encode(np.array([10, 11, 12, 13]))
            rows = client.lookup("clicks", clicks, train=False)
    assert rows[:3].any(axis=1).all()
    assert not rows[3].any()  # beyond sample_fixed_size: never looked up, never inserted


def embedding_deltas(mode: str, amp: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Rows after two steps minus rows after the lookup, for one fixed batch (SGD tables)."""
    monkeypatch.setattr(ctx_module, "_device", lambda config, local_rank: torch.device("cpu"))
    batch = Batch(
        [
            IDTypeFeatureWithSingleID("user", [1, 2, 3]),
            IDTypeFeature("clicks", [[10, 11, 12, 13], [], [11]]),
        ],
        labels=[Label(np.array([[1.0], [0.0], [1.0]], np.float32))],
    )
    keys = {
        "user": SEQUENCE_CONFIG.features["user"].encode(np.array([1, 2, 3])),
        "clicks": SEQUENCE_CONFIG.features["clicks"].encode(np.array([10, 11, 12])),
    }
    with serve_shards(SEQUENCE_CONFIG, None, 1) as shards, Client(shards.addresses) as client:
        torch.manual_seed(0)
        model = SequenceModel()
        config = TrainerConfig(
            device="cpu",
            mode=mode,
            mixed_precision=amp,
            worker=EmbeddingWorkerConfig(max_staleness=1),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with TrainCtx(model, optimizer, SEQUENCE_CONFIG, shards.addresses, config) as ctx:
            before = None
            for prepared in ctx.prepare([batch, batch, batch]):
                if before is None:
                    ctx.flush()
                    prepared.embeddings.result()
                    before = {t: client.lookup(t, k, train=False) for t, k in keys.items()}
                step(ctx, prepared)
            ctx.flush()
            assert ctx.worker_stats()["embeddb_trainer_nonfinite_gradients_total"] == 0
            after = {t: client.lookup(t, k, train=False) for t, k in keys.items()}
    return {t: after[t] - before[t] for t in keys}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hybrid", "async"])
def test_mixed_precision_unscales_embedding_gradients(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GradScaler path, run on CPU (autocast float16): the shards must receive the same
    embedding gradients as without mixed precision, not ones 65536 times larger."""
    plain = embedding_deltas(mode, False, monkeypatch)
    scaled = embedding_deltas(mode, True, monkeypatch)
    for table in plain:
        assert np.abs(plain[table]).max() > 1e-4
        np.testing.assert_allclose(scaled[table], plain[table], rtol=0.05, atol=1e-3)


# ---------------------------------------------------------------------- units
def test_embedding_gradients_are_unscaled_and_nonfinite_rows_zeroed() -> None:
    pooled = torch.zeros((3, 2), requires_grad=True)
    sequence = torch.zeros((2, 2, 2), requires_grad=True)
    unused = torch.zeros((3, 2), requires_grad=True)
    pooled.grad = torch.tensor([[4.0, 8.0], [float("inf"), 0.0], [2.0, 2.0]])
    sequence.grad = torch.tensor([[[4.0, 4.0], [float("nan"), 1.0]], [[8.0, 0.0], [0.0, 0.0]]])
    grads, nonfinite = embedding_gradients([pooled, sequence, unused], scale=4.0)
    assert nonfinite == 2 and grads[2] is None
    assert grads[0] is not None and grads[0].tolist() == [[1, 2], [0, 0], [0.5, 0.5]]
    assert grads[1] is not None and grads[1].tolist() == [[[1, 1], [0, 0]], [[2, 0], [0, 0]]]
    assert grads[0].dtype == np.float32


def test_async_dense_updates_apply_each_gradient_delay_steps_late() -> None:
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    dense = DelayedDense(
        model, torch.optim.SGD(model.parameters(), lr=1.0), None, delay=2, distributed=False
    )
    weights = []
    for t in range(1, 4):
        model.weight.grad = torch.full((1, 2), float(t))  # gradient t at step t
        dense.step()
        weights.append(model.weight.detach().clone().ravel().tolist())
    assert weights == [[1, 1], [1, 1], [0, 0]]  # step 3 applied the gradient of step 1
    dense.flush()
    assert model.weight.detach().ravel().tolist() == [-5, -5]  # then 2 and 3


def test_trainer_config_and_dist_env_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mode"):
        TrainerConfig(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_staleness"):
        TrainerConfig(worker=EmbeddingWorkerConfig(max_staleness=0))
    with pytest.raises(ConfigError, match="worker"):
        TrainerConfig(worker={"max_staleness": 2})  # type: ignore[arg-type]
    sync = TrainerConfig(mode="sync", worker=EmbeddingWorkerConfig(max_staleness=8))  # type: ignore[arg-type]
    assert sync.embedding_staleness == 1 and sync.embedding_worker().max_staleness == 1
    asynchronous = TrainerConfig(mode=Mode.ASYNC, worker=EmbeddingWorkerConfig(max_staleness=3))
    assert asynchronous.dense_delay == 3 and asynchronous.embedding_worker().max_staleness == 3
    ranked = TrainerConfig(worker=EmbeddingWorkerConfig(metrics_port=9000))
    assert ranked.embedding_worker(local_rank=2).metrics_port == 9002
    with pytest.raises(ConfigError, match="metrics_port"):
        TrainerConfig(worker=EmbeddingWorkerConfig(metrics_port=65535)).embedding_worker(1)
    model = adult_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="mixed_precision"):
        TrainCtx(
            model,
            optimizer,
            adult_config(),
            ["127.0.0.1:1"],
            TrainerConfig(device="cpu", mixed_precision=True),
        )
    with pytest.raises(ConfigError, match="address file"):
        TrainCtx(model, optimizer, adult_config(), tmp_path / "missing.txt", FAST)
    assert DistEnv.from_environ({}) == DistEnv()
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
    }
    assert DistEnv.from_environ(env) == DistEnv(1, 2, 1, "h", 29500)
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        DistEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="RANK"):
        DistEnv.from_environ({**env, "RANK": "2"})
    with pytest.raises(ConfigError, match="integer"):
        DistEnv.from_environ({**env, "WORLD_SIZE": "two"})


@pytest.mark.slow
def test_batches_with_unknown_features_are_rejected(two_shards: Shards) -> None:
    batch = Batch([IDTypeFeatureWithSingleID("zipcode", [1])], labels=[Label(np.ones((1, 1)))])
    with new_ctx(two_shards.addresses) as ctx, pytest.raises(InvalidArgumentError, match="zipcode"):
        next(ctx.prepare([batch]))


# ---------------------------------------------------------------------- GPU (NCCL, AMP)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mixed_precision_training_on_cuda(two_shards: Shards) -> None:
    config = TrainerConfig(
        device="cuda", mixed_precision=True, worker=EmbeddingWorkerConfig(max_staleness=2)
    )
    with new_ctx(two_shards.addresses, config) as ctx:
        for prepared in itertools.islice(ctx.prepare(adult("train").batches(256)), 20):
            output, labels = ctx.forward(prepared)
            assert output.is_cuda and output.dtype == torch.float32
            ctx.backward(nn.functional.binary_cross_entropy_with_logits(output, labels[0]))
        ctx.flush()
        assert ctx.worker_stats()["embeddb_trainer_gradient_pushes_total"] == 20


def _nccl_rank(rank: int, addresses: list[str], port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    model = adult_model(seed=rank)
    config = TrainerConfig(device="cuda", worker=EmbeddingWorkerConfig(max_staleness=2))
    with TrainCtx(
        model, torch.optim.SGD(model.parameters(), lr=0.1), adult_config(), addresses, config
    ) as ctx:
        assert torch.distributed.get_backend() == "nccl"
        for prepared in itertools.islice(
            ctx.prepare(adult("train").batches(128, shuffle_seed=rank)), 5
        ):
            step(ctx, prepared)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, f"{out}/nccl-{rank}.pt")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_ddp_ranks_with_nccl_keep_identical_dense_parameters(
    two_shards: Shards, tmp_path: Path
) -> None:
    tmp.spawn(_nccl_rank, args=(two_shards.addresses, free_port(), str(tmp_path)), nprocs=2)
    a, b = (torch.load(tmp_path / f"nccl-{r}.pt") for r in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)
