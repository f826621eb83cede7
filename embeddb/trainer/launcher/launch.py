"""``embeddb train JOB.yaml``: one training job on this machine, started and stopped cleanly.

What it starts, in order (torch is imported by the NN workers only, never here)::

    launcher (this process)
      ├── validation step      python -m embeddb.trainer.launcher.validate JOB.yaml --run-dir RUN:
      fits
      │                        the features (RUN/features.json, RUN/embedding.yaml when auto),
      │                        builds the model, runs it on a sample batch; exits first
      ├── embeddb cluster      S local shards (embeddb serve, supervised), unless the job
      │                        lists ``addresses``; rows under checkpoint_dir/shards when
      │                        the job checkpoints, else ephemeral; requiring the job's
      │                        token when it has a ``token_file``
      └── torchrun             python -m torch.distributed.run --standalone --nproc_per_node W
            └── rank 0..W-1    python -m embeddb.trainer.launcher.run JOB --addresses @FILE
            --run-dir RUN
                  ├── its data loader  (python -m embeddb.trainer.launcher.loader: numpy only)
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
and ``addresses`` in the job naming the shards; by hand, torchrun's own ``--max-restarts``
restarts the workers after any failure (an error too).

Failures (:mod:`embeddb.trainer.launcher.failures`). torchrun runs with ``--max-restarts=0``: the
launcher restarts, and only crashes. When torchrun exits non-zero, the ranks' records of the
attempt say what happened: a rank's deterministic error (bad data, a model bug) ends the job at
once with that error, the first one (``TrainingFailedError``: the CLI's one ``Error:`` line);
a crash (a rank killed by a signal, a peer or shard gone) starts torchrun again, up to
``max_restarts`` times when the job has a ``checkpoint_dir``, every rank resuming from the latest
checkpoint (dense state rolled back; the shards keep their embeddings, newer than the
checkpoint, as PERSIA does). Starting a job again on the same ``checkpoint_dir`` resumes it
exactly: the local shards are first rolled back to the latest checkpoint's snapshot
(:func:`restore_local_shards`). A job whose latest checkpoint has trained every epoch
(:func:`embeddb.trainer.launcher.resume.finished`) says so in one line and trains nothing; it still
exports (``export_dir``) and predicts (``--predict``) from that checkpoint, with one rank.

Stopping. On completion, Ctrl-C or SIGTERM the launcher sends SIGTERM to torchrun's process
group (torchrun, the ranks and their embedding workers), waits, SIGKILLs what is left, then
stops the shards. The shards and torchrun run in sessions of their own, so a terminal's Ctrl-C
reaches the launcher alone and everything stops in that order: no shard is gone while an
embedding worker still pushes (no retry warnings), no child process outlives the launcher, which
prints one line (``interrupted: ...``) and returns 130, no traceback.

Output. torchrun's own stderr (its banner, its ``ChildFailedError`` traceback and failure
report) is filtered out; the ranks' lines pass. Set ``EMBEDDB_TRACEBACK=1`` to see the ranks'
tracebacks and torchrun's output unfiltered. The children get ``GRPC_VERBOSITY=ERROR`` unless it
is set (gRPC's C core otherwise logs informational lines on stderr). With a ``relay`` (the CLI's
``--log-format json``) every line a child writes on stdout or stderr goes through it (each
becomes one JSON object; lines that are JSON objects already pass as they are), the local
cluster logs JSON (``--log-format json``) and the children get ``EMBEDDB_LOG_FORMAT=json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
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
from embeddb.trainer.checkpoints.files import latest_checkpoint, restore_local_shards
from embeddb.trainer.cores import CoreBudget, available_cpus, core_budget, local_addresses
from embeddb.trainer.launcher.failures import (
    ATTEMPT_ENV,
    Crash,
    StderrFilter,
    TrainingFailedError,
    first_failure,
    read_failures,
)
from embeddb.trainer.launcher.job import CONFIG_ERROR, JobConfig
from embeddb.trainer.launcher.resume import finished
from embeddb.trainer.launcher.startup import MARKS_ENV, process_started

__all__ = [
    "Relay",
    "StderrFilter",
    "child_environ",
    "job_budget",
    "launch",
    "rank_environ",
    "run_validation",
    "torchrun_command",
]

logger = logging.getLogger(__name__)

# (line, logger, level) -> the line to write instead (``--log-format json``: one JSON object)
Relay = Callable[[str, str, str], str]

_STOP_S = 20.0  # seconds torchrun and its ranks (or the shards) get to exit after SIGTERM
_CLUSTER_START_S = 120.0
_WRITE_LOCK = threading.Lock()  # relayed lines from several pipes: one whole line at a time


def torchrun_command(
    job_path: Path,
    job: JobConfig,
    address_file: Path,
    predict: int = 0,
    run_dir: Path | None = None,
    *,
    finished: bool = False,
) -> list[str]:
    """The torchrun command that starts the job's NN workers on this machine (``run_dir``:
    the validation step's output; default: the address file's folder). torchrun restarts
    nothing (``--max-restarts=0``): the launcher restarts after a crash. ``finished``: one
    rank that exports and predicts from the latest checkpoint."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={1 if finished else job.workers}",
        "--max-restarts=0",
        "-m",
        "embeddb.trainer.launcher.run",
        str(job_path),
        "--addresses",
        f"@{address_file}",
        "--run-dir",
        str(run_dir if run_dir is not None else address_file.parent),
    ]
    if predict:
        command += ["--predict", str(predict)]
    if finished:
        command.append("--finished")
    return command


def launch(
    job_path: str | os.PathLike[str],
    *,
    predict: int = 0,
    echo: Callable[[str], None] = print,
    relay: Relay | None = None,
) -> int:
    """Run the job in ``job_path``; returns 0 when it trained (or was finished already), 130
    when interrupted (SIGINT/SIGTERM).

    Args:
        job_path: the job's YAML file.
        predict: online predictions of the first test rows at the end.
        echo: writes the launcher's own lines.
        relay: ``None``: the children write to this process's stdout and stderr; else every
            line they write goes through it (see the module docstring).

    Raises:
        ConfigError: an invalid job file, its data is missing (and the job does not set
            ``skip_missing_data``, which prints why and returns 0 instead), or the validation
            step failed (bad data, features or model); nothing else has started then.
        UnavailableError: the local shards did not become healthy.
        TrainingFailedError: a rank's error, or crashes past ``max_restarts``.
    """
    marks = {"command": process_started()}  # the start-up timeline (launcher.startup)
    path = Path(job_path).resolve()
    job = JobConfig.from_yaml(job_path)
    done = finished(job)
    if done is not None:
        assert job.checkpoint_dir is not None
        echo(done.message(path, job.checkpoint_dir))
        if job.export_dir is None and not predict:
            return 0
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
        with _signals_as_interrupt(), tempfile.TemporaryDirectory(prefix="embeddb-train-") as tmp:
            run_dir = Path(tmp)
            marks["validating"] = time.time()
            run_validation(path, run_dir, echo, relay)
            marks["validated"] = time.time()
            address_file = run_dir / "shards.txt"
            with _shards(job, address_file, echo, run_dir, relay):
                marks["shards_up"] = time.time()
                attempts = _Attempts(path, job, address_file, run_dir, echo, relay, marks)
                return attempts.run(predict, finished=done is not None)
    except KeyboardInterrupt:
        echo("interrupted: stopped every process of the job")
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


def run_validation(
    job_path: Path, run_dir: Path, echo: Callable[[str], None], relay: Relay | None = None
) -> None:
    """The validation step (:mod:`embeddb.trainer.launcher.validate`) in a subprocess.

    Raises:
        ConfigError: its one-line message when the job is invalid.
    """
    command = [sys.executable, "-m", "embeddb.trainer.launcher.validate", str(job_path)]
    result = subprocess.run(
        [*command, "--run-dir", str(run_dir)],
        stdout=None if relay is None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        env=child_environ(os.environ, json_logs=relay is not None),
    )
    if relay is not None:
        _write_lines(result.stdout, sys.stdout, relay, "embeddb.trainer.launcher.validate", "INFO")
    if result.returncode == 0:
        _echo_features(run_dir, echo)
        return
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(CONFIG_ERROR):
            raise ConfigError("", line[len(CONFIG_ERROR) :])
    if result.returncode < 0 and -result.returncode == signal.SIGINT:
        raise KeyboardInterrupt
    _write_lines(result.stderr, sys.stderr, relay, "embeddb.trainer.launcher.validate", "ERROR")
    last = lines[-1] if lines else "no message"
    raise ConfigError("", f"the validation step failed (exit code {result.returncode}): {last}")


def _echo_features(run_dir: Path, echo: Callable[[str], None]) -> None:
    try:
        doc = json.loads((run_dir / "features.json").read_text())
        ids = [c.get("name") or c["column"] for c in doc["ids"]]
        numeric = [n["name"] for n in doc["numeric"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    echo(f"features: ids {', '.join(ids) or '-'}; numeric {', '.join(numeric) or '-'}")


class _Attempts:
    """torchrun, again after a crash (up to ``max_restarts`` times with a ``checkpoint_dir``),
    never after a rank's error."""

    def __init__(
        self,
        path: Path,
        job: JobConfig,
        address_file: Path,
        run_dir: Path,
        echo: Callable[[str], None],
        relay: Relay | None,
        marks: dict[str, float] | None = None,
    ) -> None:
        self.path, self.job, self.address_file, self.run_dir = path, job, address_file, run_dir
        self.echo, self.relay = echo, relay
        self.marks = marks if marks is not None else {}

    def run(self, predict: int, *, finished: bool) -> int:
        """0 once torchrun succeeds.

        Raises:
            TrainingFailedError: a rank's error, or a crash with no restart left.
        """
        job = self.job
        restarts = job.max_restarts if job.checkpoint_dir is not None and not finished else 0
        command = torchrun_command(
            self.path, job, self.address_file, predict, self.run_dir, finished=finished
        )
        self.echo(f"NN workers: {shlex.join(['torchrun', *command[3:]])}")
        for attempt in range(restarts + 1):
            code, crash = self._torchrun(command, attempt)
            if code == 0:
                return 0
            failure = first_failure(read_failures(self.run_dir, attempt))
            if failure is not None and not failure.transient:
                raise TrainingFailedError(f"the NN workers failed: {failure}")
            # a crash: the rank a signal killed, else what a rank saw of it
            seen = crash if crash is not None and (crash.killed or failure is None) else failure
            cause = str(seen) if seen is not None else f"torchrun exited with code {code}"
            if attempt == restarts:
                tries = f" (restarted {restarts} times)" if restarts else ""
                raise TrainingFailedError(f"the NN workers failed{tries}: {cause}")
            assert job.checkpoint_dir is not None
            last = latest_checkpoint(job.checkpoint_dir)
            since = f"checkpoint {last.checkpoint_id}" if last is not None else "the start"
            self.echo(
                f"the NN workers crashed ({cause}); restarting them from {since} "
                f"(restart {attempt + 1} of {restarts})"
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _torchrun(self, command: list[str], attempt: int) -> tuple[int, Crash | None]:
        """One run of torchrun: its exit code and the crash its failure report names."""
        relay = self.relay
        raw = bool(os.environ.get("EMBEDDB_TRACEBACK"))
        env = child_environ(rank_environ(self.job, os.environ), json_logs=relay is not None)
        env[ATTEMPT_ENV] = str(attempt)
        if attempt == 0:  # the start-up timeline: the first attempt's
            env[MARKS_ENV] = json.dumps({**self.marks, "torchrun": time.time()})
        child = subprocess.Popen(
            command,
            start_new_session=True,
            stdout=None if relay is None else subprocess.PIPE,
            stderr=None if raw and relay is None else subprocess.PIPE,
            env=env,
        )
        stdout = None
        if relay is not None and child.stdout is not None:
            stdout = StderrFilter(
                child.stdout,
                write=_writer(sys.stdout, relay, "embeddb.trainer.launcher.rank", "INFO"),
                filtered=False,
            )
        stderr = None
        if child.stderr is not None:
            stderr = StderrFilter(
                child.stderr,
                write=None
                if relay is None
                else _writer(sys.stderr, relay, "embeddb.trainer.launcher.rank", "WARNING"),
                filtered=not raw,
            )
        try:
            code = child.wait()
        except KeyboardInterrupt:
            for pipe in (stdout, stderr):
                if pipe is not None:
                    pipe.quiet = True
            raise
        finally:
            _stop_group(child)
            for pipe in (stdout, stderr):
                if pipe is not None:
                    pipe.join()
        return code, stderr.crash() if stderr is not None else None


def _writer(stream: IO[str], relay: Relay, name: str, level: str) -> Callable[[str], None]:
    def write(line: str) -> None:
        _write_lines(line, stream, relay, name, level)

    return write


def _write_lines(text: str, stream: IO[str], relay: Relay | None, name: str, level: str) -> None:
    """Write ``text`` to ``stream``, each line through ``relay`` when there is one."""
    if not text:
        return
    if relay is not None:
        text = "".join(relay(line, name, level) for line in text.splitlines() if line.strip())
    with _WRITE_LOCK:
        stream.write(text)
        stream.flush()


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


def child_environ(environ: Mapping[str, str], *, json_logs: bool) -> dict[str, str]:
    """The environment of every child: ``GRPC_VERBOSITY=ERROR`` unless set (gRPC's C core
    logs informational lines on stderr otherwise), ``EMBEDDB_LOG_FORMAT=json`` for JSON logs."""
    env = dict(environ)
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    if json_logs:
        env["EMBEDDB_LOG_FORMAT"] = "json"
    return env


@contextlib.contextmanager
def _shards(
    job: JobConfig,
    address_file: Path,
    echo: Callable[[str], None],
    run_dir: Path | None = None,
    relay: Relay | None = None,
) -> Iterator[None]:
    """The job's shards: the given addresses, or a local cluster (an ``embeddb cluster``
    process in a session of its own: the trainer reaches shards only through the client and
    the command line) running while inside."""
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
    if relay is not None:
        command.append("--log-format=json")
    token = job.read_token()
    if token is not None:  # the local shards require the job's token too
        command.append(f"--tokens-file={_private_tokens_file(address_file.parent, token)}")
    pipe = None if relay is None else subprocess.PIPE
    cluster = subprocess.Popen(
        command,
        start_new_session=True,  # a terminal's Ctrl-C stops it through the launcher, last
        stdout=pipe,
        stderr=pipe,
        env=child_environ(os.environ, json_logs=relay is not None),
    )
    relays = []
    if relay is not None:
        for source, stream, level in ((cluster.stdout, sys.stdout, "INFO"),
                                      (cluster.stderr, sys.stderr, "WARNING")):  # fmt: skip
            assert source is not None
            write = _writer(stream, relay, "embeddb.cluster", level)
            relays.append(StderrFilter(source, write=write, filtered=False))
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
        with _interrupts_deferred():
            if cluster.poll() is None:
                cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(_STOP_S)
            except subprocess.TimeoutExpired:
                logger.warning("the local shards did not stop in %.0f s; killing them", _STOP_S)
                cluster.kill()
                cluster.wait()
            for copier in relays:
                copier.join()


def _private_tokens_file(directory: Path, token: str) -> Path:
    """A server token file (``rw TOKEN``, mode 0600) in the job's private run directory."""
    path = directory / "tokens.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"rw {token}\n")
    return path


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM inside only mark an interrupt, raised (once) on the way out: a stop
    in progress completes (the shards run in a session of their own: an interrupted stop
    would leave them running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, defer) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught and previous[signal.SIGINT] is not signal.SIG_IGN:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt (main thread only), once: the stop that
    follows is not interrupted by a second Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM torchrun's process group, wait, SIGKILL whatever is left of it."""
    with _interrupts_deferred():
        _stop_now(child)


def _stop_now(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(_STOP_S)
    except subprocess.TimeoutExpired:
        logger.warning("torchrun did not stop in %.0f s; killing its process group", _STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # ranks or embedding workers left behind
    child.wait()
