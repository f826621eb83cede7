"""The NN worker's entry point under torchrun: ``python -m embeddb.trainer.launcher.run JOB.yaml
--addresses @SHARDS.txt [--run-dir RUN]`` (``embeddb train`` starts it after the validation step
wrote ``RUN/features.json``; see :mod:`embeddb.trainer.launcher.launch`).

This module imports no torch at module level: the embedding worker is started with
multiprocessing's spawn, which imports the parent's main module (this one) again in the child,
and the embedding worker needs no torch (about 200 MB less per NN worker). The training itself
is :func:`embeddb.trainer.launcher.rank.train`.

Data. Each rank starts one data loader (:mod:`embeddb.trainer.launcher.loader`, a numpy-only
process)
that streams the rank's disjoint part of the training data, shuffled, as batches. Steps stay
aligned across ranks with a per-step all-reduce (MIN) of "I have a batch": an epoch ends, for
every rank, at the first step some rank has no batch for (the ranks' parts differ by at most
a batch or so; the leftover is dropped). ``in_memory: true`` reads the rank's part into memory
first instead (the streaming benchmark's baseline).

Checkpoints every ``checkpoint_every`` steps (or at each epoch's end). When the checkpoint
directory holds a checkpoint the job resumes from it: after the launcher restarts the
workers (one crashed) or when the job is started again. The loader is deterministic per
(seed, epoch, rank), so resuming at step ``s`` restarts epoch ``s // steps_per_epoch`` and drops
its first ``s % steps_per_epoch`` batches (``steps_per_epoch`` is kept in
``CHECKPOINT_DIR/epochs.json`` once the first epoch has ended;
:mod:`embeddb.trainer.launcher.resume`).

Rank 0 draws a progress line (samples/s of the whole job, loss, AUC of the last batches),
evaluates on the test split (streamed), exports the model with its feature pipeline, prints
``test AUC`` and ``samples/s`` and answers ``--predict K`` online predictions. ``--finished``
(the launcher found every epoch trained, :mod:`embeddb.trainer.launcher.resume`): load the latest
checkpoint, export and predict, nothing else.

A failing rank prints one line ``embeddb train: rank R: <Type>: <message>``, writes its record
to ``RUN/errors/`` and exits with code 1 for a deterministic error or 75 when a peer, a shard
or its embedding worker went away (:mod:`embeddb.trainer.launcher.failures`: the launcher restarts
only
the latter); ``EMBEDDB_TRACEBACK=1`` prints the traceback too.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embeddb.trainer.launcher.direct import CHECK_FLAG, HOLD_FLAG
from embeddb.trainer.launcher.failures import EXIT_ERROR, EXIT_TRANSIENT, write_failure
from embeddb.trainer.launcher.startup import MARKS_ENV

if TYPE_CHECKING:
    from embeddb.trainer.launcher.job import JobConfig

__all__ = ["main", "train"]


def train(
    job: JobConfig,
    addresses: Path | Sequence[str],
    predict: int,
    *,
    job_path: Path,
    run_dir: Path | None = None,
    finished: bool = False,
    check: bool = False,
) -> dict[str, Any]:
    """Train ``job`` (read from ``job_path``, which the data loaders read again) on the shards
    of the address file: :func:`embeddb.trainer.launcher.rank.train`, imported here (it needs
    torch)."""
    from embeddb.trainer.launcher.rank import train as train_rank

    return train_rank(job, job_path, addresses, run_dir, predict, finished=finished, check=check)


def _report_failure(run_dir: Path | None, exc: BaseException) -> int:
    """One line on stderr and its record in ``RUN/errors/``
    (:mod:`embeddb.trainer.launcher.failures`);
    returns the exit code: :data:`EXIT_TRANSIENT` when a peer, a shard or the embedding worker
    went away, else :data:`EXIT_ERROR`."""
    if os.environ.get("EMBEDDB_TRACEBACK"):
        traceback.print_exc()
    failure = write_failure(run_dir, exc)
    print(f"embeddb train: {failure}", file=sys.stderr, flush=True)
    return EXIT_TRANSIENT if failure.transient else EXIT_ERROR


def _shards(values: list[str]) -> tuple[str, ...]:
    """``--addresses``: the one spelling of every command (``HOST:PORT,...`` or ``@FILE``); a
    lone existing file without ``@``, the spelling of earlier releases, is read with a
    warning."""
    if len(values) == 1 and not values[0].startswith("@") and Path(values[0]).is_file():
        print(
            "Warning: --addresses FILE is deprecated and will be removed in the next release; "
            "use --addresses @FILE",
            file=sys.stderr,
            flush=True,
        )
        values = [f"@{values[0]}"]
    from embeddb.client.options import parse_addresses

    return parse_addresses(values)


def _released() -> bool:
    """``--hold`` (:mod:`embeddb.trainer.launcher.direct`): import what training needs, then
    wait for the launcher's line on stdin (its start-up marks); False when it closed the pipe
    instead (the job is not to start)."""
    from embeddb.trainer.launcher.rank import warm_up  # torch: while the launcher validates

    # what the first optimizer imports (torch._dynamo, about a second), in a thread: once
    # released, the embedding worker's start and the model's check need none of it
    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()

    try:
        line = sys.stdin.readline()
    except KeyboardInterrupt:
        return False
    if not line.strip():
        return False
    os.environ[MARKS_ENV] = line.strip()
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embeddb.trainer.launcher.run", description=__doc__
    )
    parser.add_argument("job", type=Path, help="the training job YAML")
    parser.add_argument(
        "--addresses",
        action="append",
        required=True,
        metavar="HOST:PORT,...|@FILE",
        help="the shards, in shard order: HOST:PORT,HOST:PORT (repeatable) or @FILE, a cluster "
        "address file (a bare FILE is read too, deprecated)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the job's run directory (features.json); default: fit the pipeline here",
    )
    parser.add_argument("--predict", type=int, default=0, help="online predictions at the end")
    parser.add_argument(
        "--finished",
        action="store_true",
        help="the job is finished: load its latest checkpoint, export and predict, train nothing",
    )
    parser.add_argument(HOLD_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(CHECK_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold and not _released():
        return 0
    try:
        from embeddb.trainer.launcher.job import JobConfig  # not in the embedding worker's spawn

        job = JobConfig.from_yaml(args.job)
        train(
            job,
            _shards(args.addresses),
            args.predict,
            job_path=args.job,
            run_dir=args.run_dir,
            finished=args.finished,
            check=args.check_model,  # the validation step left the model to this rank
        )
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _report_failure(args.run_dir, exc)
    return 0


def _exit(code: int | str | None) -> None:
    """Exit now with ``code``, skipping the interpreter's teardown: torch's, gRPC's and numba's
    native state took 1-1.5 s to finalize after the job was done (the launcher waits for this
    process before it stops the shards). Everything this process started is stopped by then
    (its training context, data loader and embedding worker); its output is flushed here."""
    if isinstance(code, str):  # SystemExit("message"): printed as the interpreter would
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    try:
        status: int | str | None = main()
    except SystemExit as exc:  # argparse's usage errors, a held rank's check of the model
        status = exc.code
    _exit(status)
