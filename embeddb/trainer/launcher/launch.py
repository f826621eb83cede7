"""``embeddb train JOB.yaml``: one training job on this machine, started and stopped cleanly.

What it starts (torch is imported by the validation step and the NN workers only, never
here), each as early as it can::

    launcher (this process)
      ├── rank 0 of a one-worker job   started first, held (:mod:`.direct`): python -u -m
      │                        embeddb.trainer.launcher.run JOB ... --hold, torchrun's
      │                        environment, its own session; imports torch, then waits
      ├── validation step      python -m embeddb.trainer.launcher.validate JOB.yaml --run-dir RUN
      │                        (:mod:`.step`): fits the features (RUN/features.json,
      │                        RUN/embedding.yaml when auto, unless written already), builds
      │                        the model, runs it on a sample batch (the held rank does,
      │                        when its failure leaves no data directory: :mod:`.direct`)
      ├── embeddb cluster      S local shards (embeddb serve, supervised), unless the job
      │                        lists ``addresses``; rows under checkpoint_dir/shards when
      │                        the job checkpoints, else ephemeral; requiring the job's
      │                        token when it has a ``token_file``. Ephemeral shards start
      │                        while the validation step runs (an ``auto`` embedding config
      │                        written first by the launcher when the job file names the ID
      │                        features, :mod:`.auto_embedding`; else the step writes it and
      │                        they wait for it); shards with a data directory once it passed
      └── the NN workers       once the job is valid and the shards are up: the held rank
            │                  released (the start-up marks on its stdin), or torchrun
            │                  (python -m torch.distributed.run --standalone
            │                  --nproc_per_node W) for two workers or more
            └── rank 0..W-1    python -m embeddb.trainer.launcher.run JOB --addresses @FILE
                               --run-dir RUN
                  ├── its data loader  (python -m embeddb.trainer.launcher.loader: numpy only)
                  └── its embedding worker (spawned by the training context)

Cores: the ranks get ``OMP_NUM_THREADS`` from the job's core budget on this machine
(:func:`job_budget`, :mod:`embeddb.trainer.cores`) unless it is set already; the job's
``threads`` (torch threads per rank) still wins inside each rank.

Every mistake in the job (a key, a column, a value in the data, the model) is a
:class:`~embeddb.errors.ConfigError` raised before anything trains: the job file is checked
here before anything starts, the rest by the validation step. When the step fails, what
started meanwhile (the held rank, ephemeral shards) is stopped before its error is raised:
no process, data directory or run directory is left.

Multi-node: run the printed torchrun command (a one-worker job prints its rank's command: run it as
``torchrun --nproc_per_node=1 -m embeddb.trainer.launcher.run ...``) on every node with torchrun's
own rendezvous arguments (``--nnodes``, ``--node_rank``, ``--rdzv_endpoint``) instead of
``--standalone``, and ``addresses`` in the job naming the shards; by hand, torchrun's own
``--max-restarts`` restarts the workers after any failure (an error too).

Failures (:mod:`embeddb.trainer.launcher.failures`). torchrun runs with ``--max-restarts=0``: the
launcher restarts, and only crashes. When torchrun (or the one rank) exits non-zero, the ranks'
records of the attempt say what happened: a rank's deterministic error (bad data, a model bug) ends
the job at once with that error, the first one (``TrainingFailedError``: the CLI's one ``Error:``
line); a crash (a rank killed by a signal, a peer or shard gone) starts torchrun again, up to
``max_restarts`` times when the job has a ``checkpoint_dir``, every rank resuming from the latest
checkpoint (dense state rolled back; the shards keep their embeddings, newer than the checkpoint,
as PERSIA does). Starting a job again on the same ``checkpoint_dir`` resumes it exactly: the local
shards are first rolled back to the latest checkpoint's snapshot (:func:`restore_local_shards`). A
job whose latest checkpoint has trained every epoch
(:func:`embeddb.trainer.launcher.resume.finished`) says so in one line and trains nothing; it still
exports (``export_dir``) and predicts (``--predict``) from that checkpoint, with one rank.

Stopping. On completion, Ctrl-C or SIGTERM the launcher sends SIGTERM to torchrun's process group
(torchrun, the ranks and their embedding workers; a one-worker job's rank's group), waits, SIGKILLs
what is left, then stops the shards. The shards and torchrun (the one rank) run in sessions of
their own, so a terminal's Ctrl-C reaches the launcher alone and everything stops in that order: no
shard is gone while an embedding worker still pushes (no retry warnings), no child process outlives
the launcher, which prints one line (``interrupted: ...``) and returns 130, no traceback.

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
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from embeddb.errors import ConfigError, UnavailableError
from embeddb.trainer.checkpoints.files import latest_checkpoint, restore_local_shards
from embeddb.trainer.cores import CoreBudget, available_cpus, core_budget, local_addresses
from embeddb.trainer.launcher.auto_embedding import config_ahead
from embeddb.trainer.launcher.direct import INVALID_FILE, rank_command, rank_variables
from embeddb.trainer.launcher.failures import (
    ATTEMPT_ENV,
    Crash,
    StderrFilter,
    TrainingFailedError,
    first_failure,
    read_failures,
)
from embeddb.trainer.launcher.job import EMBEDDING_FILE, EXIT_CONFIG_ERROR, JobConfig
from embeddb.trainer.launcher.procs import (
    STOP_S,
    Relay,
    child_environ,
    interrupts_deferred,
    signals_as_interrupt,
    stop_group,
    writer,
)
from embeddb.trainer.launcher.resume import finished
from embeddb.trainer.launcher.startup import MARKS_ENV, process_started
from embeddb.trainer.launcher.step import ValidationStep, run_validation

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

_CLUSTER_START_S = 120.0


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
            step failed (bad data, features or model); what started meanwhile is stopped.
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
        with signals_as_interrupt(), tempfile.TemporaryDirectory(prefix="embeddb-train-") as tmp:
            return _run(job, path, Path(tmp), predict, done is not None, echo, relay, marks)
    except KeyboardInterrupt:
        echo("interrupted: stopped every process of the job")
        return 130


def _run(
    job: JobConfig,
    path: Path,
    run_dir: Path,
    predict: int,
    done: bool,
    echo: Callable[[str], None],
    relay: Relay | None,
    marks: dict[str, float],
) -> int:
    """The job's processes, started as early as each can be: a one-worker job's rank (held),
    the validation step, the shards (while it runs, unless they need its output or would
    write a data directory), and the NN workers once it passed and the shards are up."""
    address_file = run_dir / "shards.txt"
    attempts = _Attempts(path, job, address_file, run_dir, echo, relay, marks)
    with contextlib.ExitStack() as stack:
        stack.callback(attempts.close)
        held = attempts.hold(predict, finished=done)
        ahead = config_ahead(job) if _shards_while_validating(job) else None
        if ahead is not None:  # the shards' auto config, known from the job file: the step
            (run_dir / EMBEDDING_FILE).write_text(ahead, encoding="utf-8")  # checks it
        marks["validating"] = time.time()
        step = ValidationStep(path, run_dir, relay, model=not (held and attempts.checks_model))
        stack.callback(step.stop)

        def validated() -> None:
            try:
                step.finish(echo)
            except BaseException:
                attempts.close()  # the held rank first: it exits having started nothing
                raise
            marks["validated"] = time.time()

        meanwhile = validated if _shards_while_validating(job) else None
        if meanwhile is None:
            validated()
        with _shards(job, address_file, echo, run_dir, relay, meanwhile=meanwhile):
            marks["shards_up"] = time.time()
            return attempts.run(predict, finished=done)
    raise AssertionError("unreachable")  # pragma: no cover


def _shards_while_validating(job: JobConfig) -> bool:
    """Whether the shards may start while the validation step runs: they need nothing it
    alone writes (an ``embedding_config: auto`` whose ID features the job file names is
    written by the launcher first, :func:`config_ahead`) and write nothing that outlives the
    job (no data directory: ephemeral shards, or the job's ``addresses``)."""
    if job.addresses is not None:
        return True
    if job.shard_data_dir() is not None:
        return False
    return not job.auto_embedding or job.dataset_spec.named_id_features is not None


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


class _Attempts:
    """The NN workers (torchrun, or a one-worker job's rank: :mod:`.direct`), again after a
    crash (up to ``max_restarts`` times with a ``checkpoint_dir``), never after a rank's
    error."""

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
        self._held: _Workers | None = None

    def _direct(self, finished: bool) -> bool:
        """Whether one rank runs, started without torchrun."""
        return finished or self.job.workers == 1

    def _command(self, predict: int, *, finished: bool, hold: bool = False) -> list[str]:
        if self._direct(finished):
            check = hold and self.checks_model
            return rank_command(
                self.path, self.address_file, self.run_dir, predict, finished=finished,
                hold=hold, check=check,
            )  # fmt: skip
        return torchrun_command(
            self.path, self.job, self.address_file, predict, self.run_dir, finished=finished
        )

    def hold(self, predict: int, *, finished: bool) -> bool:
        """Start a one-worker job's rank now, held: it imports torch while the job is
        validated and the shards start (:meth:`run` releases it, :meth:`close` stops it).
        Returns whether it did."""
        if not self._direct(finished):
            return False  # torchrun: started once the job is valid
        self.marks["rank_launched"] = time.time()
        command = self._command(predict, finished=finished, hold=True)
        self._held = self._start(command, 0, direct=True, hold=True)
        return True

    @property
    def checks_model(self) -> bool:
        """Whether the held rank checks the model (not the validation step): when its
        failure leaves no data directory behind (ephemeral shards, or the job's
        ``addresses``); it runs once the step has written ``RUN/features.json`` and the auto
        ``RUN/embedding.yaml``."""
        return self.job.addresses is not None or self.job.shard_data_dir() is None

    def close(self) -> None:
        """Stop the held rank, unless released (an invalid job, an interrupt)."""
        held, self._held = self._held, None
        if held is not None:
            held.stop()

    def run(self, predict: int, *, finished: bool) -> int:
        """0 once the NN workers succeed.

        Raises:
            TrainingFailedError: a rank's error, or a crash with no restart left.
        """
        job = self.job
        restarts = job.max_restarts if job.checkpoint_dir is not None and not finished else 0
        command = self._command(predict, finished=finished)
        if self._direct(finished):
            self.echo(f"NN worker: {shlex.join(['python', *command[1:]])}")
        else:
            self.echo(f"NN workers: {shlex.join(['torchrun', *command[3:]])}")
        for attempt in range(restarts + 1):
            held, self._held = (self._held, None) if attempt == 0 else (None, None)
            if held is not None:
                held.release({**self.marks, "released": time.time()})
                workers = held
            else:
                workers = self._start(command, attempt, direct=self._direct(finished))
            code, crash = workers.wait()
            if code == 0:
                return 0
            invalid = self.run_dir / INVALID_FILE
            if code == EXIT_CONFIG_ERROR and workers.direct and invalid.is_file():
                raise ConfigError("", invalid.read_text(encoding="utf-8"))  # the model
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

    def _start(
        self, command: list[str], attempt: int, *, direct: bool, hold: bool = False
    ) -> _Workers:
        env = child_environ(rank_environ(self.job, os.environ), json_logs=self.relay is not None)
        env[ATTEMPT_ENV] = str(attempt)
        if direct:
            env.update(rank_variables())
        if attempt == 0:  # the start-up timeline: the first attempt's
            started = {} if direct else {"torchrun": time.time()}
            env[MARKS_ENV] = json.dumps({**self.marks, **started})
        return _Workers(command, env, self.relay, direct=direct, hold=hold)


class _Workers:
    """One attempt's NN workers running: torchrun (in a session of its own, its ranks and
    their embedding workers in it), or a one-worker job's rank (``direct``), and the copiers
    of their output. ``hold``: a held rank, its stdin a pipe (:mod:`.direct`)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        relay: Relay | None,
        *,
        direct: bool,
        hold: bool = False,
    ) -> None:
        raw = bool(os.environ.get("EMBEDDB_TRACEBACK"))
        self.direct = direct
        self.process = subprocess.Popen(
            command,
            start_new_session=True,
            stdin=subprocess.PIPE if hold else None,
            stdout=None if relay is None else subprocess.PIPE,
            stderr=None if raw and relay is None else subprocess.PIPE,
            env=env,
        )
        self.stdout: StderrFilter | None = None
        if relay is not None and self.process.stdout is not None:
            self.stdout = StderrFilter(
                self.process.stdout,
                write=writer(sys.stdout, relay, "embeddb.trainer.launcher.rank", "INFO"),
                filtered=False,
            )
        self.stderr: StderrFilter | None = None
        if self.process.stderr is not None:
            self.stderr = StderrFilter(
                self.process.stderr,
                write=None
                if relay is None
                else writer(sys.stderr, relay, "embeddb.trainer.launcher.rank", "WARNING"),
                filtered=not raw,
            )

    def release(self, marks: Mapping[str, float]) -> None:
        """Let a held rank train: the start-up marks on its stdin."""
        stdin = self.process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):  # it ended meanwhile: its exit code says why
            stdin.write((json.dumps(dict(marks)) + "\n").encode())
            stdin.close()

    def wait(self) -> tuple[int, Crash | None]:
        """Their exit code and the crash torchrun's failure report names (a direct rank's
        own exit code), once they ended; then nothing of them is left."""
        try:
            code = self.process.wait()
        except KeyboardInterrupt:
            for pipe in (self.stdout, self.stderr):
                if pipe is not None:
                    pipe.quiet = True
            raise
        finally:
            self.stop()
        if self.direct:
            return code, Crash("0", code) if code else None
        return code, self.stderr.crash() if self.stderr is not None else None

    def stop(self) -> None:
        """SIGTERM their process group, wait, SIGKILL what is left; their output copied."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # a held rank: exits at once, having started nothing
        stop_group(self.process)
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.join()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


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


@contextlib.contextmanager
def _shards(
    job: JobConfig,
    address_file: Path,
    echo: Callable[[str], None],
    run_dir: Path | None = None,
    relay: Relay | None = None,
    *,
    meanwhile: Callable[[], None] | None = None,
) -> Iterator[None]:
    """The job's shards: the given addresses, or a local cluster (an ``embeddb cluster``
    process in a session of its own: the trainer reaches shards only through the client and
    the command line) running while inside. ``meanwhile``: called once the cluster process
    is started, before waiting for it (what it raises stops the cluster)."""
    if job.addresses is not None:
        if meanwhile is not None:
            meanwhile()
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
            write = writer(stream, relay, "embeddb.cluster", level)
            relays.append(StderrFilter(source, write=write, filtered=False))
    try:
        if meanwhile is not None:
            meanwhile()
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
        with interrupts_deferred():
            if cluster.poll() is None:
                cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(STOP_S)
            except subprocess.TimeoutExpired:
                logger.warning("the local shards did not stop in %.0f s; killing them", STOP_S)
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
