"""``embeddb train JOB.yaml``: one training job on this machine, started and stopped cleanly.

What it starts, in order (torch is imported by the NN workers only, never here)::

    launcher (this process)
      ├── embeddb cluster      S local shards (embeddb serve, supervised), unless the job
      │                        lists ``addresses``; rows under checkpoint_dir/shards when
      │                        the job checkpoints, else ephemeral; requiring the job's
      │                        token when it has a ``token_file``
      └── torchrun             python -m torch.distributed.run --standalone --nproc_per_node W
            └── rank 0..W-1    python -m embeddb.trainer.run JOB.yaml --addresses FILE
                  └── its embedding worker (spawned by the training context)

Multi-node: run the printed torchrun command on every node with torchrun's own rendezvous
arguments (``--nnodes``, ``--node_rank``, ``--rdzv_endpoint``) instead of ``--standalone``,
and ``addresses`` in the job naming the shards.

Failures. If an NN worker dies, torchrun stops the others and restarts all of them (up to
``max_restarts`` times); each resumes from the latest checkpoint of ``checkpoint_dir`` (dense
state rolled back; the shards keep their embeddings, newer than the checkpoint, as PERSIA
does). Starting a job again on the same ``checkpoint_dir`` resumes it exactly: the local shards
are first rolled back to the latest checkpoint's snapshot (:func:`restore_local_shards`).

Stopping. On completion, Ctrl-C or SIGTERM the launcher sends SIGTERM to torchrun's process
group (torchrun, the ranks and their embedding workers), waits, SIGKILLs what is left, then
stops the shards: no child process outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from embeddb.errors import ConfigError, UnavailableError

from .checkpoint import latest_checkpoint, restore_local_shards
from .job import JobConfig

__all__ = ["launch", "torchrun_command"]

logger = logging.getLogger(__name__)

_STOP_S = 20.0  # seconds torchrun and its ranks (or the shards) get to exit after SIGTERM
_CLUSTER_START_S = 120.0


def torchrun_command(
    job_path: Path, job: JobConfig, address_file: Path, predict: int = 0
) -> list[str]:
    """The torchrun command that starts the job's NN workers on this machine."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={job.workers}",
        f"--max-restarts={job.max_restarts if job.checkpoint_dir is not None else 0}",
        "-m",
        "embeddb.trainer.run",
        str(job_path),
        "--addresses",
        str(address_file),
    ]
    if predict:
        command += ["--predict", str(predict)]
    return command


def launch(
    job_path: str | os.PathLike[str],
    *,
    predict: int = 0,
    echo: Callable[[str], None] = print,
) -> int:
    """Run the job in ``job_path``; returns torchrun's exit code (0: trained), 130 when
    interrupted (SIGINT/SIGTERM).

    Raises:
        ConfigError: an invalid job file, or its data is missing (and the job does not set
            ``skip_missing_data``, which prints why and returns 0 instead).
        UnavailableError: the local shards did not become healthy.
    """
    path = Path(job_path).resolve()
    job = JobConfig.from_yaml(path)
    missing = job.missing_data()
    if missing is not None:
        if not job.skip_missing_data:
            raise ConfigError("data_dir", missing)
        echo(
            f"skipped {path}: {missing}. The {job.dataset} data may not be redistributed, "
            "so embeddb ships no copy: set data_dir in the job file to a copy of it."
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="embeddb-train-") as run_dir:
        address_file = Path(run_dir) / "shards.txt"
        with _signals_as_interrupt(), _shards(job, address_file, echo):
            command = torchrun_command(path, job, address_file, predict)
            echo(f"NN workers: {shlex.join(['torchrun', *command[3:]])}")
            child = subprocess.Popen(command, start_new_session=True)
            try:
                return child.wait()
            except KeyboardInterrupt:
                echo("\ninterrupted: stopping the NN workers and the shards")
                return 130
            finally:
                _stop_group(child)


@contextlib.contextmanager
def _shards(job: JobConfig, address_file: Path, echo: Callable[[str], None]) -> Iterator[None]:
    """The job's shards: the given addresses, or a local cluster (an ``embeddb cluster``
    process: the trainer reaches shards only through the client and the command line)
    running while inside."""
    if job.addresses is not None:
        address_file.write_text("".join(f"{a}\n" for a in job.addresses))
        yield
        return
    data_dir = job.shard_data_dir()
    config_path = job.embedding_config_path()
    if data_dir is not None and job.checkpoint_dir is not None:
        last = latest_checkpoint(job.checkpoint_dir)
        if last is not None:
            echo(f"restoring the shards to checkpoint {last.checkpoint_id}")
            restore_local_shards(config_path, data_dir, job.shards, last.snapshot_id)
    command = [sys.executable, "-m", "embeddb.cli", "cluster", f"--num-shards={job.shards}"]
    command += [f"--config={config_path}", "--base-port=0", f"--address-file={address_file}"]
    command += ["--log-level=warning"]
    command += ["--ephemeral"] if data_dir is None else [f"--data-dir={data_dir}"]
    token = job.read_token()
    if token is not None:  # the local shards require the job's token too
        command.append(f"--tokens-file={_private_tokens_file(address_file.parent, token)}")
    cluster = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + _CLUSTER_START_S
        while not address_file.is_file():
            if cluster.poll() is not None:
                raise UnavailableError(f"the local shards exited with code {cluster.returncode}")
            if time.monotonic() > deadline:
                raise UnavailableError(f"the local shards were not up in {_CLUSTER_START_S} s")
            time.sleep(0.05)
        echo(f"shards: {', '.join(address_file.read_text().split())}")
        yield
    finally:
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            logger.warning("the local shards did not stop in %.0f s; killing them", _STOP_S)
            cluster.kill()
            cluster.wait()


def _private_tokens_file(directory: Path, token: str) -> Path:
    """A server token file (``rw TOKEN``, mode 0600) in the job's private run directory."""
    path = directory / "tokens.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"rw {token}\n")
    return path


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt too (main thread only), so both stop the job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM torchrun's process group, wait, SIGKILL whatever is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(_STOP_S)
    except subprocess.TimeoutExpired:
        logger.warning("torchrun did not stop in %.0f s; killing its process group", _STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # ranks or embedding workers left behind
    child.wait()
