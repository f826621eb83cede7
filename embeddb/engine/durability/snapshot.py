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
then :class:`SnapshotWriter` (this module) writes the files, checksums them, writes the manifest,
fsyncs and renames the directory into place. A crash at any point leaves either the complete
snapshot or a temporary directory. :func:`verify` re-reads every file against the manifest, so
a flipped byte or a truncated file anywhere is reported with its path; nothing is loaded
unverified.

The other parts of snapshots:

- :mod:`embeddb.engine.durability.manifest`: the manifest's format and checks (:func:`verify`,
  :func:`read_manifest`, :func:`check_id`, :func:`load_table`);
- :mod:`embeddb.engine.durability.snapshot_dirs`: the ``snapshots/`` directory (listing, pruning,
  removing incomplete snapshots, copying a disk checkpoint out) and the private files and
  temporary directory a new snapshot is written in;
- :mod:`embeddb.engine.durability.snapshot_transfer`: sending a snapshot to another machine (a
  follower's bootstrap) in checked chunks, and receiving one.

The names other packages use (the follower's receiver, the CLI's listing, the manifest's
checks) are importable from here.

**Paths.** A snapshot directory may be copied in by hand (``snapshots/`` is where a checkpoint
is imported) or received from another machine, so its manifest is data, not a list of paths
to trust. Every reader — :func:`verify` (restore, crash recovery, a received snapshot),
:class:`~.snapshot_transfer.SnapshotReader`, :func:`load_table`, :func:`table_files` and
:func:`entry_path` (reshard), :func:`~.snapshot_dirs.copy_disk` — resolves each listed file
inside the snapshot directory with :func:`embeddb.engine.storage.paths.resolve_inside` and
refuses, with :class:`CorruptDataError`, an absolute path, a ``..`` component or a symbolic
link that leads out of it. The directory itself may be a symbolic link
(``snapshots/ckpt-1 -> /backups/ckpt-1``): its target is the boundary.

**Privacy.** The files written for a snapshot are created 0600 and their directories 0700,
whatever the umask; the disk checkpoint's files (hard links of the live RocksDB files) are
made 0600 too.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from embeddb.engine.durability.fileio import REAL, FileIO, storage_error
from embeddb.engine.durability.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    check_id,
    checksum,
    entry_path,
    load_table,
    manifest_crc,
    read_manifest,
    table_entries,
    table_files,
    verify,
)
from embeddb.engine.durability.snapshot_dirs import (
    SnapshotInfo,
    create_private,
    list_snapshots,
    make_private,
    private_dir,
    temporary_dir,
)
from embeddb.engine.durability.snapshot_transfer import Chunk, SnapshotReceiver
from embeddb.engine.storage.paths import confined_root, resolve_inside
from embeddb.errors import CorruptDataError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Chunk",
    "SnapshotInfo",
    "SnapshotReceiver",
    "SnapshotWriter",
    "check_id",
    "entry_path",
    "list_snapshots",
    "load_table",
    "read_manifest",
    "reused_sums",
    "table_files",
    "verify",
]

_SYNC_THREADS = 8  # files checksummed and fsynced at once by a commit

_manifest_crc = manifest_crc  # its former name, still used by tools and tests


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
        self.final, self.tmp = temporary_dir(root, snapshot_id, "create")
        self._owner = f"snapshot {snapshot_id!r} being written in {self.tmp}"
        try:
            private_dir(self.tmp / "ram")
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
        self.write_table_parts(name, [(ids, rows, flags)])

    def write_table_parts(
        self,
        name: str,
        parts: Sequence[
            tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.uint8]]
        ],
    ) -> None:
        """Write one table's captured RAM tier given in parts (one per stripe): the files are
        those of :meth:`write_table` with the parts' rows concatenated, written part by part
        (no concatenated copy in memory).

        Raises:
            CorruptDataError: ``name`` would put a file outside the snapshot (``..``, ``/``).
            StorageFullError, StorageFaultError: a write failed.
        """
        root = confined_root(self.tmp, self._owner)
        kinds = ("<u8", "<f4", np.uint8)
        for k, entry in enumerate(table_entries(name)):
            path = resolve_inside(root, entry, self._owner)
            chunks = [
                np.ascontiguousarray(part[k].astype(kinds[k], copy=False))
                .reshape(-1)
                .view(np.uint8)
                for part in parts
            ]
            try:
                self._write(path, *(c.data for c in chunks))
            except OSError as exc:
                raise storage_error(self._failed, exc) from exc

    def _write(self, path: Path, *chunks: bytes | memoryview) -> None:
        fd = create_private(path)
        try:
            for data in chunks:
                self._io.write_all(fd, data)
        finally:
            os.close(fd)

    def commit(self, seq: int, meta: dict[str, Any], previous: Path | None = None) -> SnapshotInfo:
        """Checksum every file, write the manifest (with ``seq`` and ``meta``), fsync, rename.

        An SST file of the disk checkpoint that is the very file (same device and inode: a
        hard link of the same live RocksDB file) an SST entry of the complete snapshot
        ``previous`` lists, with the listed size, keeps that entry's CRC32 and is not read
        again (:func:`reused_sums`): RocksDB never rewrites an SST file, so a snapshot reads
        only the files new since the previous one. Loading checks every file as before.

        Raises:
            StorageFullError, StorageFaultError: a write, fsync or rename failed (nothing of
                the snapshot is left).
        """
        renamed = False
        try:
            make_private(self.disk_dir)  # hard links of the live files: those become 0600 too
            paths = sorted(p for p in self.tmp.rglob("*") if p.is_file())
            # the files' fsyncs overlap (one per table file and SST: waited for one by one,
            # they were most of a small snapshot's time); the first failure is raised
            known = reused_sums(previous, self.disk_dir) if previous is not None else {}
            fresh = [p for p in paths if p not in known]
            with ThreadPoolExecutor(max_workers=max(1, min(_SYNC_THREADS, len(fresh)))) as pool:
                computed = dict(zip(fresh, pool.map(self._checksum_and_sync, fresh), strict=True))
            sums = [known[p] if p in known else computed[p] for p in paths]
            self.reused = len(known)
            files = {
                path.relative_to(self.tmp).as_posix(): {"size": size, "crc32": crc}
                for path, (size, crc) in zip(paths, sums, strict=True)
            }
            total = sum(size for size, _ in sums)
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
            fd = create_private(self.tmp / MANIFEST)
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

    reused = 0  # files whose checksum the last commit took from the previous snapshot

    def _checksum_and_sync(self, path: Path) -> tuple[int, int]:
        with open(path, "rb") as f:
            size, crc = checksum(f)
            self._io.fsync(f.fileno())
        return size, crc

    def abort(self) -> None:
        """Remove the temporary directory. Idempotent."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._io.fsync_dir(fd)
        finally:
            os.close(fd)


def reused_sums(previous: Path, disk_dir: Path) -> dict[Path, tuple[int, int]]:
    """``(size, CRC32)`` of the SST files under ``disk_dir`` (a new disk checkpoint) that are
    the same files as SST entries of the complete snapshot ``previous``, from its manifest.

    Conservative: only ``disk/*.sst`` entries (RocksDB's immutable files; its ``MANIFEST``,
    ``CURRENT`` and ``OPTIONS`` files are copies and always read), matched by device and
    inode of both paths stat'ed now (so both name one file) and by size (the manifest's, the
    file's now). A previous snapshot that cannot be read, or an entry that cannot be
    resolved inside it or stat'ed, gives nothing: those files are read. Were the shared file
    changed after the previous snapshot checksummed it, the reused CRC32 is the one it had
    then, so loading either snapshot reports it.
    """
    owner = f"previous snapshot {previous}"
    try:
        listed = read_manifest(previous)["files"]
        root = confined_root(previous, owner)
    except (CorruptDataError, OSError):
        return {}
    by_inode: dict[tuple[int, int], tuple[int, int]] = {}
    for entry, want in listed.items():
        if not (entry.startswith("disk/") and entry.endswith(".sst")):
            continue
        try:
            st = os.lstat(resolve_inside(root, entry, owner))
        except (CorruptDataError, OSError):
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size == want["size"]:
            by_inode[(st.st_dev, st.st_ino)] = (int(want["size"]), int(want["crc32"]))
    found: dict[Path, tuple[int, int]] = {}
    if not by_inode or not disk_dir.is_dir():
        return found
    for path in disk_dir.rglob("*.sst"):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        sums = by_inode.get((st.st_dev, st.st_ino))
        if sums is not None and stat.S_ISREG(st.st_mode) and st.st_size == sums[0]:
            found[path] = sums
    return found
