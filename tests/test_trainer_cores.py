"""The core budget: its arithmetic, the training context applying (and restoring) torch's
threads, the embedding worker's share, and the launcher's environment for its ranks."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from embeddb.errors import ConfigError
from embeddb.trainer import EmbeddingWorkerConfig, TrainCtx, TrainerConfig
from embeddb.trainer import ctx as ctx_module
from embeddb.trainer.cores import CoreBudget, available_cpus, core_budget, local_addresses
from embeddb.trainer.launcher.job import JobConfig
from embeddb.trainer.launcher.launch import rank_environ
from tests.trainer_harness import Shards, adult_config, adult_model, serve_shards

MODEL = Path(__file__).resolve().parents[1] / "examples" / "adult" / "model.py"


# ---------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((2, 1, 1, False), CoreBudget(1, 1, 1, 0)),
        ((4, 1, 1, True), CoreBudget(2, 1, 1, 1)),
        ((16, 1, 1, True), CoreBudget(6, 2, 5, 4)),
        ((16, 2, 0, True), CoreBudget(5, 2, 4, 2)),
        ((64, 1, 0, True), CoreBudget(59, 2, 32, 4)),
    ],
)
def test_the_budget_splits_the_cpus(args: tuple[int, int, int, bool], expected: CoreBudget) -> None:
    assert core_budget(*args) == expected


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16, 96])
@pytest.mark.parametrize("ranks", [1, 2, 8])
@pytest.mark.parametrize("shards", [0, 1, 4])
def test_the_budget_never_gives_less_than_one_thread_nor_more_than_the_cpus(
    cpus: int, ranks: int, shards: int
) -> None:
    budget = core_budget(cpus, ranks, shards, loaders=True)
    assert min(budget.torch_threads, budget.worker_threads, budget.shard_threads) >= 1
    assert budget.loader_processes >= 0
    used = ranks * (budget.torch_threads + budget.loader_processes) + shards * budget.shard_threads
    assert used <= max(cpus, ranks + shards)  # oversubscribed only when there is no room


def test_a_bad_budget_request_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cpus"):
        core_budget(0, 1, 1, False)
    with pytest.raises(ConfigError, match="ranks"):
        core_budget(2, 0, 1, False)
    with pytest.raises(ConfigError, match="local_shards"):
        core_budget(2, 1, -1, False)


def test_local_addresses_counts_the_shards_on_this_machine() -> None:
    here = socket.gethostname()
    addresses = ["127.0.0.1:1", "localhost:2", f"{here}:3", "[::1]:4", "10.255.0.7:5", "x.y:6"]
    assert local_addresses(addresses) == 4


def test_torch_threads_is_validated() -> None:
    assert TrainerConfig(torch_threads=3).torch_threads == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="torch_threads"):
            TrainerConfig(torch_threads=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="threads"):
        EmbeddingWorkerConfig(threads=0)


# ---------------------------------------------------------------------- the context
@pytest.fixture
def shard() -> Iterator[Shards]:
    with serve_shards(adult_config(), None, 1) as shards:
        yield shards


@pytest.fixture
def threads() -> Iterator[int]:
    """torch's thread count before the test, restored after it."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def open_ctx(addresses: list[str], config: TrainerConfig) -> TrainCtx:
    model = adult_model()
    return TrainCtx(
        model, torch.optim.SGD(model.parameters(), lr=0.1), adult_config(), addresses, config
    )


@pytest.mark.slow
def test_an_explicit_torch_threads_is_applied_and_restored_at_close(
    shard: Shards, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # an explicit setting wins over it too
    torch.set_num_threads(2)
    with open_ctx(shard.addresses, TrainerConfig(device="cpu", torch_threads=3)) as ctx:
        assert torch.get_num_threads() == 3
        assert ctx._worker.config.threads == 1
    assert torch.get_num_threads() == 2


@pytest.mark.slow
def test_without_a_setting_the_context_applies_the_budget(
    shard: Shards, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(ctx_module, "available_cpus", lambda: 16)
    torch.set_num_threads(1)
    with open_ctx(shard.addresses, TrainerConfig(device="cpu")) as ctx:
        # 16 CPUs, one rank, one shard on loopback, no loaders: 16 - 5 (shard) - 1 (worker)
        assert torch.get_num_threads() == core_budget(16, 1, 1, False).torch_threads == 10
        assert ctx._worker.config.threads == 2
    assert torch.get_num_threads() == 1


@pytest.mark.slow
def test_omp_num_threads_is_left_to_torch_when_nothing_is_set(
    shard: Shards, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(ctx_module, "available_cpus", lambda: 16)
    torch.set_num_threads(2)
    with open_ctx(shard.addresses, TrainerConfig(device="cpu")):
        assert torch.get_num_threads() == 2


# ---------------------------------------------------------------------- the launcher
def test_the_launcher_gives_its_ranks_the_budget_unless_omp_num_threads_is_set(
    tmp_path: Path,
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {MODEL}:AdultModel\nworkers: 2\nshards: 1\n")
    job = JobConfig.from_yaml(path)
    env = rank_environ(job, {"PATH": "/bin"})
    expected = core_budget(available_cpus(), 2, 1, loaders=True).torch_threads
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": str(expected)}
    assert rank_environ(job, {"OMP_NUM_THREADS": "5"})["OMP_NUM_THREADS"] == "5"
