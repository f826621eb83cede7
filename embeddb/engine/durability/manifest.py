"""A snapshot directory's manifest and the files it lists: the format, its checks, and where
each listed file is (see :mod:`embeddb.engine.durability.snapshot` for the whole layout).

The manifest (``manifest.json``, written last) is a JSON object::

    {"format_version": 1, "snapshot_id": "s1", "seq": 811, "created": 1710000000.0,
     "shard_index": 0, "num_shards": 2,
     "tables": {"t": {"dim": 4, "width": 8, "optimizer": "adagrad", "disk_rows": 120}},
     "files": {"disk/000012.sst": {"size": 4120, "crc32": 2914117705},
               "ram/t.ids": {"size": 64, "crc32": 1033489351}, ...},
     "checksum": 3480916611}

``checksum`` is the CRC32 of the canonical JSON of every other field (:func:`manifest_crc`):
it catches damage, not forgery — anyone can recompute it. So the keys of ``files`` are
untrusted names: every function here that reads a listed file resolves it inside the snapshot
directory first (:func:`embeddb.engine.storage.paths.resolve_inside`), refusing absolute paths,
``..`` components and symbolic links that lead out, with :class:`CorruptDataError`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from embeddb.engine.storage.paths import confined_root, open_inside, resolve_inside, walk_inside
from embeddb.errors import CorruptDataError, InvalidArgumentError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "check_id",
    "checksum",
    "describe",
    "entry_path",
    "load_table",
    "manifest_crc",
    "read_manifest",
    "read_manifest_text",
    "table_entries",
    "table_files",
    "verify",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the whole id: fullmatch
_CHUNK = 8 << 20


def check_id(snapshot_id: str) -> str:
    """``snapshot_id`` if it is a safe directory name (letters, digits, ``._-``; ≤ 128).

    Raises:
        InvalidArgumentError: anything else (a path, an empty or hidden name, a trailing
            newline).
    """
    if not isinstance(snapshot_id, str) or _ID.fullmatch(snapshot_id) is None:
        raise InvalidArgumentError(
            f"snapshot id must be 1-128 letters, digits, '.', '_' or '-' and not start with "
            f"'.', '_' or '-'; got {snapshot_id!r}"
        )
    return snapshot_id


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the snapshot directory ``path`` (structure checked, files not).

    Raises:
        CorruptDataError: missing, unreadable or malformed manifest, or an unknown format.
    """
    return read_manifest_text(confined_root(path, describe(path)), path)[1]


def verify(path: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Check every file of the snapshot at ``path`` against its manifest; return the manifest.

    Every listed file is resolved inside ``path`` (see the module docstring); the unlisted ones
    are looked for without following a symbolic link out of it.

    Args:
        path: the snapshot directory.
        progress: called with ``(bytes read, bytes listed)`` after every chunk read.

    Raises:
        CorruptDataError: naming the first file that escapes the snapshot directory, is
            missing, of another size, fails its checksum, or is present but not listed.
    """
    owner = describe(path)
    root = confined_root(path, owner)
    manifest = read_manifest_text(root, path)[1]
    listed = manifest["files"]
    total = sum(int(want["size"]) for want in listed.values())
    done = [0]

    def read(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    for rel, want in sorted(listed.items()):
        file = path / rel
        with open_inside(root, rel, owner) as f:
            try:
                size, crc = checksum(f, read if progress is not None else None)
            except OSError as exc:
                raise CorruptDataError(f"snapshot file {file} is unreadable: {exc}") from exc
        if size != want["size"]:
            raise CorruptDataError(
                f"snapshot file {file} has {size} bytes, its manifest says {want['size']}"
            )
        if crc != want["crc32"]:
            raise CorruptDataError(f"snapshot file {file} fails its CRC32 checksum")
    try:
        extra = sorted(
            entry
            for entry, _ in walk_inside(root, owner)
            if entry != MANIFEST and entry not in listed
        )
    except OSError as exc:
        raise CorruptDataError(f"{owner} cannot be listed: {exc}") from exc
    if extra:
        raise CorruptDataError(f"snapshot {path} holds files its manifest does not list: {extra}")
    return manifest


def entry_path(path: Path, entry: str) -> Path:
    """Where ``entry`` (e.g. ``disk``) of the snapshot ``path`` is, resolved inside it.

    Raises:
        CorruptDataError: it would lie outside the snapshot directory.
    """
    owner = describe(path)
    return resolve_inside(confined_root(path, owner), entry, owner)


def table_files(path: Path, name: str) -> tuple[Path, Path, Path]:
    """The ``(ids, rows, flags)`` files of table ``name``'s RAM tier in the snapshot ``path``,
    resolved inside it.

    Raises:
        CorruptDataError: the files would lie outside the snapshot directory.
    """
    ids, rows, flags = (entry_path(path, entry) for entry in table_entries(name))
    return ids, rows, flags


def load_table(
    path: Path, name: str, width: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """A table's captured RAM tier from a verified snapshot.

    Raises:
        CorruptDataError: a file escapes the snapshot directory or is unreadable, or the three
            files disagree on the row count or the width.
    """
    owner = describe(path)
    root = confined_root(path, owner)
    arrays: list[npt.NDArray[Any]] = []
    dtypes = ("<u8", "<f4", "u1")
    for entry, dtype in zip(table_entries(name), dtypes, strict=True):
        with open_inside(root, entry, owner) as f:
            try:
                arrays.append(np.fromfile(f, dtype=dtype))
            except (OSError, ValueError) as exc:
                raise CorruptDataError(
                    f"cannot read table {name!r} of snapshot {path}: {exc}"
                ) from exc
    ids = arrays[0].astype(np.uint64, copy=False)
    flat = arrays[1].astype(np.float32, copy=False)
    flags = arrays[2].astype(np.uint8, copy=False)
    if flat.size != ids.size * width or flags.size != ids.size:
        raise CorruptDataError(
            f"table {name!r} of snapshot {path}: {ids.size} ids, {flat.size} floats (width "
            f"{width}) and {flags.size} flags do not match"
        )
    return ids, flat.reshape(ids.size, width), flags


def describe(path: Path) -> str:
    """How messages name the snapshot directory ``path``: ``snapshot <path>``."""
    return f"snapshot {path}"


def table_entries(name: str) -> tuple[str, str, str]:
    """The entries of table ``name``'s ``ids``, ``rows`` and ``flags`` files:
    ``ram/<name>.ids`` and so on, the whole name kept (tables ``a.b`` and ``a.c`` have files of
    their own; the resolver refuses a name that would lead out of the snapshot)."""
    if not name or "/" in name or "\\" in name or "\0" in name:
        raise CorruptDataError(f"table name {name!r} names no snapshot file")
    ids, rows, flags = (f"ram/{name}.{suffix}" for suffix in ("ids", "rows", "flags"))
    return ids, rows, flags


def read_manifest_text(root: Path, path: Path) -> tuple[bytes, dict[str, Any]]:
    """The bytes and the checked content of the manifest of the snapshot ``path``, whose
    resolved directory (:func:`~embeddb.engine.storage.paths.confined_root`) is ``root``.

    Raises:
        CorruptDataError: see :func:`read_manifest`.
    """
    with open_inside(root, MANIFEST, describe(path)) as f:
        try:
            text = f.read()
        except OSError as exc:
            raise CorruptDataError(f"{path / MANIFEST} is unreadable: {exc}") from exc
    return text, _parse_manifest(text, path / MANIFEST)


def _parse_manifest(text: bytes, file: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {manifest.get('format_version')!r}")
        if manifest.get("checksum") != manifest_crc(manifest):
            raise ValueError("its checksum does not match its content")
        for key, kind in (("seq", int), ("files", dict), ("tables", dict), ("snapshot_id", str)):
            if not isinstance(manifest.get(key), kind):
                raise ValueError(f"field {key!r} missing or not a {kind.__name__}")
        for rel, want in manifest["files"].items():
            if not (isinstance(want, dict) and _is_count(want.get("size"))):
                raise ValueError(f"file {rel!r} has no size")
            if not (_is_count(want.get("crc32")) and want["crc32"] <= 0xFFFFFFFF):
                raise ValueError(f"file {rel!r} has no CRC32")
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors, absurd nesting
        raise CorruptDataError(f"{file} is unreadable: {exc}") from exc
    return manifest


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manifest_crc(manifest: dict[str, Any]) -> int:
    """The CRC32 of the manifest's canonical JSON without its own ``checksum`` field."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def checksum(f: BinaryIO, on_read: Callable[[int], None] | None = None) -> tuple[int, int]:
    """``(size, CRC32)`` of the rest of file ``f``; ``on_read(bytes)`` after every chunk."""
    crc = 0
    size = 0
    while chunk := f.read(_CHUNK):
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
        if on_read is not None:
            on_read(len(chunk))
    return size, crc
