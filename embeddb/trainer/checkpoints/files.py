"""Job checkpoints: the dense side in one file, the embedding side as one snapshot per shard.

A checkpoint directory holds one folder per checkpoint id; the folder is a checkpoint only once
its manifest, written last, exists::

    checkpoints/
      ckpt-000000120/
        dense.pt        torch.save({"model": state_dict, "optimizer": state_dict,
                                    "scaler": state_dict | None})
        manifest.json   {"checkpoint_id": "ckpt-000000120", "step": 120, "samples": 30720,
                         "num_shards": 2, "snapshot_id": "ckpt-000000120", "created": ...}

Every shard holds a snapshot named ``snapshot_id`` (taken by
:meth:`~embeddb.client.Client.snapshot`, the same id as the checkpoint). Restoring a checkpoint
is two halves: the dense side with :meth:`TrainCtx.load_checkpoint
<embeddb.trainer.ctx.TrainCtx.load_checkpoint>`, the embedding side by starting the shards from
the snapshot (``embeddb serve --restore ID``, ``Shard(restore=ID)``, or
:func:`restore_local_shards` for the directories of a local cluster, offline).

Files are written to a temporary name and renamed, so a crash leaves no half-written file under
a final name, and a folder without a manifest is ignored by :func:`latest_checkpoint`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embeddb.errors import (
    ConfigError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

__all__ = [
    "DENSE_FILE",
    "MANIFEST",
    "CheckpointInfo",
    "checkpoint_id_for",
    "free_checkpoint_id",
    "latest_checkpoint",
    "read_checkpoint",
    "restore_local_shards",
    "write_checkpoint",
]

MANIFEST = "manifest.json"
DENSE_FILE = "dense.pt"
# The shards' snapshot id rule (embeddb.engine.durability.snapshot.check_id), matched whole.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's manifest records.

    Attributes:
        checkpoint_id: the folder's name, and every shard's snapshot id.
        step: training steps (``backward`` calls) of this rank before the checkpoint.
        samples: training samples of this rank before the checkpoint.
        num_shards: shards that took the snapshot.
        snapshot_id: the shards' snapshot id.
        created: UNIX time the manifest was written.
        path: the checkpoint's folder (not stored in the manifest).
    """

    checkpoint_id: str
    step: int
    samples: int
    num_shards: int
    snapshot_id: str
    created: float
    path: Path

    @property
    def dense_path(self) -> Path:
        return self.path / DENSE_FILE


def checkpoint_id_for(step: int) -> str:
    """The default id of a checkpoint taken after ``step`` steps (sorts by step)."""
    return f"ckpt-{step:09d}"


def free_checkpoint_id(
    base: str, directory: str | os.PathLike[str], shard_snapshots: Sequence[Sequence[Any]]
) -> str:
    """``base``, or ``base.1``, ``base.2``, ... : the first id that names no folder in
    ``directory`` and no snapshot of any shard (``shard_snapshots``: per shard, objects with a
    ``snapshot_id``, as :meth:`~embeddb.client.Client.list_snapshots` returns).

    A run killed after its shards snapshotted ``base`` but before the manifest was written
    leaves that id taken; after resuming from an earlier checkpoint the job reaches the same
    step again and must not collide with the orphan (which the shards' retention drops later).
    """
    taken = {info.snapshot_id for infos in shard_snapshots for info in infos}
    root = Path(directory)
    candidate, k = base, 0
    while candidate in taken or (root / candidate).exists():
        k += 1
        candidate = f"{base}.{k}"
    return check_id(candidate)


def check_id(checkpoint_id: str) -> str:
    """``checkpoint_id`` if it is a valid checkpoint id, which is also the shards' snapshot id.

    Raises:
        InvalidArgumentError: anything but 1-128 letters, digits or ``._-`` starting with a
            letter or digit (a path, ``..``, a trailing newline).
    """
    if not isinstance(checkpoint_id, str) or _ID.fullmatch(checkpoint_id) is None:
        raise InvalidArgumentError(
            f"a checkpoint id needs 1-128 letters, digits or ._-, starting with a letter or "
            f"digit, got {checkpoint_id!r}"
        )
    return checkpoint_id


def write_checkpoint(
    directory: str | os.PathLike[str],
    checkpoint_id: str,
    dense: dict[str, Any],
    *,
    step: int,
    samples: int,
    num_shards: int,
) -> CheckpointInfo:
    """Write the dense state, then the manifest (each atomically). The shards' snapshot must
    already be taken under ``checkpoint_id``.

    Raises:
        InvalidArgumentError: a bad id, or a checkpoint of that id already exists.
    """
    import torch

    folder = Path(directory) / check_id(checkpoint_id)
    if (folder / MANIFEST).exists():
        raise InvalidArgumentError(f"checkpoint {checkpoint_id!r} already exists in {directory}")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{DENSE_FILE}.tmp"
    torch.save(dense, tmp)
    _fsync_rename(tmp, folder / DENSE_FILE)
    info = CheckpointInfo(
        checkpoint_id, step, samples, num_shards, checkpoint_id, time.time(), folder
    )
    record = {k: v for k, v in asdict(info).items() if k != "path"}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    _fsync_rename(tmp, folder / MANIFEST)
    return info


def read_checkpoint(directory: str | os.PathLike[str], checkpoint_id: str) -> CheckpointInfo:
    """The manifest of checkpoint ``checkpoint_id``.

    Raises:
        NotFoundError: no complete checkpoint of that id (no manifest).
        ConfigError: an unreadable manifest.
    """
    folder = Path(directory) / check_id(checkpoint_id)
    path = folder / MANIFEST
    if not path.is_file():
        raise NotFoundError(f"no checkpoint {checkpoint_id!r} in {directory} (no {MANIFEST})")
    try:
        record = json.loads(path.read_text())
        return CheckpointInfo(
            checkpoint_id=str(record["checkpoint_id"]),
            step=int(record["step"]),
            samples=int(record["samples"]),
            num_shards=int(record["num_shards"]),
            snapshot_id=str(record["snapshot_id"]),
            created=float(record["created"]),
            path=folder,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(str(path), f"is not a checkpoint manifest: {exc}") from exc


def latest_checkpoint(directory: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The complete checkpoint with the most steps (then the newest), or ``None``."""
    root = Path(directory)
    if not root.is_dir():
        return None
    found = [
        read_checkpoint(root, p.name)
        for p in root.iterdir()
        if p.is_dir() and _ID.fullmatch(p.name) and (p / MANIFEST).is_file()
    ]
    return max(found, key=lambda c: (c.step, c.created), default=None)


def restore_local_shards(
    config_path: str | os.PathLike[str] | None,
    data_dir: str | os.PathLike[str],
    num_shards: int,
    snapshot_id: str,
) -> None:
    """Roll every shard directory of a local cluster (``data_dir/shard-i``, the layout of
    ``embeddb cluster``) back to ``snapshot_id``, offline, with ``embeddb restore`` (the
    trainer reaches shards only through the client or the command line); start the cluster
    afterwards. The shards must be stopped.

    Raises:
        FailedPreconditionError: a shard could not be restored (no such snapshot, a corrupt
            one); the message quotes ``embeddb restore``.
    """
    for k in range(num_shards):
        command = [sys.executable, "-m", "embeddb.cli", "restore"]
        if config_path is not None:
            command += ["--config", str(config_path)]
        command += ["--data-dir", str(Path(data_dir) / f"shard-{k}"), "--snapshot", snapshot_id]
        command += ["--shard-index", str(k), "--num-shards", str(num_shards)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise FailedPreconditionError(
                f"shard {k} could not be restored to {snapshot_id!r}: "
                f"{(done.stderr or done.stdout).strip()}"
            )


def _fsync_rename(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
