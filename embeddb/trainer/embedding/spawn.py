"""Starting the embedding worker with multiprocessing ``spawn``: the main-guard check, the start
report and Ctrl-C.

``spawn`` starts a fresh interpreter that imports the NN worker's main script again (as
``__mp_main__``) before it unpickles and runs the worker (:mod:`.worker_process`)::

    NN worker (parent)                         embedding worker (child)
    StartReport(): an empty temporary file
    start(), SIGINT blocked, the file's path   python -c spawn_main(...)
      in EMBEDDB_WORKER_START_REPORT  ───────▶   imports the main script as __mp_main__
                                                   no __main__ guard: TrainCtx(...) again
                                                   -> check_main_guard(): writes the fix to
                                                      the file, exits 1 without a traceback
                                                 unpickles its pipe, runs serve():
                                                   SIGINT ignored; a failure before Ready
                                                   -> its one-line summary to the file
    worker gone before Ready: raise the file's
      line (or the exit code) as one short EmbeddingWorkerError

The report travels through a file named in an environment variable because a child failing
while it imports the main script has not unpickled its pipe yet; the variable is set only while
the process starts. Ctrl-C sends SIGINT to the terminal's whole process group: the worker
blocks it from before its interpreter starts (:meth:`StartReport.starting`) and ignores it
(:func:`ignore_sigint`), so only the NN worker gets the ``KeyboardInterrupt``; closing its
context (or its exit) stops the worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from embeddb.trainer.errors import TrainerError

__all__ = ["REPORT_ENV", "StartReport", "check_main_guard", "ignore_sigint", "report_failure"]

REPORT_ENV = "EMBEDDB_WORKER_START_REPORT"

_START_LOCK = threading.Lock()  # one start at a time: the variable is process-wide
_HAVE_SIGMASK = hasattr(signal, "pthread_sigmask")


def importing_main() -> bool:
    """Whether this process is a ``spawn`` child still importing its parent's main script."""
    inheriting = bool(getattr(multiprocessing.process.current_process(), "_inheriting", False))
    return inheriting and "__mp_main__" in sys.modules


def main_guard_message() -> str:
    """What to add to the main script, named as this process sees it."""
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    script = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "the main script")
    return (
        f'wrap the training code of {script} in `if __name__ == "__main__":` (the embedding '
        f'worker is started with multiprocessing "spawn", which imports {script} again)'
    )


def check_main_guard() -> None:
    """Refuse to build a training or evaluation context while a ``spawn`` child imports the
    main script (a script without an ``if __name__ == "__main__":`` guard).

    In the embedding worker being started, the fix is written to the start report and the
    process exits at once without a traceback (the NN worker raises it); in any other spawn
    child (a user's process pool) it is raised.

    Raises:
        TrainerError: in a spawn child that is not an embedding worker.
        SystemExit: in an embedding worker being started (exit code 1).
    """
    if not importing_main():
        return
    message = main_guard_message()
    if report_failure(message):
        raise SystemExit(1)
    raise TrainerError(message)


def report_failure(message: str) -> bool:
    """Write ``message`` (one line) to this embedding worker's start report, if it has one
    (the child's side); returns whether it did."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return False
    try:
        Path(path).write_text(" ".join(message.split()), encoding="utf-8")
    except OSError:
        return False
    return True


def ignore_sigint() -> None:
    """The worker's side of Ctrl-C: ignore SIGINT (a pending one is dropped), then unblock it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _HAVE_SIGMASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class StartReport:
    """The parent's side: a temporary file the starting worker may write one line to.

    Usage::

        report = StartReport()
        try:
            with report.starting():
                process.start()
            ...  # the worker died before Ready: report.read()
        finally:
            report.close()
    """

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="embeddb-worker-", suffix=".start")
        os.close(fd)
        self.path = Path(path)

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Start a process inside: it inherits the report's path and a blocked SIGINT."""
        with _START_LOCK:
            previous = os.environ.get(REPORT_ENV)
            os.environ[REPORT_ENV] = str(self.path)
            old_mask = (
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if _HAVE_SIGMASK else None
            )
            try:
                yield
            finally:
                if old_mask is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
                if previous is None:
                    os.environ.pop(REPORT_ENV, None)
                else:
                    os.environ[REPORT_ENV] = previous

    def read(self) -> str | None:
        """The line the worker wrote, or ``None``."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return text or None

    def close(self) -> None:
        """Remove the file. Idempotent."""
        with contextlib.suppress(OSError):
            self.path.unlink()
