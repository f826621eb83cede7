"""The file layer under the update log: the calls that can fail because of the device.

:class:`FileIO` makes the writes, fsyncs, renames and truncations of the update log (appends,
segment rolls, the final fsync, the cut after a failed fsync) through one object, so that a
test can hand a shard a :class:`FaultyIO` that fails the *n*-th of them with ``ENOSPC`` or
``EIO`` — the faults a full or failing disk gives — instead of monkeypatching :mod:`os`.
Production code uses :data:`REAL`, which calls :mod:`os`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Sequence
from typing import Literal

from embeddb.errors import StorageError, StorageFaultError, StorageFullError

__all__ = ["FULL", "REAL", "FaultyIO", "FileIO", "Operation", "storage_error"]

FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The errnos of a full disk (or quota); any other error of a write is an I/O fault."""

Operation = Literal["write", "fsync", "rename", "truncate"]


class FileIO:
    """The real file operations (:mod:`os`)."""

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        return os.writev(fd, buffers)

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        """Write all of ``data`` (one :meth:`writev` per partial write)."""
        view = memoryview(data).cast("B")
        while view:
            view = view[self.writev(fd, [view]) :]

    def fsync(self, fd: int) -> None:
        """An fsync of a file's data (``fdatasync`` where the platform has it)."""
        getattr(os, "fdatasync", os.fsync)(fd)

    def fsync_dir(self, fd: int) -> None:
        os.fsync(fd)

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        """Free the page-cache pages of ``length`` bytes at ``offset`` (0: to the end) of a
        file whose data is fsynced (``POSIX_FADV_DONTNEED``). Advice only: nothing happens
        where the platform lacks it, and a failure is ignored (the pages merely stay)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is not None:
            with contextlib.suppress(OSError):
                advise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def replace(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        os.replace(source, target)


REAL = FileIO()


def storage_error(what: str, exc: OSError) -> StorageError:
    """The error for ``exc``, met while ``what`` (e.g. ``cannot write snapshot 's1'``), with
    no path in its message (paths go to the server log): :class:`StorageFullError`
    (RESOURCE_EXHAUSTED) for a full disk, :class:`StorageFaultError` (UNAVAILABLE) else."""
    if isinstance(exc, StorageError):
        return exc
    code = exc.errno or 0
    name = errno.errorcode.get(code, "an I/O error")
    if code in FULL:
        return StorageFullError(f"{what}: the data directory is full ({name})")
    return StorageFaultError(f"{what}: the storage failed ({name})")


class FaultyIO(FileIO):
    """:class:`FileIO` that fails the ``nth`` call (1-based) of ``operation`` with ``code``.

    ``ENOSPC`` (a full disk) keeps failing every write and rename — not fsyncs — until
    :meth:`free` is called (space came back); ``EIO`` fails that one call (what the kernel
    dropped with it is lost all the same). :attr:`calls` counts each operation's calls and
    :attr:`fired` tells whether the fault happened.
    """

    def __init__(self, operation: Operation, nth: int, code: int = errno.ENOSPC) -> None:
        if nth < 1:
            raise ValueError(f"nth must be >= 1, got {nth}")
        self.operation = operation
        self.nth = nth
        self.code = code
        self.calls: dict[str, int] = {"write": 0, "fsync": 0, "rename": 0, "truncate": 0}
        self.fired = False
        self._full = False
        self._lock = threading.Lock()

    def free(self) -> None:
        """Space is back: writes succeed again."""
        with self._lock:
            self._full = False

    def _check(self, operation: Operation) -> None:
        with self._lock:
            self.calls[operation] += 1
            if self._full and operation in ("write", "rename"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if operation != self.operation or self.calls[operation] != self.nth:
                return
            self.fired = True
            self._full = self.code == errno.ENOSPC and operation in ("write", "rename")
        raise OSError(self.code, os.strerror(self.code))

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self._check("write")
        return super().writev(fd, buffers)

    def fsync(self, fd: int) -> None:
        self._check("fsync")
        super().fsync(fd)

    def fsync_dir(self, fd: int) -> None:
        self._check("fsync")
        super().fsync_dir(fd)

    def truncate(self, fd: int, length: int) -> None:
        self._check("truncate")
        super().truncate(fd, length)

    def replace(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        self._check("rename")
        super().replace(source, target)
