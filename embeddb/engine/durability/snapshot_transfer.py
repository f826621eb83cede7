"""Sending a complete snapshot to another machine and receiving one (a follower's bootstrap).

:class:`SnapshotReader` opens every file of a complete snapshot and cuts them into
``(path, offset, data)`` chunks (:class:`Chunk`), the manifest last, checking each file's size
and CRC32 against the manifest as it goes; :class:`SnapshotReceiver` writes the chunks into a
temporary directory and, on :meth:`~SnapshotReceiver.commit`, verifies the whole snapshot
before renaming it into place. Both resolve every file inside the snapshot directory
(:func:`embeddb.engine.storage.paths.resolve_inside`): the manifest and the chunks' paths are
data, not paths to trust.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, NamedTuple

from embeddb.engine.durability.manifest import (
    MANIFEST,
    check_id,
    describe,
    read_manifest_text,
    verify,
)
from embeddb.engine.durability.snapshot_dirs import (
    SnapshotInfo,
    create_private,
    private_dirs,
    temporary_dir,
)
from embeddb.engine.storage.paths import confined_root, open_inside, resolve_inside
from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = ["Chunk", "SnapshotReader", "SnapshotReceiver"]


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
        self.final, self.tmp = temporary_dir(root, snapshot_id, "receive")
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
                private_dirs(self._root, target.parent)
                f = os.fdopen(create_private(target), "wb")  # closed by commit or abort
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
