"""Checkpointing a running job: the logic of :meth:`TrainCtx.save_checkpoint
<embeddb.trainer.ctx.TrainCtx.save_checkpoint>` and :meth:`TrainCtx.load_checkpoint
<embeddb.trainer.ctx.TrainCtx.load_checkpoint>`.

What a checkpoint is on disk (its folder, ``dense.pt``, the manifest, the ids) is
:mod:`embeddb.trainer.checkpoints.files`; this module takes one consistently across the job's ranks
and shards, and restores its dense side. Saving, every rank at the same step::

    every rank   apply pending dense updates (``async`` mode), wait until its embedding
                 gradients are applied and its lookups answered
    barrier      no push or lookup of the job is in flight while the shards snapshot
    rank 0       snapshot every shard under the checkpoint id, then write dense.pt and the
                 manifest (a failure is raised after the second barrier, on rank 0)
    barrier      rank 0 broadcasts the id it took (a free one may differ from the default)

Batches already looked up ahead keep their embeddings: in ``hybrid`` mode a resumed run looks
them up again, fresher. The embedding side of a restore is the shards' business: start them
from the snapshot (``embeddb serve --restore ID``,
:func:`~embeddb.trainer.checkpoints.files.restore_local_shards`) for an exact resume; shards left as
they are keep their newer embeddings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from embeddb.client import Client, ClientOptions
from embeddb.errors import ConfigError, NotFoundError
from embeddb.trainer.checkpoints import files as ckpt

if TYPE_CHECKING:
    from torch import nn

    from embeddb.trainer.config import TrainerConfig
    from embeddb.trainer.dense import DenseUpdater
    from embeddb.trainer.dist import DistEnv


class TrainCtx(Protocol):
    """What checkpointing reads and restores of a training context
    (:class:`embeddb.trainer.ctx.TrainCtx`, which calls these functions)."""

    step: int
    samples: int
    addresses: tuple[str, ...]
    dist_env: DistEnv
    config: TrainerConfig
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dense: DenseUpdater


__all__ = ["load_checkpoint", "save_checkpoint"]

logger = logging.getLogger(__name__)


def save_checkpoint(
    ctx: TrainCtx,
    directory: str | os.PathLike[str],
    checkpoint_id: str | None,
    *,
    drain: Callable[[], None],
) -> ckpt.CheckpointInfo:
    """Checkpoint the job of ``ctx`` (see the module docstring): dense parameters, optimizer
    state and counters in ``directory/ID/dense.pt``, and a snapshot of every shard under ``ID``.

    Args:
        ctx: this rank's training context.
        directory: the checkpoint directory (shared by the ranks).
        checkpoint_id: ``None``: ``ckpt-<step, 9 digits>``, or ``ckpt-<step>.<k>`` (the first
            ``k`` free) when a run killed between its snapshot and its manifest left that id
            taken on a shard, and the job has come back to the same step.
        drain: waits until nothing of this rank is in flight (dense updates, pushes, lookups).

    Returns:
        The checkpoint's manifest.

    Raises:
        InvalidArgumentError: a bad id, or one already taken (in ``directory`` or by a shard).
        FailedPreconditionError: a shard keeps no snapshots (no data directory).
    """
    name = ckpt.check_id(checkpoint_id or ckpt.checkpoint_id_for(ctx.step))
    pick_free_id = checkpoint_id is None
    drain()
    distributed = ctx.dist_env.distributed and dist.is_initialized()
    if distributed:
        dist.barrier()
    info: ckpt.CheckpointInfo | None = None
    failure: BaseException | None = None
    if ctx.dist_env.rank == 0:
        try:
            with Client(ctx.addresses, ClientOptions(token=ctx.config.worker.token)) as client:
                if pick_free_id:
                    name = ckpt.free_checkpoint_id(name, directory, client.list_snapshots())
                client.snapshot(name)
            info = ckpt.write_checkpoint(
                directory,
                name,
                _dense_state(ctx),
                step=ctx.step,
                samples=ctx.samples,
                num_shards=len(ctx.addresses),
            )
        except BaseException as exc:  # still meet the others at the barrier
            failure = exc
    if distributed:
        dist.barrier()
        chosen: list[str | None] = [name]  # rank 0 may have picked a free id
        dist.broadcast_object_list(chosen, src=0)
        name = str(chosen[0])
    if failure is not None:
        raise failure
    if info is None:
        info = ckpt.read_checkpoint(directory, name)
    logger.info("checkpoint %s at step %d", name, ctx.step)
    return info


def load_checkpoint(
    ctx: TrainCtx, directory: str | os.PathLike[str], checkpoint_id: str | None
) -> ckpt.CheckpointInfo:
    """Restore the dense side of a checkpoint into ``ctx``'s model, optimizer and loss scaler;
    the caller restores the counters from the manifest returned.

    Args:
        ctx: this rank's training context.
        directory: the checkpoint directory.
        checkpoint_id: ``None``: the latest complete checkpoint.

    Raises:
        NotFoundError: no such checkpoint (or none at all).
        ConfigError: the checkpoint was taken with a different number of shards.
    """
    info = (
        ckpt.read_checkpoint(directory, checkpoint_id)
        if checkpoint_id is not None
        else ckpt.latest_checkpoint(directory)
    )
    if info is None:
        raise NotFoundError(f"no checkpoint in {directory}")
    if info.num_shards != len(ctx.addresses):
        raise ConfigError(
            "shards",
            f"checkpoint {info.checkpoint_id} has {info.num_shards} shards, the job "
            f"{len(ctx.addresses)}",
        )
    state = torch.load(info.dense_path, map_location=ctx.device, weights_only=True)
    ctx.model.load_state_dict(state["model"])
    ctx.optimizer.load_state_dict(state["optimizer"])
    scaler = ctx.dense.scaler
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    return info


def _dense_state(ctx: TrainCtx) -> dict[str, Any]:
    """What ``dense.pt`` holds (:mod:`embeddb.trainer.checkpoints.files`)."""
    scaler = ctx.dense.scaler
    return {
        "model": ctx.model.state_dict(),
        "optimizer": ctx.optimizer.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
    }
