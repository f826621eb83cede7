"""What ``embeddb train``'s launcher does with the processes it starts (torch-free): their
environment, their output relayed line by line, stopping them without being interrupted, and
SIGINT/SIGTERM as :class:`KeyboardInterrupt` (:mod:`embeddb.trainer.launcher.launch`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import IO

__all__ = [
    "STOP_S",
    "Relay",
    "child_environ",
    "interrupts_deferred",
    "signals_as_interrupt",
    "stop_group",
    "write_lines",
    "writer",
]

logger = logging.getLogger("embeddb.trainer.launcher.launch")

# (line, logger, level) -> the line to write instead (``--log-format json``: one JSON object)
Relay = Callable[[str, str, str], str]

STOP_S = 20.0  # seconds torchrun and its ranks (or the shards) get to exit after SIGTERM
_WRITE_LOCK = threading.Lock()  # relayed lines from several pipes: one whole line at a time


def child_environ(environ: Mapping[str, str], *, json_logs: bool) -> dict[str, str]:
    """The environment of every child: ``GRPC_VERBOSITY=ERROR`` unless set (gRPC's C core
    logs informational lines on stderr otherwise), ``EMBEDDB_LOG_FORMAT=json`` for JSON logs."""
    env = dict(environ)
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    if json_logs:
        env["EMBEDDB_LOG_FORMAT"] = "json"
    return env


def writer(stream: IO[str], relay: Relay, name: str, level: str) -> Callable[[str], None]:
    """A function writing one line to ``stream`` through ``relay``."""

    def write(line: str) -> None:
        write_lines(line, stream, relay, name, level)

    return write


def write_lines(text: str, stream: IO[str], relay: Relay | None, name: str, level: str) -> None:
    """Write ``text`` to ``stream``, each line through ``relay`` when there is one."""
    if not text:
        return
    if relay is not None:
        text = "".join(relay(line, name, level) for line in text.splitlines() if line.strip())
    with _WRITE_LOCK:
        stream.write(text)
        stream.flush()


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
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
def signals_as_interrupt() -> Iterator[None]:
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


def stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of ``child`` (a session leader: torchrun or a rank), wait,
    SIGKILL whatever is left of it."""
    with interrupts_deferred():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(STOP_S)
        except subprocess.TimeoutExpired:
            logger.warning("the NN workers did not stop in %.0f s; killing them", STOP_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # ranks or embedding workers left behind
        child.wait()
