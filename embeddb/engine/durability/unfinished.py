"""Markers of offline operations that change a data directory in several steps, so that one
interrupted half way (a crash, ``kill -9``, a full disk) is recognised at the next start and
named, with the command that finishes it, instead of being served half done::

    DIR/restore-in-progress.json   {"operation": "restore", "snapshot_id": "ckpt-1", ...}
        written by a restore (``embeddb restore``, ``embeddb serve --restore``) before it sets
        the update log aside and replaces the disk tier; removed once the snapshot is loaded
    ROOT/reshard-in-progress.json and ROOT/shard-<j>/reshard-in-progress.json
        {"operation": "reshard", "snapshot_id": ..., "source": ..., "target": ...,
         "num_shards": M}: written by ``embeddb reshard`` before it writes any target shard;
        removed after ROOT/reshard.json, the last file it writes

Each marker is written atomically (a temporary file renamed) and read back by
:func:`unfinished`, which :class:`~embeddb.engine.recovery.ShardOpener` calls before opening a
directory.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from embeddb.errors import StorageError

__all__ = ["RESHARDING", "RESTORING", "clear", "mark", "read_mark", "unfinished", "write_json"]

RESTORING = "restore-in-progress.json"
RESHARDING = "reshard-in-progress.json"
_FORMAT_VERSION = 1


def mark(directory: Path, name: str, **fields: Any) -> None:
    """Write marker ``name`` in ``directory`` (atomically, fsynced).

    Raises:
        StorageError: it cannot be written.
    """
    doc = {"format_version": _FORMAT_VERSION, **fields, "started": time.time()}
    write_json(directory / name, doc)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the JSON file ``path``, atomically (a temporary file, fsynced, then
    renamed over it).

    Raises:
        StorageError: it cannot be written.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc}") from exc


def clear(directory: Path, name: str) -> None:
    """Remove marker ``name`` from ``directory`` (the operation finished)."""
    (directory / name).unlink(missing_ok=True)


def read_mark(directory: Path, name: str) -> dict[str, Any] | None:
    """Marker ``name`` of ``directory``; None when absent, ``{}`` when unreadable."""
    path = directory / name
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def unfinished(directory: Path) -> str | None:
    """Why ``directory`` cannot be opened: a restore or reshard that did not finish, with the
    command that finishes it; None when neither left a marker."""
    quoted = shlex.quote(str(directory))
    restore = read_mark(directory, RESTORING)
    if restore is not None:
        snapshot = str(restore.get("snapshot_id", "SNAPSHOT"))
        return (
            f"{directory} is half restored: a restore of snapshot {snapshot!r} was interrupted "
            f"(its update log is set aside in log.before-restore-*). Finish it: embeddb restore "
            f"--data-dir {quoted} --snapshot {shlex.quote(snapshot)} (with the shard's --config, "
            f"--shard-index and --num-shards), or start it with embeddb serve --restore "
            f"{shlex.quote(snapshot)}"
        )
    reshard = read_mark(directory, RESHARDING)
    if reshard is not None:
        snapshot = str(reshard.get("snapshot_id", "SNAPSHOT"))
        source, target = reshard.get("source", "FROM"), reshard.get("target", "TO")
        return (
            f"{directory} was being written by an embeddb reshard that did not finish. Run it "
            f"again (it replaces the unfinished output): embeddb reshard --from "
            f"{shlex.quote(str(source))} --to {shlex.quote(str(target))} --num-shards "
            f"{reshard.get('num_shards', 'M')} --snapshot {shlex.quote(snapshot)}"
        )
    return None
