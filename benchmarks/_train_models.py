"""benchmarks/train.py's models, embedding configs and local clusters (see its docstring).

Two model shapes: :data:`CRITEO` (the paper's 26 ID features x dim 16 + 13 numeric -> MLP
256-128-1, batch 512) and :data:`SMALL` (10 ID features x dim 16, no numeric column -> MLP
64-32-1, batch 256: the shape of a public app-usage CTR dataset).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from embeddb.server.cluster import Cluster, ClusterConfig
from embeddb.trainer import Batch

EMB_LR = 0.05
EMB_INIT_ACC = 0.01
EMB_EPS = 1e-10
EMB_STD = 0.05
DENSE_LR = 0.1
ADULT_DIM = 8


@dataclass(frozen=True)
class Shape:
    """A benchmark model's shape: ID features (one id each, dim ``dim``), numeric columns, the
    MLP's hidden widths and the training batch size."""

    name: str
    num_id: int
    num_dense: int
    dim: int
    hidden: tuple[int, ...]
    batch: int

    def describe(self) -> str:
        mlp = "-".join(map(str, self.hidden))
        return (
            f"{self.num_id} ID features x dim {self.dim} + {self.num_dense} numeric -> MLP "
            f"{mlp}-1, batch {self.batch}"
        )


CRITEO = Shape("criteo", num_id=26, num_dense=13, dim=16, hidden=(256, 128), batch=512)
SMALL = Shape("small", num_id=10, num_dense=0, dim=16, hidden=(64, 32), batch=256)


class DenseNet(nn.Module):
    """``[numeric | pooled embeddings] -> MLP -> logit``: ``forward(non_id, embeddings)``."""

    def __init__(self, num_dense: int, num_id: int, dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = num_dense + num_id * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[Any]) -> torch.Tensor:
        return self.mlp(torch.cat([*non_id, *embeddings], dim=1))  # type: ignore[no-any-return]


def dense_net(seed: int = 0, shape: Shape = CRITEO) -> DenseNet:
    """The MLP of ``shape``, initialised from ``seed``."""
    torch.manual_seed(seed)
    return DenseNet(shape.num_dense, shape.num_id, shape.dim, shape.hidden)


class InProcessModel(nn.Module):
    """The baseline: one fused ``EmbeddingBag`` (the tables as row ranges) + the MLP."""

    def __init__(
        self, buckets: int, device: torch.device, seed: int = 0, shape: Shape = CRITEO
    ) -> None:
        super().__init__()
        self.shape = shape
        self.dense = dense_net(seed, shape)
        self.buckets = buckets
        self.bag = nn.EmbeddingBag(shape.num_id * buckets, shape.dim, mode="sum", sparse=True)
        nn.init.normal_(self.bag.weight, 0.0, EMB_STD)
        self.register_buffer(
            "row_offset", torch.arange(shape.num_id, dtype=torch.int64) * buckets, persistent=False
        )
        self.to(device)

    def rows(self, batch: Batch) -> np.ndarray:
        """``(n, features)`` int64 rows: ``id % buckets`` per feature (offsets added later)."""
        ids = np.stack([f.values for f in batch.id_type_features], axis=1)
        out: np.ndarray = (ids % np.uint64(self.buckets)).astype(np.int64)
        return out

    def forward(self, rows: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        n, k = rows.shape[0], self.shape.num_id
        row_offset = cast(torch.Tensor, self.row_offset)
        flat = (rows + row_offset).reshape(-1)
        offsets = torch.arange(0, n * k, dtype=torch.int64, device=rows.device)  # 1 id/bag
        pooled = self.bag(flat, offsets).reshape(n, k * self.shape.dim)
        out: torch.Tensor = self.dense([numeric], [pooled])
        return out


def embedding_yaml(layout: str, capacity: int, shape: Shape = CRITEO) -> str:
    """The benchmark's embedding config: ``shape``'s features, Adagrad, normal init."""
    names = [f"C{i}" for i in range(1, shape.num_id + 1)]
    lines = ["feature_index_prefix_bit: 8", "seed: 0", "slots_config:"]
    lines += [f"  {n}: {{dim: {shape.dim}}}" for n in names]
    table_capacity = capacity
    if layout == "shared":
        lines += ["feature_groups:", f"  {shape.name}: [{', '.join(names)}]"]
        table_capacity = capacity * shape.num_id
    lines += [
        "defaults:",
        f"  optimizer: {{type: adagrad, lr: {EMB_LR}, initial_accumulator: {EMB_INIT_ACC}, "
        f"eps: {EMB_EPS}}}",
        f"  initializer: {{type: normal, mean: 0.0, std: {EMB_STD}}}",
        f"  capacity: {table_capacity}",
        "store: {stripes: 4}",
    ]
    return "\n".join(lines) + "\n"


def adult_yaml() -> str:
    """The packaged Adult preset."""
    return resources.files("embeddb.presets").joinpath("adult.yaml").read_text()


def adult_model() -> nn.Module:
    """The Adult run's MLP 70-64-32-1."""
    torch.manual_seed(0)
    return DenseNet(6, 8, ADULT_DIM, (64, 32))


@contextmanager
def local_cluster(yaml_text: str, shards: int, workdir: Path) -> Iterator[list[str]]:
    """A fresh ephemeral cluster of ``shards`` shard processes serving ``yaml_text``."""
    path = workdir / f"embedding-{time.monotonic_ns()}.yaml"
    path.write_text(yaml_text)
    cluster = Cluster(
        ClusterConfig(num_shards=shards, config_path=path, ephemeral=True, log_level="warning"),
        output=lambda line: None,
    )
    try:
        cluster.start()
        yield cluster.wait_healthy()
    finally:
        cluster.stop()
