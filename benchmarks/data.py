"""Data benchmark: ``embeddb train`` streaming a CSV larger than it should hold in memory.

What it does:

1. Generates a click-log CSV on disk (``examples/clicks/make_data.py``'s planted model, plus a
   ``page`` URL column the job does not use, as real exports have): ``--quick`` >= 500 MB,
   full >= 5 GB. A block of unique rows (quick 500,000, full 2,000,000) is generated and
   written again and again in freshly shuffled orders until the size is reached (generating
   5 GB of unique rows would take longer than training on them).
2. Trains one epoch of a small model (``builtin:dnn``, hidden [64, 32], 5 ID features of
   dim 8, batch 4096, one NN worker, one local shard) with ``embeddb train`` as a
   subprocess, sampling every 0.2 s the RSS (``VmRSS`` of ``/proc/PID/status``) of every
   process of the job (the launcher's whole process tree: validation step, shard, torchrun,
   rank, its data loader, its embedding worker), summed per sample; the peak is
   ``peak_rss_mb``.
3. Trains the same job with ``in_memory: true`` on a file that fits in memory (the block
   written a few times: quick 1.5M rows, full 4M; long enough that start-up effects are
   small): each rank reads its part into memory before training starts:
   ``inmemory_samples_per_s``.

4. Reads the in-memory run's file with embeddb's own CSV reader and with pyarrow's streaming
   CSV reader (``pyarrow.csv.open_csv``, :mod:`_arrow_csv`), both building the job's blocks,
   interleaved, best of ``--reader-repeats``: ``csv_rows_per_s_own`` / ``_pyarrow`` (and
   MB/s), their ratio ``csv_pyarrow_vs_own``, and pyarrow's cold import cost (issue 24: the
   own reader stays unless pyarrow's is at least as fast and keeps its errors).

``samples_per_s`` is the job's own figure (rank 0's training samples / training seconds, the
``metrics_file`` line): the time after the context started, so process start-up is not in it.
Targets (printed, never enforced): ``peak_rss_mb`` <= 1500 whatever the file size; streaming
>= 0.9 x in-memory.

Usage::

    PYTHONPATH=. python benchmarks/data.py --quick
    PYTHONPATH=. python benchmarks/data.py --json-out data.json
    PYTHONPATH=. python benchmarks/data.py --quick --readers-only   # step 4 alone
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from _figures import data_figures, draw
from _plots import add_out_dir_argument
from _report import finish, say, verdict

ROOT = Path(__file__).resolve().parents[1]
TARGET_RSS_MB = 1500.0
TARGET_RATIO = 0.9
SAMPLE_S = 0.2
MEMORY_ROWS = {True: 1_500_000, False: 4_000_000}  # the in-memory run's rows (by --quick)
HEADER = "user,item,city,device,tags,price,age,clicked,page\n"

JOB = """\
dataset:
  format: csv
  train: {train}
  test: test.csv
  label: {{column: clicked}}
  ids: [user, item, city, device, {{column: tags, separator: "|"}}]
  numeric: [{{column: price, transform: log1p}}, {{column: age, transform: standardize}}]
model: builtin:dnn
model_args: {{hidden: [64, 32]}}
embedding_config: auto
embedding_dim: 8
epochs: 1
batch_size: 4096
optimizer: {{type: adam, lr: 0.003}}
metrics_file: {metrics}
in_memory: {in_memory}
"""


def clicks_module() -> ModuleType:
    path = ROOT / "examples" / "clicks" / "make_data.py"
    spec = importlib.util.spec_from_file_location("clicks_make_data", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block_lines(rows: int, seed: int) -> list[str]:
    """``rows`` unique CSV lines (newline included) with the extra ``page`` column."""
    clicks = clicks_module()
    rng = np.random.default_rng([seed, 7])
    lines, _ = clicks.ClickModel(seed).block(rows, rng)
    pages = rng.integers(10**11, 10**12, rows).tolist()
    return [
        f"{line[:-1]},https://shop.example.com/p/{p}\n"
        for line, p in zip(lines, pages, strict=True)
    ]


def write_csv(path: Path, lines: list[str], target_bytes: int, seed: int) -> int:
    """Write the header and ``lines`` in shuffled orders until ``target_bytes``; rows written."""
    rng = np.random.default_rng([seed, 8])
    rows = 0
    with open(path, "w") as fh:
        fh.write(HEADER)
        while rows == 0 or fh.tell() < target_bytes:
            order = rng.permutation(len(lines))
            fh.write("".join([lines[i] for i in order]))
            rows += len(lines)
    return rows


def tree_rss_bytes(root: int) -> tuple[int, dict[str, float]]:
    """Summed VmRSS of ``root`` and every descendant, and each process's MB by its role."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    total, todo, roles = 0, [root], {}
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    total += rss
                    roles[f"{_role(pid)} ({pid})"] = round(rss / 2**20, 1)
        except OSError:
            continue
    return total, roles


def _role(pid: int) -> str:
    """A process's role in the job, from its command line (``-m MODULE [COMMAND]``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        i = argv.index("-m")
        module = argv[i + 1]
        if module == "embeddb.cli" and i + 2 < len(argv):
            return f"embeddb {argv[i + 2]}"
        return module
    if any("multiprocessing" in a for a in argv):
        return "embedding worker (spawn)"
    return Path(argv[0]).name if argv and argv[0] else "?"


def run_job(
    folder: Path, train: str, in_memory: bool
) -> tuple[dict[str, Any], dict[str, tuple[list[float], list[float]]]]:
    """``embeddb train`` on ``train``: its metrics, peak tree RSS and wall time, and the
    sampled RSS per process role over time (:func:`rss_timeline`)."""
    metrics = folder / f"metrics-{'memory' if in_memory else 'stream'}.jsonl"
    job = folder / f"job-{'memory' if in_memory else 'stream'}.yaml"
    job.write_text(JOB.format(train=train, metrics=metrics.name, in_memory=str(in_memory).lower()))
    log = job.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "embeddb.cli", "train", str(job)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        peak, at_peak, samples = 0, {}, []
        while proc.poll() is None:
            total, roles = tree_rss_bytes(proc.pid)
            samples.append((time.perf_counter() - started, roles))
            if total > peak:
                peak, at_peak = total, roles
            time.sleep(SAMPLE_S)  # a sampling period, not a synchronisation
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"embeddb train failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    result: dict[str, Any] = json.loads(metrics.read_text().splitlines()[-1])
    result.update(peak_rss_mb=peak / 2**20, peak_processes_mb=at_peak, wall_s=wall)
    return result, rss_timeline(samples)


def rss_timeline(
    samples: list[tuple[float, dict[str, float]]],
) -> dict[str, tuple[list[float], list[float]]]:
    """RSS MiB over time per role (processes of one role summed, 0 when absent) and in all."""
    roles = sorted({key.rsplit(" (", 1)[0] for _, by_pid in samples for key in by_pid})
    times = [t for t, _ in samples]
    series: dict[str, tuple[list[float], list[float]]] = {}
    for role in roles:
        mb = [sum(v for k, v in by.items() if k.rsplit(" (", 1)[0] == role) for _, by in samples]
        series[role] = (times, mb)
    series["all processes"] = (times, [sum(by.values()) for _, by in samples])
    return series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 500 MB file (< 90 s)")
    parser.add_argument("--gb", type=float, default=None, help="file size (default 0.5 / 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--readers-only", action="store_true", help="only step 4: own vs pyarrow CSV reader"
    )
    parser.add_argument("--reader-repeats", type=int, default=3, help="rounds of step 4")
    add_out_dir_argument(parser, "data")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    target = int((args.gb or (0.5 if args.quick else 5.0)) * 1e9)
    block_rows = 500_000 if args.quick else 2_000_000
    with tempfile.TemporaryDirectory(prefix="embeddb-bench-data-") as tmp:
        folder = Path(tmp)
        lines = block_lines(block_rows + 50_000, args.seed)
        test, lines = lines[:50_000], lines[50_000:]
        write_csv(folder / "test.csv", test, 1, args.seed)
        memory_target = int(sum(map(len, lines)) * MEMORY_ROWS[args.quick] / len(lines))
        memory_rows = write_csv(folder / "memory.csv", lines, memory_target, args.seed)
        jobs: dict[str, Any] = {}
        job_summary: list[str] = []
        timeline: dict[str, tuple[list[float], list[float]]] = {}
        if not args.readers_only:
            say(f"generating {target / 1e9:.1f} GB of CSV in {folder} ...")
            rows = write_csv(folder / "train.csv", lines, target, args.seed)
            jobs = train_jobs(folder, rows, memory_rows)
            job_summary, timeline = jobs.pop("summary"), jobs.pop("timeline")
        del lines, test
        readers = measure_readers(folder / "memory.csv", memory_rows, args.reader_repeats)
    result: dict[str, Any] = {"bench": "data", "quick": args.quick, **jobs, **readers}
    result["settings"] = {
        "model": "builtin:dnn [64, 32]",
        "batch_size": 4096,
        "workers": 1,
        "shards": 1,
        "rss_sample_s": SAMPLE_S,
        "reader_repeats": args.reader_repeats,
        "cpus": os.cpu_count(),
    }
    summary = [
        f"CSV reader: own {readers['csv_rows_per_s_own']:,.0f} rows/s, pyarrow "
        f"{readers['csv_rows_per_s_pyarrow']:,.0f} rows/s = {readers['csv_pyarrow_vs_own']:.2f}x"
        f" (pyarrow converting numbers itself: {readers['csv_pyarrow_typed_vs_own']:.2f}x)"
        if "csv_pyarrow_vs_own" in readers
        else f"CSV reader: {readers['csv_note']}"
    ]
    if jobs:
        draw(result, args.out_dir, lambda r, out: data_figures(r, out, timeline))
    return finish(result, started, job_summary + summary, args.json_out)


def train_jobs(folder: Path, rows: int, memory_rows: int) -> dict[str, Any]:
    """Steps 2 and 3: the streaming and in-memory jobs' figures (and ``summary``, ``timeline``
    for the printout and the figure)."""
    file_bytes = (folder / "train.csv").stat().st_size
    say(f"  {rows:,} rows, {file_bytes / 1e6:,.0f} MB")
    say("streaming one epoch ...")
    stream, timeline = run_job(folder, "train.csv", in_memory=False)
    say(
        f"  {stream['samples_per_s']:,.0f} samples/s, peak RSS {stream['peak_rss_mb']:,.0f} "
        f"MB, test AUC {stream['test_auc']:.4f}, {stream['wall_s']:.0f} s"
    )
    say(f"in memory ({memory_rows:,} rows) ...")
    memory, _ = run_job(folder, "memory.csv", in_memory=True)
    say(
        f"  {memory['samples_per_s']:,.0f} samples/s, peak RSS {memory['peak_rss_mb']:,.0f} "
        f"MB, {memory['wall_s']:.0f} s"
    )
    ratio = stream["samples_per_s"] / memory["samples_per_s"]
    return {
        "rows": rows,
        "file_bytes": file_bytes,
        "peak_rss_mb": stream["peak_rss_mb"],
        "peak_processes_mb": stream["peak_processes_mb"],
        "samples_per_s": stream["samples_per_s"],
        "inmemory_samples_per_s": memory["samples_per_s"],
        "streaming_vs_inmemory": ratio,
        "inmemory_rows": memory_rows,
        "inmemory_peak_rss_mb": memory["peak_rss_mb"],
        "test_auc": stream["test_auc"],
        "stream_wall_s": stream["wall_s"],
        "targets": {"peak_rss_mb": TARGET_RSS_MB, "streaming_vs_inmemory": TARGET_RATIO},
        "targets_met": {
            "peak_rss_mb": stream["peak_rss_mb"] <= TARGET_RSS_MB,
            "streaming_vs_inmemory": ratio >= TARGET_RATIO,
        },
        "summary": [
            f"peak RSS {stream['peak_rss_mb']:,.0f} MB (target <= {TARGET_RSS_MB:,.0f}: "
            f"{verdict(stream['peak_rss_mb'] <= TARGET_RSS_MB)})",
            f"streaming {stream['samples_per_s']:,.0f} vs in-memory "
            f"{memory['samples_per_s']:,.0f} samples/s = {ratio:.2f}x "
            f"(target >= {TARGET_RATIO}: {verdict(ratio >= TARGET_RATIO)})",
        ],
        "timeline": timeline,
    }


def measure_readers(path: Path, rows: int, repeats: int) -> dict[str, Any]:
    """Step 4 (needs pyarrow, the ``parquet`` extra; without it, a note says so)."""
    try:
        from _arrow_csv import compare_readers, import_cost_ms
    except ImportError as exc:
        return {"csv_note": f"own vs pyarrow CSV reader not measured: {exc}"}
    say(f"reading {rows:,} rows: own CSV reader vs pyarrow.csv.open_csv ...")
    readers = compare_readers(path, repeats)
    readers.update(import_cost_ms())
    say_readers(readers)
    return readers


def say_readers(r: dict[str, Any]) -> None:
    for name in ("own", "pyarrow", "pyarrow_typed"):
        say(
            f"  {name:14s} {r[f'csv_rows_per_s_{name}']:>12,.0f} rows/s "
            f"{r[f'csv_mb_per_s_{name}']:7.1f} MB/s"
        )
    say(
        f"  same blocks: pyarrow {r['csv_pyarrow_same_blocks']}, typed "
        f"{r['csv_pyarrow_typed_same_blocks']}; import pyarrow.csv (after numpy) "
        f"{r['pyarrow_csv_import_ms']:.0f} ms; pyarrow installed {r['pyarrow_install_mb']:.0f} MB"
    )


if __name__ == "__main__":
    sys.exit(main())
