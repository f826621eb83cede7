"""What a snapshot costs once the disk tier is large: the second snapshot of a shard whose
table spilled most of its rows to RocksDB, after a few changes.

A snapshot hard-links the disk tier's SST files (a RocksDB checkpoint) and checksums every
file into its manifest. SST files are immutable, so the checksum of a file the previous
snapshot already listed (same inode, same size) is reused (``snapshot.reused_sums``) and only
the new files are read. Arrangement: one shard, one SGD table of dim 16 with ``--ram-rows`` RAM
rows (100K) and ``--rows`` rows (5M; ``--quick`` 500K) assigned, so nearly all sit in SST
files; a first snapshot; then ``--rounds`` rounds, each changing ``--changed`` rows (1,000) and
taking two snapshots, one that reuses checksums ("new") and one that reads every file again
("old": ``reused_sums`` patched to find nothing), in alternating order. Reported: the median
``Shard.snapshot`` wall time of each, their ratio, the disk tier's bytes and the load average.

Usage::

    PYTHONPATH=. python benchmarks/snapshot_commit.py --quick
    PYTHONPATH=. python benchmarks/snapshot_commit.py --rows 5000000 --json-out snap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.durability import snapshot
from embeddb.engine.shard import Shard

DIM = 16
BATCH = 200_000


def build(path: Path, rows: int, ram_rows: int) -> Shard:
    config = EmbeddingConfig.single_table(
        "t", DIM, capacity=ram_rows, optimizer=OptimizerConfig(kind=OptimizerKind.SGD, lr=0.1)
    )
    shard = Shard(config, path)
    rng = np.random.default_rng(0)
    for low in range(0, rows, BATCH):
        ids = np.arange(low, min(low + BATCH, rows), dtype=np.uint64)
        shard.assign("t", ids, rng.standard_normal((ids.size, DIM), dtype=np.float32))
    return shard


def timed_snapshot(shard: Shard, name: str, reuse: bool) -> float:
    real = snapshot.reused_sums
    if not reuse:
        snapshot.reused_sums = lambda previous, disk_dir: {}
    try:
        began = time.perf_counter()
        shard.snapshot(name)
        return time.perf_counter() - began
    finally:
        snapshot.reused_sums = real


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    began = time.perf_counter()
    shard = build(root / "shard", args.rows, args.ram_rows)
    built_s = time.perf_counter() - began
    rng = np.random.default_rng(1)
    times: dict[str, list[float]] = {"old": [], "new": []}
    with shard:
        first = timed_snapshot(shard, "first", reuse=False)
        for k in range(args.rounds):
            for mode in ("new", "old") if k % 2 == 0 else ("old", "new"):
                ids = rng.choice(args.rows, size=args.changed, replace=False).astype(np.uint64)
                shard.assign("t", ids, rng.standard_normal((ids.size, DIM), dtype=np.float32))
                times[mode].append(timed_snapshot(shard, f"{mode}{k}", mode == "new"))
        disk = snapshot.read_manifest(shard.snapshots()[-1].path)["files"]
    disk_bytes = sum(int(w["size"]) for e, w in disk.items() if e.startswith("disk/"))
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    return {
        "bench": "snapshot_commit",
        "rows": args.rows,
        "ram_rows": args.ram_rows,
        "changed_rows": args.changed,
        "disk_tier_bytes": disk_bytes,
        "populate_s": round(built_s, 2),
        "first_snapshot_s": round(first, 3),
        "snapshot_s_old": round(old, 3),
        "snapshot_s_new": round(new, 3),
        "snapshot_speedup": round(old / new, 2),
        "loadavg": os.getloadavg(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500K rows")
    parser.add_argument("--rows", type=int, default=None, help="rows assigned (default 5M)")
    parser.add_argument("--ram-rows", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=1000, help="rows changed per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=None, help="where the shard goes")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = 500_000 if args.quick else 5_000_000
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        result = run(args, Path(tmp))
    for key, value in result.items():
        print(f"{key:>20}: {value}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
