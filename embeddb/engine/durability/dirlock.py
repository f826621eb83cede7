"""One process at a time in a data directory: an exclusive lock on ``DIR/embeddb.lock``.

A shard's data directory is written by exactly one process: the shard serving it, or an
offline command (``embeddb restore``, ``embeddb reshard``). A second one would corrupt it, e.g.
a restore deleting the disk tier of a running shard. So whoever opens a directory first takes
an exclusive ``flock(2)`` on its lock file and holds it until it is done; every other opener is
refused at once with :class:`DirectoryInUseError`, naming the directory and the holder::

    DIR/embeddb.lock     {"pid": 4242}     the holder's pid, written once it holds the lock

The kernel releases the lock when the holder's file descriptor closes, so a process that dies
(``kill -9`` included) never leaves a stale lock: the next opener just takes it. The file
itself stays (removing it would race with an opener that has it open). The descriptor is
close-on-exec: a program the holder executes does not inherit the lock.

``flock`` locks are per open file, so two opens in one process exclude each other too. On a
file system without ``flock`` (some network mounts) taking the lock fails with a
:class:`~embeddb.errors.StorageError` rather than going on unprotected.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from embeddb.errors import FailedPreconditionError, StorageError

__all__ = ["LOCK_FILE", "DirectoryInUseError", "DirectoryLock", "holder_of"]

LOCK_FILE = "embeddb.lock"
_MAX_RECORD = 4096


class DirectoryInUseError(FailedPreconditionError):
    """Another process holds the data directory's lock (the message names it)."""


def holder_of(directory: Path) -> str:
    """Who holds (or last held) ``directory``'s lock, in words: ``process 4242 (embeddb serve
    ...)`` with the command line where the system shows it, ``another process`` when the lock
    file records no pid."""
    try:
        with open(directory / LOCK_FILE, "rb") as f:
            pid = int(json.loads(f.read(_MAX_RECORD))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
    try:  # Linux; elsewhere the pid alone
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"process {pid}"
    command = _command(
        [w.decode(errors="replace") for w in words if w],
    )
    return f"process {pid} ({command})" if command else f"process {pid}"


def _command(argv: list[str]) -> str:
    """A short form of a command line: ``python -m embeddb.cli serve ...`` reads ``embeddb
    serve ...``; at most 160 characters."""
    for k, word in enumerate(argv):
        if word in ("embeddb.cli", "embeddb") and k and argv[k - 1] == "-m":
            argv = ["embeddb", *argv[k + 1 :]]
            break
        if Path(word).name == "embeddb":
            argv = ["embeddb", *argv[k + 1 :]]
            break
    text = " ".join(argv)
    return text if len(text) <= 160 else text[:157] + "..."


class DirectoryLock:
    """The exclusive lock of one data directory, held from :meth:`acquire` to :meth:`release`.

    Args:
        directory: the locked directory.
        fd: the open lock file holding the ``flock``; None: a lock that holds nothing (for a
            directory no other process can know, such as a private temporary one).
    """

    def __init__(self, directory: Path, fd: int | None) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @classmethod
    def acquire(
        cls,
        directory: str | os.PathLike[str],
        what: str = "data directory",
        *,
        read_only_ok: bool = False,
    ) -> DirectoryLock:
        """Take ``directory``'s lock (the directory must exist), or refuse at once.

        Args:
            directory: the directory.
            what: how messages name it (``data directory``, ``source shard directory``).
            read_only_ok: for a reader of a directory it may not write (a read-only copy of
                snapshots): an existing lock file is locked through a read-only open, and
                without one the directory counts as unused (no process could lock it to
                write either) and the lock returned holds nothing.

        Raises:
            DirectoryInUseError: another process (or another open in this one) holds it.
            StorageError: the lock file cannot be created or locked.
        """
        directory = Path(directory)
        path = directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if not (read_only_ok and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)):
                raise StorageError(f"cannot lock {what} {directory}: {exc}") from exc
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return cls(directory, None)
            except OSError as again:
                raise StorageError(f"cannot lock {what} {directory}: {again}") from again
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryInUseError(
                    f"{what} {directory} is in use by {holder_of(directory)}: one process at a "
                    f"time may use it; stop that one first"
                ) from None
            raise StorageError(f"cannot lock {what} {directory} ({path}): {exc}") from exc
        try:
            record = json.dumps({"pid": os.getpid()}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record + b"\n", 0)
        except OSError as exc:
            if not read_only_ok:  # a read-only open locks without saying who holds it
                os.close(fd)
                raise StorageError(f"cannot write {path}: {exc}") from exc
        return cls(directory, fd)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (closing the file releases it). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
