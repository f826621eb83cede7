"""How a failing NN worker reports, and how ``embeddb train`` tells a crash from an error.

Two kinds of failure end an attempt of a job (one run of torchrun and its ranks):

* a **crash**: a process of the job died (a signal, an out-of-memory kill, an exit nobody
  chose), or a peer or server it talks to went away: another rank's gloo connection closed, a
  shard was unavailable past the retries, the embedding worker died. Restarting every NN
  worker from the latest checkpoint may succeed, so the launcher does (``max_restarts``).
* an **error**: a rank raised a deterministic exception (bad data, a model bug, a wrong
  setting, a test split with one class). Running it again fails the same way, so the launcher
  stops at once and prints it.

The channel is the job's run directory. A rank whose exception ends its run writes one
record, ``RUN/errors/attempt<A>-rank<R>.txt``::

    <unix time>\\t<kind>\\t<Type>: <message>       kind: "error" or "transient"

and exits with :data:`EXIT_ERROR` (1) or :data:`EXIT_TRANSIENT` (75, ``EX_TEMPFAIL``); a rank
killed by a signal writes nothing. :func:`is_transient` decides the kind. The launcher reads the
attempt's records when torchrun exits non-zero (:func:`read_failures`): any ``error`` record
ends the job with that error, the first one written (:func:`first_failure`: an error beats a
rank's later ``transient`` record of the teardown it caused, whenever that was written); only
``transient`` records, or none, are a crash. torchrun's own failure report (which the launcher
hides, :class:`StderrFilter`) names the rank and exit code or signal of a crash without a
record (:meth:`StderrFilter.crash`).

This module imports no torch: torch's distributed errors are recognised by their class names.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from embeddb.trainer.errors import TrainerError

__all__ = [
    "ATTEMPT_ENV",
    "ERRORS_DIR",
    "EXIT_ERROR",
    "EXIT_TRANSIENT",
    "Crash",
    "Failure",
    "StderrFilter",
    "TrainingFailedError",
    "first_failure",
    "is_transient",
    "read_failures",
    "write_failure",
]

ERRORS_DIR = "errors"
ATTEMPT_ENV = "EMBEDDB_TRAIN_ATTEMPT"  # set by the launcher for each attempt (0, 1, ...)
EXIT_ERROR = 1  # a deterministic error: running again fails the same way
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: a peer, a shard or the embedding worker went away

_STOP_S = 20.0
# a process or a server of the job went away (the names of exception classes, their bases'
# included, and of the ``cause`` a trainer error carries across the embedding worker's pipe)
_TRANSIENT_TYPES = frozenset(
    {
        "UnavailableError",
        "ConnectionError",
        "TimeoutError",
        "EOFError",
        "DistError",  # torch.distributed: DistBackendError, DistNetworkError, DistStoreError
    }
)
# gloo reports a peer that went away as a plain RuntimeError
_PEER_GONE = re.compile(r"gloo/transport|Connection closed by peer|Connection reset by peer")


class TrainingFailedError(TrainerError):
    """``embeddb train``'s NN workers failed: a rank's error, or crashes past ``max_restarts``
    (the message names the rank and what happened)."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means a process or server of the job went away (a crash elsewhere: worth
    a restart) rather than a deterministic error of this rank."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TRANSIENT_TYPES:
        return True
    if "TrainerError" in names:
        cause = getattr(exc, "cause", None)
        if cause is not None:
            return cause in _TRANSIENT_TYPES or cause == "EmbeddingWorkerError"
        # the embedding worker process died or stopped answering; one that could not start
        # (a bad setting) is an error
        return "EmbeddingWorkerError" in names and "could not start" not in str(exc)
    return isinstance(exc, RuntimeError) and bool(_PEER_GONE.search(str(exc)))


@dataclass(frozen=True)
class Failure:
    """One rank's failure record.

    Attributes:
        attempt: the launcher's attempt (0: the first run, 1: the first restart...).
        rank: the rank that wrote it.
        time: when it was written (seconds since the epoch).
        transient: :func:`is_transient` of the exception.
        message: ``<Type>: <message>`` on one line.
    """

    attempt: int
    rank: int
    time: float
    transient: bool
    message: str

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.message}"


def _attempt(environ: dict[str, str] | os._Environ[str]) -> int:
    for name in (ATTEMPT_ENV, "TORCHELASTIC_RESTART_COUNT"):
        try:
            return int(environ.get(name, ""))
        except ValueError:
            continue
    return 0


def write_failure(run_dir: Path | None, exc: BaseException) -> Failure:
    """The record of ``exc`` for this rank (``RANK`` and the attempt from the environment),
    written to ``run_dir``'s errors folder when there is one (best effort)."""
    message = " ".join(str(exc).split()) or "(no message)"
    failure = Failure(
        attempt=_attempt(os.environ),
        rank=int(os.environ.get("RANK", "0") or 0),
        time=time.time(),
        transient=is_transient(exc),
        message=f"{type(exc).__name__}: {message}",
    )
    if run_dir is not None:
        kind = "transient" if failure.transient else "error"
        try:
            directory = run_dir / ERRORS_DIR
            directory.mkdir(exist_ok=True)
            path = directory / f"attempt{failure.attempt}-rank{failure.rank}.txt"
            path.write_text(f"{failure.time:.6f}\t{kind}\t{failure.message}\n")
        except OSError:
            pass
    return failure


def read_failures(run_dir: Path, attempt: int | None = None) -> list[Failure]:
    """The records in ``run_dir`` (of ``attempt`` only, if given), oldest first."""
    found: list[Failure] = []
    for path in (run_dir / ERRORS_DIR).glob("attempt*-rank*.txt"):
        match = re.fullmatch(r"attempt(\d+)-rank(\d+)\.txt", path.name)
        if match is None or (attempt is not None and int(match.group(1)) != attempt):
            continue
        try:
            stamp, kind, message = path.read_text().rstrip("\n").split("\t", 2)
            found.append(
                Failure(
                    attempt=int(match.group(1)),
                    rank=int(match.group(2)),
                    time=float(stamp),
                    transient=kind == "transient",
                    message=message,
                )
            )
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda f: (f.time, f.rank))


def first_failure(failures: list[Failure]) -> Failure | None:
    """The failure to report: the first error record, else the first record (a crash's
    consequence seen by a rank), else None."""
    errors = [f for f in failures if not f.transient]
    pool = errors or failures
    return min(pool, key=lambda f: (f.attempt, f.time, f.rank)) if pool else None


@dataclass(frozen=True)
class Crash:
    """A rank that torchrun's failure report names: its exit code, negative for a signal."""

    rank: str
    code: int

    @property
    def killed(self) -> bool:
        """Whether a signal ended it."""
        return self.code < 0

    def __str__(self) -> str:
        if not self.killed:
            return f"rank {self.rank} exited with code {self.code}"
        try:
            name = signal.Signals(-self.code).name
        except ValueError:
            name = f"signal {-self.code}"
        return f"rank {self.rank} was killed by {name}"


class StderrFilter:
    """Copies torchrun's stderr to ``sink`` minus torchrun's noise: its log lines (banner,
    ``failed (exitcode ...)``), its ``ChildFailedError`` traceback and its ``====`` failure
    report, and the ranks' one-line errors (the launcher prints the cause itself). The
    report's failed processes are kept: :meth:`crash`.

    Args:
        source: torchrun's stderr pipe.
        sink: where kept lines go (default ``sys.stderr``, looked up per line).
        write: instead of ``sink``, a function given each kept line (with its newline).
        filtered: False keeps every line (a plain copier of another pipe).
    """

    _NOISE = re.compile(
        r"^(\[?[IWEF]\d{4} [\d:.]+ +\d+ .*torch/distributed/"  # torch's glog-style lines
        r"|(WARNING|ERROR|INFO):torch\.distributed"
        r"|\*{10,}"
        r"|Setting OMP_NUM_THREADS"
        r"|embeddb train: rank \d+: )"
    )

    def __init__(
        self,
        source: IO[bytes],
        sink: IO[str] | None = None,
        *,
        write: Callable[[str], None] | None = None,
        filtered: bool = True,
    ) -> None:
        self.quiet = False
        self.filtered = filtered
        self._source = source
        self._sink = sink
        self._write = write
        self._entries: list[dict[str, str]] = []  # the failure report's failed processes
        self._thread = threading.Thread(target=self._run, name="stderr-filter", daemon=True)
        self._thread.start()

    def keep(self, line: str, state: dict[str, bool]) -> bool:
        """Whether ``line`` is shown (``state``: inside a traceback or a report)."""
        stripped = line.rstrip("\n")
        if state.get("report"):
            if re.fullmatch(r"={20,}", stripped):
                state["report"] = False
            elif stripped.startswith("Root Cause"):
                state["root"] = True  # the report's first observed failure follows
            elif re.fullmatch(r"\[\d+\]:", stripped.strip()):
                # one failed process: its rank, exitcode... and whether it is the root cause
                self._entries.append({"root": "1"} if state.get("root") else {})
            elif self._entries:
                found = re.match(r"\s+(rank|exitcode)\s*:\s*(\S+)", stripped)
                if found:
                    self._entries[-1].setdefault(found.group(1), found.group(2))
            return False
        if re.fullmatch(r"={20,}", stripped):
            state["report"] = True
            state["root"] = False
            return False
        if state.get("traceback"):
            if stripped and not stripped[0].isspace():
                state["traceback"] = False  # the exception line closes it
            return False
        if stripped.startswith("Traceback (most recent call last):"):
            state["traceback"] = True
            return False
        return not self._NOISE.match(stripped)

    def crash(self) -> Crash | None:
        """The failed process torchrun's failure report names: its root cause (the first
        observed failure; the others are ranks torchrun stopped after it), else a rank killed
        by a signal, else the first; None without a report."""
        failed = []
        for entry in self._entries:
            code = entry.get("exitcode", "")
            if "rank" in entry and code.lstrip("-").isdigit():
                failed.append((Crash(entry["rank"], int(code)), "root" in entry))
        if not failed:
            return None
        return min(failed, key=lambda found: (not found[1], not found[0].killed))[0]

    def _run(self) -> None:
        state: dict[str, bool] = {}
        try:
            for raw in self._source:
                line = raw.decode("utf-8", "replace")
                kept = self.keep(line, state) if self.filtered else True
                if kept and not self.quiet:
                    if self._write is not None:
                        self._write(line)
                    else:
                        sink = self._sink if self._sink is not None else sys.stderr
                        sink.write(line)
                        sink.flush()
        except (OSError, ValueError):
            return

    def join(self) -> None:
        """Wait until torchrun's stderr is closed and copied (at most 20 s)."""
        self._thread.join(timeout=_STOP_S)
