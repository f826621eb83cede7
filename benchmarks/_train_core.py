"""benchmarks/train.py's plan (sample counts per mode) and its core runs: in-process, hybrid,
sync, async (+ the other layout, CUDA), Adult and the Criteo sample (see its docstring)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from _report import say
from _train_layouts import layout_runs
from _train_models import CRITEO, adult_model, adult_yaml, embedding_yaml, local_cluster
from _train_runs import Run, run_embeddb, run_inprocess

from embeddb.features import AdultReader, CriteoReader, SyntheticCriteo
from embeddb.trainer import Batch

BATCH = CRITEO.batch
EVAL_BATCH = 4096
ADULT_BATCH = 128
ADULT_LR = 3e-3
CRITEO_TRAIN_ROWS = 8192

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass(frozen=True)
class Plan:
    train_samples: int
    test_samples: int
    evals: int
    adult_epochs: int
    criteo_epochs: int
    rtt_samples: int
    small_samples: int
    small_test_samples: int
    layout_samples: int = 0  # per batch-128 layout run


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan(
            args.samples or 61_440,
            args.test_samples or 20_480,
            args.evals or 4,
            1,
            args.criteo_epochs,
            args.rtt_samples or 30_720,
            args.small_samples or 30_720,
            10_240,
            args.layout_samples or 30_720,
        )
    return Plan(
        args.samples or 1_048_576,
        args.test_samples or 102_400,
        args.evals or 8,
        args.adult_epochs,
        args.criteo_epochs,
        args.rtt_samples or 131_072,
        args.small_samples or 262_144,
        51_200,
        args.layout_samples or 262_144,
    )


def core_runs(
    args: argparse.Namespace,
    plan: Plan,
    train: Sequence[Batch],
    test: Sequence[Batch],
    capacity: int,
    workdir: Path,
    data: SyntheticCriteo,
) -> tuple[dict[str, Run], Run, Run | None, str | None, str | None]:
    """In-process, hybrid, sync, async (+ the other layout and batch 128 in both, CUDA), Adult
    and the Criteo sample: ``(runs, adult, criteo, criteo_note, cuda_note)``."""
    cpu = torch.device("cpu")
    warm = args.warmup_batches
    yaml_main = embedding_yaml(args.layout, capacity)
    runs: dict[str, Run] = {}
    say()
    say("in-process PyTorch baseline")
    runs["inprocess"] = run_inprocess(
        "inprocess", train, test, plan.evals, args.buckets, cpu, warmup=warm
    )
    for mode, staleness in (
        ("hybrid", args.staleness),
        ("sync", args.staleness),
        ("async", args.async_staleness),
    ):
        say(f"{mode} (max_staleness {1 if mode == 'sync' else staleness})")
        with local_cluster(yaml_main, args.shards, workdir) as addresses:
            runs[mode] = run_embeddb(
                mode, mode, staleness, yaml_main, addresses, train, test, plan.evals, cpu,
                warmup=warm,
            )  # fmt: skip
    if not args.skip_layouts:
        runs.update(
            layout_runs(args, data, plan.layout_samples, train, test, plan.evals, capacity, workdir)
        )

    cuda_note: str | None = None
    if torch.cuda.is_available():
        gpu = torch.device("cuda")
        say("CUDA: in-process and hybrid with the NN on the GPU")
        runs["inprocess_cuda"] = run_inprocess(
            "inprocess_cuda", train, test, plan.evals, args.buckets, gpu, warmup=warm
        )
        with local_cluster(yaml_main, args.shards, workdir) as addresses:
            runs["hybrid_cuda"] = run_embeddb(
                "hybrid_cuda", "hybrid", args.staleness, yaml_main, addresses, train, test,
                plan.evals, gpu, warmup=warm,
            )  # fmt: skip
    else:
        cuda_note = "CUDA is not available: the GPU runs were skipped"
        say(cuda_note)

    # Adult: the packaged preset and AdultReader, hybrid, batch 128.
    say()
    say(f"Adult (AdultReader, hybrid, batch {ADULT_BATCH}, {plan.adult_epochs} epoch(s))")
    adult_train = [b for _ in range(plan.adult_epochs) for b in AdultReader(ADULT_BATCH, "train")]
    adult_test = list(AdultReader(EVAL_BATCH, "test", requires_grad=False))
    with local_cluster(adult_yaml(), args.shards, workdir) as addresses:
        adult_run = run_embeddb(
            "adult", "hybrid", args.staleness, adult_yaml(), addresses, adult_train, adult_test,
            1, cpu, adult_model(), lambda m: torch.optim.Adam(m.parameters(), lr=ADULT_LR),
            warmup=warm,
        )  # fmt: skip

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
                "criteo_sample", "hybrid", args.staleness, criteo_yaml, addresses, criteo_train,
                criteo_test, plan.criteo_epochs, cpu, warmup=warm,
            )  # fmt: skip
    else:
        criteo_note = f"{criteo_path} is absent: the Criteo sample was skipped"
        say(criteo_note)
    return runs, adult_run, criteo_run, criteo_note, cuda_note
