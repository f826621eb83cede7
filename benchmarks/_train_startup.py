"""benchmarks/train.py's start-up runs: the whole ``embeddb train examples/adult/train.yaml``
command against the equivalent plain PyTorch script (``_train_adult_torch.py``), each timed
from its start to its exit: one cold embeddb run (numba's cache, the OS's file cache), then
rounds of (PyTorch with torch's default threads, PyTorch with one thread, embeddb); the walls
compared are the best warm embeddb run and the best PyTorch run of either setting (the machine
is shared: the best run is the least disturbed). ``startup_s`` is the
job's own report (command start to the first training step, with its timeline:
:mod:`embeddb.trainer.launcher.startup`). :func:`compare_walls` is the timing itself, shared
with the public-shape job (``_train_public.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _report import say

ROOT = Path(__file__).resolve().parents[1]
ADULT_JOB = ROOT / "examples" / "adult" / "train.yaml"
TORCH_SCRIPT = Path(__file__).resolve().parent / "_train_adult_torch.py"


def adult_job(workdir: Path) -> tuple[Path, Path]:
    """``examples/adult/train.yaml`` copied to ``workdir`` (its model by absolute path) with a
    ``metrics_file``: ``(job, metrics file)``."""
    metrics = workdir / "adult-metrics.jsonl"
    lines = []
    for line in ADULT_JOB.read_text().splitlines():
        if line.startswith("model:"):
            line = f"model: {ADULT_JOB.parent / 'model.py'}:AdultModel"
        lines.append(line)
    lines.append(f"metrics_file: {metrics}")
    job = workdir / "adult-job.yaml"
    job.write_text("\n".join(lines) + "\n")
    return job, metrics


def last_json(text: str) -> dict[str, Any]:
    """The last line of ``text`` that is a JSON object (empty when none is)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return {}


def timed(command: list[str], extra_env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds of ``command`` (this checkout first on its path, ``extra_env`` added), its
    stdout.

    Raises:
        RuntimeError: it failed.
    """
    env = {**os.environ, **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{command[:4]} exited with {done.returncode}: {' | '.join(tail)}")
    return seconds, done.stdout


# The plain script as a user runs it (torch's default threads: every core) and with one torch
# thread (OMP_NUM_THREADS=1, what embeddb's core budget gives its rank on 2 cores): on a loaded
# 2-core machine the default's spinning OpenMP threads collapse (10x slower measured).
TORCH_VARIANTS: dict[str, dict[str, str]] = {"torch": {}, "torch_1thread": {"OMP_NUM_THREADS": "1"}}


def compare_walls(
    label: str,
    job: Path,
    metrics_path: Path,
    torch_cmd: list[str],
    pairs: int,
    cold: bool = True,
) -> dict[str, Any]:
    """``embeddb train job`` (first once cold when ``cold``) and ``pairs`` rounds of the plain
    script (both thread settings) then the job, each timed from its start to its exit: the
    best warm job wall (``job_wall_s``, its metrics ``job``), the best plain wall of either
    setting (``torch_wall_s``), every wall (``walls_s``) and the plain script's reports."""
    embeddb = [sys.executable, "-m", "embeddb.cli", "train", str(job)]
    walls: dict[str, list[float]] = {"embeddb": [], **{k: [] for k in TORCH_VARIANTS}}
    jobs: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    for kind in [*(["embeddb"] if cold else []), *([*TORCH_VARIANTS, "embeddb"] * pairs)]:
        if kind == "embeddb":
            seconds, out = timed(embeddb)
            jobs.append(last_json(metrics_path.read_text()))
            doc = jobs[-1]
            say(f"  embeddb train {label}: {seconds:.1f} s wall, start-up "
                f"{doc.get('startup_s') or 0:.1f} s, AUC {doc.get('test_auc', 0):.4f}")  # fmt: skip
        else:
            seconds, out = timed(torch_cmd, TORCH_VARIANTS[kind])
            plain.append(last_json(out))
            rate, score = plain[-1].get("samples_per_s", 0.0), plain[-1].get("test_auc", 0.0)
            say(f"  plain PyTorch {label} ({kind}): {seconds:.1f} s wall, {rate:,.0f} samples/s, "
                f"AUC {score:.4f}")  # fmt: skip
        walls[kind].append(seconds)
    first = 1 if cold else 0
    best = first + min(range(pairs), key=lambda i: walls["embeddb"][first + i])  # fastest warm
    torch_best = {k: min(walls[k]) for k in TORCH_VARIANTS}
    return {
        "job_wall_s": walls["embeddb"][best],
        "job_wall_cold_s": walls["embeddb"][0] if cold else None,
        "torch_wall_s": min(torch_best.values()),  # against the faster setting: no flattering
        "torch_wall_by_threads_s": torch_best,
        "job_startup_s": jobs[best].get("startup_s"),
        "job_auc": jobs[best].get("test_auc"),
        "job_samples_per_s": jobs[best].get("samples_per_s"),
        "torch_auc": plain[-1].get("test_auc"),
        "torch_samples_per_s": max(p.get("samples_per_s", 0.0) for p in plain),
        "job": jobs[best],
        "cold_job": jobs[0] if cold else None,
        "walls_s": walls,
    }


def run_startup(workdir: Path, pairs: int = 2) -> dict[str, Any]:
    """embeddb train once (cold: numba's cache, the OS's file cache), then ``pairs`` rounds of
    the plain script (both thread settings) and embeddb train: walls (the best warm run of
    each), AUCs, the warm job's start-up and its timeline."""
    job, metrics_path = adult_job(workdir)
    epochs = int(yaml.safe_load(ADULT_JOB.read_text())["epochs"])
    torch_cmd = [sys.executable, str(TORCH_SCRIPT), "--epochs", str(epochs)]
    got = compare_walls("adult", job, metrics_path, torch_cmd, pairs)
    warm, cold = got["job"], got["cold_job"] or {}
    job_wall, torch_wall = got["job_wall_s"], got["torch_wall_s"]
    return {
        "startup_s": warm.get("startup_s"),
        "startup_cold_s": cold.get("startup_s"),
        "startup_phases_s": warm.get("startup_phases_s"),
        "adult_wall_s": job_wall,
        "adult_wall_cold_s": got["job_wall_cold_s"],
        "adult_torch_wall_s": torch_wall,
        "adult_torch_wall_by_threads_s": got["torch_wall_by_threads_s"],
        "adult_wall_vs_torch": job_wall / torch_wall,
        "adult_wall_vs_torch_default_threads": job_wall / got["torch_wall_by_threads_s"]["torch"],
        "adult_job_auc": got["job_auc"],
        "adult_job_samples_per_s": got["job_samples_per_s"],
        "adult_torch_auc": got["torch_auc"],
        "adult_torch_samples_per_s": got["torch_samples_per_s"],
        "epochs": epochs,
        "walls_s": got["walls_s"],
    }
