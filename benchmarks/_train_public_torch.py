"""The plain PyTorch script of benchmarks/train.py's public-shape job (``_train_public.py``):
the same CSV files read with the csv module, a vocabulary and an ``nn.Embedding`` (dim 16,
sparse) per field, the same network as ``builtin:dnn`` without numeric columns (MLP
352-256-128-1, ReLU), the same optimizers and epochs (``_plain_torch.py``), test AUC at the end.

Usage: ``python benchmarks/_train_public_torch.py DIR [--epochs 3] [--batch 256] [--dim 16]``
(``DIR/train.csv``, ``DIR/test.csv``, label column ``click``); prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
from _plain_torch import Arrays, id_array, report, train_and_score, vocabularies
from torch import nn

LABEL = "click"


class DNN(nn.Module):
    """``builtin:dnn``'s network for ID features only: an MLP over the concatenated
    embeddings."""

    def __init__(self, width: int, hidden: tuple[int, ...] = (256, 128)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.mlp = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = self.mlp(torch.cat(embeddings, dim=1))
        return out


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    train_rows, test_rows = read(args.directory / "train.csv"), read(args.directory / "test.csv")
    fields = [c for c in train_rows[0] if c != LABEL]
    vocab = vocabularies(train_rows, fields)

    def arrays(rows: list[dict[str, str]]) -> Arrays:
        label = torch.tensor([[float(r[LABEL])] for r in rows])
        return id_array(rows, fields, vocab), None, label

    model = DNN(len(fields) * args.dim)
    return report(
        train_and_score(
            vocab, args.dim, model, arrays(train_rows), arrays(test_rows), args.epochs, args.batch
        )
    )


if __name__ == "__main__":
    sys.exit(main())
