"""The life of a server process, shared by ``embeddb serve`` and ``embeddb serve-model``::

with server_process(stop, handle_signals):   umask 0o077: every file the process creates
                                             is 0600, every directory 0700; SIGTERM and
                                             SIGINT set ``stop``
    with ExitStack() as shutdown:            its callbacks run last-registered first,
                                             each even when an earlier one raised: the
                                             fixed shutdown order (docs/style.md §13)
        shutdown.callback(port_file.unlink, missing_ok=True)
        open what is served; shutdown.callback(close it)
        start the server;    shutdown.callback(server.stop, grace)
        write_atomically(port_file, ports)   temp file + rename: a supervisor finds a
                                             port-0 server, never a partial file
        wait_for_stop(stop, ...)             SIGTERM/SIGINT, the caller, the parent's
                                             death, or a failure
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

__all__ = [
    "PRIVATE_UMASK",
    "private_umask",
    "server_process",
    "stop_on_signals",
    "wait_for_stop",
    "write_atomically",
]

logger = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_S = 0.5


@contextmanager
def private_umask() -> Iterator[None]:
    """Set the process umask to ``0o077`` for the duration; restore the previous one after.

    The umask belongs to the whole process, so every thread's new files are private meanwhile
    (RocksDB's files, whose modes no embeddb code chooses, snapshots, exports, port files):
    meant for a server process's main function, not for library code.
    """
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


@contextmanager
def stop_on_signals(stop: threading.Event, enabled: bool) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``stop`` for the duration; restore the old handlers after.

    Only possible in the main thread: elsewhere (tests driving a server in a thread) this does
    nothing, and the caller sets ``stop`` itself.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            logger.warning("%s received while already shutting down; still draining", name)
        else:
            logger.info("%s received: shutting down", name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def server_process(stop: threading.Event, handle_signals: bool) -> Iterator[None]:
    """:func:`private_umask` and :func:`stop_on_signals` for the duration."""
    with private_umask(), stop_on_signals(stop, handle_signals):
        yield


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and a rename.

    Readers see either the old content or the new, never a partial file.

    Raises:
        OSError: the directory cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def wait_for_stop(
    stop: threading.Event,
    *,
    parent_pid: int | None = None,
    failed: threading.Event | None = None,
    where: str = "server",
) -> None:
    """Block until ``stop`` is set; set it when ``parent_pid`` is no longer this process's
    parent (checked every half second) or when ``failed`` is set.

    A parent that died, even by SIGKILL, is noticed through POSIX re-parenting of orphans
    (Linux, macOS, the BSDs); where a process keeps its dead parent's id (Windows) the check
    never fires.
    """
    while not stop.wait(_POLL_S):  # a timed wait keeps the main thread responsive to signals
        if parent_pid is not None and os.getppid() != parent_pid:
            logger.warning("%s: parent process %d is gone; shutting down", where, parent_pid)
            stop.set()
        if failed is not None and failed.is_set():
            stop.set()
