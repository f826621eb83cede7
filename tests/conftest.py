"""Shared fixtures: real shards on real RocksDB directories under pytest's tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.shard import Shard

# numba compiles each kernel on its first call (seconds on a fresh checkout with no cache), so a
# per-example deadline would fail whichever test happens to call a kernel first.
settings.register_profile("embeddb", deadline=None)
settings.load_profile("embeddb")

# A test not marked ``slow`` starts no process (the fast tier, ``pytest -m "not slow"``).
pytest_plugins = ["tests.process_guard", "pytester"]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

MakeShard = Callable[..., Shard]


def one_table_config(
    dim: int = 4,
    capacity: int = 64,
    stripes: int = 1,
    eviction_chunk: float = 1e-6,
    optimizer: OptimizerConfig | None = None,
    **table: Any,
) -> EmbeddingConfig:
    """A config with one table ``t``; by default one stripe and exact-need eviction.

    Stripes of any size are allowed (``min_stripe_rows=1``) so that tiny test tables still
    exercise the multi-stripe paths.
    """
    spec = TableConfig(
        name="t", dim=dim, capacity=capacity, optimizer=optimizer or OptimizerConfig(), **table
    )
    return EmbeddingConfig(
        tables={"t": spec},
        store=StoreConfig(
            ram=RamTierConfig(stripes=stripes, eviction_chunk=eviction_chunk, min_stripe_rows=1)
        ),
    )


@pytest.fixture
def make_shard(tmp_path: Path) -> Iterator[MakeShard]:
    """Build shards over ``tmp_path/shard-N``; all are closed at teardown."""
    shards: list[Shard] = []

    def make(
        config: EmbeddingConfig | None = None, data_dir: Path | None = None, **kw: Any
    ) -> Shard:
        cfg = config if config is not None else one_table_config(**kw)
        shard = Shard(cfg, data_dir if data_dir is not None else tmp_path / f"shard-{len(shards)}")
        shards.append(shard)
        return shard

    yield make
    for shard in shards:
        shard.close()


def sgd(lr: float = 1.0) -> OptimizerConfig:
    return OptimizerConfig(kind=OptimizerKind.SGD, lr=lr)


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[[int], Any]]:
    """``make(n)``: ``n`` real shards served on 127.0.0.1 (``tests.test_client.Cluster``),
    stopped when the test ends."""
    from tests.test_client import serve_cluster

    with_clusters: list[Any] = []

    def make(n: int) -> Any:
        manager = serve_cluster(tmp_path / f"cluster-{len(with_clusters)}", n)
        with_clusters.append(manager)
        return manager.__enter__()

    yield make
    for manager in reversed(with_clusters):
        manager.__exit__(None, None, None)


@pytest.fixture
def two(make_cluster: Callable[[int], Any]) -> Any:
    """Two real shards (``tests.test_client.Cluster``)."""
    return make_cluster(2)


@pytest.fixture
def tokens_env(tmp_path: Path) -> dict[str, str]:
    """The variables of a fresh env file of ``docker/make_secrets.py`` (the deployment tests)."""
    from tests.deploy_support import make_tokens_env

    return make_tokens_env(tmp_path)
