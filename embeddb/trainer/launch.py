"""``embeddb train JOB.yaml``: one training job on this machine, started and stopped cleanly.

What it starts, in order (torch is imported by the NN workers only, never here)::

    launcher (this process)
      ├── validation step      python -m embeddb.trainer.validate JOB.yaml --run-dir RUN: fits
      │                        the features (RUN/features.json, RUN/embedding.yaml when auto),
      │                        builds the model, runs it on a sample batch; exits first
      ├── embeddb cluster      S local shards (embeddb serve, supervised), unless the job
      │                        lists ``addresses``; rows under checkpoint_dir/shards when
      │                        the job checkpoints, else ephemeral; requiring the job's
      │                        token when it has a ``token_file``
      └── torchrun             python -m torch.distributed.run --standalone --nproc_per_node W
            └── rank 0..W-1    python -m embeddb.trainer.run JOB.yaml --addresses FILE --run-dir RUN
                  ├── its data loader  (python -m embeddb.trainer.loader: numpy only)
                  └── its embedding worker (spawned by the training context)

Cores: the ranks get ``OMP_NUM_THREADS`` from the job's core budget on this machine
(:func:`job_budget`, :mod:`embeddb.trainer.cores`) unless it is set already; the job's
``threads`` (torch threads per rank) still wins inside each rank.

Every mistake in the job (a key, a column, a value in the data, the model) is a
:class:`~embeddb.errors.ConfigError` raised before the shards or torchrun start: the job file
is checked here, the rest by the validation step (a process: it imports torch, this module
never does).

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
stops the shards: no child process outlives it; the launcher prints ``interrupted`` and
returns 130, no traceback.

Failing ranks. torchrun's own stderr (its banner, its ``ChildFailedError`` traceback and
failure report) is filtered out; the ranks' lines pass. Each failing rank writes its error
as one line in ``RUN/errors/`` (:mod:`embeddb.trainer.run`); the launcher prints the root
cause (the first failure of the last attempt) last: ``embeddb train: <Type>: <message>``.
Set ``EMBEDDB_TRACEBACK=1`` to see the ranks' tracebacks and torchrun's output unfiltered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from embeddb.errors import ConfigError, UnavailableError

from .checkpoint import latest_checkpoint, restore_local_shards
from .cores import CoreBudget, available_cpus, core_budget, local_addresses
from .job import CONFIG_ERROR, JobConfig
from .run import ERRORS_DIR

__all__ = [
    "StderrFilter",
    "job_budget",
    "launch",
    "rank_environ",
    "root_cause",
    "run_validation",
    "torchrun_command",
]

logger = logging.getLogger(__name__)

_STOP_S = 20.0  # seconds torchrun and its ranks (or the shards) get to exit after SIGTERM
_CLUSTER_START_S = 120.0


def torchrun_command(
    job_path: Path,
    job: JobConfig,
    address_file: Path,
    predict: int = 0,
    run_dir: Path | None = None,
) -> list[str]:
    """The torchrun command that starts the job's NN workers on this machine (``run_dir``:
    the validation step's output; default: the address file's folder)."""
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
        "--run-dir",
        str(run_dir if run_dir is not None else address_file.parent),
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
        ConfigError: an invalid job file, its data is missing (and the job does not set
            ``skip_missing_data``, which prints why and returns 0 instead), or the validation
            step failed (bad data, features or model); nothing else has started then.
        UnavailableError: the local shards did not become healthy.
    """
    path = Path(job_path).resolve()
    job = JobConfig.from_yaml(job_path)
    missing = _missing_data(job)
    if missing is not None:
        if not job.skip_missing_data:
            raise ConfigError("data_dir" if job.data_dir is not None else "dataset", missing)
        echo(
            f"skipped {path}: {missing}. The {job.dataset_name} data may not be redistributed, "
            "so embeddb ships no copy: set data_dir in the job file to a copy of it."
        )
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="embeddb-train-") as tmp:
            run_dir = Path(tmp)
            run_validation(path, run_dir, echo)
            address_file = run_dir / "shards.txt"
            with _signals_as_interrupt(), _shards(job, address_file, echo, run_dir):
                return _run_torchrun(path, job, address_file, run_dir, predict, echo)
    except KeyboardInterrupt:
        echo("\ninterrupted")
        return 130


def _missing_data(job: JobConfig) -> str | None:
    """Why the job's data cannot be read: a preset's missing directory or file, or no file
    matching a generic dataset's train pattern."""
    missing = job.missing_data()
    if missing is not None or job.preset is not None:
        return missing
    try:
        job.dataset_spec.train_files()
    except ConfigError as exc:
        return str(exc)
    return None


def run_validation(job_path: Path, run_dir: Path, echo: Callable[[str], None]) -> None:
    """The validation step (:mod:`embeddb.trainer.validate`) in a subprocess.

    Raises:
        ConfigError: its one-line message when the job is invalid.
    """
    command = [sys.executable, "-m", "embeddb.trainer.validate", str(job_path)]
    result = subprocess.run(
        [*command, "--run-dir", str(run_dir)], stderr=subprocess.PIPE, text=True, check=False
    )
    if result.returncode == 0:
        _echo_features(run_dir, echo)
        return
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(CONFIG_ERROR):
            raise ConfigError("", line[len(CONFIG_ERROR) :])
    if result.returncode < 0 and -result.returncode == signal.SIGINT:
        raise KeyboardInterrupt
    sys.stderr.write(result.stderr)
    last = lines[-1] if lines else "no message"
    raise ConfigError("", f"the validation step failed (exit code {result.returncode}): {last}")


def _echo_features(run_dir: Path, echo: Callable[[str], None]) -> None:
    import json

    try:
        doc = json.loads((run_dir / "features.json").read_text())
        ids = [c.get("name") or c["column"] for c in doc["ids"]]
        numeric = [n["name"] for n in doc["numeric"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    echo(f"features: ids {', '.join(ids) or '-'}; numeric {', '.join(numeric) or '-'}")


def _run_torchrun(
    path: Path,
    job: JobConfig,
    address_file: Path,
    run_dir: Path,
    predict: int,
    echo: Callable[[str], None],
) -> int:
    command = torchrun_command(path, job, address_file, predict, run_dir)
    echo(f"NN workers: {shlex.join(['torchrun', *command[3:]])}")
    raw = bool(os.environ.get("EMBEDDB_TRACEBACK"))
    env = rank_environ(job, os.environ)
    child = subprocess.Popen(
        command, start_new_session=True, stderr=None if raw else subprocess.PIPE, env=env
    )
    stderr_filter = None if raw or child.stderr is None else StderrFilter(child.stderr)
    try:
        code = child.wait()
    except KeyboardInterrupt:
        if stderr_filter is not None:
            stderr_filter.quiet = True
        echo("\ninterrupted: stopping the NN workers and the shards")
        return 130
    finally:
        _stop_group(child)
        if stderr_filter is not None:
            stderr_filter.join()
    if code != 0:
        cause = root_cause(run_dir)
        echo(f"embeddb train: {cause or f'the NN workers failed (torchrun exit code {code})'}")
    return code


def job_budget(job: JobConfig) -> CoreBudget:
    """The core budget of the job on this machine: its ranks, its local shards (those it
    starts, or those of its ``addresses`` on this host) and one data loader per rank unless
    the data is read in memory."""
    shards = job.shards if job.addresses is None else local_addresses(job.addresses)
    return core_budget(available_cpus(), job.workers, shards, loaders=not job.in_memory)


def rank_environ(job: JobConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of torchrun and its ranks: ``environ`` with ``OMP_NUM_THREADS`` set to
    the job's ``threads``, else to the budget's torch threads unless the user set it."""
    env = dict(environ)
    if job.threads is not None:  # the job's own setting wins over the budget
        env["OMP_NUM_THREADS"] = str(job.threads)
    elif not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(job_budget(job).torch_threads)
    return env


def root_cause(run_dir: Path) -> str | None:
    """The first error of the ranks' last attempt (``RUN/errors/attempt<A>-rank<R>.txt``)."""
    found: list[tuple[int, float, str]] = []
    for path in (run_dir / ERRORS_DIR).glob("attempt*-rank*.txt"):
        match = re.fullmatch(r"attempt(\d+)-rank\d+\.txt", path.name)
        try:
            stamp, _, line = path.read_text().strip().partition("\t")
            found.append((int(match.group(1)) if match else 0, float(stamp), line))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    last = max(a for a, _, _ in found)
    return min((t, line) for a, t, line in found if a == last)[1]


class StderrFilter:
    """Copies torchrun's stderr to ours minus torchrun's noise: its log lines (banner,
    ``failed (exitcode ...)``), its ``ChildFailedError`` traceback and its ``====`` failure
    report, and the ranks' one-line errors (the launcher prints the root cause last)."""

    _NOISE = re.compile(
        r"^(\[?[IWEF]\d{4} [\d:.]+ +\d+ .*torch/distributed/"  # torch's glog-style lines
        r"|(WARNING|ERROR|INFO):torch\.distributed"
        r"|\*{10,}"
        r"|Setting OMP_NUM_THREADS"
        r"|embeddb train: rank \d+: )"
    )

    def __init__(self, source: IO[bytes], sink: IO[str] | None = None) -> None:
        self.quiet = False
        self._source = source
        self._sink = sink if sink is not None else sys.stderr
        self._thread = threading.Thread(target=self._run, name="stderr-filter", daemon=True)
        self._thread.start()

    def keep(self, line: str, state: dict[str, bool]) -> bool:
        """Whether ``line`` is shown (``state``: inside a traceback or a report)."""
        stripped = line.rstrip("\n")
        if state.get("report"):
            if re.fullmatch(r"={20,}", stripped):
                state["report"] = False
            return False
        if re.fullmatch(r"={20,}", stripped):
            state["report"] = True
            return False
        if state.get("traceback"):
            if stripped and not stripped[0].isspace():
                state["traceback"] = False  # the exception line closes it
            return False
        if stripped.startswith("Traceback (most recent call last):"):
            state["traceback"] = True
            return False
        return not self._NOISE.match(stripped)

    def _run(self) -> None:
        state: dict[str, bool] = {}
        try:
            for raw in self._source:
                line = raw.decode("utf-8", "replace")
                if not self.quiet and self.keep(line, state):
                    self._sink.write(line)
                    self._sink.flush()
        except (OSError, ValueError):
            return

    def join(self) -> None:
        self._thread.join(timeout=_STOP_S)


@contextlib.contextmanager
def _shards(
    job: JobConfig,
    address_file: Path,
    echo: Callable[[str], None],
    run_dir: Path | None = None,
) -> Iterator[None]:
    """The job's shards: the given addresses, or a local cluster (an ``embeddb cluster``
    process: the trainer reaches shards only through the client and the command line)
    running while inside."""
    if job.addresses is not None:
        address_file.write_text("".join(f"{a}\n" for a in job.addresses))
        yield
        return
    data_dir = job.shard_data_dir()
    config_path = job.embedding_config_path(run_dir)
    if data_dir is not None and job.checkpoint_dir is not None:
        last = latest_checkpoint(job.checkpoint_dir)
        if last is not None:
            echo(f"restoring the shards to checkpoint {last.checkpoint_id}")
            restore_local_shards(config_path, data_dir, job.shards, last.snapshot_id)
    command = [sys.executable, "-m", "embeddb.cli", "cluster", f"--num-shards={job.shards}"]
    command += [f"--config={config_path}", "--base-port=0", f"--address-file={address_file}"]
    command += ["--log-level=warning", f"--threads={job_budget(job).shard_threads}"]
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
