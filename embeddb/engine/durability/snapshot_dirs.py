"""A shard's ``snapshots/`` directory: which snapshots it holds, and the private files of new ones.

A complete snapshot is a directory with a manifest (:class:`SnapshotInfo` describes one;
:func:`list_snapshots` lists them, :func:`prune` keeps the newest, :func:`copy_disk` makes a live
copy of one's disk checkpoint). A snapshot being written or received lives in a temporary
directory ``.tmp-<snapshot id>-<random>`` (:func:`temporary_dir`), which is never read and which
:func:`remove_incomplete` removes after a crash. The files and directories written into it are
the shard owner's only: created 0600 and 0700 whatever the umask (:func:`create_private`,
:func:`private_dir`, :func:`private_dirs`, :func:`make_private`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from embeddb.engine.durability.fileio import storage_error
from embeddb.engine.durability.manifest import MANIFEST, describe, read_manifest
from embeddb.engine.storage.paths import confined_root, walk_inside
from embeddb.errors import CorruptDataError, InvalidArgumentError

__all__ = [
    "SnapshotInfo",
    "copy_disk",
    "create_private",
    "list_snapshots",
    "make_private",
    "private_dir",
    "private_dirs",
    "prune",
    "remove_incomplete",
    "temporary_dir",
]

TMP_PREFIX = ".tmp-"
_FILE_MODE = 0o600
_DIR_MODE = 0o700


@dataclass(frozen=True)
class SnapshotInfo:
    """A complete snapshot: its id, ``seq``, directory, total bytes and creation time."""

    snapshot_id: str
    seq: int
    path: Path
    bytes: int
    created: float


def list_snapshots(root: Path) -> list[SnapshotInfo]:
    """Complete snapshots under ``root`` (those with a manifest), oldest first (by seq).

    A directory whose manifest is unreadable is listed with ``seq = -1`` so that a restore
    that reaches it reports the corruption instead of skipping it silently.
    """
    out: list[SnapshotInfo] = []
    if not root.is_dir():
        return out
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX) or not path.is_dir():
            continue
        if not (path / MANIFEST).exists():
            continue
        try:
            manifest = read_manifest(path)
            seq, created = int(manifest["seq"]), float(manifest.get("created", 0.0))
            size = sum(int(f.get("size", 0)) for f in manifest["files"].values())
        except (CorruptDataError, TypeError, ValueError):
            seq, created, size = -1, 0.0, 0
        out.append(SnapshotInfo(path.name, seq, path, size, created))
    out.sort(key=lambda s: (s.seq, s.created, s.snapshot_id))
    return out


def prune(root: Path, keep: int) -> list[str]:
    """Remove all but the newest ``keep`` complete snapshots; return the removed ids."""
    snapshots = list_snapshots(root)
    doomed = snapshots[: max(0, len(snapshots) - keep)]
    for s in doomed:
        shutil.rmtree(s.path, ignore_errors=True)
    return [s.snapshot_id for s in doomed]


def remove_incomplete(root: Path) -> list[Path]:
    """Remove temporary directories left by snapshots interrupted by a crash."""
    removed = []
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(TMP_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def copy_disk(snapshot: Path, target: Path) -> None:
    """Make ``target`` a live copy of the snapshot's disk checkpoint: SST files (immutable) are
    hard-linked when possible, everything else copied. ``target`` must not exist.

    Only regular files inside the snapshot directory are copied (see the module docstring).

    Raises:
        CorruptDataError: an entry of ``disk/`` escapes the snapshot directory or is not a
            regular file.
        OSError: reading or writing failed.
    """
    owner = describe(snapshot)
    root = confined_root(snapshot, owner)
    os.makedirs(target)
    for entry, real in walk_inside(root, owner, under="disk"):
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise CorruptDataError(f"{owner}: entry {entry!r} is not a regular file")
        dst = target.joinpath(*entry.split("/")[1:])
        dst.parent.mkdir(parents=True, exist_ok=True)
        if entry.endswith(".sst"):
            try:
                os.link(real, dst)
                continue
            except OSError:
                pass
        shutil.copy2(real, dst)


# ------------------------------------------------------------------------- new snapshots' files
def temporary_dir(root: Path, snapshot_id: str, verb: str) -> tuple[Path, Path]:
    """``(final path, new temporary directory)`` for snapshot ``snapshot_id`` under ``root``.

    Raises:
        InvalidArgumentError: the snapshot exists. StorageError: ``root`` is unusable.
    """
    final = root / snapshot_id
    if final.exists():
        raise InvalidArgumentError(f"snapshot {snapshot_id!r} already exists in {root}")
    try:
        root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{snapshot_id}-", dir=root))
        os.chmod(tmp, _DIR_MODE)
    except OSError as exc:
        raise storage_error(f"cannot {verb} snapshot {snapshot_id!r}", exc) from exc
    return final, tmp


def create_private(path: Path) -> int:
    """A new file (it must not exist; never through a symbolic link), mode 0600 whatever the
    umask, open for writing: its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, _FILE_MODE)  # the umask may have taken bits away
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dir(path: Path) -> None:
    """Create directory ``path``, mode 0700 whatever the umask."""
    path.mkdir(mode=_DIR_MODE)
    os.chmod(path, _DIR_MODE)


def private_dirs(root: Path, directory: Path) -> None:
    """Create ``directory`` (inside ``root``) and its missing parents below ``root``, 0700."""
    missing = []
    while directory != root and not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        private_dir(d)


def make_private(directory: Path) -> None:
    """Mode 0700 for ``directory`` and every directory under it, 0600 for every file (links,
    which this module never writes, are left alone)."""
    if not directory.is_dir():
        return
    for current, _, names in os.walk(directory):
        os.chmod(current, _DIR_MODE)
        for name in names:
            file = os.path.join(current, name)
            if not os.path.islink(file):
                os.chmod(file, _FILE_MODE)
