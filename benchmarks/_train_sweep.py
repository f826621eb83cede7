"""benchmarks/train.py's latency runs: hybrid and sync across simulated network RTTs, and the
small-model run (see its docstring and benchmarks/README.md).

The network is :class:`embeddb.client.SimulatedNetwork` on the embedding worker's client: every
call to a shard waits ``rtt + bytes / bandwidth`` (no netem in this kernel; no contention).
Hybrid's staleness window per RTT is, unless fixed, the benchmark's staleness plus the batches
that train while one batch's two extra network round trips (its lookup and its gradient push)
are under way, at the step time measured at RTT 0 (Little's law: in-flight batches = latency /
step time): ``staleness + ceil(2 * rtt / step)``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from _report import pyplot, say
from _train_models import SMALL, Shape, dense_net, embedding_yaml, local_cluster
from _train_runs import Run, run_embeddb, run_inprocess

from embeddb.client import SimulatedNetwork
from embeddb.trainer import Batch

RTTS_MS = (0.0, 5.0, 10.0, 20.0)
BANDWIDTH_GBIT = 10.0
MODES = ("hybrid", "sync")


@dataclass
class SweepPoint:
    """One run of the sweep: mode, RTT, the staleness window it was given and what it did."""

    mode: str
    rtt_ms: float
    max_staleness: int
    samples_per_s: float  # steady state: after the warm-up batches
    total_samples_per_s: float
    staleness_peak: float | None
    auc: float


def window_for(rtt_ms: float, step_s: float, staleness: int) -> int:
    """Hybrid's window at ``rtt_ms``: ``staleness`` (what hides the loopback's latency) plus
    the steps of ``step_s`` seconds that fit in the lookup's and the push's round trips."""
    if step_s <= 0:
        return staleness
    return staleness + math.ceil(2 * rtt_ms / 1000.0 / step_s - 1e-9)


def network_at(rtt_ms: float) -> SimulatedNetwork:
    return SimulatedNetwork(rtt=rtt_ms / 1000.0, bandwidth=BANDWIDTH_GBIT * 1e9 / 8)


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep runs: the RTTs, hybrid's window (``window`` 0: per RTT, from the step
    time at RTT 0), the warm-up batches left out of the steady rate, shards, device."""

    rtts_ms: tuple[float, ...]
    staleness: int
    window: int
    warmup: int
    shards: int
    device: torch.device


def run_sweep(
    train: Sequence[Batch],
    test: Sequence[Batch],
    yaml_text: str,
    settings: SweepSettings,
    workdir: Path,
) -> list[SweepPoint]:
    """Hybrid and sync at every RTT, each on a fresh cluster (rates after ``warmup``)."""
    points: list[SweepPoint] = []
    step_s = 0.0
    for rtt in settings.rtts_ms:
        for mode in MODES:
            if mode == "sync":
                window = 1
            elif settings.window:
                window = settings.window
            else:
                window = window_for(rtt, step_s, settings.staleness)
            name = f"{mode}@{rtt:g}ms"
            say(f"{name} (max_staleness {window}, {BANDWIDTH_GBIT:g} Gbit/s)")
            with local_cluster(yaml_text, settings.shards, workdir) as addresses:
                run = run_embeddb(
                    name, mode, window, yaml_text, addresses, train, test, 1, settings.device,
                    network=network_at(rtt), warmup=settings.warmup,
                )  # fmt: skip
            if mode == "hybrid" and rtt == 0 and run.steady_samples_per_s > 0:
                step_s = train[0].batch_size / run.steady_samples_per_s
            points.append(
                SweepPoint(
                    mode,
                    rtt,
                    window,
                    run.steady_samples_per_s,
                    run.samples_per_s,
                    run.staleness_peak,
                    run.auc,
                )
            )
            say(
                f"  steady {points[-1].samples_per_s:,.0f} samples/s, staleness peak "
                f"{run.staleness_peak}"
            )
    return points


def rate_at(points: Sequence[SweepPoint], mode: str, rtt_ms: float) -> float:
    for p in points:
        if p.mode == mode and p.rtt_ms == rtt_ms:
            return p.samples_per_s
    return float("nan")


def sweep_json(points: Sequence[SweepPoint], settings: SweepSettings) -> dict[str, Any]:
    """The ``rtt_sweep`` JSON object."""
    return {
        "rtts_ms": list(settings.rtts_ms),
        "bandwidth_gbit": BANDWIDTH_GBIT,
        "window": "per RTT, from the step time at RTT 0"
        if not settings.window
        else settings.window,
        "warmup_batches": settings.warmup,
        "points": [asdict(p) for p in points],
        "samples_per_s": {
            mode: {f"{p.rtt_ms:g}": p.samples_per_s for p in points if p.mode == mode}
            for mode in MODES
        },
        "staleness_peak": {
            mode: {f"{p.rtt_ms:g}": p.staleness_peak for p in points if p.mode == mode}
            for mode in MODES
        },
    }


def write_sweep(
    points: Sequence[SweepPoint], out_dir: Path
) -> tuple[Path, Path | None, str | None]:
    """CSV of the sweep; a PNG (samples/s and staleness peak against RTT) with matplotlib."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "train_rtt.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["mode", "rtt_ms", "max_staleness", "samples_per_s", "total_samples_per_s",
             "staleness_peak", "auc"]
        )  # fmt: skip
        for p in points:
            writer.writerow(
                [p.mode, f"{p.rtt_ms:g}", p.max_staleness, f"{p.samples_per_s:.0f}",
                 f"{p.total_samples_per_s:.0f}", p.staleness_peak, f"{p.auc:.5f}"]
            )  # fmt: skip
    plt = pyplot()
    if plt is None:
        return csv_path, None, "matplotlib is not installed: the RTT sweep written to CSV only"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in MODES:
        mine = [p for p in points if p.mode == mode]
        xs = [p.rtt_ms for p in mine]
        (line,) = left.plot(xs, [p.samples_per_s for p in mine], marker="o", label=mode)
        color = line.get_color()
        peaks = [p.staleness_peak or 0 for p in mine]
        right.plot(xs, peaks, marker="o", color=color, label=f"{mode} peak")
        windows = [p.max_staleness for p in mine]
        right.plot(xs, windows, linestyle=":", color=color, label=f"{mode} window")
    left.set_ylabel("training samples/s (steady state)")
    right.set_ylabel("in-flight training batches")
    for ax in (left, right):
        ax.set_xlabel(f"simulated RTT (ms), {BANDWIDTH_GBIT:g} Gbit/s")
        ax.grid(alpha=0.3)
        ax.legend()
    left.set_ylim(bottom=0)
    fig.suptitle("embeddb train benchmark: latency hiding (hybrid) against sync")
    fig.tight_layout()
    png_path = out_dir / "train_rtt.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return csv_path, png_path, None


def run_small(
    train: Sequence[Batch],
    test: Sequence[Batch],
    evals: int,
    buckets: int,
    capacity: int,
    settings: SweepSettings,
    workdir: Path,
    shape: Shape = SMALL,
    layout: str = "per-feature",
) -> dict[str, Run]:
    """The small model in-process and hybrid (loopback, the benchmark's staleness)."""
    runs: dict[str, Run] = {}
    say(f"small model, in-process ({shape.describe()})")
    runs["small_inprocess"] = run_inprocess(
        "small_inprocess", train, test, evals, buckets, settings.device, shape, settings.warmup
    )
    say(f"small model, hybrid (max_staleness {settings.staleness}, layout {layout!r})")
    yaml_text = embedding_yaml(layout, capacity, shape)
    with local_cluster(yaml_text, settings.shards, workdir) as addresses:
        runs["small_hybrid"] = run_embeddb(
            "small_hybrid", "hybrid", settings.staleness, yaml_text, addresses, train, test,
            evals, settings.device, dense_net(0, shape), warmup=settings.warmup,
        )  # fmt: skip
    return runs
