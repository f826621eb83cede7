"""Private data directories (docs/architecture.md §6): a shard's directory is 0700, and a server
process creates every file 0600 and every directory 0700, whatever umask it was started with."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from embeddb.engine.shard import Shard
from embeddb.engine.storage.private import private_dir
from embeddb.transport import wire
from embeddb.transport.rpc.lifecycle import private_umask
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import StartServe, serve_processes

CONFIG = """
slots_config:
  t: {dim: 8}
defaults:
  capacity: 16
store: {stripes: 1, min_stripe_rows: 1}
"""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_under(root: Path) -> dict[str, list[str]]:
    """``{"0o600 file": [paths], "0o700 dir": [paths], ...}`` for everything under ``root``."""
    found: dict[str, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name, kind in [*((d, "dir") for d in dirnames), *((f, "file") for f in filenames)]:
            path = Path(dirpath) / name
            key = "symlink" if path.is_symlink() else f"{oct(mode(path))} {kind}"
            found.setdefault(key, []).append(str(path.relative_to(root)))
    return found


@pytest.mark.slow
def test_serve_under_umask_022_creates_only_private_files_and_directories(
    serve: StartServe, tmp_path: Path
) -> None:
    config, data_dir = tmp_path / "config.yaml", tmp_path / "shard"
    config.write_text(CONFIG)
    served = serve("--config", str(config), "--data-dir", str(data_dir), umask=0o022)
    with grpc.insecure_channel(served.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        ids = wire.encode_ids(np.arange(200, dtype=np.uint64))  # more than the RAM tier holds
        stub.Lookup(pb.LookupRequest(table="t", ids=ids, train=True), timeout=30)
        stub.Snapshot(pb.SnapshotRequest(snapshot_id="s1"), timeout=60)
    served.stop()

    assert mode(data_dir) == 0o700
    found = modes_under(data_dir)
    # Update log segments are opened with os.open's default mode 0o777, which the umask turns
    # into 0700: private, though executable (the update log itself makes them 0600).
    unexpected = [f for f in found.pop("0o700 file", []) if not f.startswith("log/")]
    assert not unexpected, unexpected
    assert set(found) == {"0o600 file", "0o700 dir"}, found
    files = found["0o600 file"]
    # RocksDB's files, the clean-shutdown record, the update log, the snapshot: all covered.
    assert "clean-shutdown.json" in files
    assert any(f.startswith("disk/") and f.endswith(".sst") for f in files), files
    assert any(f.startswith("snapshots/s1/") for f in files), files
    assert (data_dir / "log").is_dir() and any((data_dir / "log").iterdir())


def test_a_shard_tightens_an_existing_0755_directory_to_0700(tmp_path: Path) -> None:
    data_dir = tmp_path / "shard"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    with Shard(one_table_config(), data_dir):
        assert mode(data_dir) == 0o700
    assert mode(data_dir) == 0o700


def test_a_new_shard_directory_is_created_0700_with_its_parents(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "b" / "shard"
    with Shard(one_table_config(), data_dir):
        pass
    assert mode(data_dir) == 0o700


def test_private_dir_tightens_even_under_an_unusual_umask(tmp_path: Path) -> None:
    previous = os.umask(0o277)  # would make a new directory 0500
    try:
        made = private_dir(tmp_path / "d")
    finally:
        os.umask(previous)
    assert made == tmp_path / "d" and mode(made) == 0o700


def test_private_umask_applies_meanwhile_and_restores_the_previous_one(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        with private_umask():
            (tmp_path / "inside").write_text("x")
            (tmp_path / "inside-dir").mkdir()
        (tmp_path / "after").write_text("x")
        assert os.umask(0o022) == 0o022  # restored
    finally:
        os.umask(previous)
    assert mode(tmp_path / "inside") == 0o600
    assert mode(tmp_path / "inside-dir") == 0o700
    assert mode(tmp_path / "after") == 0o644
