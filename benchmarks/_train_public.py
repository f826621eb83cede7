"""benchmarks/train.py's public-shape job (``public_shape_vs_torch``): a click log shaped like
Avazu's (22 categorical fields, no numeric column; synthetic, written here with a fixed seed:
no public CTR dataset is redistributed with embeddb) trained from YAML with ``embeddb train``
against the plain PyTorch script of the same shape (``_train_public_torch.py``), whole-job
wall times, timed as the Adult job is (:func:`_train_startup.compare_walls`).

The job: 9,000 rows (7,200 in ``train.csv``, 1,800 in ``test.csv``), the 22 fields as ids
(``embedding_config: auto``: one table of dim 16 per field, Adagrad lr 0.05 on the shard),
``model: builtin:dnn`` (MLP 352-256-128-1), Adam lr 1e-3, batch 256, 3 epochs, hybrid, one
local shard. ``public_shape_vs_torch`` is the plain script's wall over the job's (a speed
ratio: higher is better, target >= 0.6).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _report import say
from _train_startup import compare_walls, last_json, timed

TORCH_SCRIPT = Path(__file__).resolve().parent / "_train_public_torch.py"
TARGET_PUBLIC_SHAPE_VS_TORCH = 0.6

# Avazu's 22 categorical fields with a cardinality of the order seen in its first rows.
FIELDS: dict[str, int] = {
    "hour": 24, "C1": 7, "banner_pos": 7, "site_id": 1_500, "site_domain": 1_200,
    "site_category": 20, "app_id": 1_200, "app_domain": 150, "app_category": 25,
    "device_id": 4_000, "device_ip": 7_000, "device_model": 2_500, "device_type": 5,
    "device_conn_type": 4, "C14": 1_000, "C15": 8, "C16": 9, "C17": 300, "C18": 4,
    "C19": 60, "C20": 150, "C21": 50,
}  # fmt: skip
LABEL = "click"
ROWS = 9_000
TEST_ROWS = 1_800
BATCH = 256
EPOCHS = 3
DIM = 16
SEED = 0


def write_data(directory: Path, rows: int = ROWS, seed: int = SEED) -> tuple[Path, Path]:
    """``directory/train.csv`` and ``test.csv`` (the last ``TEST_ROWS`` rows of ``rows``): a
    header, then per row the 22 fields as 8-hex-digit hashes of Zipf(1.2)-ranked values (Avazu
    writes its ids so) and ``click``, drawn from a planted logistic model of per-value effects
    (about 17% positives)."""
    rng = np.random.default_rng(seed)
    columns: list[list[str]] = []
    logit = np.full(rows, -1.9)
    for j, cardinality in enumerate(FIELDS.values()):
        rank = np.minimum(rng.zipf(1.2, rows) - 1, cardinality - 1)
        logit += rng.normal(0.0, 0.5, cardinality)[rank]
        hashed = (rank * 2_654_435_761 + j * 40_503) % (1 << 32)
        columns.append([f"{h:08x}" for h in hashed.tolist()])
    click = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64).tolist()
    header = ",".join([*FIELDS, LABEL]) + "\n"
    lines = [",".join(values) + f",{y}\n" for *values, y in zip(*columns, click, strict=True)]
    directory.mkdir(parents=True, exist_ok=True)
    train, test = directory / "train.csv", directory / "test.csv"
    train.write_text(header + "".join(lines[: rows - TEST_ROWS]))
    test.write_text(header + "".join(lines[rows - TEST_ROWS :]))
    return train, test


def public_job(directory: Path) -> tuple[Path, Path]:
    """The data and the job YAML in ``directory``: ``(job, metrics file)``."""
    write_data(directory)
    metrics = directory / "metrics.jsonl"
    job: dict[str, Any] = {
        "dataset": {
            "format": "csv",
            "train": "train.csv",
            "test": "test.csv",
            "label": {"column": LABEL},
            "ids": list(FIELDS),
        },
        "model": "builtin:dnn",
        "embedding_config": "auto",
        "embedding_dim": DIM,
        "mode": "hybrid",
        "max_staleness": 4,
        "epochs": EPOCHS,
        "batch_size": BATCH,
        "optimizer": {"type": "adam", "lr": 0.001},
        "seed": SEED,
        "shards": 1,
        "workers": 1,
        "metrics_file": str(metrics),
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path, metrics


def run_public_shape(workdir: Path, pairs: int = 1) -> dict[str, Any]:
    """The job (warm: the Adult runs before it loaded numba's cache) against the plain script,
    ``pairs`` rounds: walls, AUCs and ``public_shape_vs_torch``."""
    directory = workdir / "public-shape"
    job, metrics = public_job(directory)
    torch_cmd = [
        sys.executable, str(TORCH_SCRIPT), str(directory), "--epochs", str(EPOCHS),
        "--batch", str(BATCH), "--dim", str(DIM),
    ]  # fmt: skip
    walls = compare_walls("public shape", job, metrics, torch_cmd, pairs, cold=False)
    return {
        "public_shape_vs_torch": walls["torch_wall_s"] / walls["job_wall_s"],
        "fields": len(FIELDS),
        "rows": ROWS,
        "test_rows": TEST_ROWS,
        "batch": BATCH,
        "epochs": EPOCHS,
        **walls,
    }


TARGET_CHECKPOINT_RATIO = 0.8


def run_checkpoint_ratio(workdir: Path, without: dict[str, Any] | None = None) -> dict[str, Any]:
    """``checkpoint_ratio``: the public-shape job with ``checkpoint_dir`` set (a checkpoint at
    the end of every epoch: ``checkpoint_every: 0``) over the same job without, as the job's
    own ``samples_per_s`` (training time, the checkpoints of the first two epochs' ends
    included; the last one, the job's final checkpoint, follows training). ``without``: the
    metrics of a warm run of the job without checkpoints (:func:`run_public_shape`'s ``job``),
    else one is run here first."""
    say()
    say("checkpoints: the public-shape job with a checkpoint per epoch against without")
    command = [sys.executable, "-m", "embeddb.cli", "train"]
    if without is None:
        job, metrics = public_job(workdir / "public-shape")
        timed([*command, str(job)])
        without = last_json(metrics.read_text())
    directory = workdir / "public-checkpoint"
    job, metrics = public_job(directory)
    spec = yaml.safe_load(job.read_text())
    spec["checkpoint_dir"] = str(directory / "checkpoints")
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    seconds, _ = timed([*command, str(job)])
    with_ckpt = last_json(metrics.read_text())
    ratio = with_ckpt["samples_per_s"] / without["samples_per_s"]
    return {
        "checkpoint_ratio": ratio,
        "samples_per_s_with": with_ckpt["samples_per_s"],
        "samples_per_s_without": without["samples_per_s"],
        "checkpoint_s": with_ckpt.get("checkpoint_s"),
        "final_checkpoint_s": with_ckpt.get("final_checkpoint_s"),
        "checkpoints": EPOCHS - 1,  # in the timed training; the last epoch's is the final one
        "job_wall_s": seconds,
    }


def checkpoint_note(checkpoints: dict[str, Any]) -> str:
    """The summary line's tail for ``checkpoint_ratio`` (empty when it was skipped)."""
    if not checkpoints:
        return ""
    return (
        f"; {checkpoints['samples_per_s_with']:,.0f} samples/s with {checkpoints['checkpoints']} "
        f"checkpoints ({checkpoints['checkpoint_s'] or 0:.2f} s; the final one "
        f"{checkpoints['final_checkpoint_s'] or 0:.2f} s) against "
        f"{checkpoints['samples_per_s_without']:,.0f} without"
    )
