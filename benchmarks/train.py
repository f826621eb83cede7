"""Training benchmark: PERSIA's comparison on this machine -- hybrid, sync and async training on
embeddb shards against an in-process PyTorch model, same data, same dense network.

Model (the paper's Criteo-shaped MLP): 26 ID features of dim 16, pooled (one id per sample), and
13 numeric columns, concatenated (429 floats) into an MLP 256-128-1; batch 512; binary
cross-entropy. Embeddings are trained with Adagrad (server side for embeddb: the shards'
optimizer; ``torch.optim.Adagrad`` on sparse gradients in-process), the dense network with
plain SGD. All runs start from the same dense initialisation (one seed) and the same
embedding initialisation law (normal, std 0.05).

Data: :class:`~embeddb.trainer.data.SyntheticCriteo` (26 Zipf(1.05) ID features of
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

Embedding layouts (``--layout``): ``shared`` puts the 26 features in one feature group, so they
read one table; ``per-feature`` gives each feature its own table. Either way the embedding
worker sends one LookupMany and one ApplyGradientsMany per shard per batch (with 26 parts in
the per-feature layout). ``--compare-layouts`` also runs hybrid in the other layout.

Timing: each run trains in ``--evals`` equal segments; after each segment the embedding updates
are flushed and the model scored on the test set. Only training is timed
(``time.perf_counter`` around each segment; scoring, cluster start and stop are not), so
samples/s = training samples / summed segment time; the median of the per-segment rates is
reported too (robust to a burst of other load on a shared machine). The AUC curves (against
samples and against training wall time) go to a CSV file and, with matplotlib, a PNG plot.
``torch.set_num_threads(--threads)`` holds for every run.

Also: the Adult example (:class:`~embeddb.trainer.data.AdultReader`, packaged Adult preset,
hybrid, batch 128, ``--adult-epochs``) and, when ``../shared/data/criteo`` is present, the
10,000-row Criteo sample (first 8,192 rows train, the rest test, ``--criteo-epochs``, hybrid,
the benchmark's model), both for test AUC.

Output: a table as the run goes, then, as the last line, one JSON object (keys in
``benchmarks/README.md``). Targets (``hybrid_vs_inprocess`` >= 0.8, ``hybrid_vs_sync`` >= 2,
|AUC hybrid - AUC sync| <= 0.001, async below) are printed, never enforced.

Usage::

    PYTHONPATH=. python benchmarks/train.py --quick
    PYTHONPATH=. python benchmarks/train.py --json-out train.json
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _report import finish, fmt_rate, say, verdict
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.evaluation import auc
from embeddb.server.cluster import Cluster, ClusterConfig
from embeddb.trainer import Batch, EmbeddingWorkerConfig, TrainCtx, TrainerConfig
from embeddb.trainer.data import AdultReader, CriteoReader, SyntheticCriteo, SyntheticCriteoConfig

NUM_ID = 26
NUM_DENSE = 13
DIM = 16
HIDDEN = (256, 128)
BATCH = 512
EVAL_BATCH = 4096
EMB_LR = 0.05
EMB_INIT_ACC = 0.01
EMB_EPS = 1e-10
EMB_STD = 0.05
DENSE_LR = 0.1
ADULT_BATCH = 128
ADULT_DIM = 8
ADULT_LR = 3e-3
CRITEO_TRAIN_ROWS = 8192

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

TARGET_VS_INPROCESS = 0.8
TARGET_VS_SYNC = 2.0
TARGET_AUC_GAP = 0.001

# The real PERSIA on a 2-core machine (the reference point).
PERSIA_SAMPLES_PER_S = 26_800
PERSIA_TORCH_SAMPLES_PER_S = 47_000
PERSIA_ADULT = "13-15k samples/s (batch 128), AUC 0.893-0.896 after one epoch"


# ------------------------------------------------------------------------------------ models


class DenseNet(nn.Module):
    """``[numeric | pooled embeddings] -> MLP -> logit``: ``forward(non_id, embeddings)``."""

    def __init__(self, num_dense: int, num_id: int, dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = num_dense + num_id * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[Any]) -> torch.Tensor:
        return self.mlp(torch.cat([*non_id, *embeddings], dim=1))  # type: ignore[no-any-return]


def dense_net(seed: int = 0) -> DenseNet:
    torch.manual_seed(seed)
    return DenseNet(NUM_DENSE, NUM_ID, DIM, HIDDEN)


class InProcessModel(nn.Module):
    """The baseline: one fused ``EmbeddingBag`` (the 26 tables as row ranges) + the MLP."""

    def __init__(self, buckets: int, device: torch.device, seed: int = 0) -> None:
        super().__init__()
        self.dense = dense_net(seed)
        self.buckets = buckets
        self.bag = nn.EmbeddingBag(NUM_ID * buckets, DIM, mode="sum", sparse=True)
        nn.init.normal_(self.bag.weight, 0.0, EMB_STD)
        self.register_buffer(
            "row_offset", torch.arange(NUM_ID, dtype=torch.int64) * buckets, persistent=False
        )
        self.to(device)

    def rows(self, batch: Batch) -> np.ndarray:
        """``(n, 26)`` int64 rows: ``id % buckets`` per feature (the offset is added on device)."""
        ids = np.stack([f.values for f in batch.id_type_features], axis=1)
        out: np.ndarray = (ids % np.uint64(self.buckets)).astype(np.int64)
        return out

    def forward(self, rows: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        n = rows.shape[0]
        flat = (rows + self.row_offset).reshape(-1)
        offsets = torch.arange(0, n * NUM_ID, dtype=torch.int64, device=rows.device)
        pooled = self.bag(flat, offsets).reshape(n, NUM_ID * DIM)
        return self.dense([numeric], [pooled])


# ------------------------------------------------------------------------------------ configs


def embedding_yaml(layout: str, capacity: int) -> str:
    """The benchmark's embedding config: 26 features of dim 16, Adagrad, normal init."""
    names = [f"C{i}" for i in range(1, NUM_ID + 1)]
    lines = ["feature_index_prefix_bit: 8", "seed: 0", "slots_config:"]
    lines += [f"  {n}: {{dim: {DIM}}}" for n in names]
    table_capacity = capacity
    if layout == "shared":
        lines += ["feature_groups:", f"  criteo: [{', '.join(names)}]"]
        table_capacity = capacity * NUM_ID
    lines += [
        "defaults:",
        f"  optimizer: {{type: adagrad, lr: {EMB_LR}, initial_accumulator: {EMB_INIT_ACC}, "
        f"eps: {EMB_EPS}}}",
        f"  initializer: {{type: normal, mean: 0.0, std: {EMB_STD}}}",
        f"  capacity: {table_capacity}",
        "store: {stripes: 4}",
    ]
    return "\n".join(lines) + "\n"


def adult_yaml() -> str:
    return resources.files("embeddb.presets").joinpath("adult.yaml").read_text()


@contextmanager
def local_cluster(yaml_text: str, shards: int, workdir: Path) -> Iterator[list[str]]:
    """A fresh ephemeral cluster of ``shards`` shard processes serving ``yaml_text``."""
    path = workdir / f"embedding-{time.monotonic_ns()}.yaml"
    path.write_text(yaml_text)
    cluster = Cluster(
        ClusterConfig(num_shards=shards, config_path=path, ephemeral=True, log_level="warning"),
        output=lambda line: None,
    )
    try:
        cluster.start()
        yield cluster.wait_healthy()
    finally:
        cluster.stop()


# ------------------------------------------------------------------------------------ runs


@dataclass
class Run:
    """One training run: its rate and its AUC curve."""

    name: str
    samples: int = 0
    seconds: float = 0.0
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # samples, s, AUC
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def median_segment_samples_per_s(self) -> float:
        """Median rate over the segments: robust to a burst of other load on the machine."""
        points = [(0, 0.0), *((c[0], c[1]) for c in self.curve)]
        rates = [
            (b[0] - a[0]) / (b[1] - a[1]) for a, b in itertools.pairwise(points) if b[1] > a[1]
        ]
        return float(np.median(rates)) if rates else 0.0

    @property
    def auc(self) -> float:
        return self.curve[-1][2] if self.curve else float("nan")

    def record(self, score: float) -> None:
        self.curve.append((self.samples, self.seconds, score))
        say(
            f"  {self.name:<22} {self.samples:>9,} samples  {self.seconds:7.1f} s  "
            f"{fmt_rate(self.samples_per_s):>7} samples/s  AUC {score:.4f}"
        )


def segments(batches: Sequence[Batch], count: int) -> list[Sequence[Batch]]:
    bounds = np.linspace(0, len(batches), count + 1).round().astype(int)
    return [batches[lo:hi] for lo, hi in itertools.pairwise(bounds) if hi > lo]


def labels_of(batches: Sequence[Batch]) -> np.ndarray:
    return np.concatenate([b.labels[0].data.ravel() for b in batches])


def run_inprocess(
    name: str,
    train: Sequence[Batch],
    test: Sequence[Batch],
    evals: int,
    buckets: int,
    device: torch.device,
) -> Run:
    """The in-process PyTorch baseline (see the module docstring)."""
    model = InProcessModel(buckets, device)
    emb_opt = torch.optim.Adagrad(
        [model.bag.weight], lr=EMB_LR, initial_accumulator_value=EMB_INIT_ACC, eps=EMB_EPS
    )
    dense_opt = torch.optim.SGD(model.dense.parameters(), lr=DENSE_LR)
    loss_fn = nn.BCEWithLogitsLoss()
    truth = labels_of(test)

    def tensors(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(model.rows(batch)).to(device, non_blocking=True)
        numeric = torch.from_numpy(batch.non_id_type_features[0].data).to(device)
        label = torch.from_numpy(batch.labels[0].data).to(device)
        return rows, numeric, label

    run = Run(name)
    # Opt out of sparse invariant checks explicitly (torch warns when it is left implicit).
    invariants = torch.sparse.check_sparse_tensor_invariants(enable=False)
    for part in segments(train, evals):
        began = time.perf_counter()
        for batch in part:
            rows, numeric, label = tensors(batch)
            loss = loss_fn(model(rows, numeric), label)
            emb_opt.zero_grad(set_to_none=True)
            dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            with invariants:
                emb_opt.step()
            dense_opt.step()
            run.samples += batch.batch_size
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        run.seconds += time.perf_counter() - began
        with torch.no_grad():
            scores = [model(*tensors(b)[:2]).float().cpu().numpy().ravel() for b in test]
        run.record(auc(np.concatenate(scores), truth))
    return run


def run_embeddb(
    name: str,
    mode: str,
    staleness: int,
    yaml_text: str,
    addresses: list[str],
    train: Sequence[Batch],
    test: Sequence[Batch],
    evals: int,
    device: torch.device,
    model: nn.Module | None = None,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
) -> Run:
    """Train with :class:`TrainCtx` against ``addresses``; score after every segment."""
    model = model if model is not None else dense_net()
    opt = (
        optimizer(model)
        if optimizer is not None
        else torch.optim.SGD(model.parameters(), lr=DENSE_LR)
    )
    loss_fn = nn.BCEWithLogitsLoss()
    config = TrainerConfig(
        mode=mode, device=str(device), worker=EmbeddingWorkerConfig(max_staleness=staleness)
    )
    truth = labels_of(test)
    run = Run(name)
    emb_config = EmbeddingConfig.from_yaml_text(yaml_text)
    with TrainCtx(model, opt, emb_config, addresses, config) as ctx:
        for part in segments(train, evals):
            began = time.perf_counter()
            for prepared in ctx.prepare(part):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
                run.samples += prepared.batch.batch_size
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            run.seconds += time.perf_counter() - began
            with ctx.eval_ctx() as ev:
                scores = [ev.forward(p)[0].float().cpu().numpy().ravel() for p in ev.prepare(test)]
            run.record(auc(np.concatenate(scores), truth))
        run.stats = ctx.worker_stats()
    return run


def adult_model() -> nn.Module:
    torch.manual_seed(0)
    return DenseNet(6, 8, ADULT_DIM, (64, 32))


# ------------------------------------------------------------------------------------ main


@dataclass(frozen=True)
class Plan:
    train_samples: int
    test_samples: int
    evals: int
    adult_epochs: int
    criteo_epochs: int


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan(
            args.samples or 61_440,
            args.test_samples or 20_480,
            args.evals or 4,
            1,
            args.criteo_epochs,
        )
    return Plan(
        args.samples or 1_048_576,
        args.test_samples or 102_400,
        args.evals or 8,
        args.adult_epochs,
        args.criteo_epochs,
    )


def write_curves(runs: Sequence[Run], out_dir: Path) -> tuple[Path, Path | None, str | None]:
    """CSV of every curve; a PNG plot (AUC against samples and against wall time) if possible."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "train_auc.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["run", "samples", "train_seconds", "auc"])
        for run in runs:
            for samples, seconds, score in run.curve:
                writer.writerow([run.name, samples, f"{seconds:.3f}", f"{score:.5f}"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return csv_path, None, "matplotlib is not installed: curves written to CSV only"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        xs = [c[0] for c in run.curve]
        ts = [c[1] for c in run.curve]
        ys = [c[2] for c in run.curve]
        left.plot(xs, ys, marker="o", label=run.name)
        right.plot(ts, ys, marker="o", label=run.name)
    left.set_xlabel("training samples")
    right.set_xlabel("training wall time (s)")
    for ax in (left, right):
        ax.set_ylabel("test AUC")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("embeddb train benchmark: test AUC per mode")
    fig.tight_layout()
    png_path = out_dir / "train_auc.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return csv_path, png_path, None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="< 120 s: fewer samples")
    parser.add_argument("--samples", type=int, default=0, help="training samples per run")
    parser.add_argument("--test-samples", type=int, default=0)
    parser.add_argument("--evals", type=int, default=0, help="AUC points per run")
    parser.add_argument("--cardinality", type=int, default=200_000, help="ids per feature")
    parser.add_argument("--buckets", type=int, default=1 << 19, help="in-process rows/feature")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--layout", choices=("shared", "per-feature"), default="shared")
    parser.add_argument("--compare-layouts", action="store_true")
    parser.add_argument("--staleness", type=int, default=4, help="hybrid's max_staleness")
    parser.add_argument("--async-staleness", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--adult-epochs", type=int, default=1)
    parser.add_argument("--criteo-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/train"))
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    plan = plan_of(args)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")

    say(f"train benchmark ({'quick' if args.quick else 'full'}): {plan}")
    say(
        f"model: {NUM_ID} ID features x dim {DIM} + {NUM_DENSE} numeric -> MLP "
        f"{'-'.join(map(str, HIDDEN))}-1, batch {BATCH}; Adagrad embeddings (lr {EMB_LR}), "
        f"SGD dense (lr {DENSE_LR}); torch threads {args.threads}; CPUs {os.cpu_count()}"
    )
    say(
        f"embeddb: {args.shards} local shard process(es), layout {args.layout!r}; in-process: "
        f"ids hashed into {args.buckets:,} rows per feature"
    )

    began = time.perf_counter()
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinality=args.cardinality, seed=args.seed))
    train = list(data.batches(plan.train_samples, BATCH, "train"))
    test = list(data.batches(plan.test_samples, EVAL_BATCH, "test", requires_grad=False))
    best = data.best_auc(plan.test_samples, "test")
    distinct = max(
        len(np.unique(np.concatenate([b.id_type_features[j].values for b in train + test])))
        for j in range(NUM_ID)
    )
    say(
        f"data: {plan.train_samples:,} train / {plan.test_samples:,} test samples generated in "
        f"{time.perf_counter() - began:.1f} s; teacher's best test AUC {best:.4f}; at most "
        f"{distinct:,} distinct ids per feature"
    )
    capacity = int(distinct * 1.2) + 1024
    yaml_main = embedding_yaml(args.layout, capacity)
    other = "per-feature" if args.layout == "shared" else "shared"

    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="embeddb-train-bench-") as tmp:
        workdir = Path(tmp)
        say()
        say("in-process PyTorch baseline")
        runs["inprocess"] = run_inprocess("inprocess", train, test, plan.evals, args.buckets, cpu)
        for mode, staleness in (
            ("hybrid", args.staleness),
            ("sync", args.staleness),
            ("async", args.async_staleness),
        ):
            say(f"{mode} (max_staleness {1 if mode == 'sync' else staleness})")
            with local_cluster(yaml_main, args.shards, workdir) as addresses:
                runs[mode] = run_embeddb(
                    mode, mode, staleness, yaml_main, addresses, train, test, plan.evals, cpu
                )
        if args.compare_layouts:
            name = f"hybrid_{other.replace('-', '_')}"
            say(f"hybrid, layout {other!r}")
            yaml_other = embedding_yaml(other, capacity)
            with local_cluster(yaml_other, args.shards, workdir) as addresses:
                runs[name] = run_embeddb(
                    name,
                    "hybrid",
                    args.staleness,
                    yaml_other,
                    addresses,
                    train,
                    test,
                    plan.evals,
                    cpu,
                )

        cuda_note: str | None = None
        if torch.cuda.is_available():
            gpu = torch.device("cuda")
            say("CUDA: in-process and hybrid with the NN on the GPU")
            runs["inprocess_cuda"] = run_inprocess(
                "inprocess_cuda", train, test, plan.evals, args.buckets, gpu
            )
            with local_cluster(yaml_main, args.shards, workdir) as addresses:
                runs["hybrid_cuda"] = run_embeddb(
                    "hybrid_cuda",
                    "hybrid",
                    args.staleness,
                    yaml_main,
                    addresses,
                    train,
                    test,
                    plan.evals,
                    gpu,
                )
        else:
            cuda_note = "CUDA is not available: the GPU runs were skipped"
            say(cuda_note)

        # Adult: the packaged preset and AdultReader, hybrid, batch 128.
        say()
        say(f"Adult (AdultReader, hybrid, batch {ADULT_BATCH}, {plan.adult_epochs} epoch(s))")
        adult_train = [
            b for _ in range(plan.adult_epochs) for b in AdultReader(ADULT_BATCH, "train")
        ]
        adult_test = list(AdultReader(EVAL_BATCH, "test", requires_grad=False))
        with local_cluster(adult_yaml(), args.shards, workdir) as addresses:
            adult_run = run_embeddb(
                "adult",
                "hybrid",
                args.staleness,
                adult_yaml(),
                addresses,
                adult_train,
                adult_test,
                1,
                cpu,
                adult_model(),
                lambda m: torch.optim.Adam(m.parameters(), lr=ADULT_LR),
            )

        criteo_run: Run | None = None
        criteo_note: str | None = None
        criteo_path = SHARED_DATA / "criteo" / "sample.train.gz"
        if criteo_path.is_file():
            say(f"Criteo sample ({criteo_path}, hybrid, {plan.criteo_epochs} epoch(s))")
            rows = list(CriteoReader(criteo_path, BATCH))
            cut = CRITEO_TRAIN_ROWS // BATCH
            criteo_train = rows[:cut] * plan.criteo_epochs
            criteo_test = [
                Batch(b.id_type_features, b.non_id_type_features, b.labels, requires_grad=False)
                for b in rows[cut:]
            ]
            criteo_yaml = embedding_yaml(args.layout, 20_000)
            with local_cluster(criteo_yaml, args.shards, workdir) as addresses:
                criteo_run = run_embeddb(
                    "criteo_sample",
                    "hybrid",
                    args.staleness,
                    criteo_yaml,
                    addresses,
                    criteo_train,
                    criteo_test,
                    plan.criteo_epochs,
                    cpu,
                )
        else:
            criteo_note = f"{criteo_path} is absent: the Criteo sample was skipped"
            say(criteo_note)

    curve_runs = list(runs.values())
    csv_path, png_path, plot_note = write_curves(curve_runs, args.out_dir)
    if plot_note:
        say(plot_note)

    hy, sy, asy, ip = runs["hybrid"], runs["sync"], runs["async"], runs["inprocess"]
    vs_inprocess = hy.samples_per_s / ip.samples_per_s
    vs_sync = hy.samples_per_s / sy.samples_per_s
    gap = abs(hy.auc - sy.auc)
    async_drop = hy.auc - asy.auc
    say()
    say(f"{'run':<24}{'samples/s':>12}{'median seg':>12}{'AUC':>9}{'samples':>11}{'train s':>9}")
    for run in [*curve_runs, adult_run, *([criteo_run] if criteo_run else [])]:
        say(
            f"{run.name:<24}{run.samples_per_s:>12,.0f}{run.median_segment_samples_per_s:>12,.0f}"
            f"{run.auc:>9.4f}{run.samples:>11,}{run.seconds:>9.1f}"
        )
    say(f"{'teacher (best possible)':<24}{'':>12}{best:>9.4f}")
    say(
        f"reference, the real PERSIA on a 2-core machine: {PERSIA_SAMPLES_PER_S:,} samples/s "
        f"(plain PyTorch {PERSIA_TORCH_SAMPLES_PER_S:,}); Adult {PERSIA_ADULT}"
    )
    summary = [
        f"hybrid_vs_inprocess {vs_inprocess:.2f} (target >= {TARGET_VS_INPROCESS}: "
        f"{verdict(vs_inprocess >= TARGET_VS_INPROCESS)})",
        f"hybrid_vs_sync {vs_sync:.2f} (target >= {TARGET_VS_SYNC}: "
        f"{verdict(vs_sync >= TARGET_VS_SYNC)})",
        f"|AUC hybrid - AUC sync| {gap:.4f} (target <= {TARGET_AUC_GAP}: "
        f"{verdict(gap <= TARGET_AUC_GAP)})",
        f"AUC hybrid - AUC async {async_drop:+.4f} (async at staleness {args.async_staleness}; "
        f"target: measurably below: {verdict(async_drop > TARGET_AUC_GAP)})",
        f"adult AUC {adult_run.auc:.4f} at {adult_run.samples_per_s:,.0f} samples/s",
        f"curves: {csv_path}" + (f", {png_path}" if png_path else ""),
    ]
    result: dict[str, Any] = {
        "bench": "train",
        "quick": args.quick,
        "hybrid_samples_per_s": hy.samples_per_s,
        "sync_samples_per_s": sy.samples_per_s,
        "async_samples_per_s": asy.samples_per_s,
        "inprocess_samples_per_s": ip.samples_per_s,
        "hybrid_vs_inprocess": vs_inprocess,
        "hybrid_vs_sync": vs_sync,
        "auc_hybrid": hy.auc,
        "auc_sync": sy.auc,
        "auc_async": asy.auc,
        "auc_inprocess": ip.auc,
        "auc_gap_hybrid_sync": gap,
        "auc_drop_async": async_drop,
        "best_auc": best,
        "adult_auc": adult_run.auc,
        "adult_samples_per_s": adult_run.samples_per_s,
        "criteo_sample_auc": criteo_run.auc if criteo_run else None,
        "criteo_sample_samples_per_s": criteo_run.samples_per_s if criteo_run else None,
        "criteo_note": criteo_note,
        "runs": {
            name: {
                "samples_per_s": run.samples_per_s,
                "median_segment_samples_per_s": run.median_segment_samples_per_s,
                "staleness_peak": run.stats.get("embeddb_trainer_staleness_peak"),
                "auc": run.auc,
                "samples": run.samples,
                "train_seconds": run.seconds,
                "curve": run.curve,
            }
            for name, run in runs.items()
        },
        "cuda_note": cuda_note,
        "curves_csv": str(csv_path),
        "plot_png": str(png_path) if png_path else None,
        "plot_note": plot_note,
        "targets": {
            "hybrid_vs_inprocess": TARGET_VS_INPROCESS,
            "hybrid_vs_sync": TARGET_VS_SYNC,
            "auc_gap_hybrid_sync": TARGET_AUC_GAP,
        },
        "targets_met": {
            "hybrid_vs_inprocess": vs_inprocess >= TARGET_VS_INPROCESS,
            "hybrid_vs_sync": vs_sync >= TARGET_VS_SYNC,
            "auc_gap_hybrid_sync": gap <= TARGET_AUC_GAP,
            "async_below": async_drop > TARGET_AUC_GAP,
        },
        "reference": {
            "persia_samples_per_s": PERSIA_SAMPLES_PER_S,
            "persia_pytorch_samples_per_s": PERSIA_TORCH_SAMPLES_PER_S,
            "persia_adult": PERSIA_ADULT,
        },
        "settings": {
            "batch": BATCH,
            "dim": DIM,
            "hidden": list(HIDDEN),
            "train_samples": plan.train_samples,
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
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    if math.isnan(result["auc_hybrid"]):
        say("warning: no AUC was measured")
    return finish(result, started, summary, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
