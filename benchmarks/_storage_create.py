"""Phase (iv) of benchmarks/storage.py: creating rows for first-seen ids, next to the gather.

One table of dim 16 per optimizer (SGD, Adagrad) with ``CREATE_CAPACITY`` RAM rows, so that no
row is evicted while the phase runs. Three operations are timed in alternating rounds
(:func:`time_interleaved`), each on batches of ``BATCH`` ids:

* create: a training lookup of ids never seen before (every id misses RAM and the disk tier and
  is admitted: initializer, optimizer state, hash-index insert, the stripe's bookkeeping);
* gather: a training lookup of ids already resident (uniform over the rows created by the
  untimed warm-up), the shard's own gather;
* raw gather: numpy ``arr[idx]`` on a ``(1M, dim)`` float32 array, as in phase (i).

``create_vs_gather`` is create / gather (the issue's target: >= 0.5), ``create_vs_raw_gather``
create / raw gather.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from _report import fmt_rate, say, verdict
from _storage_common import (
    BATCH,
    RAM_IDS,
    TABLE,
    Budget,
    as_table_ids,
    make_config,
    open_shard,
    rng_for,
    table_stats,
    time_interleaved,
    warm_up,
)

from embeddb.config import OptimizerKind, StoreConfig

CREATE_DIM = 16
CREATE_CAPACITY = 4_000_000  # RAM rows: more than a full-mode run creates, so nothing is evicted
CREATE_OPTIMIZERS = (OptimizerKind.SGD, OptimizerKind.ADAGRAD)
CREATE_FIRST_ID = 1 << 40  # created ids: CREATE_FIRST_ID + i for i = 0, 1, ...
GATHER_POOL = 16  # batches of resident ids the gather cycles through
TARGET_CREATE_VS_GATHER = 0.5

HEADER = (
    f"{'optimizer':>9} {'create/s':>9} {'gather/s':>9} {'create_vs_gather':>16} "
    f"{'raw gather/s':>12} {'create_vs_raw_gather':>20} {'evicted':>7}"
)


def run_create(
    root: Path | None, budget: Budget, seed: int, store: StoreConfig
) -> dict[str, dict[str, Any]]:
    """Phase (iv): ``{"sgd": {...}, "adagrad": {...}}``."""
    say(HEADER)
    results: dict[str, dict[str, Any]] = {}
    for kind in CREATE_OPTIMIZERS:
        result = _one(kind, root, budget, seed, store)
        results[kind.value] = result
        say(
            f"{kind.value:>9} {fmt_rate(result['create_ids_per_s']):>9} "
            f"{fmt_rate(result['gather_ids_per_s']):>9} {result['create_vs_gather']:>16.2f} "
            f"{fmt_rate(result['raw_gather_rows_per_s']):>12} "
            f"{result['create_vs_raw_gather']:>20.2f} {result['evicted']:>7,}"
        )
    return results


def _one(
    kind: OptimizerKind, root: Path | None, budget: Budget, seed: int, store: StoreConfig
) -> dict[str, Any]:
    config = make_config(CREATE_DIM, CREATE_CAPACITY, kind, store)
    rng = rng_for(seed, 4)
    raw = rng.random((RAM_IDS, CREATE_DIM), dtype=np.float32)
    raw_idx = [rng.integers(0, RAM_IDS, BATCH, dtype=np.int64) for _ in range(GATHER_POOL)]
    created = [0]  # batches of new ids handed out so far

    def fresh() -> np.ndarray:
        low = CREATE_FIRST_ID + created[0] * BATCH
        created[0] += 1
        return np.arange(low, low + BATCH, dtype=np.uint64)

    with open_shard(config, root, f"create-{kind.value}") as shard:

        def create(_: int) -> object:
            return shard.lookup(TABLE, fresh(), train=True)

        warm_up(create)  # these rows are the ones the gather reads
        resident = created[0] * BATCH
        pool = [
            as_table_ids(CREATE_FIRST_ID + rng.integers(0, resident, BATCH, dtype=np.int64))
            for _ in range(GATHER_POOL)
        ]

        def gather(i: int) -> object:
            return shard.lookup(TABLE, pool[i % GATHER_POOL], train=True)

        def raw_gather(i: int) -> object:
            return raw[raw_idx[i % GATHER_POOL]]

        works = {"create": create, "gather": gather, "raw_gather": raw_gather}
        warm_up(gather)
        warm_up(raw_gather)
        before = table_stats(shard)
        rates = time_interleaved(works, budget)
        after = table_stats(shard)
    create_rate = rates["create"].ids_per_s
    return {
        "optimizer": kind.value,
        "dim": CREATE_DIM,
        "create_ids_per_s": create_rate,
        "gather_ids_per_s": rates["gather"].ids_per_s,
        "create_vs_gather": create_rate / rates["gather"].ids_per_s,
        "raw_gather_rows_per_s": rates["raw_gather"].ids_per_s,
        "create_vs_raw_gather": create_rate / rates["raw_gather"].ids_per_s,
        "created_rows": after.admitted - before.admitted,
        "evicted": after.evicted - before.evicted,
        "measurements": {name: rate.as_dict() for name, rate in rates.items()},
    }


def create_summary(result: dict[str, Any]) -> str:
    """The headline line of phase (iv) (Adagrad, dim 16)."""
    return (
        f"create   {fmt_rate(result['create_ids_per_s'])} new ids/s vs gather "
        f"{fmt_rate(result['gather_ids_per_s'])} resident ids/s: create_vs_gather "
        f"{result['create_vs_gather']:.2f} [target >= {TARGET_CREATE_VS_GATHER}: "
        f"{verdict(result['create_vs_gather'] >= TARGET_CREATE_VS_GATHER)}]; vs numpy gather "
        f"{result['create_vs_raw_gather']:.2f}"
    )
