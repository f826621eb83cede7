"""The Adult example's model: a small DNN over the pooled embeddings and the numeric columns,
plus a factorization-machine term over the embeddings (PERSIA's Adult example is a DNN).

``forward(non_id, embeddings)``: ``non_id[0]`` is AdultReader's ``dense`` (n, 6) of
``log(1 + x)`` numbers; ``embeddings`` holds one (n, dim) tensor per categorical feature.
"""

from __future__ import annotations

import torch
from torch import nn


class AdultModel(nn.Module):
    def __init__(self, num_features: int = 8, dim: int = 8, numeric: int = 6) -> None:
        super().__init__()
        self.numeric = nn.BatchNorm1d(numeric)
        self.mlp = nn.Sequential(
            nn.Linear(numeric + num_features * dim, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        dense = self.numeric(non_id[0])
        stacked = torch.stack(embeddings, dim=1)  # (n, features, dim)
        fm = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1, keepdim=True)
        out: torch.Tensor = self.mlp(torch.cat([dense, stacked.flatten(1)], dim=1)) + fm
        return out
