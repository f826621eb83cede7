"""The data root a reshard writes (``TO`` of :mod:`embeddb.engine.durability.reshard`): which roots
it
may write, the locks it holds meanwhile, its record, and the undoing of a failed one.

A reshard writes a new root: one that does not exist, an empty directory, or the output of a
reshard that did not finish (killed half way: ``reshard-in-progress.json`` is there and
``reshard.json`` is not, see :mod:`embeddb.engine.durability.unfinished`), which it replaces. It
holds
the lock (:mod:`embeddb.engine.durability.dirlock`) of every source shard directory, of the root and
of every target shard directory until it is done, so no shard serves a half-written target and
no shard changes a source meanwhile.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from embeddb.engine.durability import unfinished
from embeddb.engine.durability.dirlock import LOCK_FILE, DirectoryLock
from embeddb.errors import InvalidArgumentError

__all__ = [
    "RESHARD_RECORD",
    "check_target",
    "locked",
    "remove_output",
    "shard_dirs",
    "unfinished_output",
    "write_record",
]

RESHARD_RECORD = "reshard.json"
_SHARD_DIR = re.compile(r"shard-(\d+)")


def shard_dirs(root: Path) -> dict[int, Path]:
    """The ``shard-<i>`` directories under ``root``, by ``i``."""
    return {
        int(found.group(1)): p
        for p in root.iterdir()
        if (found := _SHARD_DIR.fullmatch(p.name)) is not None and p.is_dir()
    }


@contextmanager
def locked(directory: Path, what: str, *, read_only_ok: bool = False) -> Iterator[None]:
    """``directory``'s lock, held in the block (``read_only_ok``: see
    :meth:`~embeddb.engine.durability.dirlock.DirectoryLock.acquire`).

    Raises:
        DirectoryInUseError: another process holds it.
    """
    lock = DirectoryLock.acquire(directory, what, read_only_ok=read_only_ok)
    try:
        yield
    finally:
        lock.release()


def unfinished_output(target: Path) -> bool:
    """Whether ``target`` is the output of a reshard that did not finish (its marker is there
    and ``reshard.json`` is not): a new reshard may replace it."""
    return (target / unfinished.RESHARDING).exists() and not (target / RESHARD_RECORD).exists()


def check_target(target: Path) -> None:
    """Raises:
    InvalidArgumentError: ``target`` exists and is neither an empty directory (its lock file
        aside) nor the output of a reshard that did not finish."""
    if not target.exists():
        return
    if target.is_dir():
        entries = [p for p in target.iterdir() if p.name != LOCK_FILE]
        if not entries or unfinished_output(target):
            return
    raise InvalidArgumentError(
        f"{target} exists and is not an empty directory; reshard writes a new data root"
    )


def write_record(target: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as ``target/reshard.json`` (atomically, fsynced).

    Raises:
        StorageError: it cannot be written.
    """
    unfinished.write_json(target / RESHARD_RECORD, record)


def remove_output(target: Path, existed: bool) -> None:
    """Undo a failed reshard: remove ``target`` (or only its contents, if it existed; its lock
    file, held by this reshard, stays)."""
    if not existed:
        shutil.rmtree(target, ignore_errors=True)
        return
    if target.is_dir():
        for entry in target.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
