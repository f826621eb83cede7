"""Snapshots of one shard: self-checking directories, complete only once their manifest exists.

Layout under a shard's ``snapshots/`` directory::

    snapshots/
      <snapshot id>/
        ram/<table>.ids      uint64   resident ids of the table's RAM tier
        ram/<table>.rows     float32  their rows [vector | state], (n, width)
        ram/<table>.flags    uint8    ON_DISK / DIRTY per row (see embeddb.storage.ram_tier)
        disk/...             a RocksDB checkpoint of the disk tier (SST files hard-linked)
        manifest.json        written last: format, id, seq, shard index/count, tables, the
                             size and CRC32 of every other file, and its own CRC32
      .tmp-<snapshot id>-<random>/   a snapshot being written (never read; removed at start)

A snapshot holds exactly the mutations up to its ``seq``: the shard captures the RAM tier and
checkpoints the disk tier while no mutation can run (:meth:`embeddb.shard.Shard.snapshot`),
then this module writes the files, checksums them, writes the manifest, fsyncs and renames the
directory into place. A crash at any point leaves either the complete snapshot or a temporary
directory. :func:`verify` re-reads every file against the manifest, so a flipped byte or a
truncated file anywhere is reported with its path; nothing is loaded unverified.

Sending a snapshot to another machine (a follower's bootstrap): :class:`SnapshotReader` opens
every file of a complete snapshot and cuts them into ``(path, offset, data)`` chunks, the
manifest last; :class:`SnapshotReceiver` writes the chunks into a temporary directory and, on
:meth:`~SnapshotReceiver.commit`, verifies the whole snapshot before renaming it into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import numpy.typing as npt

from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Chunk",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotReceiver",
    "SnapshotWriter",
    "list_snapshots",
    "load_table",
    "prune",
    "read_manifest",
    "remove_incomplete",
    "verify",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class SnapshotInfo:
    """A complete snapshot: its id, ``seq``, directory, total bytes and creation time."""

    snapshot_id: str
    seq: int
    path: Path
    bytes: int
    created: float


def check_id(snapshot_id: str) -> str:
    """``snapshot_id`` if it is a safe directory name (letters, digits, ``._-``; ≤ 128).

    Raises:
        InvalidArgumentError: anything else (a path, an empty or hidden name).
    """
    if not isinstance(snapshot_id, str) or not _ID.match(snapshot_id):
        raise InvalidArgumentError(
            f"snapshot id must be 1-128 letters, digits, '.', '_' or '-' and not start with "
            f"'.', '_' or '-'; got {snapshot_id!r}"
        )
    return snapshot_id


class SnapshotWriter:
    """Writes one snapshot into a temporary directory, then :meth:`commit` renames it in.

    Args:
        root: the shard's ``snapshots/`` directory (created if missing).
        snapshot_id: the new snapshot's id (see :func:`check_id`); must not exist yet.

    Raises:
        InvalidArgumentError: a bad or existing id.
        StorageError: the directory cannot be created.
    """

    def __init__(self, root: Path, snapshot_id: str) -> None:
        self.root = root
        self.snapshot_id = check_id(snapshot_id)
        self.final, self.tmp = _temporary_dir(root, snapshot_id, "create")
        try:
            (self.tmp / "ram").mkdir()
        except OSError as exc:
            raise StorageError(f"cannot create a snapshot in {root}: {exc}") from exc
        self.disk_dir = self.tmp / "disk"  # the RocksDB checkpoint goes here (must not exist)

    def write_table(
        self,
        name: str,
        ids: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        flags: npt.NDArray[np.uint8],
    ) -> None:
        """Write one table's captured RAM tier."""
        base = self.tmp / "ram" / name
        for suffix, arr in (("ids", ids.astype("<u8")), ("rows", rows.astype("<f4"))):
            _write_file(base.with_suffix(f".{suffix}"), arr)
        _write_file(base.with_suffix(".flags"), flags.astype(np.uint8))

    def commit(self, seq: int, meta: dict[str, Any]) -> SnapshotInfo:
        """Checksum every file, write the manifest (with ``seq`` and ``meta``), fsync, rename.

        Raises:
            StorageError: a write failed (the temporary directory is removed).
        """
        try:
            files = {}
            total = 0
            for path in sorted(p for p in self.tmp.rglob("*") if p.is_file()):
                rel = path.relative_to(self.tmp).as_posix()
                size, crc = _checksum(path)
                files[rel] = {"size": size, "crc32": crc}
                total += size
                _fsync_file(path)
            created = time.time()
            manifest = {
                "format_version": FORMAT_VERSION,
                "snapshot_id": self.snapshot_id,
                "seq": seq,
                "created": created,
                **meta,
                "files": files,
            }
            manifest["checksum"] = _manifest_crc(manifest)
            text = json.dumps(manifest, indent=1, sort_keys=True).encode()
            manifest_path = self.tmp / MANIFEST
            with open(manifest_path, "wb") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            for d in [p for p in self.tmp.rglob("*") if p.is_dir()] + [self.tmp]:
                _fsync_dir(d)
            os.rename(self.tmp, self.final)
            _fsync_dir(self.root)
        except OSError as exc:
            self.abort()
            raise StorageError(f"cannot write snapshot {self.snapshot_id!r}: {exc}") from exc
        return SnapshotInfo(self.snapshot_id, seq, self.final, total + len(text), created)

    def abort(self) -> None:
        """Remove the temporary directory. Idempotent."""
        shutil.rmtree(self.tmp, ignore_errors=True)


class Chunk(NamedTuple):
    """``data`` is the bytes of snapshot file ``path`` (relative, ``/``-separated) from
    ``offset`` on."""

    path: str
    offset: int
    data: bytes


class SnapshotReader:
    """The files of one complete snapshot, opened for sending.

    :meth:`open` opens every file the manifest lists, so the snapshot is read whole even if
    it is pruned meanwhile (an unlinked file stays readable while open).

    Args:
        info: the snapshot.
        files: its files as ``(relative path, open file)``, the manifest last.
    """

    def __init__(self, info: SnapshotInfo, files: list[tuple[str, BinaryIO]]) -> None:
        self.info = info
        self._files = files

    @classmethod
    def open(cls, info: SnapshotInfo) -> SnapshotReader:
        """Open the files of the complete snapshot ``info``.

        Raises:
            CorruptDataError: its manifest is unreadable or a listed file is missing.
        """
        manifest = read_manifest(info.path)
        files: list[tuple[str, BinaryIO]] = []
        try:
            for rel in [*sorted(manifest["files"]), MANIFEST]:
                files.append((rel, open(info.path / rel, "rb")))  # noqa: SIM115 (closed by close())
        except OSError as exc:
            for _, f in files:
                f.close()
            raise CorruptDataError(f"cannot open snapshot {info.path}: {exc}") from exc
        return cls(info, files)

    def chunks(self, chunk_bytes: int = 1 << 20) -> Iterator[Chunk]:
        """The files in chunks of at most ``chunk_bytes``, in order, the manifest last; an empty
        file is one chunk without data."""
        for rel, f in self._files:
            offset = 0
            while True:
                data = f.read(chunk_bytes)
                if data or offset == 0:
                    yield Chunk(rel, offset, data)
                if len(data) < chunk_bytes:
                    break
                offset += len(data)

    def close(self) -> None:
        """Close every file. Idempotent."""
        for _, f in self._files:
            f.close()

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
        self._open: dict[str, tuple[BinaryIO, int]] = {}  # path -> (file, bytes written)
        self.bytes = 0

    def write(self, chunk: Chunk) -> None:
        """Write one chunk; the chunks of a file must arrive in order.

        Raises:
            CorruptDataError: an unsafe path (absolute, ``..``) or a chunk out of order.
            StorageError: the write failed.
        """
        rel = _safe_path(chunk.path)
        entry = self._open.get(rel)
        written = 0 if entry is None else entry[1]
        if chunk.offset != written:
            raise CorruptDataError(
                f"snapshot {self.snapshot_id!r}: chunk of {rel} at offset {chunk.offset}, "
                f"expected {written}"
            )
        try:
            if entry is None:
                target = self.tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                f: BinaryIO = open(target, "xb")  # noqa: SIM115 (closed by commit or abort)
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


def _safe_path(path: str) -> str:
    """``path`` if it is a plain relative path inside a snapshot; CorruptDataError otherwise."""
    parts = PurePosixPath(path).parts
    if (
        not parts
        or path.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or ("\\" in path)
    ):
        raise CorruptDataError(f"snapshot chunk path {path!r} is not a relative path inside it")
    return "/".join(parts)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the snapshot directory ``path`` (structure checked, files not).

    Raises:
        CorruptDataError: missing, unreadable or malformed manifest, or an unknown format.
    """
    file = path / MANIFEST
    try:
        manifest = json.loads(file.read_bytes())
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {manifest.get('format_version')!r}")
        if manifest.get("checksum") != _manifest_crc(manifest):
            raise ValueError("its checksum does not match its content")
        for key, kind in (("seq", int), ("files", dict), ("tables", dict), ("snapshot_id", str)):
            if not isinstance(manifest.get(key), kind):
                raise ValueError(f"field {key!r} missing or not a {kind.__name__}")
    except (OSError, ValueError) as exc:
        raise CorruptDataError(f"{file} is unreadable: {exc}") from exc
    return manifest


def verify(path: Path) -> dict[str, Any]:
    """Check every file of the snapshot at ``path`` against its manifest; return the manifest.

    Raises:
        CorruptDataError: naming the first file that is missing, of another size, fails its
            checksum, or is present but not listed.
    """
    manifest = read_manifest(path)
    listed = manifest["files"]
    for rel, want in sorted(listed.items()):
        file = path / rel
        try:
            size, crc = _checksum(file)
        except OSError as exc:
            raise CorruptDataError(f"snapshot file {file} is unreadable: {exc}") from exc
        if size != want.get("size"):
            raise CorruptDataError(
                f"snapshot file {file} has {size} bytes, its manifest says {want.get('size')}"
            )
        if crc != want.get("crc32"):
            raise CorruptDataError(f"snapshot file {file} fails its CRC32 checksum")
    extra = sorted(
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if p.is_file() and p.name != MANIFEST and p.relative_to(path).as_posix() not in listed
    )
    if extra:
        raise CorruptDataError(f"snapshot {path} holds files its manifest does not list: {extra}")
    return manifest


def load_table(
    path: Path, name: str, width: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """A table's captured RAM tier from a verified snapshot.

    Raises:
        CorruptDataError: the three files disagree on the row count or the width.
    """
    base = path / "ram" / name
    try:
        ids = np.fromfile(base.with_suffix(".ids"), dtype="<u8").astype(np.uint64, copy=False)
        flat = np.fromfile(base.with_suffix(".rows"), dtype="<f4").astype(np.float32, copy=False)
        flags = np.fromfile(base.with_suffix(".flags"), dtype=np.uint8)
    except OSError as exc:
        raise CorruptDataError(f"cannot read table {name!r} of snapshot {path}: {exc}") from exc
    if flat.size != ids.size * width or flags.size != ids.size:
        raise CorruptDataError(
            f"table {name!r} of snapshot {path}: {ids.size} ids, {flat.size} floats (width "
            f"{width}) and {flags.size} flags do not match"
        )
    return ids, flat.reshape(ids.size, width), flags


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
    hard-linked when possible, everything else copied. ``target`` must not exist."""
    source = snapshot / "disk"

    def link_or_copy(src: str, dst: str) -> None:
        if src.endswith(".sst"):
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy)


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
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{snapshot_id}-", dir=root))
    except OSError as exc:
        raise StorageError(f"cannot {verb} a snapshot in {root}: {exc}") from exc
    return final, tmp


def _manifest_crc(manifest: dict[str, Any]) -> int:
    """CRC32 of the manifest's canonical JSON without its own ``checksum`` field."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _write_file(path: Path, arr: npt.NDArray[Any]) -> None:
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)


def _checksum(path: Path) -> tuple[int, int]:
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
