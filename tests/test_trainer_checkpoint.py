"""Checkpoints of a training job: dense state and one snapshot per shard under one id; a run
resumed from a checkpoint (shards restored too) retraces the original run in ``sync`` mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.client import Client
from embeddb.errors import InvalidArgumentError, NotFoundError
from embeddb.trainer import TrainCtx, TrainerConfig
from embeddb.trainer.checkpoints.files import (
    latest_checkpoint,
    read_checkpoint,
    restore_local_shards,
)
from tests.trainer_harness import adult, adult_config, adult_model, serve_shards

N, M, BATCH = 6, 6, 256
CONFIG = TrainerConfig(mode="sync", device="cpu", close_timeout=30.0, lookup_timeout=30.0)


def table_keys(batches: list[Any]) -> dict[str, np.ndarray]:
    """Every table's encoded ids seen in ``batches``."""
    config = adult_config()
    keys: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        for f in batch.id_type_features:
            feature = config.features[f.name]
            keys.setdefault(feature.table, []).append(feature.encode(f.values))
    return {t: np.unique(np.concatenate(k)) for t, k in keys.items()}


def rows(addresses: list[str], keys: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with Client(addresses) as client:
        return {t: client.lookup(t, k, train=False) for t, k in keys.items()}


def train(ctx: TrainCtx, batches: list[Any], losses: list[float]) -> None:
    loss_fn = nn.BCEWithLogitsLoss()
    for prepared in ctx.prepare(batches):
        output, labels = ctx.forward(prepared)
        loss = loss_fn(output, labels[0])
        ctx.backward(loss)
        losses.append(loss.item())


def new_ctx(addresses: list[str], seed: int) -> TrainCtx:
    torch.set_num_threads(1)
    model = adult_model(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return TrainCtx(model, optimizer, adult_config(), addresses, CONFIG)


@pytest.mark.slow
def test_a_resumed_run_retraces_the_original_from_its_checkpoint(tmp_path: Path) -> None:
    batches = list(adult("train").batches(BATCH))[: N + M]
    keys = table_keys(batches)
    data, checkpoints = tmp_path / "data", tmp_path / "checkpoints"
    with serve_shards(adult_config(), data, 2) as shards, new_ctx(shards.addresses, seed=0) as ctx:
        train(ctx, batches[:N], [])
        info = ctx.save_checkpoint(checkpoints)
        dense_at_checkpoint = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        rows_at_checkpoint = rows(shards.addresses, keys)
        first_losses: list[float] = []
        train(ctx, batches[N:], first_losses)
        ctx.flush()
        dense_at_end = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        rows_at_end = rows(shards.addresses, keys)
        with pytest.raises(InvalidArgumentError, match="already"):
            ctx.save_checkpoint(checkpoints, info.checkpoint_id)

    assert info.checkpoint_id == "ckpt-000000006" and info.step == N
    assert info.samples == N * BATCH and info.num_shards == 2
    assert latest_checkpoint(checkpoints) == info
    manifest = json.loads((checkpoints / info.checkpoint_id / "manifest.json").read_text())
    assert manifest["snapshot_id"] == info.checkpoint_id

    with serve_shards(adult_config(), data, 2, restore=info.checkpoint_id) as shards:
        restored = rows(shards.addresses, keys)
        for table, expected in rows_at_checkpoint.items():
            np.testing.assert_array_equal(restored[table], expected)  # exactly
        with new_ctx(shards.addresses, seed=1) as ctx:  # other initial weights: all restored
            assert ctx.load_checkpoint(checkpoints) == info
            assert (ctx.step, ctx.samples) == (N, N * BATCH)
            for name, tensor in ctx.model.state_dict().items():
                assert torch.equal(tensor, dense_at_checkpoint[name]), name
            second_losses: list[float] = []
            train(ctx, batches[N:], second_losses)
            ctx.flush()
            np.testing.assert_allclose(second_losses, first_losses, rtol=1e-5, atol=1e-6)
            for name, tensor in ctx.model.state_dict().items():
                torch.testing.assert_close(tensor, dense_at_end[name], rtol=1e-5, atol=1e-6)
            resumed = rows(shards.addresses, keys)
        for table, expected in rows_at_end.items():
            np.testing.assert_allclose(resumed[table], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_local_shard_directories_are_restored_offline(tmp_path: Path) -> None:
    config = adult_config()
    path = tmp_path / "config.yaml"
    path.write_text((Path(__file__).parents[1] / "embeddb/presets/adult.yaml").read_text())
    keys = table_keys(list(adult("train").batches(64))[:1])
    with serve_shards(config, tmp_path / "data", 2) as shards:
        before = rows(shards.addresses, keys)
        with Client(shards.addresses) as client:
            client.snapshot("before")
            for table, k in keys.items():
                client.lookup(table, k)  # inserts rows
    restore_local_shards(path, tmp_path / "data", 2, "before")
    with serve_shards(config, tmp_path / "data", 2) as shards:
        after = rows(shards.addresses, keys)
    for table in keys:
        np.testing.assert_array_equal(after[table], before[table])
        assert not before[table].any()


def test_missing_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    (tmp_path / "ckpt-000000001").mkdir()  # no manifest: not a checkpoint
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(NotFoundError, match="manifest"):
        read_checkpoint(tmp_path, "ckpt-000000001")
    with pytest.raises(InvalidArgumentError, match="id"):
        read_checkpoint(tmp_path, "../x")


def test_checkpoint_ids_follow_the_snapshot_id_rule_matched_whole(tmp_path: Path) -> None:
    """A checkpoint id is the shards' snapshot id: no ``..``, no trailing newline."""
    (tmp_path / "manifest.json").write_text("{}")  # what ".." would reach from checkpoints/
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    for bad in ("..", ".", "ckpt-1\n", "-x"):
        with pytest.raises(InvalidArgumentError, match="checkpoint id"):
            read_checkpoint(checkpoints, bad)


@pytest.mark.slow
def test_a_default_checkpoint_id_left_taken_by_a_killed_run_is_not_reused(tmp_path: Path) -> None:
    """A run killed between its shards' snapshot and the manifest leaves ``ckpt-<step>``
    taken on the shards (and maybe a folder without a manifest); reaching that step again
    takes the next free id instead of failing on the collision."""
    batches = list(adult("train").batches(BATCH))[:1]
    checkpoints = tmp_path / "checkpoints"
    with (
        serve_shards(adult_config(), tmp_path / "data", 2) as shards,
        new_ctx(shards.addresses, seed=0) as ctx,
    ):
        train(ctx, batches, [])
        with Client(shards.addresses) as client:
            client.snapshot("ckpt-000000001")  # the killed run's snapshot
        (checkpoints / "ckpt-000000001.1").mkdir(parents=True)  # and a folder, no manifest
        info = ctx.save_checkpoint(checkpoints)
        with Client(shards.addresses) as client:
            ids = [{s.snapshot_id for s in shard} for shard in client.list_snapshots()]
    assert info.checkpoint_id == info.snapshot_id == "ckpt-000000001.2" and info.step == 1
    assert all("ckpt-000000001.2" in shard for shard in ids)
    assert latest_checkpoint(checkpoints) == info
