"""Phase (iii) of benchmarks/storage.py: the capacity series, one SGD table grown to 10^9 ids.

One table of dim 16 (SGD: no optimizer state, to keep the disk small) with a fixed RAM tier
(``--capacity-ram-rows``, default 1M rows) grows in place to 1M, 10M, 100M and 1B distinct ids
(``--max-ids`` caps the series). At each size, in one shard directory:

1. **populate**: ``populate()`` creates the new ids with training lookups (rows/s), on the
   shard opened **without an update log**, as phases (i)-(ii) and the issue's figures measure
   it (a primary's log would add ``8 + 4 dim`` bytes and their write per created row);
2. **lookups**: ``timed_zipf_lookups()`` warms the RAM tier up to its steady state, then times
   Zipf(1.05) training lookups over the current size (ids/s, disk share against
   ``ideal_disk_share(n, ram_rows)``, the hottest-N cache's share);
3. the shard closes (dirty RAM rows written back) and reopens **as a primary** (update log on,
   one retained snapshot), then ``Shard.snapshot()`` is timed;
4. **follower bootstrap**: the primary is served on 127.0.0.1 (``build_server``) and an
   in-process :class:`~embeddb.server.follower.Follower` (what ``embeddb serve --follow`` runs)
   bootstraps from it; the time from its start until it serves (``wait_ready``) is reported,
   then evaluation lookups of a sample of ids must return the primary's values exactly;
5. **reshard**: the primary closes and ``reshard()`` (``embeddb reshard``) rewrites that
   snapshot into 2 shards (seconds, rows/s; every row must arrive);
6. the follower's and the reshard's copies are deleted and the next size begins.

A size is skipped (and every larger one) when the disk cannot hold it: the bytes it needs are
estimated from the bytes per row measured at the previous size times the copies measured
there (the primary's disk tier, the follower's snapshot and disk tier, the reshard output),
against ``shutil.disk_usage().free`` plus what the series itself already holds. The follower
bootstrap and the reshard are likewise skipped at a size where the previous size's rate
projects them beyond ``--capacity-step-budget-s``; the reason, with its numbers, goes to the
output and the JSON (never silently).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np
from _report import fmt_rate, say, verdict
from _storage_common import (
    SPILL_WARMUP_MAX_BATCHES,
    TABLE,
    Budget,
    IdSampler,
    ideal_disk_share,
    make_config,
    populate,
    rng_for,
)
from _storage_spill import timed_zipf_lookups

from embeddb.config import EmbeddingConfig, Eviction, OptimizerKind, StoreConfig, TableConfig
from embeddb.engine.durability.reshard import reshard
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions

CAPACITY_SIZES = (10**6, 10**7, 10**8, 10**9)
CAPACITY_DEFAULT_MAX_IDS = 10**8
CAPACITY_DIM = 16
CAPACITY_RAM_ROWS = 1_000_000
CAPACITY_RAM_ROWS_RANGE = (1_000_000, 4_000_000)  # what the issue allows
RESHARD_SHARDS = 2
STEP_BUDGET_S = 600.0  # the most one follower bootstrap or one reshard may be projected to take
SNAPSHOT_ID = "capacity-{n}"
VERIFY_IDS = 65_536  # ids whose values the follower must return exactly as the primary
FOLLOWER_TIMEOUT_S = 3600.0
# Before anything is measured: a disk row is about ``4 dim + 8`` bytes plus RocksDB's overhead
# (docs/operations.md: 78.7 B for SGD dim 16), held about 4 times (the primary's disk tier, the
# follower's snapshot and disk tier, the reshard output).
FIRST_BYTES_PER_ROW = 4 * CAPACITY_DIM + 24
FIRST_COPIES = 4.0
DISK_RESERVE_BYTES = 2 * 10**9  # left free (a follower refuses a snapshot within 1 GiB of full)

TARGET_FLATNESS = 0.8
TARGET_LOOKUP_100M = 1_000_000
TARGET_LOOKUP_1B = 500_000
TARGET_SHARE_VS_IDEAL = 1.1
TARGET_POPULATE = 1_000_000
CAPACITY_TARGETS = {
    "spill_flatness": TARGET_FLATNESS,
    "spill_lookup_ids_per_s_100m": TARGET_LOOKUP_100M,
    "spill_lookup_ids_per_s_1b": TARGET_LOOKUP_1B,
    "capacity_disk_share_vs_ideal": TARGET_SHARE_VS_IDEAL,
    "populate_rows_per_s_min": TARGET_POPULATE,
}


# ------------------------------------------------------------------------------------ options


def id_count(text: str) -> int:
    """An id count from the command line: ``100000000``, ``1e8``, ``1E9`` or ``1_000_000``.

    Raises:
        argparse.ArgumentTypeError: not a whole number, or below the series' first size.
    """
    try:
        value = Decimal(text.strip().replace("_", ""))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"not a whole number of ids: {text!r}")
    if value < CAPACITY_SIZES[0]:
        raise argparse.ArgumentTypeError(
            f"must be at least {CAPACITY_SIZES[0]:,} (the series' first size), got {text!r}"
        )
    return int(value)


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-ids``, ``--capacity-ram-rows``, ``--capacity-step-budget-s`` and the hidden
    development option ``--capacity-sizes``."""
    parser.add_argument(
        "--max-ids",
        type=id_count,
        default=CAPACITY_DEFAULT_MAX_IDS,
        help="largest table of the capacity series: 1e6, 1e7, 1e8 or 1e9 (also 100000000; "
        f"default {CAPACITY_DEFAULT_MAX_IDS:.0e}); sizes the free disk cannot hold are skipped",
    )
    parser.add_argument(
        "--capacity-eviction",
        choices=[e.value for e in Eviction],
        default=TableConfig.eviction.value,
        help="RAM-tier eviction of the capacity table (default: the table default, "
        f"{TableConfig.eviction.value})",
    )
    parser.add_argument(
        "--capacity-ram-rows",
        type=int,
        default=CAPACITY_RAM_ROWS,
        help=f"RAM-tier rows of the capacity table ({CAPACITY_RAM_ROWS_RANGE[0]:,} to "
        f"{CAPACITY_RAM_ROWS_RANGE[1]:,}; default {CAPACITY_RAM_ROWS:,})",
    )
    parser.add_argument(
        "--capacity-step-budget-s",
        type=float,
        default=STEP_BUDGET_S,
        help="skip (and say so) a follower bootstrap or reshard projected to take longer "
        f"(default {STEP_BUDGET_S:g} s)",
    )
    parser.add_argument(  # development: small sizes with a small RAM tier
        "--capacity-sizes", type=str, default=None, help=argparse.SUPPRESS
    )


def check_capacity_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate the capacity options and set ``args.capacity_series`` (the sizes)."""
    low, high = CAPACITY_RAM_ROWS_RANGE
    if args.capacity_sizes is not None:
        try:
            args.capacity_series = sorted(int(s) for s in args.capacity_sizes.split(","))
        except ValueError:
            parser.error(f"--capacity-sizes: not a list of integers: {args.capacity_sizes!r}")
        low = 1
    else:
        args.capacity_series = [n for n in CAPACITY_SIZES if n <= args.max_ids]
    if not low <= args.capacity_ram_rows <= high:
        parser.error(
            f"--capacity-ram-rows must be {low:,} to {high:,}, got {args.capacity_ram_rows}"
        )
    if not args.capacity_step_budget_s > 0:
        parser.error(f"--capacity-step-budget-s must be > 0, got {args.capacity_step_budget_s}")


# ------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class DiskEstimate:
    """What the previous size measured: bytes per row of the disk tier and the copies held."""

    bytes_per_row: float
    copies: float
    measured_at: int | None  # the size it was measured at; None: the first size's guess

    def needed(self, n_ids: int) -> float:
        return self.bytes_per_row * n_ids * self.copies


def disk_skip_reason(
    n_ids: int, estimate: DiskEstimate, free_bytes: int, held_bytes: int, where: Path
) -> str | None:
    """Why the disk cannot hold a series step of ``n_ids`` ids, or None when it can.

    ``held_bytes`` is what the series' directory already holds (reused by the step).
    """
    needed = estimate.needed(n_ids)
    available = free_bytes + held_bytes - DISK_RESERVE_BYTES
    if needed <= available:
        return None
    basis = (
        f"measured at {estimate.measured_at:,} ids"
        if estimate.measured_at is not None
        else "estimated before any size was measured"
    )
    return (
        f"{n_ids:,} ids need ~{needed / 1e9:.1f} GB: {estimate.bytes_per_row:.1f} B/row "
        f"({basis}) x {n_ids:,} rows = {estimate.bytes_per_row * n_ids / 1e9:.1f} GB of rows, "
        f"x {estimate.copies:.2f} copies (primary disk tier, follower snapshot and disk tier, "
        f"reshard output); only {free_bytes / 1e9:.1f} GB free under {where} + "
        f"{held_bytes / 1e9:.1f} GB the series holds - {DISK_RESERVE_BYTES / 1e9:.0f} GB reserve"
    )


def step_skip_reason(
    what: str, amount: float, rate: float | None, unit: str, budget: float
) -> str | None:
    """Why ``what`` of ``amount`` units at the previous size's ``rate`` would exceed ``budget``."""
    if rate is None or rate <= 0:
        return None
    projected = amount / rate
    if projected <= budget:
        return None
    return (
        f"{what} skipped: {amount:,.0f} {unit} at {fmt_rate(rate)} {unit}/s (the previous "
        f"size's rate) project {projected:.0f} s > the step budget {budget:g} s"
    )


# ------------------------------------------------------------------------------------ files


def unique_bytes(path: Path) -> int:
    """Bytes of the files under ``path``, each hard-linked file counted once (as ``du``)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for f in path.rglob("*"):
        try:
            st = f.lstat()
        except FileNotFoundError:
            continue
        if f.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def rss_bytes() -> int | None:
    """This process's resident set size (Linux), else None."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def rss_anon_bytes() -> int | None:
    """The anonymous part of the resident set (Linux ``RssAnon``): the process's own memory,
    without file pages it maps (RocksDB reads SST files through mmap, and those resident
    pages count in the RSS although they are the page cache's), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


# ------------------------------------------------------------------------------------ series


@dataclass
class Series:
    """The shard directory of the series and the configs it is opened with."""

    work: Path
    grow: EmbeddingConfig  # no update log: populate and the timed lookups
    primary: EmbeddingConfig  # update log on, one retained snapshot

    @property
    def shard_dir(self) -> Path:
        return self.work / "shard-0"


def series_configs(
    store: StoreConfig, ram_rows: int, eviction: Eviction | None = None
) -> tuple[EmbeddingConfig, EmbeddingConfig]:
    grow = dataclasses.replace(store, log=dataclasses.replace(store.log, enabled=False))
    primary = dataclasses.replace(
        store,
        log=dataclasses.replace(store.log, enabled=True),
        snapshots=dataclasses.replace(store.snapshots, retention=1),
    )
    return (
        make_config(CAPACITY_DIM, ram_rows, OptimizerKind.SGD, grow, eviction),
        make_config(CAPACITY_DIM, ram_rows, OptimizerKind.SGD, primary, eviction),
    )


def snapshot_step(shard: Shard, n_ids: int) -> dict[str, Any]:
    taken = shard.snapshot(SNAPSHOT_ID.format(n=n_ids))
    return {
        "snapshot_seconds": taken.seconds,
        "snapshot_pause_s": taken.pause_s,
        "snapshot_bytes": taken.info.bytes,
    }


def follower_step(
    series: Series, shard: Shard, n_ids: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Serve ``shard`` and time a follower's bootstrap from it; check its values."""
    server = build_server(shard, ServerConfig(workers=4))
    follower = Follower(
        series.primary, series.work / "follower", FollowerOptions(f"127.0.0.1:{server.port}")
    )
    try:
        began = time.perf_counter()
        follower.start()
        ready = follower.wait_ready(FOLLOWER_TIMEOUT_S)
        seconds = time.perf_counter() - began
        if not ready:
            raise RuntimeError(f"the follower did not bootstrap: {follower.error!r}")
        replica = follower.served.current
        assert replica is not None
        ids = np.unique(rng.integers(0, n_ids, VERIFY_IDS, dtype=np.int64)).astype(np.uint64)
        equal = bool(
            np.array_equal(
                shard.lookup(TABLE, ids, train=False), replica.lookup(TABLE, ids, train=False)
            )
        )
        if not equal:
            raise RuntimeError("the follower serves other values than its primary")
        copies = unique_bytes(series.work)
        caught_up = follower.applied_seq >= shard.seq
    finally:
        follower.stop()  # first: the primary's shutdown would break its feed
        server.stop(0.5)
    return {
        "follower_bootstrap_seconds": seconds,
        "follower_bootstrap_bytes_per_s": shard.snapshots()[-1].bytes / seconds,
        "follower_values_equal": equal,
        "follower_verified_ids": int(ids.size),
        "follower_caught_up": caught_up,
        "bytes_with_follower": copies,
    }


def reshard_step(series: Series, n_ids: int) -> dict[str, Any]:
    """Reshard the closed primary's snapshot into ``RESHARD_SHARDS`` shards (timed)."""
    target = series.work / f"reshard-{RESHARD_SHARDS}"
    began = time.perf_counter()
    result = reshard(series.work, target, RESHARD_SHARDS, SNAPSHOT_ID.format(n=n_ids))
    seconds = time.perf_counter() - began
    held = unique_bytes(series.work)
    shutil.rmtree(target)
    if result.total_rows != n_ids:
        raise RuntimeError(f"reshard wrote {result.total_rows:,} rows of {n_ids:,}")
    return {
        "reshard_seconds": seconds,
        "reshard_rows": result.total_rows,
        "reshard_rows_per_s": result.total_rows / seconds,
        "reshard_shards": RESHARD_SHARDS,
        "bytes_with_reshard": held,
    }


def one_size(
    series: Series,
    shard: Shard,
    n_ids: int,
    populated: int,
    budget: Budget,
    rng: np.random.Generator,
    previous: dict[str, Any] | None,
    step_budget: float,
) -> dict[str, Any]:
    """Grow ``shard`` (opened without a log) to ``n_ids``, close it, and measure every figure
    of the size as a primary (see the module docstring)."""
    ram_rows = series.grow.tables[TABLE].capacity
    filled = populate(shard, populated, n_ids)
    sampler = IdSampler(n_ids, "zipf", rng)
    point = timed_zipf_lookups(shard, sampler, budget, SPILL_WARMUP_MAX_BATCHES)
    del sampler
    ideal = ideal_disk_share(n_ids, ram_rows)
    disk_bytes = unique_bytes(series.shard_dir / "disk")
    point.update(
        distinct_ids=n_ids,
        ram_capacity=ram_rows,
        populate_rows=filled.rows,
        populate_rows_per_s=filled.rows_per_s,
        populate_seconds=filled.seconds,
        ideal_disk_share=ideal,
        disk_share_vs_ideal=point["disk_share"] / ideal if ideal > 0 else None,
        disk_bytes=disk_bytes,
        disk_bytes_per_row=disk_bytes / n_ids,
        rss_bytes=rss_bytes(),
        rss_anon_bytes=rss_anon_bytes(),
    )
    began = time.perf_counter()
    shard.close()
    point["close_seconds"] = time.perf_counter() - began
    closed = unique_bytes(series.shard_dir / "disk")  # every row written back
    point.update(disk_bytes_closed=closed, disk_bytes_per_row_closed=closed / n_ids)
    began = time.perf_counter()
    primary = Shard(series.primary, series.shard_dir)
    point["primary_open_seconds"] = time.perf_counter() - began
    try:
        point.update(snapshot_step(primary, n_ids))
        skip = step_skip_reason(
            "follower bootstrap",
            point["snapshot_bytes"],
            previous.get("follower_bootstrap_bytes_per_s") if previous else None,
            "bytes",
            step_budget,
        )
        point["follower_skipped"] = skip
        if skip is None:
            point.update(follower_step(series, primary, n_ids, rng))
    finally:
        primary.close()
    skip = step_skip_reason(
        "reshard",
        n_ids,
        previous.get("reshard_rows_per_s") if previous else None,
        "rows",
        step_budget,
    )
    point["reshard_skipped"] = skip
    if skip is None:
        point.update(reshard_step(series, n_ids))
    held = max(point.get("bytes_with_follower", 0), point.get("bytes_with_reshard", 0))
    point["disk_copies"] = held / closed if held and closed else None
    return point


SERIES_HEADER = (
    f"{'distinct ids':>13} {'populate/s':>10} {'lookup/s':>9} {'disk share':>10} "
    f"{'ideal':>6} {'ratio':>5} {'disk GB':>7} {'snapshot s':>10} {'follower s':>10} "
    f"{'reshard s':>9}"
)


def _seconds(point: dict[str, Any], key: str) -> str:
    value = point.get(key)
    return "skipped" if value is None else f"{value:.1f}"


def series_row(point: dict[str, Any]) -> str:
    ratio = point["disk_share_vs_ideal"]
    return (
        f"{point['distinct_ids']:>13,} {fmt_rate(point['populate_rows_per_s']):>10} "
        f"{fmt_rate(point['lookup_ids_per_s']):>9} {point['disk_share']:>10.1%} "
        f"{point['ideal_disk_share']:>6.1%} {'-' if ratio is None else f'{ratio:.2f}':>5} "
        f"{point['disk_bytes'] / 1e9:>7.2f} {_seconds(point, 'snapshot_seconds'):>10} "
        f"{_seconds(point, 'follower_bootstrap_seconds'):>10} "
        f"{_seconds(point, 'reshard_seconds'):>9}"
    )


def estimate_after(point: dict[str, Any] | None) -> DiskEstimate:
    """The disk estimate for the size after ``point`` (None: before the first size); the
    copies fall back to ``FIRST_COPIES`` where the follower and the reshard were skipped."""
    if point is None:
        return DiskEstimate(FIRST_BYTES_PER_ROW, FIRST_COPIES, None)
    return DiskEstimate(
        point["disk_bytes_per_row_closed"],
        point["disk_copies"] or FIRST_COPIES,
        point["distinct_ids"],
    )


def run_capacity(
    sizes: Sequence[int],
    ram_rows: int,
    root: Path | None,
    budget: Budget,
    seed: int,
    store: StoreConfig,
    step_budget: float = STEP_BUDGET_S,
    eviction: Eviction | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Phase (iii) (the table's RAM tier evicting by ``eviction``, None: the default): returns
    the measured points and the skipped sizes (``distinct_ids``, ``reason``)."""
    rng = rng_for(seed, 3)
    grow, primary = series_configs(store, ram_rows, eviction)
    where = Path(tempfile.gettempdir()) if root is None else root
    series = Series(Path(tempfile.mkdtemp(prefix="capacity-", dir=where)), grow, primary)
    points: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    say(SERIES_HEADER)
    try:
        populated = 0
        for n_ids in sizes:
            previous = points[-1] if points else None
            estimate = estimate_after(previous)
            free, held = shutil.disk_usage(series.work).free, unique_bytes(series.work)
            if disk_skip_reason(n_ids, estimate, free, held, where) is not None:
                for n in (n for n in sizes if n >= n_ids):  # each larger size, with its numbers
                    reason = disk_skip_reason(n, estimate, free, held, where)
                    skipped.append({"distinct_ids": n, "reason": reason})
                    say(f"{n:>13,} skipped: {reason}")
                break
            shard = Shard(grow, series.shard_dir)
            try:
                point = one_size(
                    series, shard, n_ids, populated, budget, rng, previous, step_budget
                )
            finally:
                shard.close()  # a no-op once one_size closed it
            populated = n_ids
            points.append(point)
            say(series_row(point))
            for key in ("follower_skipped", "reshard_skipped"):
                if point[key]:
                    say(f"    {point[key]}")
    finally:
        shutil.rmtree(series.work, ignore_errors=True)
    return points, skipped


# ------------------------------------------------------------------------------------ keys


def capacity_keys(
    points: Sequence[dict[str, Any]],
    skipped: Sequence[dict[str, Any]],
    max_ids: int,
    not_run: str | None = None,
) -> dict[str, Any]:
    """The top-level JSON keys computed from the series (None where a size is missing);
    ``not_run`` is why the whole series did not run (``--quick``)."""
    by_size = {p["distinct_ids"]: p for p in points}

    def lookup(n: int) -> float | None:
        return by_size[n]["lookup_ids_per_s"] if n in by_size else None

    at_10m, at_100m, at_1b = lookup(10**7), lookup(10**8), lookup(10**9)
    ratios = [
        by_size[n]["disk_share_vs_ideal"]
        for n in (10**7, 10**8)
        if n in by_size and by_size[n]["disk_share_vs_ideal"] is not None
    ]
    populate_rates = [p["populate_rows_per_s"] for p in points]
    reason_1b = None
    if at_1b is None:
        reasons = [s["reason"] for s in skipped if s["distinct_ids"] == 10**9]
        reason_1b = (
            not_run
            or (reasons[0] if reasons else None)
            or f"--max-ids {max_ids:,} is below {10**9:,} (not run)"
        )
    return {
        "spill_flatness": at_100m / at_10m if at_10m and at_100m is not None else None,
        "spill_lookup_ids_per_s_100m": at_100m,
        "spill_lookup_ids_per_s_1b": at_1b,
        "spill_1b_skipped": reason_1b,
        "capacity_disk_share_vs_ideal": max(ratios) if ratios else None,
        "populate_rows_per_s_min": min(populate_rates) if populate_rates else None,
    }


def capacity_met(keys: dict[str, Any]) -> dict[str, bool | None]:
    """Whether each capacity key meets its target (None: not measured)."""
    met: dict[str, bool | None] = {}
    for key, target in CAPACITY_TARGETS.items():
        value = keys.get(key)
        if value is None:
            met[key] = None
        elif key == "capacity_disk_share_vs_ideal":
            met[key] = value <= target
        else:
            met[key] = value >= target
    return met


def capacity_summary(result: dict[str, Any]) -> Iterator[str]:
    """One line per capacity target, with its verdict (or why it was not measured)."""
    met = capacity_met(result)
    labels = {
        "spill_flatness": ("lookup ids/s at 100M / at 10M", ">=", "{:.2f}"),
        "spill_lookup_ids_per_s_100m": ("lookup ids/s at 100M ids", ">=", "rate"),
        "spill_lookup_ids_per_s_1b": ("lookup ids/s at 1B ids", ">=", "rate"),
        "capacity_disk_share_vs_ideal": ("disk share / ideal, worst of 10M, 100M", "<=", "{:.2f}"),
        "populate_rows_per_s_min": ("populate rows/s, slowest size", ">=", "rate"),
    }
    for key, (label, op, form) in labels.items():
        value, target = result.get(key), CAPACITY_TARGETS[key]
        shown = (
            "n/a" if value is None else fmt_rate(value) if form == "rate" else form.format(value)
        )
        goal = fmt_rate(target) if form == "rate" else f"{target:g}"
        state = "not measured" if met[key] is None else verdict(bool(met[key]))
        line = f"{key} {shown} ({label}) [target {op} {goal}: {state}]"
        if key == "spill_lookup_ids_per_s_1b" and result.get("spill_1b_skipped"):
            line += f": {result['spill_1b_skipped']}"
        yield line
