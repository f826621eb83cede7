"""Storage benchmark of one embeddb shard: RAM-tier and disk-tier throughput against raw numpy.

Everything runs in one process and one calling thread, on batches of 65,536 ids (``BATCH``),
for tables of dim 16 and 64. Four measurements:

(i) **RAM-resident.** An Adagrad table with exactly 1M RAM-tier rows, pre-populated with ids
    0..1M-1, is read with training lookups and updated with ``apply_gradients`` on uniform and
    Zipf(1.05) id batches. In the same run, on the same batches (as int64 indices), two raw numpy
    baselines set the bar:

    * gather: ``arr[idx]`` on a preallocated float32 array of shape ``(1M, dim)`` -- the least a
      lookup must do (move ``dim`` floats per id from random rows into a fresh output array);
    * scatter-update: ``arr[idx] -= lr * g`` (gather, subtract, scatter) on the same array -- the
      least an update must do (read and write ``dim`` floats per id).

    ``lookup_ratio`` and ``update_ratio`` are ours / raw. An Adagrad row also carries its
    accumulator (``state_dim == dim``), so the update inevitably moves twice the bytes of the
    ``(1M, dim)`` baseline; a second, width-matched baseline runs the same scatter-update on a
    ``(1M, dim + state_dim)`` array with gradient rows of that width, and
    ``update_ratio_same_bytes`` compares against it. The shard does more than either baseline:
    hash-index probes, LRU stamps, duplicate-id gradient summing, NaN checks and the Adagrad
    arithmetic; the baselines are what a perfect store with a dense id space would cost.
    (Each lock stripe gets an equal share of the capacity but ids hash unevenly over stripes, so
    a few thousand of the 1M rows spill to disk; the disk share of the timed lookups is printed.)
(ii) **Spill.** Zipf(1.05) ids over 10M distinct ids with 1M RAM rows (``--quick``: 2M ids over
    200K rows, dim 16 only), so that roughly 10% of looked-up ids come from the RocksDB disk
    tier. The table is populated first, then warmed up with Zipf batches until the per-batch
    disk share stops falling (the LRU tier reaches its steady state), then training lookups are
    timed. The measured disk share (``disk_hits / lookup_ids`` over the timed phase, from the
    stats delta) is reported as it is: an LRU tier keeps fewer hot rows than an ideal top-k
    cache, so it comes out above the ~10% that the Zipf mass outside the top ranks suggests.
(iii) **Capacity** (full mode only; ``benchmarks/_storage_capacity.py``). One SGD table of dim
    16 with a fixed RAM tier (``--capacity-ram-rows``, default 1M rows) grows in place to 1M,
    10M, 100M and 1B distinct ids (``--max-ids`` caps the series, default 1e8). At each size:
    the populate rate, Zipf training lookups over the current size (ids/s, disk share against
    the ideal hottest-N share), the disk bytes, then, with the shard reopened as a primary,
    the snapshot time, the bootstrap time of a real follower served from it and the time of
    ``reshard`` of that snapshot into 2 shards. Sizes the free disk cannot hold are skipped,
    with the numbers, in the output and the JSON.
(iv) **Creation.** Training lookups of ids never seen before (every id is created: initializer,
    optimizer state, hash-index insert) against training lookups of resident ids (the shard's
    gather) and numpy's gather, alternating, for SGD and Adagrad tables of dim 16 with room for
    every row (``benchmarks/_storage_create.py``); ``create_vs_gather`` is the first over the
    second (target >= 0.5). It runs right after (i), before the spill phase: run after it, the
    same code created rows at less than half the rate (the state the spill phase leaves in the
    process, not the code measured).

Id batches: uniform ids are ``rng.integers``; Zipf ids draw ranks by inverse CDF over the finite
id space (cumulative weights ``k ** -1.05``, ``np.searchsorted`` on uniform draws) and map rank to
id through a fixed random permutation, so hot ids are neither the small ids nor clustered. Above
20M ids the permutation is replaced by the cheaper bijection ``(a * rank + b) mod n`` with a prime
``a`` (it keeps ids inside the populated range ``0..n-1``, which a multiply mod 2**64 would not).

Timing: batches are generated before timing; each measurement runs a few untimed warm-up batches
and then times batches with ``time.perf_counter`` until it has run for at least 1 s and at least
20 batches (``--quick``: whichever comes first). The reported rate is total ids / total time;
the median of per-batch rates is kept in the JSON as well. RAM-resident batches cycle through a
pool of 32 pre-generated batches, and the five RAM-resident operations (lookup, update and the
three baselines) are timed in 5 alternating rounds, so that load from other processes on a
shared machine skews ours and raw alike; spill and capacity batches are never repeated.

Output: a table printed as the run goes, then, as the last line, one JSON object (keys described
in ``benchmarks/README.md``). The issue's targets (``lookup_ratio`` and ``update_ratio`` >= 0.5
for RAM-resident ids; >= 1M lookup ids/s with ~10% disk-tier ids) are printed next to the figures
and never enforced.

Usage::

    PYTHONPATH=. python benchmarks/storage.py --quick
    PYTHONPATH=. python benchmarks/storage.py --json-out storage.json
    PYTHONPATH=. python benchmarks/storage.py --max-ids 1e9   # the capacity series to 10^9 ids
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ownership
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, fmt_rate, say, verdict
from _storage_capacity import (
    CAPACITY_DIM,
    CAPACITY_TARGETS,
    add_capacity_arguments,
    capacity_keys,
    capacity_met,
    capacity_summary,
    check_capacity_arguments,
    run_capacity,
)
from _storage_common import (
    BATCH,
    DIMS,
    DISTRIBUTIONS,
    GRAD_POOL,
    LR,
    MIN_BATCHES,
    MIN_SECONDS,
    RAM_CAPACITY,
    RAM_IDS,
    RAM_POOL_BATCHES,
    SPILL_DIMS_QUICK,
    SPILL_FULL,
    SPILL_QUICK,
    TABLE,
    TARGET_RATIO,
    TARGET_SPILL_DISK_SHARE,
    TARGET_SPILL_IDS_PER_S,
    TIMING_METHOD,
    ZIPF_S,
    Budget,
    IdSampler,
    as_table_ids,
    disk_share,
    make_config,
    open_shard,
    populate,
    rng_for,
    table_stats,
    time_interleaved,
    warm_up,
)
from _storage_create import TARGET_CREATE_VS_GATHER, create_summary, run_create
from _storage_spill import run_spill

from embeddb.common.arrays import F32, I64, U64
from embeddb.config import (
    Eviction,
    OptimizerKind,
    ParallelConfig,
    RamTierConfig,
    StoreConfig,
)
from embeddb.engine.shard import Shard
from embeddb.engine.storage.parallel import default_threads
from embeddb.errors import ConfigError

# ------------------------------------------------------------------------------------ printing


# ------------------------------------------------------------------------------------ (i) RAM


@dataclass(frozen=True)
class RamBatches:
    """One distribution's pool of id batches (uint64 for the shard, int64 for numpy)."""

    index: list[I64]

    def ids(self, i: int) -> U64:
        return as_table_ids(self.index[i % len(self.index)])

    def idx(self, i: int) -> I64:
        return self.index[i % len(self.index)]


def ram_combination(
    shard: Shard,
    batches: RamBatches,
    raw: F32,
    raw_wide: F32,
    grads: Sequence[F32],
    grads_wide: Sequence[F32],
    budget: Budget,
) -> dict[str, Any]:
    """Measure lookup, Adagrad update and the three numpy baselines on one batch pool."""

    def lookup(i: int) -> object:
        return shard.lookup(TABLE, batches.ids(i), train=True)

    def update(i: int) -> object:
        return shard.apply_gradients(TABLE, batches.ids(i), grads[i % GRAD_POOL])

    def gather(i: int) -> object:
        return raw[batches.idx(i)]

    def scatter(i: int) -> None:
        raw[batches.idx(i)] -= LR * grads[i % GRAD_POOL]

    def scatter_wide(i: int) -> None:
        raw_wide[batches.idx(i)] -= LR * grads_wide[i % GRAD_POOL]

    works = {
        "lookup": lookup,
        "adagrad": update,
        "raw_gather": gather,
        "raw_scatter": scatter,
        "raw_scatter_same_bytes": scatter_wide,
    }
    for work in works.values():
        warm_up(work)
    before = table_stats(shard)
    rates = time_interleaved(works, budget)
    after = table_stats(shard)
    return {
        "lookup_ids_per_s": rates["lookup"].ids_per_s,
        "raw_gather_rows_per_s": rates["raw_gather"].ids_per_s,
        "lookup_ratio": rates["lookup"].ids_per_s / rates["raw_gather"].ids_per_s,
        "adagrad_ids_per_s": rates["adagrad"].ids_per_s,
        "raw_scatter_rows_per_s": rates["raw_scatter"].ids_per_s,
        "update_ratio": rates["adagrad"].ids_per_s / rates["raw_scatter"].ids_per_s,
        "raw_scatter_same_bytes_rows_per_s": rates["raw_scatter_same_bytes"].ids_per_s,
        "update_ratio_same_bytes": (
            rates["adagrad"].ids_per_s / rates["raw_scatter_same_bytes"].ids_per_s
        ),
        "disk_share": disk_share(before, after),
        "distinct_ids_per_batch": float(np.mean([np.unique(b).size for b in batches.index])),
        "measurements": {name: rate.as_dict() for name, rate in rates.items()},
    }


RAM_HEADER = (
    f"{'dim':>4} {'ids':<8} {'lookup/s':>9} {'gather/s':>9} {'lookup_ratio':>12} "
    f"{'adagrad/s':>9} {'scatter/s':>9} {'update_ratio':>12} {'wide/s':>9} "
    f"{'update_ratio_same_bytes':>23} {'disk share':>10}"
)


def ram_row(dim: int, distribution: str, r: dict[str, Any]) -> str:
    return (
        f"{dim:>4} {distribution:<8} {fmt_rate(r['lookup_ids_per_s']):>9} "
        f"{fmt_rate(r['raw_gather_rows_per_s']):>9} {r['lookup_ratio']:>12.2f} "
        f"{fmt_rate(r['adagrad_ids_per_s']):>9} {fmt_rate(r['raw_scatter_rows_per_s']):>9} "
        f"{r['update_ratio']:>12.2f} {fmt_rate(r['raw_scatter_same_bytes_rows_per_s']):>9} "
        f"{r['update_ratio_same_bytes']:>23.2f} {r['disk_share']:>10.2%}"
    )


def run_ram(
    dim: int, root: Path | None, budget: Budget, seed: int, store: StoreConfig
) -> dict[str, dict[str, Any]]:
    """Phase (i) for one dim: returns ``{"dim16_uniform": {...}, ...}``."""
    config = make_config(dim, RAM_CAPACITY, OptimizerKind.ADAGRAD, store)
    width = config.tables[TABLE].row_width
    rng = rng_for(seed, 1, dim)
    results: dict[str, dict[str, Any]] = {}
    with open_shard(config, root, f"ram-d{dim}") as shard:
        filled = populate(shard, 0, RAM_IDS)
        resident = table_stats(shard)
        say(
            f"  dim {dim}: populated {RAM_IDS:,} ids in {filled.seconds:.1f} s "
            f"({fmt_rate(filled.rows_per_s)} rows/s); RAM rows {resident.ram_rows:,}, "
            f"disk rows {resident.disk_rows:,}"
        )
        if resident.disk_rows:
            say(
                f"  note: {resident.disk_rows:,} rows did not fit their lock stripe and went to "
                "disk (stripes split the capacity evenly, ids hash unevenly)"
            )
        say(RAM_HEADER)
        raw = rng.random((RAM_IDS, dim), dtype=np.float32)
        raw_wide = rng.random((RAM_IDS, width), dtype=np.float32)
        grads = [rng.random((BATCH, dim), dtype=np.float32) for _ in range(GRAD_POOL)]
        grads_wide = [rng.random((BATCH, width), dtype=np.float32) for _ in range(GRAD_POOL)]
        for distribution in DISTRIBUTIONS:
            sampler = IdSampler(RAM_IDS, distribution, rng)
            batches = RamBatches([sampler.batch() for _ in range(RAM_POOL_BATCHES)])
            result = ram_combination(shard, batches, raw, raw_wide, grads, grads_wide, budget)
            result.update(
                dim=dim,
                distribution=distribution,
                row_width=width,
                ram_rows=resident.ram_rows,
                disk_rows_after_populate=resident.disk_rows,
                populate_rows_per_s=filled.rows_per_s,
            )
            results[f"dim{dim}_{distribution}"] = result
            say(ram_row(dim, distribution, result))
    return results


# ------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Storage benchmark of one embeddb shard (RAM tier, disk tier, capacity).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short run (< 60 s): spill scaled to 2M ids / 200K RAM rows and dim 16, "
        "no capacity series, each measurement >= 1 s or >= 20 batches",
    )
    add_capacity_arguments(parser)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="create each shard's directory (its RocksDB disk tier) under this directory, "
        "removing it after its phase (default: each shard's own private temporary directory, "
        "removed when the shard closes)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every id batch")
    parser.add_argument(
        "--stripes",
        type=int,
        default=None,
        help=f"lock stripes per table (default: StoreConfig's, {RamTierConfig().stripes})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads that may serve the stripes of one call (store.parallel.threads; default 0: "
        "every CPU; 1: the calling thread only, as the numpy baselines run)",
    )
    add_out_dir_argument(parser, "storage")
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write the final JSON object to this file"
    )
    args = parser.parse_args(argv)
    check_capacity_arguments(parser, args)
    try:
        ram = RamTierConfig() if args.stripes is None else RamTierConfig(stripes=args.stripes)
        args.store = StoreConfig(ram=ram, parallel=ParallelConfig(threads=args.threads))
    except ConfigError as exc:
        parser.error(f"--stripes/--threads: {exc}")
    return args


def data_root(requested: Path | None) -> Path | None:
    """``requested``, created if missing (and kept); ``None`` for the shards' own temp dirs."""
    if requested is not None:
        requested.mkdir(parents=True, exist_ok=True)
    return requested


def summary(result: dict[str, Any]) -> list[str]:
    """Headline figures next to the issue's targets (informational only)."""
    lines = [
        "== headline (dim 16, uniform ids vs (1M, dim) numpy; targets are informational) ==",
        f"lookup   {fmt_rate(result['lookup_ids_per_s'])} ids/s vs gather "
        f"{fmt_rate(result['raw_gather_rows_per_s'])} rows/s: lookup_ratio "
        f"{result['lookup_ratio']:.2f} [target >= {TARGET_RATIO}: "
        f"{verdict(result['lookup_ratio'] >= TARGET_RATIO)}]",
        f"adagrad  {fmt_rate(result['adagrad_ids_per_s'])} ids/s vs scatter-update "
        f"{fmt_rate(result['raw_scatter_rows_per_s'])} rows/s: update_ratio "
        f"{result['update_ratio']:.2f} [target >= {TARGET_RATIO}: "
        f"{verdict(result['update_ratio'] >= TARGET_RATIO)}]; same bytes: "
        f"{result['update_ratio_same_bytes']:.2f}",
        f"spill    {fmt_rate(result['spill_lookup_ids_per_s'])} ids/s at disk share "
        f"{result['spill_disk_share']:.1%} [target >= {fmt_rate(TARGET_SPILL_IDS_PER_S)} ids/s "
        f"at ~{TARGET_SPILL_DISK_SHARE:.0%}: "
        f"{verdict(result['spill_lookup_ids_per_s'] >= TARGET_SPILL_IDS_PER_S)}]",
        create_summary(result),
    ]
    if not result["quick"]:
        lines += ["== capacity series (iii) ==", *capacity_summary(result)]
    return lines


def run_all(args: argparse.Namespace, budget: Budget, root: Path | None) -> dict[str, Any]:
    """Run phases (i)-(iii); returns their results under ``ram``, ``spill`` and ``capacity``."""
    phase_start = time.perf_counter()
    say(
        f"\n(i) RAM-resident: {RAM_IDS:,} ids, {RAM_CAPACITY:,} RAM rows, Adagrad; "
        "training lookups and apply_gradients vs numpy gather / scatter-update (rows/s)"
    )
    ram: dict[str, dict[str, Any]] = {}
    for dim in DIMS:
        ram.update(run_ram(dim, root, budget, args.seed, args.store))
    say(f"  ({time.perf_counter() - phase_start:.1f} s)")

    # Creation runs before the spill phase: after it, the same code created rows at less than
    # half the rate in the same process (5.5M vs 2.2M Adagrad rows/s, --quick), from the state
    # the spill phase leaves behind, not from the code measured.
    phase_start = time.perf_counter()
    say(
        "\n(iv) creation: dim 16, SGD and Adagrad; training lookups of first-seen ids (create) "
        "vs of resident ids (gather) and numpy gather, alternating"
    )
    create = run_create(root, budget, args.seed, args.store)
    say(f"  ({time.perf_counter() - phase_start:.1f} s)")

    phase_start = time.perf_counter()
    spill_ids, spill_capacity = SPILL_QUICK if args.quick else SPILL_FULL
    spill_dims = SPILL_DIMS_QUICK if args.quick else DIMS
    scaled = (
        f" (--quick: scaled down from {SPILL_FULL[0]:,} ids / {SPILL_FULL[1]:,} RAM rows, "
        f"dim {', '.join(map(str, spill_dims))} only)"
        if args.quick
        else ""
    )
    say(
        f"\n(ii) spill: Zipf({ZIPF_S}) over {spill_ids:,} ids, {spill_capacity:,} RAM rows, "
        f"Adagrad, training lookups{scaled}"
    )
    spill = {
        f"dim{dim}": run_spill(dim, spill_ids, spill_capacity, root, budget, args.seed, args.store)
        for dim in spill_dims
    }
    say(f"  ({time.perf_counter() - phase_start:.1f} s)")

    capacity: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    if not args.quick:
        phase_start = time.perf_counter()
        say(
            f"\n(iii) capacity: SGD dim {CAPACITY_DIM}, {args.capacity_ram_rows:,} RAM rows "
            f"({args.capacity_eviction}), "
            f"Zipf({ZIPF_S}) training lookups over the current table size, then snapshot, "
            f"follower bootstrap and reshard to 2 shards; sizes "
            f"{', '.join(f'{n:,}' for n in args.capacity_series)}"
        )
        capacity, skipped = run_capacity(
            args.capacity_series,
            args.capacity_ram_rows,
            root,
            budget,
            args.seed,
            args.store,
            args.capacity_step_budget_s,
            Eviction(args.capacity_eviction),
        )
        say(f"  ({time.perf_counter() - phase_start:.1f} s)")
    capacity_note = (
        "skipped in --quick mode"
        if args.quick
        else "; ".join(f"{s['distinct_ids']:,} ids skipped: {s['reason']}" for s in skipped) or None
    )
    return {
        "ram": ram,
        "spill": spill,
        "spill_distinct_ids": spill_ids,
        "spill_ram_capacity": spill_capacity,
        "create": create,
        "capacity": capacity,
        "capacity_skipped": skipped,
        "capacity_note": capacity_note,
    }


def build_result(args: argparse.Namespace, phases: dict[str, Any]) -> dict[str, Any]:
    """The final JSON object: headline figures first, then every measurement."""
    head = phases["ram"]["dim16_uniform"]
    spill_head = phases["spill"]["dim16"]
    create_head = phases["create"]["adagrad"]
    result: dict[str, Any] = {
        "bench": "storage",
        "quick": args.quick,
        "lookup_ids_per_s": head["lookup_ids_per_s"],
        "raw_gather_rows_per_s": head["raw_gather_rows_per_s"],
        "lookup_ratio": head["lookup_ratio"],
        "adagrad_ids_per_s": head["adagrad_ids_per_s"],
        "raw_scatter_rows_per_s": head["raw_scatter_rows_per_s"],
        "update_ratio": head["update_ratio"],
        "raw_scatter_same_bytes_rows_per_s": head["raw_scatter_same_bytes_rows_per_s"],
        "update_ratio_same_bytes": head["update_ratio_same_bytes"],
        "spill_lookup_ids_per_s": spill_head["lookup_ids_per_s"],
        "spill_disk_share": spill_head["disk_share"],
        "disk_share_vs_ideal": spill_head["disk_share_vs_ideal"],
        "disk_share_vs_ideal_lru": spill_head["disk_share_vs_ideal_lru"],
        "spill_lookup_ids_per_s_lru": spill_head["lru"]["lookup_ids_per_s"],
        "create_ids_per_s": create_head["create_ids_per_s"],
        "gather_ids_per_s": create_head["gather_ids_per_s"],
        "create_vs_gather": create_head["create_vs_gather"],
        "create_vs_raw_gather": create_head["create_vs_raw_gather"],
        **capacity_keys(
            phases["capacity"],
            phases["capacity_skipped"],
            args.max_ids,
            "the capacity series does not run in --quick mode" if args.quick else None,
        ),
        **phases,
        "targets": {
            **CAPACITY_TARGETS,
            "lookup_ratio": TARGET_RATIO,
            "update_ratio": TARGET_RATIO,
            "spill_lookup_ids_per_s": TARGET_SPILL_IDS_PER_S,
            "spill_disk_share": TARGET_SPILL_DISK_SHARE,
            "create_vs_gather": TARGET_CREATE_VS_GATHER,
        },
        "settings": {
            "batch": BATCH,
            "dims": list(DIMS),
            "zipf_s": ZIPF_S,
            "lr": LR,
            "stripes": args.store.ram.stripes,
            "threads": args.store.parallel.threads or default_threads(),
            "seed": args.seed,
            "capacity_ram_rows": args.capacity_ram_rows,
            "capacity_eviction": args.capacity_eviction,
            "capacity_sizes": args.capacity_series,
            "max_ids": args.max_ids,
            "timing": TIMING_METHOD,
            "min_seconds": MIN_SECONDS,
            "min_batches": MIN_BATCHES,
            "budget": "either" if args.quick else "both",
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
    }
    result["ownership_storage_ratio"] = phases["ownership"]["ownership_storage_ratio"]
    result["ownership_rpc_ratio"] = phases["ownership"]["ownership_rpc_ratio"]
    result["targets_met"] = {
        "lookup_ratio": result["lookup_ratio"] >= TARGET_RATIO,
        "update_ratio": result["update_ratio"] >= TARGET_RATIO,
        "spill_lookup_ids_per_s": result["spill_lookup_ids_per_s"] >= TARGET_SPILL_IDS_PER_S,
        "create_vs_gather": result["create_vs_gather"] >= TARGET_CREATE_VS_GATHER,
        **capacity_met(result),
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    stripes = args.store.ram.stripes
    threads = args.store.parallel.threads or default_threads()
    say(
        f"embeddb storage benchmark: {'quick' if args.quick else 'full'} mode, batch {BATCH:,} "
        f"ids, {stripes} stripes, {threads} threads per call, "
        f"seed {args.seed}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}"
    )
    say(
        f"timing: {TIMING_METHOD}; each measurement >= {MIN_SECONDS:g} s "
        f"{'or' if args.quick else 'and'} >= {MIN_BATCHES} batches"
    )
    phases = run_all(args, Budget(quick=args.quick), data_root(args.data_dir))
    say("\n(ownership) the cost of the shard-ownership check (benchmarks/ownership.py)")
    phases["ownership"] = ownership.run(args.quick, args.seed)
    result = build_result(args, phases)
    return finish(draw(result, args.out_dir), started, summary(result), args.json_out)


if __name__ == "__main__":
    sys.exit(main())
