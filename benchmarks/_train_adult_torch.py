"""The plain PyTorch script equivalent to ``embeddb train examples/adult/train.yaml``: the same
data (the packaged UCI Adult copy, read with the csv module), the same features (8 categorical
columns, one embedding of dim 8 per column, a vocabulary per column; the 6 numeric columns as
``log(1 + x)``), the same model (``examples/adult/model.py``'s ``AdultModel``), the same
optimizers (Adagrad lr 0.05 on the embeddings, normal(0, 0.05) initialisation; Adam lr 1e-3 on
the dense network), 3 shuffled epochs at batch 128, test AUC at the end. One process, no embeddb
import: what a user would write by hand. benchmarks/train.py times it, from the interpreter's
start to its exit, against the whole ``embeddb train`` command (``adult_wall_vs_torch``).

Usage: ``python benchmarks/_train_adult_torch.py [--epochs 3]``; prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "embeddb" / "datasets" / "adult"
COLUMNS = (
    *("age", "workclass", "fnlwgt", "education", "education_num", "marital_status"),
    *("occupation", "relationship", "race", "gender", "capital_gain", "capital_loss"),
    *("hours_per_week", "native_country", "income"),
)
NUMERIC = ("age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week")
CATEGORICAL = tuple(c for c in COLUMNS if c not in NUMERIC and c != "income")


def read(name: str) -> list[dict[str, str]]:
    with gzip.open(ADULT / f"{name}.gz", "rt") as fh:
        rows = csv.reader(line for line in fh if line.strip() and not line.startswith("|"))
        return [dict(zip(COLUMNS, (v.strip() for v in row), strict=True)) for row in rows]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Rank AUC (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    train_rows, test_rows = read("adult.data"), read("adult.test")
    vocab = {
        c: {v: i for i, v in enumerate(sorted({r[c] for r in train_rows}))} for c in CATEGORICAL
    }

    def arrays(rows: list[dict[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = np.array(
            [[vocab[c].get(r[c], len(vocab[c])) for c in CATEGORICAL] for r in rows], np.int64
        )
        num = np.log1p(np.array([[float(r[c]) for c in NUMERIC] for r in rows], np.float32))
        label = np.array([[r["income"].startswith(">50K")] for r in rows], np.float32)
        return torch.from_numpy(ids), torch.from_numpy(num), torch.from_numpy(label)

    train, test = arrays(train_rows), arrays(test_rows)
    spec = importlib.util.spec_from_file_location("adult_model", ROOT / "examples/adult/model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.AdultModel(len(CATEGORICAL), 8, len(NUMERIC))
    embeddings = [nn.Embedding(len(vocab[c]) + 1, 8, sparse=True) for c in CATEGORICAL]
    for table in embeddings:
        nn.init.normal_(table.weight, 0.0, 0.05)
    tables = nn.ModuleList(embeddings)
    emb_opt = torch.optim.Adagrad(
        tables.parameters(), lr=0.05, initial_accumulator_value=0.01, eps=1e-10
    )
    dense_opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()

    def forward(ids: torch.Tensor, num: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model([num], [t(ids[:, j]) for j, t in enumerate(embeddings)])
        return out

    # sparse invariant checks off, explicitly (torch warns when it is left implicit)
    invariants = torch.sparse.check_sparse_tensor_invariants(enable=False)  # type: ignore[no-untyped-call]
    began = time.perf_counter()
    samples = 0
    n = len(train[0])
    for _ in range(args.epochs):
        model.train()
        perm = torch.randperm(n)
        for lo in range(0, n, args.batch):
            take = perm[lo : lo + args.batch]
            loss = loss_fn(forward(train[0][take], train[1][take]), train[2][take])
            emb_opt.zero_grad(set_to_none=True)
            dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            with invariants:
                emb_opt.step()
            dense_opt.step()
            samples += len(take)
    seconds = time.perf_counter() - began
    model.eval()
    with torch.no_grad():
        scores = forward(test[0], test[1]).numpy().ravel()
    result = {"test_auc": auc(test[2].numpy().ravel(), scores), "samples_per_s": samples / seconds}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
