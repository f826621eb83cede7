"""Write a click log to train on: ``python examples/clicks/make_data.py [--rows N] [--out DIR]``.

``DIR/train.csv`` and ``DIR/test.csv`` (default ``examples/clicks/data``, 200,000 rows of which
20% test), a CSV with a header and string columns, as a user's own export would be::

    user,item,city,device,tags,price,age,clicked
    u1043,i77,Zurich,ios,sport|news,12.47,34,0
    u88,i5,,android,,3.10,,1

* ``user`` (``u0``..), ``item`` (``i0``..): Zipf-distributed ids; ``city`` (sometimes empty),
  ``device``: a few values; ``tags``: 0-3 tags separated by ``|`` (a multi-valued column);
* ``price``: log-normal (a long tail: log1p helps); ``age``: 18-80, empty here and there;
* ``clicked``: 1 with probability ``sigmoid(logit)``, a planted logistic model of every
  column (per-value effects drawn once from the seed), so the best achievable test AUC is
  the AUC of the true logits (printed; about 0.78).

numpy only; the rows are generated and written a block at a time (memory stays bounded for
any ``--rows``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO

import numpy as np

CITIES = np.array(["Zurich", "Geneva", "Basel", "Bern", "Lausanne", "Lugano", "Chur", ""])
DEVICES = np.array(["ios", "android", "web", "tv"])
TAGS = np.array(["sport", "news", "music", "food", "travel", "tech", "kids", "cars"])
USERS = 50_000
ITEMS = 5_000
HEADER = "user,item,city,device,tags,price,age,clicked\n"


class ClickModel:
    """The planted model: per-value effects of every column, drawn from ``seed``."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng([seed, 1])
        self.user = rng.normal(0.0, 0.8, USERS)
        self.item = rng.normal(0.0, 0.8, ITEMS)
        self.city = rng.normal(0.0, 0.3, CITIES.size)
        self.device = rng.normal(0.0, 0.4, DEVICES.size)
        self.tag = rng.normal(0.0, 0.5, TAGS.size)
        self.bias = -1.0

    def block(self, rows: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
        """``rows`` CSV lines (with their newline) and their true logits."""
        user = np.minimum(rng.zipf(1.1, rows) - 1, USERS - 1)
        user = (user * 7919) % USERS  # popular users spread over the id range
        item = np.minimum(rng.zipf(1.15, rows) - 1, ITEMS - 1)
        city = rng.integers(0, CITIES.size, rows)
        device = rng.integers(0, DEVICES.size, rows)
        tag_mask = rng.random((rows, TAGS.size)) < 0.18
        price = np.round(rng.lognormal(2.5, 1.0, rows), 2)
        age = rng.integers(18, 81, rows)
        age_missing = rng.random(rows) < 0.05
        logit = (
            self.bias
            + self.user[user]
            + self.item[item]
            + self.city[city]
            + self.device[device]
            + tag_mask @ self.tag
            - 0.35 * (np.log1p(price) - 2.5)
            + np.where(age_missing, 0.0, 0.02 * (age - 45))
        )
        clicked = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        tag_text = ["|".join(TAGS[m]) for m in tag_mask]
        age_text = np.where(age_missing, "", age.astype(str))
        lines = [
            f"u{u},i{i},{c},{d},{t},{p:.2f},{a},{y}\n"
            for u, i, c, d, t, p, a, y in zip(
                user.tolist(),
                item.tolist(),
                CITIES[city].tolist(),
                DEVICES[device].tolist(),
                tag_text,
                price.tolist(),
                age_text.tolist(),
                clicked.tolist(),
                strict=True,
            )
        ]
        return lines, logit


def write_rows(
    out: IO[str], rows: int, model: ClickModel, rng: np.random.Generator, block: int = 100_000
) -> np.ndarray:
    """Write ``rows`` lines (no header) to ``out``; returns their true logits."""
    logits = []
    for start in range(0, rows, block):
        lines, logit = model.block(min(block, rows - start), rng)
        out.write("".join(lines))
        logits.append(logit)
    return np.concatenate(logits) if logits else np.zeros(0)


def make(out_dir: Path, rows: int, test_fraction: float = 0.2, seed: int = 0) -> dict[str, object]:
    """Write ``train.csv`` and ``test.csv``; returns the row counts and the planted model's
    test AUC (the best a model can reach, up to sampling noise)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = ClickModel(seed)
    rng = np.random.default_rng([seed, 2])
    test_rows = int(rows * test_fraction)
    with open(out_dir / "train.csv", "w") as fh:
        fh.write(HEADER)
        write_rows(fh, rows - test_rows, model, rng)
    with open(out_dir / "test.csv", "w") as fh:
        fh.write(HEADER)
        logits = write_rows(fh, test_rows, model, rng)
    labels = np.loadtxt(out_dir / "test.csv", delimiter=",", skiprows=1, usecols=7, ndmin=1)
    return {
        "train_rows": rows - test_rows,
        "test_rows": test_rows,
        "best_auc": _auc(logits, labels),
    }


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size)
    ranks[order] = np.arange(1, scores.size + 1)
    pos = labels > 0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows in all (train + test)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    info = make(args.out, args.rows, args.test_fraction, args.seed)
    print(
        f"wrote {args.out}/train.csv ({info['train_rows']:,} rows) and test.csv "
        f"({info['test_rows']:,} rows); the planted model's test AUC is {info['best_auc']:.4f}"
    )


if __name__ == "__main__":
    main()
