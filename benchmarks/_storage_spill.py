"""Phase (ii) of benchmarks/storage.py: training lookups once the RAM tier is in steady state,
for both eviction policies in the same run: the phase's result (and storage.py's ``spill_*``
headline keys) are ``tinylfu``'s, ``lru``'s (the default policy) is under ``"lru"``
(``spill_lookup_ids_per_s_lru``, ``disk_share_vs_ideal_lru``).

Each policy's disk share is set beside the ideal one (``ideal_disk_share``: the Zipf mass
outside the hottest ``capacity`` ids, what a clairvoyant frequency-ranked RAM tier would still
read from disk): ``disk_share_vs_ideal`` = measured / ideal (target <= 1.1).

Run alone: ``python benchmarks/_storage_spill.py [--quick]`` (2M ids / 200K rows quick, else
10M / 1M; dim 16) prints the JSON of both policies.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import fmt_rate, say, verdict
from _storage_common import (
    MIN_BATCHES,
    SPILL_FULL,
    SPILL_QUICK,
    SPILL_TIMED_BATCHES,
    SPILL_WARMUP_MAX_BATCHES,
    SPILL_WARMUP_WINDOW,
    TABLE,
    TARGET_SPILL_IDS_PER_S,
    Budget,
    IdSampler,
    as_table_ids,
    disk_share,
    ideal_disk_share,
    make_config,
    open_shard,
    populate,
    rng_for,
    table_stats,
    time_batches,
)

from embeddb.config import (
    Eviction,
    OptimizerKind,
    StoreConfig,
)
from embeddb.engine.shard import Shard

# ------------------------------------------------------------------------------------ (ii) spill


@dataclass(frozen=True)
class WarmUp:
    """How many untimed batches the warm-up took, and its first and last disk shares."""

    batches: int
    first_share: float
    last_share: float


# A frequency-ranked tier converges more slowly than LRU (an id's rank shows only after it was
# seen a few times: at 10M ids over 1M rows the last hot ids are looked up about once per 400
# batches), so the steady-state check compares longer windows, relatively: the warm-up ends
# when a window's disk share is within 0.5% of the one before (or after the most batches).
STEADY_WINDOW = 4 * SPILL_WARMUP_WINDOW
STEADY_RELATIVE = 0.005
STEADY_MAX_BATCHES = {True: 2 * SPILL_WARMUP_MAX_BATCHES, False: 4 * SPILL_WARMUP_MAX_BATCHES}


def warm_to_steady_state(shard: Shard, sampler: IdSampler, max_batches: int) -> WarmUp:
    """Run untimed lookups until the per-window disk share stops falling (steady state)."""
    shares: list[float] = []
    windows: list[float] = []
    while len(shares) < max_batches:
        ids = as_table_ids(sampler.batch())
        before = table_stats(shard)
        shard.lookup(TABLE, ids, train=True)
        shares.append(disk_share(before, table_stats(shard)))
        if len(shares) % STEADY_WINDOW == 0:
            windows.append(statistics.fmean(shares[-STEADY_WINDOW:]))
            if len(windows) >= 2 and windows[-1] >= windows[-2] * (1 - STEADY_RELATIVE):
                break
    return WarmUp(len(shares), shares[0], windows[-1] if windows else shares[-1])


def timed_zipf_lookups(
    shard: Shard, sampler: IdSampler, budget: Budget, warm_max: int
) -> dict[str, Any]:
    """Warm up to steady state, then time training lookups of fresh Zipf batches."""
    warm = warm_to_steady_state(shard, sampler, warm_max)
    limit = MIN_BATCHES if budget.quick else SPILL_TIMED_BATCHES
    batches = [as_table_ids(sampler.batch()) for _ in range(limit)]
    before = table_stats(shard)
    rate = time_batches(lambda i: shard.lookup(TABLE, batches[i], train=True), budget, limit=limit)
    after = table_stats(shard)
    return {
        "lookup_ids_per_s": rate.ids_per_s,
        "median_batch_ids_per_s": rate.median_batch_ids_per_s,
        "batches": rate.batches,
        "seconds": rate.seconds,
        "disk_share": disk_share(before, after),
        "promoted": after.promoted - before.promoted,
        "evicted": after.evicted - before.evicted,
        "warmup_batches": warm.batches,
        "warmup_first_disk_share": warm.first_share,
        "warmup_last_disk_share": warm.last_share,
        "ram_rows": after.ram_rows,
        "disk_rows": after.disk_rows,
    }


TARGET_DISK_SHARE_VS_IDEAL = 1.1


def run_policy(
    dim: int,
    n_ids: int,
    capacity: int,
    root: Path | None,
    budget: Budget,
    seed: int,
    store: StoreConfig,
    eviction: Eviction,
) -> dict[str, Any]:
    """Phase (ii) for one dim and one eviction policy (the same ids for every policy)."""
    config = make_config(dim, capacity, OptimizerKind.ADAGRAD, store, eviction)
    rng = rng_for(seed, 2, dim)
    with open_shard(config, root, f"spill-d{dim}-{eviction.value}") as shard:
        filled = populate(shard, 0, n_ids)
        sampler = IdSampler(n_ids, "zipf", rng)
        result = timed_zipf_lookups(shard, sampler, budget, STEADY_MAX_BATCHES[budget.quick])
        result["not_admitted"] = table_stats(shard).not_admitted
    ideal = ideal_disk_share(n_ids, capacity)
    result.update(
        eviction=eviction.value,
        dim=dim,
        distinct_ids=n_ids,
        ram_capacity=capacity,
        populate_rows_per_s=filled.rows_per_s,
        populate_seconds=filled.seconds,
        disk_share_ideal=ideal,
        disk_share_vs_ideal=result["disk_share"] / ideal if ideal else 1.0,
    )
    met = result["lookup_ids_per_s"] >= TARGET_SPILL_IDS_PER_S
    say(
        f"  dim {dim:>2} {eviction.value:>7}: populate {fmt_rate(filled.rows_per_s)} rows/s "
        f"({filled.seconds:.1f} s); warm-up {result['warmup_batches']} batches "
        f"(disk share {result['warmup_first_disk_share']:.1%} -> "
        f"{result['warmup_last_disk_share']:.1%}); lookup "
        f"{fmt_rate(result['lookup_ids_per_s'])} ids/s over {result['batches']} batches, "
        f"disk share {result['disk_share']:.2%} (ideal {ideal:.2%}: x"
        f"{result['disk_share_vs_ideal']:.3f}) "
        f"[target >= {fmt_rate(TARGET_SPILL_IDS_PER_S)} ids/s: {verdict(met)}]"
    )
    return result


def run_spill(
    dim: int,
    n_ids: int,
    capacity: int,
    root: Path | None,
    budget: Budget,
    seed: int,
    store: StoreConfig,
) -> dict[str, Any]:
    """Phase (ii) for one dim: the ``tinylfu`` result, with the ``lru`` one under ``"lru"``."""
    lru = run_policy(dim, n_ids, capacity, root, budget, seed, store, Eviction.LRU)
    result = run_policy(dim, n_ids, capacity, root, budget, seed, store, Eviction.TINYLFU)
    result["lru"] = lru
    result["disk_share_vs_ideal_lru"] = lru["disk_share_vs_ideal"]
    result["lookup_ids_per_s_vs_lru"] = result["lookup_ids_per_s"] / lru["lookup_ids_per_s"]
    met = result["disk_share_vs_ideal"] <= TARGET_DISK_SHARE_VS_IDEAL
    say(
        f"  dim {dim:>2}: disk share vs ideal: tinylfu x{result['disk_share_vs_ideal']:.3f}, "
        f"lru x{lru['disk_share_vs_ideal']:.3f} [target <= {TARGET_DISK_SHARE_VS_IDEAL}: "
        f"{verdict(met)}]; lookup ids/s tinylfu / lru {result['lookup_ids_per_s_vs_lru']:.2f}"
    )
    return result


def main() -> None:
    """Phase (ii) alone, dim 16, default store settings; prints the JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2M ids / 200K RAM rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n_ids, capacity = SPILL_QUICK if args.quick else SPILL_FULL
    result = run_spill(
        16, n_ids, capacity, None, Budget(quick=args.quick), args.seed, StoreConfig()
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
