"""What the table layout costs one shard: one shared table against one table per feature.

A Criteo-shaped training step sends one shard the ids of 26 categorical features. With
``embedding_config: auto`` every feature gets its own table, so the shard's
``lookup_many`` (training lookups: the path that creates rows) and ``apply_gradients_many``
see 26 parts; with one shared table they see one part holding the same number of ids. This
benchmark runs both layouts in process (no gRPC) on the same batches:

* ids: per feature, Zipf(1.05) ranks over ``FEATURE_IDS`` distinct ids mapped through a fixed
  permutation; in the shared table feature ``f``'s id ``i`` becomes ``f * FEATURE_IDS + i``;
* tables: dim 16, Adagrad, RAM capacity for every id (no disk reads in the timed phase), an
  update log in a temporary directory (``fsync: interval``, the default);
* one step: ``lookup_many`` with ``train=True`` for every part, then ``apply_gradients_many``
  with one float32 gradient row per looked-up id.

Both layouts are warmed up (rows created) and then timed in alternating rounds, so that other
load on a shared machine skews both alike. ``shard_table_layout_ratio_b{batch}`` is the
26-table throughput divided by the one-table throughput (ids per second of whole steps;
target >= 0.9). A cProfile top 20 of the 26-table steps at the largest batch follows.

Page size matters here, not only per-table work: numpy asks the kernel for huge pages
(``madvise``) for arrays of 4 MiB or more, so the one shared table's stripes (16 MiB index,
33 MiB rows each) get 2 MiB pages while the 26 small tables' stripes (0.5 MiB, 1.3 MiB) get
4 KiB pages and pay a TLB miss on most random row accesses: the compiled lookup and update
passes run ~1.5x slower on them for the same ids. ``--small-pages`` turns the advice off for
both layouts, which isolates what the shard itself spends per table. (Real per-feature tables
differ in size: the large ones get huge pages, and the small ones mostly stay in cache.)

Usage::

    PYTHONPATH=. python benchmarks/shard_tables.py --quick
    PYTHONPATH=. python benchmarks/shard_tables.py --json-out shard_tables.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.shard import Shard

FEATURES = 26
FEATURE_IDS = 20_000
DIM = 16
ZIPF_S = 1.05
BATCHES = (128, 512)
POOL = 16  # distinct batches per layout, cycled
WARMUP_STEPS = 40
ROUNDS = 5
TARGET = 0.9
SHARED = "shared"


def feature_table(f: int) -> str:
    return f"c{f + 1}"


def make_batches(batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``POOL`` batches of ``(FEATURES, batch)`` per-feature ids (uint64)."""
    weights = np.arange(1, FEATURE_IDS + 1, dtype=np.float64) ** -ZIPF_S
    cdf = np.cumsum(weights) / weights.sum()
    perms = [rng.permutation(FEATURE_IDS).astype(np.uint64) for _ in range(FEATURES)]
    out = []
    for _ in range(POOL):
        ranks = np.minimum(np.searchsorted(cdf, rng.random((FEATURES, batch))), FEATURE_IDS - 1)
        out.append(np.stack([perms[f][ranks[f]] for f in range(FEATURES)]))
    return out


def open_shard(per_feature: bool, root: Path) -> Shard:
    names = [feature_table(f) for f in range(FEATURES)] if per_feature else [SHARED]
    capacity = 2 * FEATURE_IDS * (1 if per_feature else FEATURES)
    tables = {
        n: TableConfig(
            name=n,
            dim=DIM,
            capacity=capacity,
            optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD),
        )
        for n in names
    }
    data_dir = Path(tempfile.mkdtemp(prefix="tables-" if per_feature else "one-", dir=root))
    return Shard(EmbeddingConfig(tables=tables, store=StoreConfig()), data_dir)


Step = Callable[[int], None]


def make_step(shard: Shard, per_feature: bool, batches: list[np.ndarray]) -> Step:
    grads = np.random.default_rng(7).standard_normal((FEATURES * batches[0].shape[1], DIM)).astype(
        np.float32
    ) * np.float32(0.01)
    if per_feature:
        parts = [[(feature_table(f), b[f], True) for f in range(FEATURES)] for b in batches]
        n = batches[0].shape[1]
        upd = [
            [(feature_table(f), b[f], grads[f * n : (f + 1) * n]) for f in range(FEATURES)]
            for b in batches
        ]
    else:
        offsets = (np.arange(FEATURES, dtype=np.uint64) * np.uint64(FEATURE_IDS))[:, None]
        flat = [(b + offsets).reshape(-1) for b in batches]
        parts = [[(SHARED, ids, True)] for ids in flat]
        upd = [[(SHARED, ids, grads)] for ids in flat]

    def step(i: int) -> None:
        k = i % len(batches)
        shard.lookup_many(parts[k])
        shard.apply_gradients_many(upd[k])

    return step


def timed(step: Step, steps: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + steps):
        step(i)
    return time.perf_counter() - began


def run_batch(batch: int, quick: bool, root: Path, seed: int) -> dict[str, Any]:
    batches = make_batches(batch, np.random.default_rng([seed, batch]))
    steps = (60 if quick else 200) * (512 // batch if batch < 512 else 1) // (2 if quick else 1)
    one = open_shard(False, root)
    many = open_shard(True, root)
    try:
        step_one = make_step(one, False, batches)
        step_many = make_step(many, True, batches)
        for i in range(WARMUP_STEPS):
            step_one(i)
            step_many(i)
        secs = {"one": 0.0, "tables": 0.0}
        for r in range(ROUNDS):
            secs["one"] += timed(step_one, steps, r * steps)
            secs["tables"] += timed(step_many, steps, r * steps)
        ids = FEATURES * batch * steps * ROUNDS
        profile = ""
        if batch == max(BATCHES):
            prof = cProfile.Profile()
            prof.enable()
            for i in range(steps):
                step_many(i)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
            profile = text.getvalue()
    finally:
        one.close()
        many.close()
    one_rate, many_rate = ids / secs["one"], ids / secs["tables"]
    return {
        "batch": batch,
        "steps": steps * ROUNDS,
        "one_table_ids_per_s": one_rate,
        "tables_ids_per_s": many_rate,
        "one_table_step_us": 1e6 * secs["one"] / (steps * ROUNDS),
        "tables_step_us": 1e6 * secs["tables"] / (steps * ROUNDS),
        "ratio": many_rate / one_rate,
        "profile": profile,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (< 30 s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile top 20")
    parser.add_argument(
        "--small-pages",
        action="store_true",
        help="turn off numpy's huge-page advice (arrays of >= 4 MiB), so both layouts' stripes "
        "use 4 KiB pages (see the module docstring)",
    )
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.small_pages:
        np._core.multiarray._set_madvise_hugepage(False)  # type: ignore[attr-defined]
    root = Path(tempfile.mkdtemp(prefix="embeddb-shard-tables-"))
    result: dict[str, Any] = {
        "features": FEATURES,
        "dim": DIM,
        "quick": args.quick,
        "small_pages": args.small_pages,
    }
    try:
        print(
            f"embeddb shard table layout: {FEATURES} features, dim {DIM}, Adagrad, Zipf({ZIPF_S}) "
            f"over {FEATURE_IDS:,} ids per feature; one step = lookup_many(train) + "
            f"apply_gradients_many; {ROUNDS} alternating rounds"
        )
        for batch in BATCHES:
            r = run_batch(batch, args.quick, root, args.seed)
            print(
                f"  batch {batch:>4}: one table {r['one_table_step_us']:8.0f} us/step "
                f"({r['one_table_ids_per_s'] / 1e6:.2f}M ids/s), {FEATURES} tables "
                f"{r['tables_step_us']:8.0f} us/step ({r['tables_ids_per_s'] / 1e6:.2f}M ids/s)"
                f"  ratio {r['ratio']:.2f} (target >= {TARGET})"
            )
            if r["profile"] and not args.no_profile:
                print(f"  cProfile of the {FEATURES}-table steps, batch {batch} (top 20 tottime):")
                print(r["profile"])
            result[f"shard_table_layout_ratio_b{batch}"] = round(r["ratio"], 4)
            result[f"b{batch}"] = {k: v for k, v in r.items() if k != "profile"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["target"] = TARGET
    line = json.dumps(result)
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
