"""The shards of a job checkpoint opened in-process, read-only: lookups for
:class:`~embeddb.serving.InferCtx` without shard servers (``embeddb serve-model
--from-checkpoint``).

A job with a ``checkpoint_dir`` keeps its local shards' data under it
(:meth:`JobConfig.shard_data_dir <embeddb.trainer.launcher.job.JobConfig.shard_data_dir>`), and
every
checkpoint is one snapshot per shard under the checkpoint's id::

    CHECKPOINT_DIR/
      ckpt-000000300/manifest.json          num_shards, snapshot_id
      (embeddb.trainer.checkpoints.files)
      shards/shard-0/snapshots/ckpt-000000300/    shard 0's snapshot
      shards/shard-1/snapshots/ckpt-000000300/    shard 1's snapshot

:meth:`LocalShards.open` copies each shard's snapshot into a private temporary directory
(the checkpoint's files are never opened for writing: a shard restoring a snapshot moves its
update log aside and writes its disk tier; the copy costs the snapshot's size on disk, in the
temporary directory, for as long as it is open) and opens it there as a read-only
:class:`~embeddb.engine.shard.Shard` (a follower: every mutation is refused). Lookups route ids
exactly as the cluster does (:func:`embeddb.common.routing.split_by_shard`), so each shard answers
for the ids it owns, and have the semantics of a client's evaluation lookups
(``Client.lookup_many(train=False)``): nothing is inserted or refreshed, an id no shard stores
reads as zeros.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from embeddb.common.arrays import F32
from embeddb.common.routing import as_ids, split_by_shard
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.errors import FailedPreconditionError, NotFoundError, TableNotFoundError
from embeddb.trainer.checkpoints.files import CheckpointInfo, latest_checkpoint, read_checkpoint

__all__ = ["LocalShards", "LocalTable", "shard_snapshot_dir"]

logger = logging.getLogger(__name__)

SHARDS_DIR = "shards"  # JobConfig.shard_data_dir() relative to the checkpoint directory


@dataclass(frozen=True)
class LocalTable:
    """A table as :meth:`LocalShards.list_tables` describes it (as a shard does)."""

    name: str
    dim: int


def shard_snapshot_dir(checkpoint_dir: Path, shard_index: int, snapshot_id: str) -> Path:
    """Where shard ``shard_index`` of a job keeps snapshot ``snapshot_id``."""
    return checkpoint_dir / SHARDS_DIR / f"shard-{shard_index}" / "snapshots" / snapshot_id


class LocalShards:
    """The shards of one checkpoint, open read-only in this process (see the module
    docstring). Thread-safe (a :class:`~embeddb.engine.shard.Shard` is).

    Use :meth:`open`; close with :meth:`close` (or ``with``), which removes the private copy.

    Attributes:
        checkpoint: the checkpoint served.
        shards: the open shards, in shard order.
    """

    def __init__(self, checkpoint: CheckpointInfo, shards: Sequence[Shard], workdir: Path) -> None:
        self.checkpoint = checkpoint
        self.shards = list(shards)
        self._workdir = workdir
        self._closed = False

    @classmethod
    def open(
        cls,
        checkpoint_dir: str | os.PathLike[str],
        config: EmbeddingConfig,
        *,
        checkpoint_id: str | None = None,
    ) -> LocalShards:
        """Open the shards of a checkpoint of ``checkpoint_dir`` (default: the latest).

        Args:
            checkpoint_dir: a job's ``checkpoint_dir``.
            config: the embedding config (the exported model's ``embedding.yaml``).
            checkpoint_id: the checkpoint; ``None``: the latest complete one.

        Raises:
            NotFoundError: no checkpoint in ``checkpoint_dir``, no such checkpoint, or a shard
                without the checkpoint's snapshot (its data is not under
                ``checkpoint_dir/shards``, or the snapshot was pruned).
            CorruptDataError: a snapshot fails its checks, or its tables contradict
                ``config`` (another dim or optimizer).
            StorageError: the private copy cannot be written.
        """
        root = Path(checkpoint_dir)
        if checkpoint_id is None:
            info = latest_checkpoint(root)
            if info is None:
                raise NotFoundError(
                    f"{root} holds no complete checkpoint (a folder with a manifest.json): "
                    "give a job's checkpoint_dir after it saved a checkpoint"
                )
        else:
            info = read_checkpoint(root, checkpoint_id)
        sources = [shard_snapshot_dir(root, k, info.snapshot_id) for k in range(info.num_shards)]
        for k, source in enumerate(sources):
            if not (source / "manifest.json").is_file():
                raise NotFoundError(
                    f"shard {k} of checkpoint {info.checkpoint_id} has no complete snapshot "
                    f"{info.snapshot_id!r} at {source} (only a job's local shards keep their "
                    "data under its checkpoint_dir; a pruned snapshot is gone)"
                )
        workdir = Path(tempfile.mkdtemp(prefix="embeddb-checkpoint-"))
        shards: list[Shard] = []
        try:
            for k, source in enumerate(sources):
                data_dir = workdir / f"shard-{k}"
                shutil.copytree(source, data_dir / "snapshots" / info.snapshot_id)
                shards.append(
                    Shard(
                        config,
                        data_dir,
                        shard_index=k,
                        num_shards=info.num_shards,
                        restore=info.snapshot_id,
                        follower=True,  # read-only: no update log, mutations refused
                    )
                )
        except BaseException:
            for shard in shards:
                shard.close()
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        logger.info(
            "opened checkpoint %s (%d shards) read-only from %s",
            info.checkpoint_id,
            info.num_shards,
            root,
        )
        return cls(info, shards, workdir)

    @property
    def addresses(self) -> tuple[str, ...]:
        """Where each shard's data comes from (for logs; no network address)."""
        root = self.checkpoint.path.parent
        return tuple(
            str(shard_snapshot_dir(root, k, self.checkpoint.snapshot_id))
            for k in range(len(self.shards))
        )

    def check_topology(self) -> None:
        """Nothing to check: each shard was opened at its index of the checkpoint's count."""

    def list_tables(self) -> list[LocalTable]:
        """The tables the shards serve (every shard serves every table)."""
        config = self.shards[0].config
        return [LocalTable(name, t.dim) for name, t in config.tables.items()]

    def lookup_many(self, requests: Mapping[str, object], train: bool = False) -> dict[str, F32]:
        """Every table's vectors of its ids, in the caller's order, as
        ``Client.lookup_many(train=False)`` returns them.

        Args:
            requests: table -> ids (1-D non-negative integers; duplicates allowed).
            train: must be false: the shards are read-only.

        Raises:
            FailedPreconditionError: ``train`` (a training lookup needs writable shards), or
                the shards are closed.
            TableNotFoundError, InvalidArgumentError: an unknown table, bad ids.
        """
        if train:
            raise FailedPreconditionError(
                "the checkpoint's shards are open read-only: evaluation lookups only"
            )
        if self._closed:
            raise FailedPreconditionError("the checkpoint's shards are closed")
        tables = self.shards[0].config.tables
        n = len(self.shards)
        out: dict[str, F32] = {}
        parts: list[list[tuple[str, object, bool]]] = [[] for _ in range(n)]
        positions: list[list[tuple[str, np.ndarray]]] = [[] for _ in range(n)]
        for table, raw in requests.items():
            if table not in tables:
                raise TableNotFoundError(f"no table {table!r} (tables: {', '.join(tables)})")
            ids = as_ids(raw, f"{table}.ids")
            out[table] = np.zeros((ids.size, tables[table].dim), dtype=np.float32)
            order, bounds = split_by_shard(ids, n)
            for k in range(n):
                at = order[bounds[k] : bounds[k + 1]]
                if at.size:
                    parts[k].append((table, ids[at], False))
                    positions[k].append((table, at))
        for k, shard in enumerate(self.shards):
            if not parts[k]:
                continue
            for (table, at), vectors in zip(positions[k], shard.lookup_many(parts[k]), strict=True):
                out[table][at] = vectors
        return out

    def close(self) -> None:
        """Close the shards and remove the private copy. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for shard in self.shards:
                shard.close()
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LocalShards:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LocalShards({str(self.checkpoint.path)!r}, shards={len(self.shards)}, "
            f"snapshot={self.checkpoint.snapshot_id!r})"
        )
