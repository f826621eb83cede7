"""Disk-tier point reads: the GIL during a multi-get, thread scaling, and RocksDB settings.

One table of ``--rows`` ids (default 10M; ``--quick`` 1M), dim 16 (64-byte rows of random
floats), written through :class:`embeddb.engine.storage.DiskTier` in sorted batches and
compacted. Reads are the disk share of Zipf(1.05) lookups: ranks outside the hottest 10% of
ids (the RAM tier holds those), mapped to ids by a random permutation, in batches of ``BATCH``
distinct sorted ids (what a 65,536-id lookup with ~14% disk misses asks for).

Measured, all as ratios inside one run (the machine is shared; variants alternate in rounds):

1. **GIL.** A Python thread counts loop turns while the main thread runs one long call:
   its progress during the call divided by its progress while the main thread sleeps. A call
   that holds the GIL gives ~0 (it never reaches a switch point); ``hashlib.sha256`` of a large
   buffer (releases the GIL, uses a core) is the reference for "released".
2. **Threads.** Microseconds per key of a multi-get with 1 and 2 Python threads each issuing
   their own batches, and of one batch split by the tier's pool (``DiskTier(pool=...)``).
3. **Settings.** Microseconds per key per :class:`~embeddb.engine.storage.disk_tier.Tuning`
   field, against the chosen defaults: settings that change the files are measured on a
   database built with them (and compared with ``default_rebuilt``, the default settings in a
   database of its own, since a database read less often stays less warm); the others reopen
   the default database.

Last line: one JSON object. Usage::

    PYTHONPATH=. python benchmarks/disk_tier.py --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _report import say

from embeddb.engine.storage.disk_tier import DiskTier, Tuning
from embeddb.engine.storage.parallel import StripePool

TABLE = "t"
DIM = 16
BATCH = 9_000
ZIPF_S = 1.05
RAM_SHARE = 0.1
WRITE_CHUNK = 1 << 20
ROUNDS = 4

# Settings that change the SST files (a database per variant) and those read at open.
FILE_VARIANTS: dict[str, dict[str, Any]] = {
    "default_rebuilt": {},  # the default settings in a database of its own: the bias of a rebuild
    "block_size_16k": {"block_size": 16384},
    "no_filter": {"bloom_bits": 0},
    "bloom_bits_16": {"bloom_bits": 16},
    "partitioned": {"partitioned": True},
    "optimize_filters_for_hits": {"optimize_filters_for_hits": True},
    "compression_lz4": {"compression": "lz4"},
}
OPEN_VARIANTS: dict[str, dict[str, Any]] = {
    "cache_index_and_filter_pin_l0": {"cache_index_and_filter": True, "pin_l0": True},
    "no_mmap": {"mmap_reads": False},
    "direct_reads": {"mmap_reads": False, "direct_reads": True},
    "hyper_clock_cache": {"hyper_clock": True},
}
CACHE_MB = (64, 256, 1024)


def build(path: Path, rows: int, tuning: Tuning) -> float:
    """Write ``rows`` rows (ids 0..rows-1) and compact; returns the write rate (rows/s)."""
    disk = DiskTier(path, {TABLE: DIM}, tuning=tuning)
    rng = np.random.default_rng(0)
    began = time.perf_counter()
    for low in range(0, rows, WRITE_CHUNK):
        ids = np.arange(low, min(low + WRITE_CHUNK, rows), dtype=np.uint64)
        disk.put(TABLE, ids, rng.random((ids.size, DIM), dtype=np.float32))
    rate = rows / (time.perf_counter() - began)
    disk.flush()
    disk._views[TABLE].compact_range(None, None)  # a settled LSM: reads measure reads
    disk.close()
    return rate


def batches(rows: int, count: int, seed: int) -> list[np.ndarray]:
    """Sorted distinct ids of the Zipf tail outside the hottest ``RAM_SHARE`` of ids."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.power(np.arange(1, rows + 1, dtype=np.float64), -ZIPF_S))
    cdf /= cdf[-1]
    hot = int(rows * RAM_SHARE)
    low = cdf[hot - 1]
    perm = rng.permutation(rows).astype(np.uint64)
    out = []
    for _ in range(count):
        u = low + (1.0 - low) * rng.random(BATCH * 2)
        ranks = np.minimum(np.searchsorted(cdf, u, side="right"), rows - 1)
        ids = np.unique(perm[ranks])[:BATCH]
        out.append(ids)
    return out


def per_key_us(fn: Callable[[np.ndarray], object], work: list[np.ndarray], seconds: float) -> float:
    """Microseconds per id of ``fn`` over ``work`` batches (cycled for ``seconds``)."""
    keys = 0
    began = time.perf_counter()
    i = 0
    while True:
        fn(work[i % len(work)])
        keys += work[i % len(work)].size
        i += 1
        elapsed = time.perf_counter() - began
        if elapsed >= seconds and i >= len(work):
            return elapsed / keys * 1e6


def spinner_share(call: Callable[[], object]) -> float:
    """A spinning thread's progress during ``call()`` ÷ its progress during a sleep as long."""
    state = {"stop": False, "n": 0}

    def spin() -> None:
        while not state["stop"]:
            state["n"] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        n0, t0 = state["n"], time.perf_counter()
        call()
        n1, t1 = state["n"], time.perf_counter()
        time.sleep(t1 - t0)
        n2, t2 = state["n"], time.perf_counter()
    finally:
        state["stop"] = True
        thread.join()
    return ((n1 - n0) / (t1 - t0)) / max((n2 - n1) / (t2 - t1), 1.0)


def gil(disk: DiskTier, work: list[np.ndarray]) -> dict[str, float]:
    big = np.unique(np.concatenate(work))
    blob = bytes(256 << 20)
    shares: dict[str, list[float]] = {"multi_get": [], "sha256_gil_free": [], "put_write": []}
    rows = np.random.default_rng(1).random((big.size, DIM), dtype=np.float32)
    for _ in range(ROUNDS):
        shares["multi_get"].append(spinner_share(lambda: disk._views[TABLE].get(
            big.astype(">u8").view("V8").tolist())))  # fmt: skip
        shares["sha256_gil_free"].append(spinner_share(lambda: hashlib.sha256(blob).digest()))
        shares["put_write"].append(spinner_share(lambda: disk.put(TABLE, big, rows)))
    return {k: float(np.median(v)) for k, v in shares.items()}


def threads(
    path: Path, pool: StripePool, work: list[np.ndarray], seconds: float
) -> dict[str, float]:
    """Per-key microseconds: one thread, two threads on halves of each batch, the pool."""

    def two(disk: DiskTier, batch: np.ndarray) -> None:
        half = [batch[: batch.size // 2], batch[batch.size // 2 :]]
        done = [threading.Thread(target=disk.get, args=(TABLE, h)) for h in half]
        for t in done:
            t.start()
        for t in done:
            t.join()

    total = {"one_thread": 0.0, "two_threads": 0.0, "pool_2": 0.0}
    share = seconds / ROUNDS
    for _ in range(ROUNDS):
        disk = DiskTier(path, {TABLE: DIM})
        try:
            total["one_thread"] += per_key_us(lambda b, d=disk: d.get(TABLE, b), work, share)
            total["two_threads"] += per_key_us(lambda b, d=disk: two(d, b), work, share)
        finally:
            disk.close()
        disk = DiskTier(path, {TABLE: DIM}, pool=pool)
        try:
            total["pool_2"] += per_key_us(lambda b, d=disk: d.get(TABLE, b), work, share)
        finally:
            disk.close()
    return {k: v / ROUNDS for k, v in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M rows, shorter timings")
    parser.add_argument("--rows", type=int, default=None, help="table rows (default 10M)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    args = parser.parse_args()
    rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    seconds = args.seconds or (0.6 if args.quick else 2.0)
    root = Path(tempfile.mkdtemp(prefix="disk-tier-bench-", dir=args.dir))
    result: dict[str, Any] = {"rows": rows, "batch": BATCH, "dim": DIM}
    pool = StripePool(2, 1)
    try:
        work = batches(rows, 16, 7)
        say(f"building {rows:,} rows (default tuning) ...")
        result["build_rows_per_s"] = build(root / "default", rows, Tuning())
        disk = DiskTier(root / "default", {TABLE: DIM})
        try:
            per_key_us(lambda b, d=disk: d.get(TABLE, b), work, seconds)  # warm the page cache
            result["gil_spinner_share"] = gil(disk, work)
        finally:
            disk.close()
        say(f"GIL (spinner share, 1 = released): {result['gil_spinner_share']}")
        result["threads_us_per_key"] = threads(root / "default", pool, work, seconds)
        say(f"threads (us/key): {result['threads_us_per_key']}")
        result["settings_us_per_key"] = settings(root, rows, work, seconds, result)
        say(f"settings (us/key): {result['settings_us_per_key']}")
    finally:
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
    base = result["settings_us_per_key"]["default"]
    result["settings_vs_default"] = {k: v / base for k, v in result["settings_us_per_key"].items()}
    rebuilt = result["settings_us_per_key"]["default_rebuilt"]
    result["file_settings_vs_default_rebuilt"] = {
        k: result["settings_us_per_key"][k] / rebuilt for k in FILE_VARIANTS
    }
    result["pool_speedup"] = (
        result["threads_us_per_key"]["one_thread"] / result["threads_us_per_key"]["pool_2"]
    )
    print(json.dumps(result))


def settings(
    root: Path, rows: int, work: list[np.ndarray], seconds: float, result: dict[str, Any]
) -> dict[str, float]:
    """Per-key microseconds of every variant, each against the default in the same rounds."""
    builds: dict[str, float] = {}
    tunings: dict[str, tuple[Path, Tuning, int]] = {"default": (root / "default", Tuning(), 256)}
    for name, change in FILE_VARIANTS.items():
        say(f"building {name} ...")
        tuning = dataclasses.replace(Tuning(), **change)
        builds[name] = build(root / name, rows, tuning)
        tunings[name] = (root / name, tuning, 256)
    for name, change in OPEN_VARIANTS.items():
        tunings[name] = (root / "default", dataclasses.replace(Tuning(), **change), 256)
    for mb in CACHE_MB:
        tunings[f"cache_{mb}mb"] = (root / "default", Tuning(), mb)
    result["build_rows_per_s_by_variant"] = builds
    tunings["default_again"] = tunings["default"]  # the noise floor: same settings, reopened
    totals = dict.fromkeys(tunings, 0.0)
    order = np.random.default_rng(3)
    for _ in range(ROUNDS):
        for name in order.permutation(list(tunings)).tolist():  # no variant always goes first
            path, tuning, mb = tunings[name]
            disk = DiskTier(path, {TABLE: DIM}, mb, tuning=tuning)
            try:
                for batch in work:  # warm: the timed reads touch these blocks only
                    disk.get(TABLE, batch)
                totals[name] += per_key_us(
                    lambda b, d=disk: d.get(TABLE, b), work, seconds / ROUNDS
                )
            finally:
                disk.close()
    return {k: v / ROUNDS for k, v in totals.items()}


if __name__ == "__main__":
    main()
