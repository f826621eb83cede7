"""Shared helpers of the trainer tests: shards served in-process on port 0, the Adult data as
Batch objects (built here, independent of embeddb.features), and a small dense model."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from embeddb.config import EmbeddingConfig
from embeddb.datasets.adult import AdultTable, load_adult
from embeddb.engine.shard import Shard
from embeddb.features.batch import Batch, IDTypeFeatureWithSingleID, Label, NonIDTypeFeature
from embeddb.server import ServerConfig, build_server
from embeddb.transport.rpc import RpcServer


@dataclass
class Shards:
    """``n`` shards served on 127.0.0.1 (port 0), in shard order."""

    shards: list[Shard] = field(default_factory=list)
    servers: list[RpcServer] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    def stop(self, k: int) -> None:
        """Stop serving shard ``k`` at once (the shard process "dies")."""
        self.servers[k].stop(grace=0)


@contextmanager
def serve_shards(
    config: EmbeddingConfig, data_dir: Path | None, n: int = 1, *, restore: str | None = None
) -> Iterator[Shards]:
    """Serve ``n`` shards of ``config``; ``data_dir=None`` keeps rows in temporary dirs;
    ``restore``: start every shard from that snapshot."""
    out = Shards()
    try:
        for k in range(n):
            path = None if data_dir is None else data_dir / f"shard-{k}"
            shard = Shard(config, path, shard_index=k, num_shards=n, restore=restore)
            out.shards.append(shard)
            server = build_server(shard, ServerConfig(shard_index=k, num_shards=n))
            out.servers.append(server)
            out.addresses.append(f"127.0.0.1:{server.port}")
        yield out
    finally:
        for server in out.servers:
            server.stop(grace=0)
        for shard in out.shards:
            shard.close()


def adult_config() -> EmbeddingConfig:
    """The packaged Adult preset: 11 features, 9 tables (``demographics`` shared by three
    features), ``native_country`` hash-stacked in 2 rounds."""
    text = resources.files("embeddb.presets").joinpath("adult.yaml").read_text()
    return EmbeddingConfig.from_yaml_text(text)


# ---------------------------------------------------------------------- Adult as batches
ADULT_NUMERIC = ("age", "education_num", "capital_gain", "capital_loss", "hours_per_week")


@dataclass(frozen=True)
class AdultArrays:
    ids: dict[str, npt.NDArray[np.uint64]]  # raw feature ids, one per row
    dense: npt.NDArray[np.float32]  # (n, 5) normalised numeric columns
    label: npt.NDArray[np.float32]  # (n, 1)

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def batches(
        self, batch_size: int, *, shuffle_seed: int | None = None, requires_grad: bool = True
    ) -> Iterator[Batch]:
        order = np.arange(len(self))
        if shuffle_seed is not None:
            order = np.random.default_rng(shuffle_seed).permutation(len(self))
        for start in range(0, len(self), batch_size):
            rows = order[start : start + batch_size]
            yield Batch(
                [IDTypeFeatureWithSingleID(name, v[rows]) for name, v in self.ids.items()],
                [NonIDTypeFeature(self.dense[rows], name="numeric")],
                [Label(self.label[rows], name="income")],
                requires_grad=requires_grad,
            )


def _stable_ids(values: npt.NDArray[np.str_]) -> npt.NDArray[np.uint64]:
    uniq, inverse = np.unique(values, return_inverse=True)
    hashed = np.array(
        [
            int.from_bytes(hashlib.blake2b(v.encode(), digest_size=7).digest(), "little")
            for v in uniq
        ],
        dtype=np.uint64,
    )
    return hashed[inverse]


def _arrays(table: AdultTable) -> AdultArrays:
    cols = dict(table.categorical)
    num = table.numeric
    cols["age_bucket"] = (num["age"] // 10).astype(np.int64).astype(np.str_)
    cols["hours_bucket"] = np.digitize(num["hours_per_week"], [20, 35, 40, 41, 50, 60]).astype(
        np.str_
    )
    gain = num["capital_gain"] - num["capital_loss"]
    cols["capital_bucket"] = np.digitize(gain, [-2000, -1, 1, 3000, 7000, 15000]).astype(np.str_)
    features = adult_config().features
    ids = {name: _stable_ids(cols[name]) for name in features}
    dense = np.stack(
        [
            num["age"] / 100.0,
            num["education_num"] / 16.0,
            np.log1p(num["capital_gain"]) / 12.0,
            np.log1p(num["capital_loss"]) / 9.0,
            num["hours_per_week"] / 100.0,
        ],
        axis=1,
    ).astype(np.float32)
    return AdultArrays(ids, dense, table.label.reshape(-1, 1).astype(np.float32))


@lru_cache(maxsize=2)
def adult(split: str) -> AdultArrays:
    return _arrays(load_adult(split))


# ---------------------------------------------------------------------- the Adult model
def adult_model(seed: int = 0) -> Any:
    """A small MLP over the numeric columns and the 11 pooled embeddings (dim 8)."""
    import torch
    from torch import nn

    class AdultModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = nn.Sequential(
                nn.Linear(5 + 11 * 8, 64),
                nn.ReLU(),
                nn.Linear(64, 32),
                nn.ReLU(),
                nn.Linear(32, 1),
            )

        def forward(self, non_id: list[torch.Tensor], embeddings: list[Any]) -> torch.Tensor:
            return self.mlp(torch.cat([*non_id, *embeddings], dim=1))  # type: ignore[no-any-return]

    torch.manual_seed(seed)
    return AdultModel()


def random_adult_batches(count: int, batch_size: int, seed: int) -> Iterator[Batch]:
    """Adult-shaped batches of random ids, numbers and labels (no CSV to read)."""
    rng = np.random.default_rng(seed)
    names = list(adult_config().features)
    for _ in range(count):
        yield Batch(
            [IDTypeFeatureWithSingleID(n, rng.integers(0, 50, size=batch_size)) for n in names],
            [NonIDTypeFeature(rng.random((batch_size, 5), dtype=np.float32))],
            [Label(rng.integers(0, 2, size=(batch_size, 1)).astype(np.float32))],
        )
