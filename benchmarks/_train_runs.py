"""benchmarks/train.py's timed runs: the in-process baseline and embeddb's modes (see its
docstring for the method)."""

from __future__ import annotations

import csv
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from _report import fmt_rate, pyplot, say
from _train_models import (
    CRITEO,
    DENSE_LR,
    EMB_EPS,
    EMB_INIT_ACC,
    EMB_LR,
    InProcessModel,
    Shape,
    dense_net,
)
from torch import nn

from embeddb.client import SimulatedNetwork
from embeddb.common.evaluation import auc
from embeddb.config import EmbeddingConfig
from embeddb.trainer import Batch, EmbeddingWorkerConfig, TrainCtx, TrainerConfig


@dataclass
class Run:
    """One training run: its rate, its AUC curve and its steady-state rate.

    ``warm`` is ``(samples, seconds)`` trained when the first ``warmup`` batches were done
    (start-up: the first lookups create the rows, the pipeline fills); the steady-state rate
    counts only what came after.
    """

    name: str
    samples: int = 0
    seconds: float = 0.0
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # samples, s, AUC
    stats: dict[str, float] = field(default_factory=dict)
    warm: tuple[int, float] | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def steady_samples_per_s(self) -> float:
        """Samples/s after the warm-up batches (all of the run without a warm-up)."""
        if self.warm is None:
            return self.samples_per_s
        samples, seconds = self.samples - self.warm[0], self.seconds - self.warm[1]
        return samples / seconds if seconds > 0 and samples > 0 else self.samples_per_s

    @property
    def median_segment_samples_per_s(self) -> float:
        """Median rate over the segments: robust to a burst of other load on the machine."""
        points = [(0, 0.0), *((c[0], c[1]) for c in self.curve)]
        rates = [
            (b[0] - a[0]) / (b[1] - a[1]) for a, b in itertools.pairwise(points) if b[1] > a[1]
        ]
        return float(np.median(rates)) if rates else 0.0

    @property
    def staleness_peak(self) -> float | None:
        """The embedding worker's peak of in-flight training batches (``None`` in-process)."""
        return self.stats.get("embeddb_trainer_staleness_peak")

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


class _Clock:
    """Training time of a run, with the warm-up mark taken after ``warmup`` batches."""

    def __init__(self, run: Run, warmup: int) -> None:
        self.run, self.warmup, self.batches = run, warmup, 0
        self.began = 0.0

    def start(self) -> None:
        self.began = time.perf_counter()

    def step(self, samples: int) -> None:
        self.run.samples += samples
        self.batches += 1
        if self.batches == self.warmup:
            self.run.warm = (self.run.samples, self.run.seconds + time.perf_counter() - self.began)

    def stop(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.run.seconds += time.perf_counter() - self.began


def run_inprocess(
    name: str,
    train: Sequence[Batch],
    test: Sequence[Batch],
    evals: int,
    buckets: int,
    device: torch.device,
    shape: Shape = CRITEO,
    warmup: int = 0,
) -> Run:
    """The in-process PyTorch baseline (see the module docstring)."""
    model = InProcessModel(buckets, device, shape=shape)
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
    clock = _Clock(run, warmup)
    # Opt out of sparse invariant checks explicitly (torch warns when it is left implicit).
    invariants = torch.sparse.check_sparse_tensor_invariants(enable=False)  # type: ignore[no-untyped-call]
    for part in segments(train, evals):
        clock.start()
        for batch in part:
            rows, numeric, label = tensors(batch)
            loss = loss_fn(model(rows, numeric), label)
            emb_opt.zero_grad(set_to_none=True)
            dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            with invariants:
                emb_opt.step()
            dense_opt.step()
            clock.step(batch.batch_size)
        clock.stop(device)
        with torch.no_grad():
            scores = [model(*tensors(b)[:2]).float().cpu().numpy().ravel() for b in test]
        run.record(auc(labels=truth, scores=np.concatenate(scores)))
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
    *,
    network: SimulatedNetwork | None = None,
    warmup: int = 0,
    score: bool = True,
) -> Run:
    """Train with :class:`TrainCtx` against ``addresses``; score after every segment (unless
    ``score`` is false: a rate-only run). ``network``: the embedding worker's simulated
    network (``None``: loopback as it is)."""
    model = model if model is not None else dense_net()
    opt = (
        optimizer(model)
        if optimizer is not None
        else torch.optim.SGD(model.parameters(), lr=DENSE_LR)
    )
    loss_fn = nn.BCEWithLogitsLoss()
    config = TrainerConfig(
        mode=mode,  # type: ignore[arg-type]
        device=str(device),
        worker=EmbeddingWorkerConfig(max_staleness=staleness, network=network),
    )
    truth = labels_of(test) if score else None
    run = Run(name)
    clock = _Clock(run, warmup)
    emb_config = EmbeddingConfig.from_yaml_text(yaml_text)
    with TrainCtx(model, opt, emb_config, addresses, config) as ctx:
        for part in segments(train, evals):
            clock.start()
            for prepared in ctx.prepare(part):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
                clock.step(prepared.batch.batch_size)
            clock.stop(device)
            if truth is None:
                continue
            with ctx.eval_ctx() as ev:
                scores = [ev.forward(p)[0].float().cpu().numpy().ravel() for p in ev.prepare(test)]
            run.record(auc(labels=truth, scores=np.concatenate(scores)))
        run.stats = ctx.worker_stats()
    return run


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
    plt = pyplot()
    if plt is None:
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
