"""Measure a shard's RAM bytes and disk bytes per row, per optimizer (``docs/operations.md``).

Run from the repository root (about a minute per optimizer at the defaults)::

    python docs/measure_row_bytes.py --rows 1000000 --dim 16

For each optimizer, in a fresh child process (so that RSS deltas belong to one shard):

* **RAM**: resident set size grown by opening a shard whose table has ``--rows`` RAM slots and
  filling them with training lookups (update log off, so only the RAM tier is counted).
* **disk**: a shard with a small RAM tier (update log on) creates ``--rows`` rows, updates each
  once, closes (every dirty row goes to RocksDB) and reopens to take a snapshot; bytes of its
  ``disk/`` (RocksDB), ``log/`` (update log: the records of one gradient update of every row,
  with normally distributed gradients) and the snapshot directory.

Prints one line per optimizer and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 65_536


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _du(path: Path) -> int:
    seen: set[int] = set()
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def _config(kind: str, dim: int, capacity: int, update_log: bool) -> Any:
    from embeddb import EmbeddingConfig
    from embeddb.config import (
        OptimizerConfig,
        OptimizerKind,
        StoreConfig,
        TableConfig,
        UpdateLogConfig,
    )

    table = TableConfig(
        name="t", dim=dim, optimizer=OptimizerConfig(kind=OptimizerKind(kind)), capacity=capacity
    )
    return EmbeddingConfig(
        tables={"t": table}, store=StoreConfig(log=UpdateLogConfig(enabled=update_log))
    )


def _ram(kind: str, dim: int, rows: int) -> dict[str, Any]:
    from embeddb import Shard

    warm = Shard(_config(kind, dim, 4096, False))  # compile the kernels before measuring
    warm.lookup("t", np.arange(100, dtype=np.uint64))
    warm.close()
    ids = np.random.default_rng(0).permutation(rows).astype(np.uint64)
    # 2**k slots with >= 4% slack: every stripe holds its share of ids (no eviction, so the disk
    # tier's memtables stay empty) and its index gets exactly 2 buckets per slot.
    capacity = 1 << (rows * 26 // 25 - 1).bit_length()
    base = _rss()
    shard = Shard(_config(kind, dim, capacity, False))
    for start in range(0, rows, BATCH):
        shard.lookup("t", ids[start : start + BATCH])
    grown = _rss() - base
    stats = shard.stats().tables["t"]
    shard.close()
    return {
        "rss_bytes": grown,
        "ram_rows": stats.ram_rows,
        "capacity": stats.ram_capacity,
        "disk_rows_after_ram_phase": stats.disk_rows,
    }


def _disk(kind: str, dim: int, rows: int) -> dict[str, Any]:
    from embeddb import Shard

    root = Path(tempfile.mkdtemp(prefix="embeddb-measure-"))
    config = _config(kind, dim, max(4096, rows // 16), True)
    ids = np.random.default_rng(1).permutation(rows).astype(np.uint64)
    rng = np.random.default_rng(2)
    shard = Shard(config, root / "shard")
    for start in range(0, rows, BATCH):
        shard.lookup("t", ids[start : start + BATCH])
    created_log_bytes = _du(root / "shard" / "log")
    for start in range(0, rows, BATCH):
        part = ids[start : start + BATCH]
        grads = rng.normal(0.0, 0.01, (part.size, dim)).astype(np.float32)
        shard.apply_gradients("t", part, grads)
    log_bytes = _du(root / "shard" / "log") - created_log_bytes
    shard.close()
    disk_bytes = _du(root / "shard" / "disk")
    shard = Shard(config, root / "shard")
    # Rows written twice (created, then updated after an eviction) sit in two SST files until
    # RocksDB compacts them; a full compaction gives the steady-state size.
    import rocksdict

    opts = rocksdict.CompactOptions()
    opts.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
    shard._disk._views["t"].compact_range(None, None, opts)  # type: ignore[union-attr]
    compacted_bytes = _du(root / "shard" / "disk")
    shard.snapshot("measure")
    snap_bytes = _du(root / "shard" / "snapshots" / "measure")
    shard.close()
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return {
        "disk_bytes_written": disk_bytes,
        "disk_bytes": compacted_bytes,
        "created_log_bytes": created_log_bytes,
        "log_bytes": log_bytes,
        "snapshot_bytes": snap_bytes,
    }


def _one(args: tuple[str, int, int]) -> dict[str, Any]:
    kind, dim, rows = args
    from embeddb.config import OptimizerConfig, OptimizerKind

    width = dim + OptimizerConfig(kind=OptimizerKind(kind)).state_dim(dim)
    ram = _ram(kind, dim, rows)
    disk = _disk(kind, dim, rows)
    return {
        "optimizer": kind,
        "dim": dim,
        "rows": rows,
        "row_width": width,
        "ram_bytes_per_row": ram["rss_bytes"] / rows,
        "ram_bytes_per_slot": ram["rss_bytes"] / ram["capacity"],
        "disk_bytes_per_row": disk["disk_bytes"] / rows,
        "log_bytes_per_row": disk["log_bytes"] / rows,
        "snapshot_bytes_per_row": disk["snapshot_bytes"] / rows,
        **ram,
        **disk,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--optimizers", default="sgd,adagrad,adam")
    args = parser.parse_args()
    results = []
    ctx = multiprocessing.get_context("spawn")
    for kind in args.optimizers.split(","):
        with ctx.Pool(1) as pool:
            result = pool.map(_one, [(kind, args.dim, args.rows)])[0]
        results.append(result)
        r = result
        print(
            f"{kind:8s} width {r['row_width']:3d}: RAM {r['ram_bytes_per_slot']:6.1f} B/slot "
            f"({r['ram_bytes_per_row']:6.1f} B/row), disk {r['disk_bytes_per_row']:6.1f} B/row "
            f"(as written {r['disk_bytes_written'] / r['rows']:6.1f}), log "
            f"{r['log_bytes_per_row']:6.1f} B/updated row, snapshot "
            f"{r['snapshot_bytes_per_row']:6.1f} B/row",
            flush=True,
        )
    print(json.dumps({"rows": args.rows, "dim": args.dim, "results": results}))


if __name__ == "__main__":
    main()
