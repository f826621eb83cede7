"""The launcher's side of the validation step (:mod:`embeddb.trainer.launcher.validate`, a
process: it imports torch, the launcher never does): started at once, so the shards and a
one-worker job's rank start while it runs, and finished (its verdict read) before any of them
is used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from embeddb.errors import ConfigError
from embeddb.trainer.launcher.job import CONFIG_ERROR
from embeddb.trainer.launcher.procs import Relay, child_environ, write_lines

__all__ = ["ValidationStep", "run_validation"]

_NAME = "embeddb.trainer.launcher.validate"


class ValidationStep:
    """``python -m embeddb.trainer.launcher.validate JOB --run-dir RUN``, running.

    Args:
        job_path: the job's YAML file.
        run_dir: where it writes ``features.json`` (and the auto ``embedding.yaml``).
        relay: ``None``: its stdout is this process's; else each line goes through it.
        model: False: the step leaves the model to the job's held rank (``--no-model``).
    """

    def __init__(
        self, job_path: Path, run_dir: Path, relay: Relay | None = None, *, model: bool = True
    ) -> None:
        self.run_dir, self.relay = run_dir, relay
        command = [sys.executable, "-m", _NAME, str(job_path), "--run-dir", str(run_dir)]
        if not model:
            command.append("--no-model")
        self._process = subprocess.Popen(
            command,
            stdout=None if relay is None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_environ(os.environ, json_logs=relay is not None),
        )
        self._read = False  # its output read (its pipes closed)

    def finish(self, echo: Callable[[str], None]) -> None:
        """Wait for its verdict; the job's features echoed when it is valid.

        Raises:
            ConfigError: its one-line message when the job is invalid.
            KeyboardInterrupt: it was interrupted (SIGINT).
        """
        try:
            stdout, stderr = self._process.communicate()
        except BaseException:
            self.stop()
            raise
        self._read = True
        relay, code = self.relay, self._process.returncode
        if relay is not None:
            write_lines(stdout, sys.stdout, relay, _NAME, "INFO")
        if code == 0:
            _echo_features(self.run_dir, echo)
            return
        lines = [line for line in stderr.splitlines() if line.strip()]
        for line in lines:
            if line.startswith(CONFIG_ERROR):
                raise ConfigError("", line[len(CONFIG_ERROR) :])
        if code < 0 and -code == signal.SIGINT:
            raise KeyboardInterrupt
        write_lines(stderr, sys.stderr, relay, _NAME, "ERROR")
        last = lines[-1] if lines else "no message"
        raise ConfigError("", f"the validation step failed (exit code {code}): {last}")

    def stop(self) -> None:
        """Kill it unless it has ended (an interrupt, or another failure first)."""
        if self._read:
            return
        self._read = True
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


def run_validation(
    job_path: Path, run_dir: Path, echo: Callable[[str], None], relay: Relay | None = None
) -> None:
    """The validation step, from its start to its verdict.

    Raises:
        ConfigError: its one-line message when the job is invalid.
    """
    ValidationStep(job_path, run_dir, relay).finish(echo)


def _echo_features(run_dir: Path, echo: Callable[[str], None]) -> None:
    try:
        doc = json.loads((run_dir / "features.json").read_text())
        ids = [c.get("name") or c["column"] for c in doc["ids"]]
        numeric = [n["name"] for n in doc["numeric"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    echo(f"features: ids {', '.join(ids) or '-'}; numeric {', '.join(numeric) or '-'}")
