"""Durability benchmark of one embeddb shard: what the update log costs under each fsync policy,
how long a snapshot takes and pauses serving, how fast a crashed shard recovers, and how far
behind a follower runs under load.

Arrangement (single process, local disk, dim 16, Adagrad, all rows RAM-resident):

(a) **Update throughput.** Four shards of the same table, populated with the same ``rows`` ids
    (``--quick``: 1M, full: 10M) by training lookups: one with the update log off (the
    baseline), and one per fsync policy -- ``never``, ``interval`` (the default, 5 ms) and
    ``always``. ``apply_gradients`` of batches of 65,536 distinct uniform ids (pre-generated)
    is timed on each in alternating rounds, so load on the machine skews them alike. Each
    update writes one log record per stripe holding the resulting rows (ids, vectors and
    Adagrad state: 136 bytes per row). ``update_ratio_<policy>`` = ids/s with the log / ids/s
    without (target for ``interval``: >= 0.6). ``--breakdown`` then attributes the log's cost
    per call to its stages on the log-off shard (``benchmarks/_log_breakdown.py``).
(b) **Snapshot.** On the ``interval`` shard, ``Shard.snapshot()`` while a reader thread sends
    small evaluation lookups (26 ids) back to back: ``snapshot_s`` is the call's wall time,
    ``snapshot_lock_ms`` the time every stripe lock was held (RAM copy + RocksDB checkpoint),
    ``snapshot_pause_ms`` the longest reader call that overlapped the snapshot (what a client
    sees), against the readers' median latency outside it. Snapshot size on disk is reported.
(c) **Restore and replay.** More updates after the snapshot (``replay_batches`` batches), then
    the shard is discarded as a crash would leave it and reopened: ``restore_s`` is the
    recovery time (verify every snapshot file, load the RAM tier, copy the disk checkpoint,
    replay the log after the snapshot's seq); the replay rate is records and rows per second of
    the replay alone (recovery time minus the time to restore the snapshot only, measured by
    a second restore with ``restore=<id>``).
(d) **Follower lag** (``follower_lag_p50_ms`` / ``p99``): a follower shard served over gRPC
    (``embeddb.server.follower``) applies the primary's ``Subscribe`` stream while the primary
    takes a sustained update load; the lag of each record is its apply time on the follower
    minus its append time on the primary (same machine, same clock).

Output: a readable table as it goes; the last line is one JSON object (``bench``,
``update_ratio_interval``, ``update_ratio_always``, ``snapshot_s``, ``snapshot_pause_ms``,
``restore_s``, ``follower_lag_p99_ms`` and the details; see benchmarks/README.md).

Usage::

    PYTHONPATH=. python benchmarks/durability.py --quick       # < 60 s
    PYTHONPATH=. python benchmarks/durability.py --quick --updates-only --breakdown  # (a) only
    PYTHONPATH=. python benchmarks/durability.py --json-out durability.json
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _log_breakdown as log_breakdown
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, fmt_rate, say, verdict

from embeddb.common.arrays import F32, U64
from embeddb.config import (
    EmbeddingConfig,
    FsyncPolicy,
    OptimizerConfig,
    OptimizerKind,
    StoreConfig,
    TableConfig,
    UpdateLogConfig,
)
from embeddb.engine.shard import Shard

TABLE = "t"
DIM = 16
BATCH = 65_536
ROWS_FULL = 10_000_000
ROWS_QUICK = 1_000_000
POLICIES = ("off", "never", "interval", "always")
TARGET_UPDATE_RATIO_INTERVAL = 0.6
READER_IDS = 26


def make_config(rows: int, policy: str) -> EmbeddingConfig:
    table = TableConfig(
        name=TABLE,
        dim=DIM,
        capacity=int(rows * 1.05),  # all resident (stripes split the capacity evenly)
        optimizer=OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.01),
    )
    fsync = FsyncPolicy.INTERVAL if policy == "off" else FsyncPolicy(policy)
    store = StoreConfig(log=UpdateLogConfig(enabled=policy != "off", fsync=fsync))
    return EmbeddingConfig(tables={TABLE: table}, store=store)


def populate(shard: Shard, rows: int) -> float:
    began = time.perf_counter()
    for low in range(0, rows, BATCH):
        shard.lookup(TABLE, np.arange(low, min(low + BATCH, rows), dtype=np.uint64))
    return time.perf_counter() - began


# ----------------------------------------------------------------------------- (a) updates
def time_updates(
    shards: dict[str, Shard],
    batches: list[U64],
    grads: F32,
    rounds: int,
    round_seconds: float,
) -> dict[str, dict[str, float]]:
    totals = {name: [0, 0.0] for name in shards}
    k = 0
    for _ in range(rounds):
        for name, shard in shards.items():
            began = time.perf_counter()
            n = 0
            while True:
                ids = batches[k % len(batches)]
                k += 1
                shard.apply_gradients(TABLE, ids, grads)
                n += ids.size
                if time.perf_counter() - began >= round_seconds:
                    break
            totals[name][0] += n
            totals[name][1] += time.perf_counter() - began
    return {
        name: {"ids": ids, "seconds": secs, "ids_per_s": ids / secs}
        for name, (ids, secs) in totals.items()
    }


# ----------------------------------------------------------------------------- (b) snapshot
def snapshot_under_reads(shard: Shard, rows: int) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    latencies: list[tuple[float, float]] = []  # (start, end)
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            ids = rng.integers(0, rows, READER_IDS).astype(np.uint64)
            began = time.perf_counter()
            shard.lookup(TABLE, ids, train=False)
            latencies.append((began, time.perf_counter()))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(0.5)
    began = time.perf_counter()
    result = shard.snapshot("bench")
    ended = time.perf_counter()
    time.sleep(0.3)
    stop.set()
    thread.join()
    during = [e - s for s, e in latencies if e >= began and s <= ended]
    outside = [e - s for s, e in latencies if e < began or s > ended]
    size = sum(f.stat().st_size for f in result.info.path.rglob("*") if f.is_file())
    return {
        "snapshot_s": result.seconds,
        "snapshot_lock_ms": result.pause_s * 1e3,
        "snapshot_pause_ms": max(during) * 1e3 if during else result.pause_s * 1e3,
        "reader_calls_during": len(during),
        "reader_median_ms": statistics.median(outside) * 1e3 if outside else None,
        "snapshot_bytes": size,
        "snapshot_seq": result.info.seq,
    }


# ----------------------------------------------------------------------------- (c) restore
def restore_and_replay(
    shard: Shard,
    config: EmbeddingConfig,
    data_dir: Path,
    batches: list[U64],
    grads: F32,
    replay_batches: int,
) -> dict[str, Any]:
    for k in range(replay_batches):
        shard.apply_gradients(TABLE, batches[k % len(batches)], grads)
    seq = shard.seq
    shard.discard()  # as a crash leaves it
    began = time.perf_counter()
    recovered = Shard(config, data_dir)
    restore_s = time.perf_counter() - began
    rec = recovered.recovery
    assert rec.source == "snapshot" and rec.seq == seq, rec
    recovered.discard()
    # The snapshot alone (no replay): an explicit restore of the same snapshot.
    began = time.perf_counter()
    only = Shard(config, data_dir, restore="bench")
    snapshot_only_s = time.perf_counter() - began
    only.discard()
    replay_s = max(restore_s - snapshot_only_s, 1e-9)
    rows = rec.replayed and replay_batches * BATCH
    return {
        "restore_s": restore_s,
        "restore_snapshot_only_s": snapshot_only_s,
        "replayed_records": rec.replayed,
        "replayed_rows": rows,
        "replay_records_per_s": rec.replayed / replay_s,
        "replay_rows_per_s": rows / replay_s,
    }


# ----------------------------------------------------------------------------- (d) follower
def follower_lag(rows: int, seconds: float, root: Path) -> dict[str, Any]:
    """Lag of a gRPC follower under load (see benchmarks/follower_lag.py)."""
    from follower_lag import measure

    return measure(rows=rows, seconds=seconds, root=root)


# ----------------------------------------------------------------------------- (b)-(d)
SNAPSHOT_KEYS = ("snapshot_s", "snapshot_lock_ms", "snapshot_pause_ms", "reader_calls_during",
                 "reader_median_ms", "snapshot_bytes", "snapshot_seq")  # fmt: skip
RESTORE_KEYS = ("restore_s", "restore_snapshot_only_s", "replayed_records", "replayed_rows",
                "replay_records_per_s", "replay_rows_per_s")  # fmt: skip


def later_parts(
    shards: dict[str, Shard],
    rows: int,
    root: Path,
    batches: list[U64],
    grads: F32,
    replay_batches: int,
    quick: bool,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Parts (b), (c) and (d) on the ``interval`` shard (taken out of ``shards``)."""
    say("\n(b) snapshot of the interval shard while a reader sends 26-id lookups")
    snap = snapshot_under_reads(shards["interval"], rows)
    say(
        f"  {snap['snapshot_s']:.2f} s, {snap['snapshot_bytes'] / 2**20:,.0f} MiB; locks held "
        f"{snap['snapshot_lock_ms']:.0f} ms; longest overlapping read "
        f"{snap['snapshot_pause_ms']:.0f} ms (median read {snap['reader_median_ms']:.2f} ms)"
    )

    say(f"\n(c) {replay_batches} more update batches, crash, recover")
    config = make_config(rows, "interval")
    shard = shards.pop("interval")
    restore = restore_and_replay(shard, config, root / "interval", batches, grads,
                                 replay_batches)  # fmt: skip
    say(
        f"  recovery {restore['restore_s']:.2f} s (snapshot alone "
        f"{restore['restore_snapshot_only_s']:.2f} s); replayed "
        f"{restore['replayed_records']:,} records = {restore['replayed_rows']:,} rows, "
        f"{fmt_rate(restore['replay_rows_per_s'])} rows/s"
    )

    say("\n(d) follower lag under a sustained update load")
    lag = follower_lag(min(rows, 1_000_000), 3.0 if quick else 10.0, root)
    say(
        f"  {lag['pushes']:,} pushes of {lag['push_ids']:,} ids ({lag['pushes_per_s']:.0f}/s) "
        f"-> {lag['records']:,} records; lag p50 {lag['lag_p50_ms']:.2f} ms, p99 "
        f"{lag['lag_p99_ms']:.2f} ms, max {lag['lag_max_ms']:.1f} ms (bootstrap "
        f"{lag['bootstrap_s']:.1f} s)"
    )
    return snap, restore, lag


# ----------------------------------------------------------------------------- driver
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="< 60 s: 1M rows, short rounds")
    parser.add_argument("--rows", type=int, default=None, help="rows per shard (default 10M)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where shards are created")
    parser.add_argument("--rounds", type=int, default=None, help="(a) rounds (5; quick 3)")
    parser.add_argument(
        "--round-seconds", type=float, default=None, help="(a) seconds per shard per round"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="attribute the log's cost per call to its stages"
    )
    parser.add_argument(
        "--updates-only", action="store_true", help="run (a) only; the other keys are null"
    )
    add_out_dir_argument(parser, "durability")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    rows = args.rows or (ROWS_QUICK if args.quick else ROWS_FULL)
    rounds, round_s = (3, 0.5) if args.quick else (5, 2.0)
    rounds, round_s = args.rounds or rounds, args.round_seconds or round_s
    replay_batches = 20 if args.quick else 100
    root = Path(tempfile.mkdtemp(prefix="embeddb-durability-", dir=args.data_dir))
    say(
        f"embeddb durability benchmark: {'quick' if args.quick else 'full'} mode, {rows:,} rows "
        f"of dim {DIM} (Adagrad), batches of {BATCH:,} ids, data in {root}, "
        f"{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
    )
    rng = np.random.default_rng(0)
    batches = [rng.choice(rows, BATCH, replace=False).astype(np.uint64) for _ in range(16)]
    grads = (rng.standard_normal((BATCH, DIM)) * 0.01).astype(np.float32)
    shards: dict[str, Shard] = {}
    result: dict[str, Any] = {"bench": "durability", "quick": args.quick, "rows": rows}
    try:
        say("\n(a) apply_gradients throughput per fsync policy (same run, alternating rounds)")
        populate_s = {}
        for policy in POLICIES:
            shards[policy] = Shard(make_config(rows, policy), root / policy)
            populate_s[policy] = populate(shards[policy], rows)
            say(f"  populated {policy:>8}: {rows:,} rows in {populate_s[policy]:.1f} s")
        updates = time_updates(shards, batches, grads, rounds, round_s)
        base = updates["off"]["ids_per_s"]
        say(f"  {'policy':>8} {'ids/s':>9} {'ratio':>6}")
        for policy, m in updates.items():
            m["ratio"] = m["ids_per_s"] / base
            say(f"  {policy:>8} {fmt_rate(m['ids_per_s']):>9} {m['ratio']:>6.2f}")
        breakdown: dict[str, dict[str, float]] | None = None
        if args.breakdown:
            say("\n(a') the log's cost per apply_gradients call, by stage (on the log-off shard)")
            breakdown = log_breakdown.measure(
                shards["off"], TABLE, batches, grads, root / "breakdown", rounds=rounds
            )
            say(f"  {'stage':>14} {'wall ms':>8} {'added':>6} {'CPU ms':>7} {'added':>6}  over")
            for stage, m in breakdown.items():
                over = log_breakdown.BASE.get(stage)
                wall, cpu = m["wall_ms"], m["cpu_ms"]
                step = (
                    f"{wall - breakdown[over]['wall_ms']:>+6.1f} {cpu:>7.1f} "
                    f"{cpu - breakdown[over]['cpu_ms']:>+6.1f}  {over}"
                    if over
                    else f"{'':>6} {cpu:>7.1f}"
                )
                say(f"  {stage:>14} {wall:>8.1f} {step}")
        for policy in ("off", "never", "always"):
            shards.pop(policy).discard()
            shutil.rmtree(root / policy, ignore_errors=True)

        if args.updates_only:
            snap, restore = dict.fromkeys(SNAPSHOT_KEYS), dict.fromkeys(RESTORE_KEYS)
            lag = dict.fromkeys(("lag_p50_ms", "lag_p99_ms"))
        else:
            snap, restore, lag = later_parts(
                shards, rows, root, batches, grads, replay_batches, args.quick
            )
    finally:
        for shard in shards.values():
            shard.discard()
        shutil.rmtree(root, ignore_errors=True)

    result.update(
        {
            "update_ratio_never": updates["never"]["ratio"],
            "update_ratio_interval": updates["interval"]["ratio"],
            "update_ratio_always": updates["always"]["ratio"],
            "updates": updates,
            "log_breakdown_ms": breakdown,
            "populate_seconds": populate_s,
            **snap,
            **restore,
            "follower_lag_p50_ms": lag["lag_p50_ms"],
            "follower_lag_p99_ms": lag["lag_p99_ms"],
            "follower": lag,
            "targets": {"update_ratio_interval": TARGET_UPDATE_RATIO_INTERVAL},
            "targets_met": {
                "update_ratio_interval": updates["interval"]["ratio"]
                >= TARGET_UPDATE_RATIO_INTERVAL
            },
            "settings": {
                "dim": DIM,
                "batch": BATCH,
                "rounds": rounds,
                "round_seconds": round_s,
                "replay_batches": replay_batches,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "numpy": np.__version__,
            },
        }
    )
    summary = [
        "== headline (targets are informational) ==",
        f"update_ratio interval {result['update_ratio_interval']:.2f} [target >= "
        f"{TARGET_UPDATE_RATIO_INTERVAL}: "
        f"{verdict(result['targets_met']['update_ratio_interval'])}], always "
        f"{result['update_ratio_always']:.2f}, never {result['update_ratio_never']:.2f}",
    ]
    if not args.updates_only:
        summary.append(
            f"snapshot {result['snapshot_s']:.2f} s, serving pause "
            f"{result['snapshot_pause_ms']:.0f} ms; restore {result['restore_s']:.2f} s"
        )
    return finish(draw(result, args.out_dir), started, summary, args.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
