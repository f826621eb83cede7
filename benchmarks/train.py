"""Training benchmark: PERSIA's comparison on this machine -- hybrid, sync and async training on
embeddb shards against an in-process PyTorch model, same data, same dense network.

Model (the paper's Criteo-shaped MLP): 26 ID features of dim 16, pooled (one id per sample), and
13 numeric columns, concatenated (429 floats) into an MLP 256-128-1; batch 512; binary
cross-entropy. Embeddings are trained with Adagrad (server side for embeddb: the shards'
optimizer; ``torch.optim.Adagrad`` on sparse gradients in-process), the dense network with
plain SGD. All runs start from the same dense initialisation (one seed) and the same
embedding initialisation law (normal, std 0.05).

Data: :class:`~embeddb.features.SyntheticCriteo` (26 Zipf(1.05) ID features of
``--cardinality`` ids each, 13 dense columns, labels from a hidden teacher, so the best AUC is
known). The training and test batches are generated once, before any timing, and every run
trains on the same batches in the same order and is scored on the same test set.

Runs, one after the other in one process (the NN side), each on fresh shards:

* ``inprocess``: the no-distribution limit. One fused ``nn.EmbeddingBag`` (``mode="sum"``,
  ``sparse=True``) holding the 26 tables as disjoint row ranges; ids are hashed into a fixed
  number of rows per feature (``--buckets``, ``id % buckets``: the cardinalities are large and
  ids are 64-bit hashes, so collisions are possible, as in any hashed baseline).
* ``hybrid``, ``sync``, ``async``: :class:`~embeddb.trainer.TrainCtx` against a local cluster of
  ``--shards`` shard processes (:class:`~embeddb.server.cluster.Cluster`, ephemeral), one
  embedding worker process, the NN worker in this process (world size 1). ``hybrid`` and ``sync``
  use ``max_staleness`` = ``--staleness`` (``sync`` forces 1); ``async`` uses
  ``--async-staleness`` (high, so that its accuracy loss can show).

Embedding layouts (``--layout``): ``per-feature`` (the default, for every run and ratio: what
``embedding_config: auto`` and PERSIA's configs produce) gives each feature its own table;
``shared`` puts the 26 features in one feature group, so they read one table. Either way the
embedding worker sends one LookupMany and one ApplyGradientsMany per shard per batch (with 26
parts in the per-feature layout). Hybrid also runs in the other layout, at batch 512 and (rate
only, ``--layout-samples``) at batch 128 in both: ``table_layout_ratio`` and
``table_layout_ratio_b128`` are samples/s with 26 tables over one shared table, in the same run
(``--skip-layouts`` leaves them out, with the in-process run at 128; ``_train_layouts.py``).

Start-up (``--skip-startup`` leaves it out; ``_train_startup.py``): the whole ``embeddb train
examples/adult/train.yaml`` command against the equivalent plain PyTorch script
(``_train_adult_torch.py``, same data, model, optimizers and epochs), each timed from its start
to its exit, interleaved, twice: ``adult_wall_vs_torch`` is the second (warm) embeddb wall over
the second PyTorch wall; ``startup_s`` is the warm job's own report (command start to the first
training step) and ``startup`` holds its timeline.

Public shape (``--skip-public`` leaves it out; ``_train_public.py``): a synthetic Avazu-shaped
click log (22 categorical fields, 9k rows, fixed seed) trained from YAML with ``embeddb train``
(batch 256) against the plain PyTorch script of the same shape, timed as the Adult job:
``public_shape_vs_torch`` is the PyTorch wall over the warm embeddb wall. ``checkpoint_ratio``
(``--skip-checkpoint``): the job's samples/s with a checkpoint per epoch over without's.

Peers (``peers``): the in-process PyTorch run (one fused ``nn.EmbeddingBag`` + Adagrad, one
process) against hybrid, at batch 512 and (``inprocess_b128`` against ``hybrid_b128``:
``hybrid_vs_inprocess_b128``) 128, and TorchRec's reason to be skipped (fbgemm-gpu-cpu does not
load here). ``readme_table.py`` renders README.md's comparison from a recorded run.

Timing: each run trains in ``--evals`` equal segments; after each segment the embedding updates
are flushed and the model scored on the test set. Only training is timed
(``time.perf_counter`` around each segment; scoring, cluster start and stop are not), so
samples/s = training samples / summed segment time; the median of the per-segment rates is
reported too (robust to a burst of other load on a shared machine). The AUC curves (against
samples and against training wall time) go to a CSV file and, with matplotlib, a PNG plot.
``torch.set_num_threads(--threads)`` holds for the in-process runs; in the embeddb runs
:class:`~embeddb.trainer.TrainCtx` applies its core budget (``TrainerConfig.torch_threads``
unset) and restores the setting when it closes.

Also: the Adult example (:class:`~embeddb.features.AdultReader`, packaged Adult preset,
hybrid, batch 128, ``--adult-epochs``) and, when ``../shared/data/criteo`` is present, the
10,000-row Criteo sample (first 8,192 rows train, the rest test, ``--criteo-epochs``, hybrid,
the benchmark's model), both for test AUC.

Latency hiding (``--rtt-ms``, default 0,5,10,20; quick 0,20): hybrid and sync again, each on
a fresh cluster, with a simulated network between the embedding worker and the shards
(:class:`embeddb.client.SimulatedNetwork` on its client: each call to one shard waits ``rtt +
bytes / 10 Gbit/s``; this kernel has no netem, and link contention is not modelled). Rates are
steady-state (after ``--warmup-batches``); hybrid's window per RTT is, unless ``--rtt-window``
fixes it, ``--staleness + ceil(2 * rtt / step)`` with the step time of hybrid at RTT 0 (a
batch's lookup and push are two round trips, during which that many more steps train).
Samples/s and the staleness peak against RTT go to ``train_rtt.csv`` and ``train_rtt.png``.
The AUC parity check stays at ``--staleness``.

Small model (``--small-samples``): 10 ID features x dim 16, no numeric column, MLP 64-32-1,
batch 256, in-process against hybrid.

Output: a table as the run goes, then, as the last line, one JSON object (keys in
``benchmarks/README.md``). Targets (``hybrid_vs_inprocess`` >= 0.8, ``hybrid_vs_inprocess_b128``
>= 0.6, ``hybrid_vs_sync`` >= 2, |AUC hybrid - AUC sync| <= 0.001, async below,
``hybrid_rtt_flatness`` >= 0.9, ``hybrid_vs_sync_rtt20ms`` >= 2.5, ``small_hybrid_vs_inprocess``
>= 0.6, ``table_layout_ratio(_b128)`` >= 0.9, ``adult_wall_vs_torch`` <= 1.5,
``public_shape_vs_torch`` >= 0.6, ``checkpoint_ratio`` >= 0.8) are printed, never enforced.

Usage::

    PYTHONPATH=. python benchmarks/train.py --quick
    PYTHONPATH=. python benchmarks/train.py --quick --rtt-only     # the RTT sweep alone
    PYTHONPATH=. python benchmarks/train.py --json-out train.json
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _train_public as bench_public
import numpy as np
import torch
from _report import finish, say, verdict
from _train_core import BATCH, EVAL_BATCH, core_runs, plan_of
from _train_layouts import (
    SIDE_BY_SIDE,
    TARGET_LAYOUT_RATIO,
    hybrid_vs_inprocess_b128,
    layout_ratios,
    peers_json,
    torchrec_missing,
)
from _train_models import (
    CRITEO,
    DENSE_LR,
    EMB_LR,
    SMALL,
    DenseNet,
    InProcessModel,
    dense_net,
    embedding_yaml,
)
from _train_public import TARGET_PUBLIC_SHAPE_VS_TORCH, run_public_shape
from _train_runs import Run, labels_of, run_embeddb, run_inprocess, segments, write_curves
from _train_startup import run_startup
from _train_sweep import (
    RTTS_MS,
    SweepPoint,
    SweepSettings,
    rate_at,
    run_small,
    run_sweep,
    sweep_json,
    window_for,
    write_sweep,
)

from embeddb.features import SyntheticCriteo, SyntheticCriteoConfig
from embeddb.trainer import Batch

__all__ = [  # with the pieces tests/test_bench_train.py drives
    "SMALL",
    "DenseNet",
    "InProcessModel",
    "Run",
    "SweepPoint",
    "SweepSettings",
    "dense_net",
    "embedding_yaml",
    "labels_of",
    "main",
    "rate_at",
    "run_embeddb",
    "run_inprocess",
    "segments",
    "sweep_json",
    "window_for",
    "write_curves",
    "write_sweep",
]

NUM_ID = CRITEO.num_id
NUM_DENSE = CRITEO.num_dense
DIM = CRITEO.dim
HIDDEN = CRITEO.hidden
TARGET_VS_INPROCESS = 0.8
TARGET_VS_INPROCESS_B128 = 0.6
TARGET_VS_SYNC = 2.0
TARGET_AUC_GAP = 0.001
TARGET_RTT_FLATNESS = 0.9
TARGET_VS_SYNC_RTT20 = 2.5
TARGET_SMALL_VS_INPROCESS = 0.6
TARGET_ADULT_WALL_VS_TORCH = 1.5

# The real PERSIA on a 2-core machine (the reference point).
PERSIA_SAMPLES_PER_S = 26_800
PERSIA_TORCH_SAMPLES_PER_S = 47_000
PERSIA_ADULT = "13-15k samples/s (batch 128), AUC 0.893-0.896 after one epoch"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="fewer samples: 2.5 min measured on 2 idle cores (7-9 min at load 5-7)",
    )
    add("--samples", type=int, default=0, help="training samples per run")
    add("--test-samples", type=int, default=0)
    add("--evals", type=int, default=0, help="AUC points per run")
    add("--cardinality", type=int, default=200_000, help="ids per feature")
    add("--buckets", type=int, default=1 << 19, help="in-process rows/feature")
    add("--shards", type=int, default=1)
    add("--layout", choices=("shared", "per-feature"), default="per-feature")
    add("--compare-layouts", action="store_true", help="(the default now; see --skip-layouts)")
    add("--skip-layouts", action="store_true", help="no run in the other layout, no batch 128")
    add("--layout-samples", type=int, default=0, help="samples per batch-128 layout run")
    add("--skip-startup", action="store_true", help="no embeddb train / PyTorch Adult walls")
    add("--skip-public", action="store_true", help="no public-shape embeddb train / PyTorch walls")
    add("--skip-checkpoint", action="store_true", help="no checkpoint_ratio (public-shape job)")
    add("--staleness", type=int, default=4, help="hybrid's max_staleness")
    add("--async-staleness", type=int, default=32)
    add("--threads", type=int, default=os.cpu_count() or 1)
    add("--adult-epochs", type=int, default=1)
    add("--criteo-epochs", type=int, default=3)
    add("--seed", type=int, default=0)
    add("--rtt-ms", default="", help="the sweep's RTTs in ms (default 0,5,10,20; quick 0,20)")
    add("--rtt-window", type=int, default=0, help="hybrid's window in the sweep; 0: per RTT")
    add("--rtt-samples", type=int, default=0, help="training samples per sweep run")
    add("--small-samples", type=int, default=0, help="training samples of the small model")
    add("--warmup-batches", type=int, default=10, help="left out of the steady-state rates")
    add("--rtt-only", action="store_true", help="only the RTT sweep")
    add("--skip-rtt", action="store_true", help="no RTT sweep")
    add("--skip-small", action="store_true", help="no small-model run")
    add("--out-dir", type=Path, default=Path("benchmarks/results/train"))
    add("--json-out", type=Path, default=None)
    return parser.parse_args(argv)


def distinct_ids(batches: Sequence[Batch], features: int) -> int:
    """The most distinct ids any one feature has in ``batches``."""
    return max(
        len(np.unique(np.concatenate([b.id_type_features[j].values for b in batches])))
        for j in range(features)
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def target_line(name: str, value: float | None, target: float, at_least: bool = True) -> str:
    if value is None:
        return f"{name}: not measured (skipped)"
    met = value >= target if at_least else value <= target
    return f"{name} {value:.2f} (target {'>=' if at_least else '<='} {target}: {verdict(met)})"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    load_start = list(os.getloadavg())
    plan = plan_of(args)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    rtts = tuple(float(r) for r in str(args.rtt_ms).split(",") if r.strip()) or (
        (0.0, 20.0) if args.quick else RTTS_MS
    )
    sweep = SweepSettings(
        rtts, args.staleness, args.rtt_window, args.warmup_batches, args.shards, cpu
    )
    core = not args.rtt_only

    say(f"train benchmark ({'quick' if args.quick else 'full'}): {plan}")
    say(
        f"model: {CRITEO.describe()}; Adagrad embeddings (lr {EMB_LR}), SGD dense (lr "
        f"{DENSE_LR}); torch threads {args.threads}; CPUs {os.cpu_count()}"
    )
    say(
        f"embeddb: {args.shards} local shard process(es), layout {args.layout!r}; in-process: "
        f"ids hashed into {args.buckets:,} rows per feature"
    )

    began = time.perf_counter()
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinality=args.cardinality, seed=args.seed))
    samples = plan.train_samples if core else plan.rtt_samples
    train = list(data.batches(samples, BATCH, "train"))
    test = list(data.batches(plan.test_samples, EVAL_BATCH, "test", requires_grad=False))
    best = data.best_auc(plan.test_samples, "test")
    distinct = distinct_ids(train + test, NUM_ID)
    say(
        f"data: {samples:,} train / {plan.test_samples:,} test samples generated in "
        f"{time.perf_counter() - began:.1f} s; teacher's best test AUC {best:.4f}; at most "
        f"{distinct:,} distinct ids per feature"
    )
    capacity = int(distinct * 1.2) + 1024

    runs: dict[str, Run] = {}
    adult_run: Run | None = None
    criteo_run: Run | None = None
    criteo_note = cuda_note = None
    points: list[SweepPoint] = []
    small: dict[str, Run] = {}
    startup: dict[str, Any] = {}
    public: dict[str, Any] = {}
    checkpoints: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="embeddb-train-bench-") as tmp:
        workdir = Path(tmp)
        if core:
            runs, adult_run, criteo_run, criteo_note, cuda_note = core_runs(
                args, plan, train, test, capacity, workdir, data
            )
        if not args.skip_rtt and rtts:
            say()
            say(f"RTT sweep: {plan.rtt_samples:,} samples per run, rates after "
                f"{args.warmup_batches} warm-up batches")  # fmt: skip
            sweep_train = train[: max(1, plan.rtt_samples // BATCH)]
            points = run_sweep(
                sweep_train, test, embedding_yaml(args.layout, capacity), sweep, workdir
            )
        if core and not args.skip_small:
            say()
            small_data = SyntheticCriteo(
                SyntheticCriteoConfig(
                    num_id_features=SMALL.num_id,
                    num_dense=SMALL.num_dense,
                    cardinality=args.cardinality,
                    seed=args.seed,
                )
            )
            small_train = list(small_data.batches(plan.small_samples, SMALL.batch, "train"))
            small_test = list(
                small_data.batches(plan.small_test_samples, EVAL_BATCH, "test", requires_grad=False)
            )
            small_capacity = int(distinct_ids(small_train + small_test, SMALL.num_id) * 1.2) + 1024
            small = run_small(
                small_train, small_test, max(1, plan.evals // 2), args.buckets, small_capacity,
                sweep, workdir, layout=args.layout,
            )  # fmt: skip
        if core and not args.skip_startup:
            say()
            say("start-up: embeddb train examples/adult/train.yaml against plain PyTorch")
            startup = run_startup(workdir, pairs=1 if args.quick else 2)
        if core and not args.skip_public:
            say()
            say("public shape: 22 fields, 9k rows, embeddb train (YAML) against plain PyTorch")
            public = run_public_shape(workdir, pairs=1 if args.quick else 2)
        if core and not args.skip_checkpoint:
            checkpoints = bench_public.run_checkpoint_ratio(workdir, public.get("job"))

    curve_runs = [r for r in [*runs.values(), *small.values()] if r.curve]
    table_runs = [*runs.values(), *small.values()]
    csv_path, png_path, plot_note = (
        write_curves(curve_runs, args.out_dir) if curve_runs else (None, None, None)
    )
    rtt_csv, rtt_png, rtt_note = write_sweep(points, args.out_dir) if points else (None, None, None)
    for note in (plot_note, rtt_note):
        if note:
            say(note)

    def rate(name: str) -> float | None:
        return runs[name].samples_per_s if name in runs else None

    def score(name: str) -> float | None:
        return runs[name].auc if name in runs else None

    vs_inprocess = ratio(rate("hybrid"), rate("inprocess"))
    vs_sync = ratio(rate("hybrid"), rate("sync"))
    hy_auc, sy_auc, asy_auc = score("hybrid"), score("sync"), score("async")
    gap = abs(hy_auc - sy_auc) if hy_auc is not None and sy_auc is not None else None
    async_drop = hy_auc - asy_auc if hy_auc is not None and asy_auc is not None else None
    top = max(rtts) if rtts else 20.0
    flatness = ratio(rate_at(points, "hybrid", top), rate_at(points, "hybrid", 0.0))
    vs_sync_rtt = ratio(rate_at(points, "hybrid", top), rate_at(points, "sync", top))
    if points and top != 20.0:
        say(f"note: the sweep's top RTT is {top:g} ms; the *_rtt20ms keys use it")
    small_ratio = (
        ratio(small["small_hybrid"].samples_per_s, small["small_inprocess"].samples_per_s)
        if small
        else None
    )
    layouts = layout_ratios(runs, args.layout)
    vs_inprocess_b128 = hybrid_vs_inprocess_b128(runs)
    public_ratio = public.get("public_shape_vs_torch")
    checkpoint_ratio = checkpoints.get("checkpoint_ratio")
    wall_ratio = startup.get("adult_wall_vs_torch")
    small_steady = (
        ratio(
            small["small_hybrid"].steady_samples_per_s,
            small["small_inprocess"].steady_samples_per_s,
        )
        if small
        else None
    )

    say()
    say(
        f"{'run':<24}{'samples/s':>12}{'steady':>10}{'median seg':>12}{'AUC':>9}"
        f"{'samples':>11}{'train s':>9}"
    )
    table = [
        *table_runs,
        *([adult_run] if adult_run else []),
        *([criteo_run] if criteo_run else []),
    ]
    for run in table:
        say(
            f"{run.name:<24}{run.samples_per_s:>12,.0f}{run.steady_samples_per_s:>10,.0f}"
            f"{run.median_segment_samples_per_s:>12,.0f}{run.auc:>9.4f}{run.samples:>11,}"
            f"{run.seconds:>9.1f}"
        )
    if core:
        say(f"{'teacher (best possible)':<24}{'':>34}{best:>9.4f}")
    if points:
        say()
        say(
            f"{'RTT (ms)':<10}"
            + "".join(f"{m + ' samples/s':>20}{'peak':>6}" for m in ("hybrid", "sync"))
        )
        for rtt in rtts:
            cells = ""
            for mode in ("hybrid", "sync"):
                p = next(x for x in points if x.mode == mode and x.rtt_ms == rtt)
                cells += f"{p.samples_per_s:>20,.0f}{p.staleness_peak or 0:>6.0f}"
            say(f"{rtt:<10g}{cells}")
    say(
        f"reference, the real PERSIA on a 2-core machine: {PERSIA_SAMPLES_PER_S:,} samples/s "
        f"(plain PyTorch {PERSIA_TORCH_SAMPLES_PER_S:,}); Adult {PERSIA_ADULT}"
    )
    summary = [
        target_line("hybrid_vs_inprocess", vs_inprocess, TARGET_VS_INPROCESS),
        target_line("hybrid_vs_inprocess_b128", vs_inprocess_b128, TARGET_VS_INPROCESS_B128),
        target_line("hybrid_vs_sync", vs_sync, TARGET_VS_SYNC),
        target_line("|AUC hybrid - AUC sync|", gap, TARGET_AUC_GAP, at_least=False),
        f"AUC hybrid - AUC async {async_drop:+.4f} (async at staleness {args.async_staleness}; "
        f"target: measurably below: {verdict(async_drop > TARGET_AUC_GAP)})"
        if async_drop is not None
        else "AUC hybrid - AUC async: not measured (skipped)",
        target_line("hybrid_rtt_flatness", flatness, TARGET_RTT_FLATNESS),
        target_line("hybrid_vs_sync_rtt20ms", vs_sync_rtt, TARGET_VS_SYNC_RTT20),
        target_line("small_hybrid_vs_inprocess", small_ratio, TARGET_SMALL_VS_INPROCESS)
        + (f"; steady state {small_steady:.2f}" if small_steady is not None else ""),
    ]
    summary += [
        target_line("table_layout_ratio", layouts["table_layout_ratio"], TARGET_LAYOUT_RATIO),
        target_line(
            "table_layout_ratio_b128", layouts["table_layout_ratio_b128"], TARGET_LAYOUT_RATIO
        ),
        target_line("adult_wall_vs_torch", wall_ratio, TARGET_ADULT_WALL_VS_TORCH, at_least=False)
        + (
            f"; embeddb train {startup['adult_wall_s']:.1f} s (start-up "
            f"{startup['startup_s'] or 0:.1f} s) against {startup['adult_torch_wall_s']:.1f} s"
            if startup
            else ""
        ),
        target_line("public_shape_vs_torch", public_ratio, TARGET_PUBLIC_SHAPE_VS_TORCH)
        + (
            f"; embeddb train {public['job_wall_s']:.1f} s (start-up "
            f"{public['job_startup_s'] or 0:.1f} s, AUC {public['job_auc'] or 0:.4f}) against "
            f"{public['torch_wall_s']:.1f} s (AUC {public['torch_auc'] or 0:.4f})"
            if public
            else ""
        ),
        target_line("checkpoint_ratio", checkpoint_ratio, bench_public.TARGET_CHECKPOINT_RATIO)
        + bench_public.checkpoint_note(checkpoints),
    ]
    if adult_run is not None:
        summary.append(f"adult AUC {adult_run.auc:.4f} at {adult_run.samples_per_s:,.0f} samples/s")
    if csv_path is not None:
        summary.append(f"curves: {csv_path}" + (f", {png_path}" if png_path else ""))
    if rtt_csv is not None:
        summary.append(f"RTT sweep: {rtt_csv}" + (f", {rtt_png}" if rtt_png else ""))

    def run_json(run: Run) -> dict[str, Any]:
        return {
            "samples_per_s": run.samples_per_s,
            "steady_samples_per_s": run.steady_samples_per_s,
            "median_segment_samples_per_s": run.median_segment_samples_per_s,
            "staleness_peak": run.staleness_peak,
            "auc": run.auc,
            "samples": run.samples,
            "train_seconds": run.seconds,
            "curve": run.curve,
        }

    result: dict[str, Any] = {
        "bench": "train",
        "quick": args.quick,
        "hybrid_samples_per_s": rate("hybrid"),
        "sync_samples_per_s": rate("sync"),
        "async_samples_per_s": rate("async"),
        "inprocess_samples_per_s": rate("inprocess"),
        "hybrid_vs_inprocess": vs_inprocess,
        "hybrid_vs_inprocess_b128": vs_inprocess_b128,
        "hybrid_vs_sync": vs_sync,
        "auc_hybrid": hy_auc,
        "auc_sync": sy_auc,
        "auc_async": asy_auc,
        "auc_inprocess": score("inprocess"),
        "auc_gap_hybrid_sync": gap,
        "auc_drop_async": async_drop,
        "best_auc": best,
        "adult_auc": adult_run.auc if adult_run else None,
        "adult_samples_per_s": adult_run.samples_per_s if adult_run else None,
        "adult_steady_samples_per_s": adult_run.steady_samples_per_s if adult_run else None,
        "criteo_sample_auc": criteo_run.auc if criteo_run else None,
        "criteo_sample_samples_per_s": criteo_run.samples_per_s if criteo_run else None,
        "criteo_note": criteo_note,
        "hybrid_rtt_flatness": flatness,
        "hybrid_vs_sync_rtt20ms": vs_sync_rtt,
        "rtt_sweep": sweep_json(points, sweep) if points else None,
        "small_hybrid_vs_inprocess": small_ratio,
        "small_hybrid_vs_inprocess_steady": small_steady,
        "runs": {name: run_json(run) for name, run in [*runs.items(), *small.items()]},
        **layouts,
        "startup_s": startup.get("startup_s"),
        "adult_wall_vs_torch": wall_ratio,
        "startup": startup or None,
        "public_shape_vs_torch": public_ratio,
        "public_shape": public or None,
        "checkpoint_ratio": checkpoint_ratio,
        "checkpoints": checkpoints or None,
        "peers": peers_json(runs, BATCH, torchrec_missing()) if core else None,
        "cuda_note": cuda_note,
        "curves_csv": str(csv_path) if csv_path else None,
        "plot_png": str(png_path) if png_path else None,
        "plot_note": plot_note,
        "rtt_csv": str(rtt_csv) if rtt_csv else None,
        "rtt_png": str(rtt_png) if rtt_png else None,
        "targets": {
            "hybrid_vs_inprocess": TARGET_VS_INPROCESS,
            "hybrid_vs_inprocess_b128": TARGET_VS_INPROCESS_B128,
            "public_shape_vs_torch": TARGET_PUBLIC_SHAPE_VS_TORCH,
            "checkpoint_ratio": bench_public.TARGET_CHECKPOINT_RATIO,
            "hybrid_vs_sync": TARGET_VS_SYNC,
            "auc_gap_hybrid_sync": TARGET_AUC_GAP,
            "hybrid_rtt_flatness": TARGET_RTT_FLATNESS,
            "hybrid_vs_sync_rtt20ms": TARGET_VS_SYNC_RTT20,
            "small_hybrid_vs_inprocess": TARGET_SMALL_VS_INPROCESS,
            "table_layout_ratio": TARGET_LAYOUT_RATIO,
            "table_layout_ratio_b128": TARGET_LAYOUT_RATIO,
            "adult_wall_vs_torch_at_most": TARGET_ADULT_WALL_VS_TORCH,
        },
        "targets_met": {
            "hybrid_vs_inprocess": _met(vs_inprocess, TARGET_VS_INPROCESS),
            "hybrid_vs_inprocess_b128": _met(vs_inprocess_b128, TARGET_VS_INPROCESS_B128),
            "public_shape_vs_torch": _met(public_ratio, TARGET_PUBLIC_SHAPE_VS_TORCH),
            "checkpoint_ratio": _met(checkpoint_ratio, bench_public.TARGET_CHECKPOINT_RATIO),
            "hybrid_vs_sync": _met(vs_sync, TARGET_VS_SYNC),
            "auc_gap_hybrid_sync": None if gap is None else gap <= TARGET_AUC_GAP,
            "async_below": None if async_drop is None else async_drop > TARGET_AUC_GAP,
            "hybrid_rtt_flatness": _met(flatness, TARGET_RTT_FLATNESS),
            "hybrid_vs_sync_rtt20ms": _met(vs_sync_rtt, TARGET_VS_SYNC_RTT20),
            "small_hybrid_vs_inprocess": _met(small_ratio, TARGET_SMALL_VS_INPROCESS),
            "table_layout_ratio": _met(layouts["table_layout_ratio"], TARGET_LAYOUT_RATIO),
            "table_layout_ratio_b128": _met(
                layouts["table_layout_ratio_b128"], TARGET_LAYOUT_RATIO
            ),
            "adult_wall_vs_torch": None
            if wall_ratio is None
            else wall_ratio <= TARGET_ADULT_WALL_VS_TORCH,
        },
        "reference": {
            "persia_samples_per_s": PERSIA_SAMPLES_PER_S,
            "persia_pytorch_samples_per_s": PERSIA_TORCH_SAMPLES_PER_S,
            "persia_adult": PERSIA_ADULT,
            "side_by_side": SIDE_BY_SIDE,
        },
        "settings": {
            "batch": BATCH,
            "dim": DIM,
            "hidden": list(HIDDEN),
            "train_samples": plan.train_samples if core else 0,
            "test_samples": plan.test_samples,
            "evals": plan.evals,
            "cardinality": args.cardinality,
            "max_distinct_ids_per_feature": distinct,
            "buckets": args.buckets,
            "shards": args.shards,
            "layout": args.layout,
            "staleness": args.staleness,
            "async_staleness": args.async_staleness,
            "threads": args.threads,
            "emb_lr": EMB_LR,
            "dense_lr": DENSE_LR,
            "adult_epochs": plan.adult_epochs,
            "criteo_epochs": plan.criteo_epochs,
            "rtt_samples": plan.rtt_samples,
            "small_samples": plan.small_samples,
            "layout_samples": plan.layout_samples,
            "small_model": SMALL.describe(),
            "warmup_batches": args.warmup_batches,
            "cpus": os.cpu_count(),
            "load_average": [load_start, list(os.getloadavg())],  # 1/5/15 min: start, end
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    if core and (hy_auc is None or math.isnan(hy_auc)):
        say("warning: no AUC was measured")
    return finish(result, started, summary, args.json_out)


def _met(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


if __name__ == "__main__":
    sys.exit(main())
