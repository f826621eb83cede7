"""LocalShards: a job checkpoint's shards opened in-process, read-only, answer evaluation
lookups exactly as the served shards do (routing included), refuse training lookups, leave
the checkpoint untouched, and name what is missing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client
from embeddb.config import EmbeddingConfig
from embeddb.errors import FailedPreconditionError, NotFoundError, TableNotFoundError
from embeddb.serving.local_shards import LocalShards
from embeddb.trainer.checkpoints.files import write_checkpoint
from tests.trainer_harness import serve_shards

CONFIG = EmbeddingConfig.from_yaml_text(
    """
slots_config:
  user: {dim: 4}
  item: {dim: 3}
defaults:
  optimizer: {type: sgd, lr: 0.1}
  initializer: {type: normal, mean: 0.0, std: 0.1}
  capacity: 10000
store: {stripes: 2}
"""
)
IDS = np.arange(1, 301, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def make_checkpoint(root: Path, shards_count: int = 3) -> dict[str, np.ndarray]:
    """Shards under ``root/shards`` with rows for IDS, snapshotted and checkpointed as
    ``ckpt-000000001``; returns what the served shards answered (then stopped)."""
    with (
        serve_shards(CONFIG, root / "shards", shards_count) as shards,
        Client(shards.addresses) as client,
    ):
        client.lookup_many({"user": IDS, "item": IDS[:100]}, train=True)  # creates rows
        client.snapshot("ckpt-000000001")
        probe = {"user": np.concatenate([IDS[::-1], [np.uint64(7)]]), "item": IDS[:150]}
        want = client.lookup_many(probe, train=False)
    write_checkpoint(root, "ckpt-000000001", {}, step=1, samples=1, num_shards=shards_count)
    return want


@pytest.mark.slow
def test_lookups_equal_the_served_shards_and_nothing_is_written(tmp_path: Path) -> None:
    want = make_checkpoint(tmp_path)
    snapshots = sorted(tmp_path.glob("shards/*/snapshots/ckpt-000000001"))
    assert len(snapshots) == 3
    before = {str(s): digest(s) for s in snapshots}
    with LocalShards.open(tmp_path, CONFIG) as local:
        assert local.checkpoint.checkpoint_id == "ckpt-000000001" and len(local.shards) == 3
        assert {(t.name, t.dim) for t in local.list_tables()} == {("user", 4), ("item", 3)}
        probe = {"user": np.concatenate([IDS[::-1], [np.uint64(7)]]), "item": IDS[:150]}
        got = local.lookup_many(probe, train=False)
        for table, vectors in want.items():
            np.testing.assert_array_equal(got[table], vectors)
        assert np.all(got["user"][-1] == 0) and np.all(got["item"][100:] == 0)  # unknown ids
        assert np.any(got["user"][:-1] != 0, axis=1).all()
        with pytest.raises(FailedPreconditionError, match="read-only"):
            local.lookup_many({"user": IDS[:3]}, train=True)
        with pytest.raises(TableNotFoundError):
            local.lookup_many({"nope": IDS[:3]})
        assert local.lookup_many({"user": IDS[:0]})["user"].shape == (0, 4)
        workdir = local._workdir
        assert workdir.is_dir()
    assert not workdir.exists()  # the private copy is removed on close
    assert {str(s): digest(s) for s in snapshots} == before


def test_a_missing_checkpoint_or_snapshot_is_named(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no complete checkpoint"):
        LocalShards.open(tmp_path, CONFIG)
    make_checkpoint(tmp_path, 2)
    with pytest.raises(NotFoundError, match="no checkpoint 'ckpt-9'"):
        LocalShards.open(tmp_path, CONFIG, checkpoint_id="ckpt-9")
    gone = tmp_path / "shards" / "shard-1" / "snapshots" / "ckpt-000000001" / "manifest.json"
    gone.unlink()
    with pytest.raises(NotFoundError, match="shard 1 of checkpoint ckpt-000000001"):
        LocalShards.open(tmp_path, CONFIG)
