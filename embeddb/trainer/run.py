"""The NN worker's entry point under torchrun: ``python -m embeddb.trainer.run JOB.yaml
--addresses SHARDS.txt [--run-dir RUN]`` (``embeddb train`` starts it after the validation step
wrote ``RUN/features.json``; see :mod:`embeddb.trainer.launch`).

This module imports no torch at module level: the embedding worker is started with
multiprocessing's spawn, which imports the parent's main module (this one) again in the child,
and the embedding worker needs no torch (about 200 MB less per NN worker). The training itself
is :func:`embeddb.trainer.rank.train`.

Data. Each rank starts one data loader (:mod:`embeddb.trainer.loader`, a numpy-only process)
that streams the rank's disjoint part of the training data, shuffled, as batches. Steps stay
aligned across ranks with a per-step all-reduce (MIN) of "I have a batch": an epoch ends, for
every rank, at the first step some rank has no batch for (the ranks' parts differ by at most
a batch or so; the leftover is dropped). ``in_memory: true`` reads the rank's part into memory
first instead (the streaming benchmark's baseline).

Checkpoints every ``checkpoint_every`` steps (or at each epoch's end). When the checkpoint
directory holds a checkpoint the job resumes from it: after torchrun restarts the workers (one
died) or when the job is started again. The loader is deterministic per (seed, epoch, rank),
so resuming at step ``s`` restarts epoch ``s // steps_per_epoch`` and drops its first
``s % steps_per_epoch`` batches (``steps_per_epoch`` is kept in ``CHECKPOINT_DIR/epochs.json``
once the first epoch has ended).

Rank 0 draws a progress line (samples/s of the whole job, loss, AUC of the last batches),
evaluates on the test split (streamed), exports the model with its feature pipeline, prints
``test AUC`` and ``samples/s`` and answers ``--predict K`` online predictions. A failing rank
prints one line ``embeddb train: <Type>: <message>`` and writes it to ``RUN/errors/`` (the
launcher prints the root cause last); ``EMBEDDB_TRACEBACK=1`` prints the traceback too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .job import JobConfig

__all__ = ["ERRORS_DIR", "main", "train"]

ERRORS_DIR = "errors"  # RUN/errors/attempt<A>-rank<R>.txt: "<unix time>\t<Type>: <message>"


def train(
    job: JobConfig,
    addresses: Path,
    predict: int,
    *,
    job_path: Path,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """Train ``job`` (read from ``job_path``, which the data loaders read again) on the shards
    of the address file: :func:`embeddb.trainer.rank.train`, imported here (it needs torch)."""
    from .rank import train as train_rank

    return train_rank(job, job_path, addresses, run_dir, predict)


def _report_failure(run_dir: Path | None, exc: BaseException) -> None:
    """One line on stderr and in ``RUN/errors/`` (the launcher prints the root cause last)."""
    message = " ".join(str(exc).split()) or "(no message)"
    line = f"{type(exc).__name__}: {message}"
    if os.environ.get("EMBEDDB_TRACEBACK"):
        traceback.print_exc()
    print(f"embeddb train: rank {os.environ.get('RANK', '0')}: {line}", file=sys.stderr, flush=True)
    if run_dir is None:
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    directory = run_dir / ERRORS_DIR
    try:
        directory.mkdir(exist_ok=True)
        path = directory / f"attempt{attempt}-rank{os.environ.get('RANK', '0')}.txt"
        path.write_text(f"{time.time():.6f}\t{line}\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embeddb.trainer.run", description=__doc__)
    parser.add_argument("job", type=Path, help="the training job YAML")
    parser.add_argument("--addresses", type=Path, required=True, help="the shards' address file")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the job's run directory (features.json); default: fit the pipeline here",
    )
    parser.add_argument("--predict", type=int, default=0, help="online predictions at the end")
    args = parser.parse_args(argv)
    try:
        job = JobConfig.from_yaml(args.job)
        train(job, args.addresses, args.predict, job_path=args.job, run_dir=args.run_dir)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        _report_failure(args.run_dir, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
