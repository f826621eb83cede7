"""What the plain PyTorch scripts that benchmarks/train.py times against ``embeddb train`` share
(``_train_adult_torch.py``, ``_train_public_torch.py``): a vocabulary per categorical column,
one sparse ``nn.Embedding`` per column (normal(0, 0.05), Adagrad lr 0.05: the shards' optimizer
of the jobs they mirror), the dense network with Adam, shuffled epochs, a rank AUC. No embeddb
import: what a user would write by hand.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

EMB_LR = 0.05
EMB_INIT_ACC = 0.01
EMB_EPS = 1e-10
EMB_STD = 0.05

#: (ids (n, columns) int64, numeric (n, w) float32 or None, labels (n, 1) float32)
Arrays = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]
Model = Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor]


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


def vocabularies(rows: Sequence[dict[str, str]], columns: Sequence[str]) -> list[dict[str, int]]:
    """Per column, its training values' indexes (an unseen value gets ``len(vocab)``)."""
    return [{v: i for i, v in enumerate(sorted({r[c] for r in rows}))} for c in columns]


def id_array(
    rows: Sequence[dict[str, str]], columns: Sequence[str], vocab: Sequence[dict[str, int]]
) -> torch.Tensor:
    return torch.from_numpy(
        np.array(
            [[v.get(r[c], len(v)) for c, v in zip(columns, vocab, strict=True)] for r in rows],
            np.int64,
        )
    )


def train_and_score(
    vocab: Sequence[dict[str, int]],
    dim: int,
    model: nn.Module,
    train: Arrays,
    test: Arrays,
    epochs: int,
    batch: int,
    dense_lr: float = 1e-3,
) -> dict[str, float]:
    """Train ``model`` with one embedding table per column for ``epochs`` shuffled epochs, then
    score the test set: ``{"test_auc", "samples_per_s"}`` (training time only)."""
    embeddings = [nn.Embedding(len(v) + 1, dim, sparse=True) for v in vocab]
    for table in embeddings:
        nn.init.normal_(table.weight, 0.0, EMB_STD)
    tables = nn.ModuleList(embeddings)
    emb_opt = torch.optim.Adagrad(
        tables.parameters(), lr=EMB_LR, initial_accumulator_value=EMB_INIT_ACC, eps=EMB_EPS
    )
    dense_opt = torch.optim.Adam(model.parameters(), lr=dense_lr)
    loss_fn = nn.BCEWithLogitsLoss()

    def forward(ids: torch.Tensor, num: torch.Tensor | None) -> torch.Tensor:
        out: torch.Tensor = model(
            [] if num is None else [num], [t(ids[:, j]) for j, t in enumerate(embeddings)]
        )
        return out

    # sparse invariant checks off, explicitly (torch warns when it is left implicit)
    invariants = torch.sparse.check_sparse_tensor_invariants(enable=False)  # type: ignore[no-untyped-call]
    ids, num, label = train
    began = time.perf_counter()
    samples = 0
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(ids))
        for lo in range(0, len(ids), batch):
            take = perm[lo : lo + batch]
            loss = loss_fn(forward(ids[take], None if num is None else num[take]), label[take])
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
    return {"test_auc": auc(test[2].numpy().ravel(), scores), "samples_per_s": samples / seconds}


def report(result: dict[str, float]) -> int:
    """Print the script's one JSON line; exit code 0."""
    print(json.dumps(result), flush=True)
    return 0
