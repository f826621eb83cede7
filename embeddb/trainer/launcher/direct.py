"""A one-worker job's NN worker, started by the launcher itself instead of torchrun (torch-free).

torchrun costs a one-worker job about a second of start-up (its own interpreter importing
torch, then the rank's) and adds nothing there: no peer to rendezvous with, and the launcher
restarts after crashes itself. So ``embeddb train`` starts that rank as a plain process in a
session of its own, with the environment torchrun would give it (:func:`rank_variables`), and
jobs of two or more workers keep torchrun.

The rank is started before the job is known valid, held (``--hold``): it imports torch and
what it trains with, then reads one line on its stdin (:data:`HOLD_FLAG`). The launcher
writes the start-up marks of the validation step and the shards there (JSON, one line) once
both are ready, and the rank trains; it closes the pipe instead (an invalid job, Ctrl-C) and
the rank exits 0 at once, having started nothing.

The model is the held rank's to check, not the validation step's, when a failing check leaves
nothing behind (shards with no data directory: ephemeral, or the job's ``addresses``), an
``embedding_config: auto`` job's too (the rank is released after the step has written
``RUN/features.json`` and ``RUN/embedding.yaml``). The validation step then runs with
``--no-model`` and imports no torch (a second or more of a job's start-up), and the rank
(``--check-model``), once released, before anything else, builds the model and runs it on the
sample batch (the step's, ``RUN/sample-batch.bin``: the rank reads no data itself)
(:func:`embeddb.trainer.launcher.validate.check_model`). A failure is the validation step's
own error line, written to ``RUN/invalid-job.txt`` (:data:`INVALID_FILE`), and exit code 2;
the launcher raises it as the job's :class:`~embeddb.errors.ConfigError`.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

__all__ = ["CHECK_FLAG", "HOLD_FLAG", "INVALID_FILE", "rank_command", "rank_variables"]

HOLD_FLAG = "--hold"
CHECK_FLAG = "--check-model"
# RUN/INVALID_FILE: the held rank's verdict on the model, the validation step's error line
INVALID_FILE = "invalid-job.txt"


def rank_command(
    job_path: Path,
    address_file: Path,
    run_dir: Path,
    predict: int = 0,
    *,
    finished: bool = False,
    hold: bool = False,
    check: bool = False,
) -> list[str]:
    """The one rank's command: what torchrun would run (``python -u -m
    embeddb.trainer.launcher.run ...``), ``--hold`` when it waits for the launcher's go,
    ``--check-model`` when it checks the model before it trains."""
    command = [sys.executable, "-u", "-m", "embeddb.trainer.launcher.run", str(job_path)]
    command += ["--addresses", f"@{address_file}", "--run-dir", str(run_dir)]
    if predict:
        command += ["--predict", str(predict)]
    if finished:
        command.append("--finished")
    if hold:
        command.append(HOLD_FLAG)
    if check:
        command.append(CHECK_FLAG)
    return command


def rank_variables() -> dict[str, str]:
    """torchrun's variables for rank 0 of a world of one (``--standalone``, no restart by
    torchrun: the launcher restarts), its master port a free port of this host (nothing
    listens on it: one process forms no group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    one = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT"}
    variables = {name: "0" for name in one}
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE"):
        variables[name] = "1"
    variables.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ROLE_NAME="default",
        TORCHELASTIC_MAX_RESTARTS="0",
    )
    return variables
