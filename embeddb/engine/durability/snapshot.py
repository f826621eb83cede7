"""Snapshots of one shard: self-checking directories, complete only once their manifest exists.

Layout under a shard's ``snapshots/`` directory::

    snapshots/
      <snapshot id>/
        ram/<table>.ids      uint64   resident ids of the table's RAM tier
        ram/<table>.rows     float32  their rows [vector | state], (n, width)
        ram/<table>.flags    uint8    ON_DISK / DIRTY per row (see embeddb.engine.storage.ram_tier)
        disk/...             a RocksDB checkpoint of the disk tier (SST files hard-linked)
        manifest.json        written last: format, id, seq, shard index/count, tables, the
                             size and CRC32 of every other file, and its own CRC32
      .tmp-<snapshot id>-<random>/   a snapshot being written (never read; removed at start)

A snapshot holds exactly the mutations up to its ``seq``: the shard captures the RAM tier and
checkpoints the disk tier while no mutation can run (:meth:`embeddb.engine.shard.Shard.snapshot`),
then this module writes the files, checksums them, writes the manifest, fsyncs and renames the
directory into place. A crash at any point leaves either the complete snapshot or a temporary
directory. :func:`verify` re-reads every file against the manifest, so a flipped byte or a
truncated file anywhere is reported with its path; nothing is loaded unverified.

Sending a snapshot to another machine (a follower's bootstrap): :class:`SnapshotReader` opens
every file of a complete snapshot and cuts them into ``(path, offset, data)`` chunks, the
manifest last, checking each file's size and CRC32 against the manifest as it goes;
:class:`SnapshotReceiver` writes the chunks into a temporary directory and, on
:meth:`~SnapshotReceiver.commit`, verifies the whole snapshot before renaming it into place.

The manifest's format and checks (:func:`verify`, :func:`read_manifest`, :func:`check_id`,
:func:`load_table`) live in :mod:`embeddb.engine.durability.manifest`; they are importable from
here.

**Paths.** A snapshot directory may be copied in by hand (``snapshots/`` is where a checkpoint
is imported) or received from another machine, so its manifest is data, not a list of paths
to trust. Every reader — :func:`verify` (restore, crash recovery, a received snapshot),
:class:`SnapshotReader`, :func:`load_table`, :func:`table_files` and :func:`entry_path`
(reshard), :func:`copy_disk` — resolves each listed file inside the snapshot directory with
:func:`embeddb.engine.storage.paths.resolve_inside` and refuses, with :class:`CorruptDataError`, an
absolute path, a ``..`` component or a symbolic link that leads out of it. The directory itself
may be a symbolic link (``snapshots/ckpt-1 -> /backups/ckpt-1``): its target is the boundary.

**Privacy.** The files written here are created 0600 and their directories 0700, whatever the
umask; the disk checkpoint's files (hard links of the live RocksDB files) are made 0600 too.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import numpy.typing as npt

from embeddb.engine.durability.fileio import REAL, FileIO, storage_error
from embeddb.engine.durability.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    check_id,
    checksum,
    describe,
    entry_path,
    load_table,
    manifest_crc,
    read_manifest,
    read_manifest_text,
    table_entries,
    table_files,
    verify,
)
from embeddb.engine.storage.paths import confined_root, open_inside, resolve_inside, walk_inside
from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Chunk",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotReceiver",
    "SnapshotWriter",
    "check_id",
    "copy_disk",
    "entry_path",
    "list_snapshots",
    "load_table",
    "prune",
    "read_manifest",
    "remove_incomplete",
    "table_files",
    "verify",
]

_TMP_PREFIX = ".tmp-"
_manifest_crc = manifest_crc  # its former name, still used by tools and tests
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


class SnapshotWriter:
    """Writes one snapshot into a temporary directory, then :meth:`commit` renames it in.

    Its writes, fsyncs and renames go through ``file_io`` (the shard's, so a test's
    :class:`~embeddb.engine.durability.fileio.FaultyIO` reaches them); a failure is a
    :class:`~embeddb.errors.StorageFullError` or :class:`~embeddb.errors.StorageFaultError`
    naming no path, and leaves no snapshot (the manifest, the mark of a complete one, is
    written last; the directory is renamed in only after it).

    Args:
        root: the shard's ``snapshots/`` directory (created if missing).
        snapshot_id: the new snapshot's id (see :func:`check_id`); must not exist yet.
        file_io: the file layer.

    Raises:
        InvalidArgumentError: a bad or existing id.
        StorageError: the directory cannot be created.
    """

    def __init__(self, root: Path, snapshot_id: str, file_io: FileIO = REAL) -> None:
        self.root = root
        self.snapshot_id = check_id(snapshot_id)
        self._io = file_io
        self._failed = f"cannot write snapshot {snapshot_id!r}"
        self.final, self.tmp = _temporary_dir(root, snapshot_id, "create")
        self._owner = f"snapshot {snapshot_id!r} being written in {self.tmp}"
        try:
            _private_dir(self.tmp / "ram")
        except OSError as exc:
            raise storage_error(self._failed, exc) from exc
        self.disk_dir = self.tmp / "disk"  # the RocksDB checkpoint goes here (must not exist)

    def write_table(
        self,
        name: str,
        ids: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        flags: npt.NDArray[np.uint8],
    ) -> None:
        """Write one table's captured RAM tier.

        Raises:
            CorruptDataError: ``name`` would put a file outside the snapshot (``..``, ``/``).
            StorageFullError, StorageFaultError: a write failed.
        """
        root = confined_root(self.tmp, self._owner)
        arrays = (ids.astype("<u8"), rows.astype("<f4"), flags.astype(np.uint8))
        for entry, arr in zip(table_entries(name), arrays, strict=True):
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
            try:
                self._write(resolve_inside(root, entry, self._owner), data)
            except OSError as exc:
                raise storage_error(self._failed, exc) from exc

    def _write(self, path: Path, data: bytes | memoryview) -> None:
        fd = _create_private(path)
        try:
            self._io.write_all(fd, data)
        finally:
            os.close(fd)

    def commit(self, seq: int, meta: dict[str, Any]) -> SnapshotInfo:
        """Checksum every file, write the manifest (with ``seq`` and ``meta``), fsync, rename.

        Raises:
            StorageFullError, StorageFaultError: a write, fsync or rename failed (nothing of
                the snapshot is left).
        """
        renamed = False
        try:
            _make_private(self.disk_dir)  # hard links of the live files: those become 0600 too
            files = {}
            total = 0
            for path in sorted(p for p in self.tmp.rglob("*") if p.is_file()):
                rel = path.relative_to(self.tmp).as_posix()
                with open(path, "rb") as f:
                    size, crc = checksum(f)
                    self._io.fsync(f.fileno())
                files[rel] = {"size": size, "crc32": crc}
                total += size
            created = time.time()
            manifest = {
                "format_version": FORMAT_VERSION,
                "snapshot_id": self.snapshot_id,
                "seq": seq,
                "created": created,
                **meta,
                "files": files,
            }
            manifest["checksum"] = manifest_crc(manifest)
            text = json.dumps(manifest, indent=1, sort_keys=True).encode()
            fd = _create_private(self.tmp / MANIFEST)
            try:
                self._io.write_all(fd, text)
                self._io.fsync(fd)
            finally:
                os.close(fd)
            for d in [p for p in self.tmp.rglob("*") if p.is_dir()] + [self.tmp]:
                self._fsync_dir(d)
            self._io.replace(self.tmp, self.final)
            renamed = True
            self._fsync_dir(self.root)
        except OSError as exc:
            self.abort()
            if renamed:  # its directory entry may not be durable: no snapshot, not half of one
                shutil.rmtree(self.final, ignore_errors=True)
            raise storage_error(self._failed, exc) from exc
        return SnapshotInfo(self.snapshot_id, seq, self.final, total + len(text), created)

    def abort(self) -> None:
        """Remove the temporary directory. Idempotent."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._io.fsync_dir(fd)
        finally:
            os.close(fd)


class Chunk(NamedTuple):
    """``data`` is the bytes of snapshot file ``path`` (relative, ``/``-separated) from
    ``offset`` on."""

    path: str
    offset: int
    data: bytes


class _Listed(NamedTuple):
    """A file of a snapshot being sent: its entry, the open file, the manifest's size and CRC."""

    path: str
    file: BinaryIO
    size: int
    crc32: int


class SnapshotReader:
    """The files of one complete snapshot, opened for sending.

    :meth:`open` opens every file the manifest lists, so the snapshot is read whole even if
    it is pruned meanwhile (an unlinked file stays readable while open). :meth:`chunks` checks
    every file against the manifest while it reads it.

    Args:
        info: the snapshot.
        files: its listed files, in the order to send them.
        manifest: the manifest's bytes, as verified (sent last).
    """

    def __init__(self, info: SnapshotInfo, files: list[_Listed], manifest: bytes) -> None:
        self.info = info
        self._files = files
        self._manifest = manifest
        self._owner = describe(info.path)

    @classmethod
    def open(cls, info: SnapshotInfo) -> SnapshotReader:
        """Open the files of the complete snapshot ``info``; its manifest is read again and
        checked (its own checksum included), and every listed file resolved inside it.

        Raises:
            CorruptDataError: its manifest is unreadable, or a listed file is missing, not a
                regular file, or escapes the snapshot directory.
        """
        owner = describe(info.path)
        root = confined_root(info.path, owner)
        text, manifest = read_manifest_text(root, info.path)
        files: list[_Listed] = []
        try:
            for rel, want in sorted(manifest["files"].items()):
                f = open_inside(root, rel, owner)
                files.append(_Listed(rel, f, want["size"], want["crc32"]))
        except BaseException:
            for listed in files:
                listed.file.close()
            raise
        return cls(info, files, text)

    def chunks(self, chunk_bytes: int = 1 << 20) -> Iterator[Chunk]:
        """The files in chunks of at most ``chunk_bytes``, in order, the manifest last; an empty
        file is one chunk without data.

        Raises:
            CorruptDataError: (while iterating) a file is shorter or longer than its manifest
                says, or fails its CRC32: it changed since the snapshot was taken. No byte
                beyond the listed size is ever yielded, and a file's last chunk only once its
                whole content matched.
        """
        if chunk_bytes < 1:
            raise InvalidArgumentError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        for listed in self._files:
            yield from self._checked(listed, chunk_bytes)
        for offset in range(0, len(self._manifest), chunk_bytes):
            yield Chunk(MANIFEST, offset, self._manifest[offset : offset + chunk_bytes])

    def _checked(self, listed: _Listed, chunk_bytes: int) -> Iterator[Chunk]:
        offset = crc = 0
        while True:
            wanted = min(chunk_bytes, listed.size - offset)
            try:
                data = listed.file.read(wanted) if wanted else b""
                last = offset + len(data) == listed.size
                grown = last and listed.file.read(1) != b""
            except OSError as exc:
                raise CorruptDataError(f"{self._where(listed)} is unreadable: {exc}") from exc
            crc = zlib.crc32(data, crc)
            if len(data) < wanted:
                raise CorruptDataError(
                    f"{self._where(listed)} ends after {offset + len(data)} bytes, its "
                    f"manifest says {listed.size}: it changed since the snapshot was taken"
                )
            if grown:
                raise CorruptDataError(
                    f"{self._where(listed)} is longer than the {listed.size} bytes its manifest "
                    f"says: it changed since the snapshot was taken"
                )
            if last and crc != listed.crc32:
                raise CorruptDataError(
                    f"{self._where(listed)} fails its CRC32 checksum: it changed since the "
                    f"snapshot was taken"
                )
            yield Chunk(listed.path, offset, data)
            if last:
                return
            offset += len(data)

    def _where(self, listed: _Listed) -> str:
        return f"{self._owner}: file {listed.path!r}"

    def close(self) -> None:
        """Close every file. Idempotent."""
        for listed in self._files:
            listed.file.close()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SnapshotReceiver:
    """Writes a snapshot arriving in chunks (from :meth:`SnapshotReader.chunks`) under ``root``.

    The files go to a temporary directory; :meth:`commit` verifies the whole snapshot against
    its manifest (:func:`verify`) and only then renames it to ``root/<snapshot id>``.

    Args:
        root: the ``snapshots/`` directory to receive into (created if missing).
        snapshot_id: the snapshot's id (see :func:`check_id`); must not exist under ``root``.

    Raises:
        InvalidArgumentError: a bad or existing id.
        StorageError: the directory cannot be created.
    """

    def __init__(self, root: Path, snapshot_id: str) -> None:
        self.root = root
        self.snapshot_id = check_id(snapshot_id)
        self.final, self.tmp = _temporary_dir(root, snapshot_id, "receive")
        self._owner = f"snapshot {snapshot_id!r} being received in {self.tmp}"
        self._root = confined_root(self.tmp, self._owner)
        self._open: dict[str, tuple[BinaryIO, int]] = {}  # path -> (file, bytes written)
        self.bytes = 0

    def write(self, chunk: Chunk) -> None:
        """Write one chunk; the chunks of a file must arrive in order.

        Raises:
            CorruptDataError: an unsafe path (absolute, ``..``, see
                :func:`~embeddb.engine.storage.paths.resolve_inside`) or a chunk out of order.
            StorageError: the write failed.
        """
        target = resolve_inside(self._root, chunk.path, self._owner)
        rel = chunk.path
        entry = self._open.get(rel)
        written = 0 if entry is None else entry[1]
        if chunk.offset != written:
            raise CorruptDataError(
                f"snapshot {self.snapshot_id!r}: chunk of {rel} at offset {chunk.offset}, "
                f"expected {written}"
            )
        f: BinaryIO
        try:
            if entry is None:
                _private_dirs(self._root, target.parent)
                f = os.fdopen(_create_private(target), "wb")  # closed by commit or abort
            else:
                f = entry[0]
            f.write(chunk.data)
        except OSError as exc:
            raise StorageError(f"cannot write snapshot file {self.tmp / rel}: {exc}") from exc
        self._open[rel] = (f, written + len(chunk.data))
        self.bytes += len(chunk.data)

    def commit(self) -> SnapshotInfo:
        """Verify the received snapshot and rename it into place.

        Raises:
            CorruptDataError: it fails :func:`verify` (the temporary directory is removed).
            StorageError: the rename failed.
        """
        self._close_files()
        try:
            manifest = verify(self.tmp)
            if manifest["snapshot_id"] != self.snapshot_id:
                raise CorruptDataError(
                    f"received snapshot {self.snapshot_id!r} has the manifest of "
                    f"{manifest['snapshot_id']!r}"
                )
            os.rename(self.tmp, self.final)
        except CorruptDataError:
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise StorageError(f"cannot store snapshot {self.snapshot_id!r}: {exc}") from exc
        created = float(manifest.get("created", 0.0))
        return SnapshotInfo(self.snapshot_id, int(manifest["seq"]), self.final, self.bytes, created)

    def abort(self) -> None:
        """Remove the temporary directory. Idempotent."""
        self._close_files()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _close_files(self) -> None:
        for f, _ in self._open.values():
            f.close()
        self._open.clear()


def list_snapshots(root: Path) -> list[SnapshotInfo]:
    """Complete snapshots under ``root`` (those with a manifest), oldest first (by seq).

    A directory whose manifest is unreadable is listed with ``seq = -1`` so that a restore
    that reaches it reports the corruption instead of skipping it silently.
    """
    out: list[SnapshotInfo] = []
    if not root.is_dir():
        return out
    for path in root.iterdir():
        if path.name.startswith(_TMP_PREFIX) or not path.is_dir():
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
            if path.name.startswith(_TMP_PREFIX):
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


# ----------------------------------------------------------------------------------- helpers
def _temporary_dir(root: Path, snapshot_id: str, verb: str) -> tuple[Path, Path]:
    """``(final path, new temporary directory)`` for snapshot ``snapshot_id`` under ``root``.

    Raises:
        InvalidArgumentError: the snapshot exists. StorageError: ``root`` is unusable.
    """
    final = root / snapshot_id
    if final.exists():
        raise InvalidArgumentError(f"snapshot {snapshot_id!r} already exists in {root}")
    try:
        root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{snapshot_id}-", dir=root))
        os.chmod(tmp, _DIR_MODE)
    except OSError as exc:
        raise storage_error(f"cannot {verb} snapshot {snapshot_id!r}", exc) from exc
    return final, tmp


def _create_private(path: Path) -> int:
    """A new file (it must not exist; never through a symbolic link), mode 0600 whatever the
    umask, open for writing: its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, _FILE_MODE)  # the umask may have taken bits away
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private_dir(path: Path) -> None:
    """Create directory ``path``, mode 0700 whatever the umask."""
    path.mkdir(mode=_DIR_MODE)
    os.chmod(path, _DIR_MODE)


def _private_dirs(root: Path, directory: Path) -> None:
    """Create ``directory`` (inside ``root``) and its missing parents below ``root``, 0700."""
    missing = []
    while directory != root and not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        _private_dir(d)


def _make_private(directory: Path) -> None:
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
