"""The Criteo example's model, DLRM-shaped: the 13 numeric columns go through a bottom MLP to
the embedding width, then every pair of the 27 vectors (numeric + 26 pooled embeddings) meets
in a dot product, and a top MLP reads the numeric vector and the 351 dot products.

``forward(non_id, embeddings)``: ``non_id[0]`` is CriteoReader's ``dense`` (n, 13) of
``log(1 + x)``; ``embeddings`` holds 26 tensors (n, dim), one per ``C`` column.
"""

from __future__ import annotations

import torch
from torch import nn


class CriteoModel(nn.Module):
    def __init__(self, num_features: int = 26, dim: int = 16, numeric: int = 13) -> None:
        super().__init__()
        self.bottom = nn.Sequential(
            nn.BatchNorm1d(numeric), nn.Linear(numeric, 64), nn.ReLU(), nn.Linear(64, dim)
        )
        vectors = num_features + 1
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = nn.Sequential(
            nn.Linear(dim + rows.numel(), 256),
            nn.ReLU(),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, 1),
        )

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        dense = self.bottom(non_id[0])
        stacked = torch.stack([dense, *embeddings], dim=1)  # (n, 27, dim)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        out: torch.Tensor = self.top(torch.cat([dense, dots], dim=1))
        return out
