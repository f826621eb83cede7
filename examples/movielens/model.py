"""The MovieLens example's model: a factorization machine over the 7 pooled embeddings (its
user x item term is matrix factorization) plus a DNN over them and the 4 numeric columns.

``forward(non_id, embeddings)``: ``non_id[0]`` is MovieLensReader's ``dense`` (n, 4);
``embeddings`` holds 7 tensors (n, dim): user_id, item_id, genres, occupation, gender,
age_bucket, zip_prefix.
"""

from __future__ import annotations

import torch
from torch import nn


class MovieLensModel(nn.Module):
    def __init__(self, num_features: int = 7, dim: int = 16, numeric: int = 4) -> None:
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
        stacked = torch.stack(embeddings, dim=1)  # (n, features, dim)
        fm = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1, keepdim=True)
        dense = self.numeric(non_id[0])
        out: torch.Tensor = self.mlp(torch.cat([dense, stacked.flatten(1)], dim=1)) + fm
        return out
