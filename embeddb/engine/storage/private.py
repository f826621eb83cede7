"""Private data: a shard's directory and files are its own user's only (docs/architecture.md §6).

Two measures, applied together:

* :func:`private_dir` makes a data directory ``0700``: created so, or tightened so when it
  exists with looser bits (:class:`~embeddb.engine.shard.Shard` calls it on the directory it opens).
  Files inside it are then out of other users' reach whatever their own modes.
* ``embeddb.transport.rpc.lifecycle.private_umask`` sets the process umask to ``0o077`` while a
server
  runs (``embeddb serve`` and the shards ``embeddb cluster`` starts, ``embeddb serve-model``), so
  every file the process creates is ``0600`` and every directory ``0700``: RocksDB's files,
  whose modes no embeddb code chooses, the clean-shutdown record, snapshots, exports. A copy
  taken elsewhere (``cp -a`` of a snapshot) keeps those modes.

A library user who opens a :class:`~embeddb.engine.shard.Shard` in their own process keeps their own
umask: only the data directory itself is tightened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "private_dir"]

PRIVATE_DIR_MODE = 0o700


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) or tighten it to mode ``0700``.

    Missing parents are created with the process's usual modes; only ``path`` itself is made
    private. A symbolic link is followed: its target directory is the one tightened.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: ``path`` cannot be created, or its mode cannot be changed (another user owns
            it, a read-only file system).
    """
    directory = Path(path)
    directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) != PRIVATE_DIR_MODE:
        directory.chmod(PRIVATE_DIR_MODE)
    return directory
