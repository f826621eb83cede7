"""Files named by stored or received data, confined to their directory (docs/architecture.md §6).

A snapshot's manifest, a chunk received from a primary and a RocksDB checkpoint's listing all
name files *inside* one directory. Such a name is data, not a path to trust: every reader turns
it into a path with :func:`resolve_inside`, the one resolver of the code base, which refuses
anything that could reach outside the directory, and a backslash or a NUL in a name too.

An **entry** is a relative, ``/``-separated name: ``ram/t.ids``, ``disk/000012.sst``. The root
is resolved first (:func:`confined_root`), so a directory that is itself a symbolic link works
(``snapshots/ckpt-1 -> /backups/ckpt-1``: its entries must stay inside ``/backups/ckpt-1``)::

    root = confined_root(Path("snapshots/ckpt-1"), owner)   # /backups/ckpt-1
    resolve_inside(root, "ram/t.ids", owner)                 # /backups/ckpt-1/ram/t.ids
    resolve_inside(root, "../../secret", owner)              # CorruptDataError: '..'
    resolve_inside(root, "/proc/self/cmdline", owner)        # CorruptDataError: absolute
    resolve_inside(root, "ram//t.ids", owner)                # CorruptDataError: empty component
    resolve_inside(root, "disk/x.sst", owner)                # CorruptDataError when disk/x.sst
                                                             # is a link to /etc/passwd
    resolve_inside(root, "disk/y.sst", owner)                # /backups/ckpt-1/disk/x.sst when
                                                             # disk/y.sst is a link to x.sst

Refusals are :class:`~embeddb.errors.CorruptDataError` naming the ``owner`` (e.g. ``snapshot
/data/snapshots/ckpt-1``) and the entry, never a file's content. :func:`open_inside` also
refuses anything but a regular file (a FIFO would block the reader, a device never ends), and
:func:`walk_inside` lists a directory's files without following a symbolic link out of it.

It lives in the storage layer, the lowest one that reads files, so that the read-only disk
tier and :mod:`embeddb.engine.durability` share it (docs/architecture.md §2: dependencies point
inward).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from embeddb.errors import CorruptDataError

__all__ = ["confined_root", "open_inside", "resolve_inside", "walk_inside"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def confined_root(directory: Path, owner: str) -> Path:
    """``directory`` with every symbolic link resolved: the root its entries must stay in.

    Raises:
        CorruptDataError: ``directory`` does not exist or is not a directory.
    """
    try:
        root = Path(os.path.realpath(directory, strict=True))
    except OSError as exc:
        raise CorruptDataError(f"{owner}: {directory} is unusable: {exc.strerror}") from exc
    if not root.is_dir():
        raise CorruptDataError(f"{owner}: {directory} is not a directory")
    return root


def resolve_inside(root: Path, entry: str, owner: str) -> Path:
    """The real path of ``entry`` inside ``root``, if it stays inside.

    Args:
        root: a directory as :func:`confined_root` returns it (no symbolic link in it).
        entry: a relative ``/``-separated name (see the module docstring).
        owner: what ``root`` is, for messages (e.g. ``"snapshot /data/snapshots/s1"``).

    Returns:
        ``root/entry`` with symbolic links resolved; it need not exist.

    Raises:
        CorruptDataError: ``entry`` is not a plain relative name (absolute, empty, a ``.`` or
            ``..`` or empty component, a backslash or NUL), or a symbolic link on its way
            resolves outside ``root``.
    """
    if (
        not isinstance(entry, str)
        or not entry
        or entry.startswith("/")
        or "\\" in entry
        or "\0" in entry
        or any(part in ("", ".", "..") for part in entry.split("/"))
    ):
        raise CorruptDataError(f"{owner}: entry {entry!r} is not a relative path inside it")
    real = Path(os.path.realpath(root.joinpath(*entry.split("/"))))
    if not real.is_relative_to(root):
        raise CorruptDataError(
            f"{owner}: entry {entry!r} is a symbolic link (or lies under one) that resolves "
            f"outside it"
        )
    return real


def open_inside(root: Path, entry: str, owner: str) -> BinaryIO:
    """Open the regular file ``entry`` inside ``root`` for reading (see :func:`resolve_inside`).

    Raises:
        CorruptDataError: ``entry`` escapes ``root``, is missing or unreadable, or is not a
            regular file.
    """
    real = resolve_inside(root, entry, owner)
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise CorruptDataError(f"{owner}: entry {entry!r} is unreadable: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptDataError(f"{owner}: entry {entry!r} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def walk_inside(root: Path, owner: str, under: str | None = None) -> Iterator[tuple[str, Path]]:
    """Every entry below ``root`` (or below its directory ``under``) that is not a directory,
    as ``(entry, real path)``, directory by directory.

    Directories are descended, symbolic links to directories inside ``root`` too (each real
    directory once, so a link loop ends); a symbolic link resolving outside ``root`` is
    refused, never followed.

    Raises:
        CorruptDataError: an entry resolves outside ``root``.
        OSError: a directory cannot be listed (``under`` missing, for one).
    """
    start = root if under is None else resolve_inside(root, under, owner)
    seen: set[Path] = set()
    pending = [("" if under is None else under + "/", start)]
    while pending:
        prefix, directory = pending.pop()
        if directory in seen:
            continue
        seen.add(directory)
        subdirs = []
        for name in sorted(os.listdir(directory)):
            entry = prefix + name
            real = resolve_inside(root, entry, owner)
            if real.is_dir():
                subdirs.append((entry + "/", real))
            else:
                yield entry, real
        pending.extend(reversed(subdirs))
