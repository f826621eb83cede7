"""The plain PyTorch script equivalent to ``embeddb train examples/adult/train.yaml``: the same
data (the packaged UCI Adult copy, read with the csv module), the same features (8 categorical
columns, one embedding of dim 8 per column, a vocabulary per column; the 6 numeric columns as
``log(1 + x)``), the same model (``examples/adult/model.py``'s ``AdultModel``), the same
optimizers (Adagrad lr 0.05 on the embeddings, normal(0, 0.05) initialisation; Adam lr 1e-3 on
the dense network), 3 shuffled epochs at batch 128, test AUC at the end. One process, no embeddb
import: what a user would write by hand (the loop: ``_plain_torch.py``, shared with
``_train_public_torch.py``). benchmarks/train.py times it, from the interpreter's
start to its exit, against the whole ``embeddb train`` command (``adult_wall_vs_torch``).

Usage: ``python benchmarks/_train_adult_torch.py [--epochs 3]``; prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
from _plain_torch import Arrays, auc, id_array, report, train_and_score, vocabularies

__all__ = ["CATEGORICAL", "NUMERIC", "auc", "main", "read"]  # auc: tests check it

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    train_rows, test_rows = read("adult.data"), read("adult.test")
    vocab = vocabularies(train_rows, CATEGORICAL)

    def arrays(rows: list[dict[str, str]]) -> Arrays:
        num = np.log1p(np.array([[float(r[c]) for c in NUMERIC] for r in rows], np.float32))
        label = np.array([[r["income"].startswith(">50K")] for r in rows], np.float32)
        return id_array(rows, CATEGORICAL, vocab), torch.from_numpy(num), torch.from_numpy(label)

    spec = importlib.util.spec_from_file_location("adult_model", ROOT / "examples/adult/model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.AdultModel(len(CATEGORICAL), 8, len(NUMERIC))
    return report(
        train_and_score(
            vocab, 8, model, arrays(train_rows), arrays(test_rows), args.epochs, args.batch
        )
    )


if __name__ == "__main__":
    sys.exit(main())
