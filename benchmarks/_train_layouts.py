"""benchmarks/train.py's table-layout runs and its peers section (see its docstring).

Layouts. The default layout is one table per feature (what ``embedding_config: auto`` and
PERSIA's own configs produce); the shared layout puts the 26 features in one table. Hybrid runs
in the other layout too, at batch 512 (scored: it is the ``hybrid_<other>`` curve) and, rate
only, both layouts at batch 128, on fresh clusters, same model and data, one after the other
in this run: ``table_layout_ratio`` (batch 512) and ``table_layout_ratio_b128`` are the
one-table-per-feature samples/s over the shared table's.

Peers. ``pytorch_inprocess`` is the in-process run (one fused ``nn.EmbeddingBag`` + torch's
Adagrad, one process; at batch 128 too, ``inprocess_b128`` against ``hybrid_b128``:
``hybrid_vs_inprocess_b128``); TorchRec's unsharded ``EmbeddingBagCollection`` with its fused
Adagrad runs only when ``torchrec`` and ``fbgemm_gpu`` import here; otherwise the JSON says why.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _report import say
from _train_models import embedding_yaml, local_cluster
from _train_runs import Run, run_embeddb, run_inprocess

from embeddb.features import SyntheticCriteo
from embeddb.trainer import Batch

LAYOUTS = ("per-feature", "shared")
SMALL_BATCH = 128
TARGET_LAYOUT_RATIO = 0.9


def other_layout(layout: str) -> str:
    return "shared" if layout == "per-feature" else "per-feature"


def layout_name(layout: str, suffix: str = "") -> str:
    """The run's name: ``hybrid`` in the main layout, ``hybrid_<layout>`` in the other."""
    return f"hybrid_{layout.replace('-', '_')}{suffix}"


def layout_runs(
    args: argparse.Namespace,
    data: SyntheticCriteo,
    samples: int,
    train: Sequence[Batch],
    test: Sequence[Batch],
    evals: int,
    capacity: int,
    workdir: Path,
) -> dict[str, Run]:
    """Hybrid in the other layout at batch 512 (scored), in-process PyTorch at batch 128 (scored
    once) and hybrid in both layouts at batch 128 (rate only), ``samples`` each: runs named
    ``hybrid_<other>``, ``inprocess_b128``, ``hybrid_b128`` and ``hybrid_<other>_b128``."""
    cpu = torch.device("cpu")
    other = other_layout(args.layout)
    runs: dict[str, Run] = {}
    say(f"hybrid, layout {other!r} (batch {train[0].batch_size})")
    yaml_other = embedding_yaml(other, capacity)
    name = layout_name(other)
    with local_cluster(yaml_other, args.shards, workdir) as addresses:
        runs[name] = run_embeddb(
            name, "hybrid", args.staleness, yaml_other, addresses, train, test, evals, cpu,
            warmup=args.warmup_batches,
        )  # fmt: skip
    small = list(data.batches(samples, SMALL_BATCH, "train"))
    say(f"in-process PyTorch, batch {SMALL_BATCH}")
    runs["inprocess_b128"] = run_inprocess(
        "inprocess_b128", small, test, 1, args.buckets, cpu, warmup=args.warmup_batches
    )
    for layout in (args.layout, other):
        name = "hybrid_b128" if layout == args.layout else layout_name(layout, "_b128")
        say(f"hybrid, layout {layout!r}, batch {SMALL_BATCH} (rate only)")
        yaml_text = embedding_yaml(layout, capacity)
        with local_cluster(yaml_text, args.shards, workdir) as addresses:
            runs[name] = run_embeddb(
                name, "hybrid", args.staleness, yaml_text, addresses, small, test, 1, cpu,
                warmup=args.warmup_batches, score=False,
            )  # fmt: skip
        say(f"  {name:<22} {runs[name].samples_per_s:,.0f} samples/s")
    return runs


def layout_ratios(runs: dict[str, Run], layout: str) -> dict[str, float | None]:
    """``table_layout_ratio`` (batch 512) and ``table_layout_ratio_b128``: one table per
    feature over one shared table (``None`` when a run is missing)."""

    def rate(name: str) -> float | None:
        run = runs.get(name)
        return run.samples_per_s if run is not None and run.samples_per_s else None

    def per_feature_over_shared(main: str, other: str) -> float | None:
        a, b = rate(main), rate(other)
        if a is None or b is None:
            return None
        return a / b if layout == "per-feature" else b / a

    other = other_layout(layout)
    return {
        "table_layout_ratio": per_feature_over_shared("hybrid", layout_name(other)),
        "table_layout_ratio_b128": per_feature_over_shared(
            "hybrid_b128", layout_name(other, "_b128")
        ),
    }


def torchrec_missing() -> str | None:
    """Why TorchRec cannot run here (``None``: it imports)."""
    try:
        importlib.import_module("fbgemm_gpu")
        importlib.import_module("torchrec")
    except Exception as exc:  # an ImportError, or fbgemm's OSError on a torch ABI mismatch
        text = str(exc).splitlines()[0] if str(exc) else ""
        return f"{type(exc).__name__}: {text[:300]}"
    return None


TORCHREC_NOTE = (  # what was found when it was tried here
    "fbgemm-gpu-cpu 1.9.0, the newest on PyPI (with torchrec 1.9.2), is built against an older "
    "torch: its libraries do not load under torch {torch} (undefined symbol "
    "torch::autograd::_wrap_outputs), and torchrec imports fbgemm_gpu"
)


def hybrid_vs_inprocess_b128(runs: dict[str, Run]) -> float | None:
    """Hybrid (the main layout) over in-process PyTorch samples/s at batch 128, same batches,
    same run (``None`` when a run is missing)."""
    hybrid, inproc = runs.get("hybrid_b128"), runs.get("inprocess_b128")
    if hybrid is None or inproc is None or not inproc.samples_per_s:
        return None
    return hybrid.samples_per_s / inproc.samples_per_s


def peers_json(runs: dict[str, Run], batch: int, torchrec_reason: str | None) -> dict[str, Any]:
    """The ``peers`` JSON object: the in-process PyTorch peer against hybrid, in this run (at
    ``batch``, and at batch 128 under ``batch_128`` when those runs were made)."""
    hybrid, inproc = runs.get("hybrid"), runs.get("inprocess")
    peers: dict[str, Any] = {"batch": batch}
    peers["hybrid"] = {"samples_per_s": hybrid.samples_per_s, "auc": hybrid.auc} if hybrid else None
    peers["pytorch_inprocess"] = (
        {
            "what": "one fused nn.EmbeddingBag (sparse) + torch.optim.Adagrad, one process",
            "samples_per_s": inproc.samples_per_s,
            "auc": inproc.auc,
            "hybrid_vs": hybrid.samples_per_s / inproc.samples_per_s
            if hybrid and inproc.samples_per_s
            else None,
            "auc_minus_hybrid": inproc.auc - hybrid.auc if hybrid else None,
        }
        if inproc
        else None
    )
    if torchrec_reason is not None:
        note = TORCHREC_NOTE.format(torch=torch.__version__)
        abi = torchrec_reason.startswith("OSError") and "fbgemm" in torchrec_reason
        peers["torchrec"] = {"skipped": f"{torchrec_reason} ({note})" if abi else torchrec_reason}
    else:
        peers["torchrec"] = {"skipped": "torchrec imports, but this benchmark has no TorchRec run"}
    small = {name: runs.get(f"{name}_b128") for name in ("hybrid", "inprocess")}
    peers["batch_128"] = (
        {
            "hybrid_samples_per_s": small["hybrid"].samples_per_s,
            "pytorch_inprocess_samples_per_s": small["inprocess"].samples_per_s,
            "pytorch_inprocess_auc": small["inprocess"].auc,
            "hybrid_vs": hybrid_vs_inprocess_b128(runs),
        }
        if small["hybrid"] is not None and small["inprocess"] is not None
        else None
    )
    return peers


# The side-by-side session of docs/performance.md ("Against PERSIA and TorchRec"): one idle
# 2-core machine, one shared table, medians of 2-4 alternating runs; its harness is not in this
# repository. samples/s by batch.
SIDE_BY_SIDE: dict[str, Any] = {
    "what": (
        "an earlier side-by-side session (harness not in this repository): one idle 2-core "
        "machine, the 26 features in one shared table, 524k rows, medians of 2-4 runs"
    ),
    "embeddb_hybrid": {"128": 31_300, "512": 56_200, "2048": 72_900},
    "persia": {"128": 12_200, "512": 20_800, "2048": 26_400},
    "pytorch_inprocess": {"128": 70_500, "512": 98_600, "2048": 105_800},
    "torchrec_session": {
        "embeddb_hybrid": {"512": 54_300, "2048": 72_600},
        "torchrec_exact_adagrad": {"512": 77_900, "2048": 94_100},
        "torchrec_rowwise_adagrad": {"512": 111_000, "2048": 119_000},
    },
}
