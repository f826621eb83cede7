"""A snapshot reads only the SST files new since the previous snapshot
(embeddb.engine.durability.snapshot.reused_sums): a file that is the very file the previous
snapshot listed (same inode, same size) keeps its CRC32; loading checks every file as strictly
as before, so a shared file corrupted after the first snapshot fails both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embeddb.engine.durability import snapshot
from embeddb.engine.durability.manifest import read_manifest, verify
from embeddb.engine.shard import Shard
from embeddb.errors import CorruptDataError
from tests.conftest import one_table_config


def spilled_shard(path: Path) -> Shard:
    """A shard whose one table (RAM capacity 64) has spilled 2000 rows to its disk tier."""
    shard = Shard(one_table_config(capacity=64), path)
    ids = np.arange(2000, dtype=np.uint64)
    shard.assign("t", ids, np.ones((ids.size, 4), np.float32))
    return shard


def read_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the next commits read to checksum."""
    seen: list[str] = []
    original = snapshot.SnapshotWriter._checksum_and_sync

    def counting(self: snapshot.SnapshotWriter, path: Path) -> tuple[int, int]:
        seen.append(path.name)
        return original(self, path)

    monkeypatch.setattr(snapshot.SnapshotWriter, "_checksum_and_sync", counting)
    return seen


def test_a_second_snapshot_reads_no_unchanged_sst_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with spilled_shard(tmp_path / "s") as shard:
        first = shard.snapshot("a").info
        ssts = [e for e in read_manifest(first.path)["files"] if e.endswith(".sst")]
        assert ssts  # the disk tier is in SST files
        seen = read_files(monkeypatch)
        second = shard.snapshot("b").info
    assert not [name for name in seen if name.endswith(".sst")]  # before: every SST again
    old, new = read_manifest(first.path)["files"], read_manifest(second.path)["files"]
    for entry in ssts:
        assert new[entry] == old[entry]
    verify(second.path)  # the reused sums are the files' own


def test_new_sst_files_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with spilled_shard(tmp_path / "s") as shard:
        first = shard.snapshot("a").info
        ids = np.arange(5000, 7000, dtype=np.uint64)
        shard.assign("t", ids, np.full((ids.size, 4), 2.0, np.float32))
        seen = read_files(monkeypatch)
        second = shard.snapshot("b").info
    old = set(read_manifest(first.path)["files"])
    added = {e.rpartition("/")[2] for e in read_manifest(second.path)["files"]} - {
        e.rpartition("/")[2] for e in old
    }
    assert {n for n in added if n.endswith(".sst")} <= set(seen)
    assert any(n.endswith(".sst") for n in added)
    verify(second.path)


def test_a_shared_file_corrupted_after_the_first_snapshot_fails_both(tmp_path: Path) -> None:
    with spilled_shard(tmp_path / "s") as shard:
        first = shard.snapshot("a").info
        entry = next(e for e in read_manifest(first.path)["files"] if e.endswith(".sst"))
        shared = first.path / entry
        data = bytearray(shared.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shared.write_bytes(bytes(data))  # in place: every hard link of it changes
        second = shard.snapshot("b").info
        both = (second.path / entry).stat().st_ino == shared.stat().st_ino
    assert both
    for taken in (first, second):
        with pytest.raises(CorruptDataError, match="fails its CRC32"):
            verify(taken.path)


def test_no_previous_snapshot_or_an_unreadable_one_reuses_nothing(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "1.sst").write_bytes(b"x")
    assert snapshot.reused_sums(tmp_path / "missing", tmp_path / "disk") == {}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{", encoding="utf-8")
    assert snapshot.reused_sums(tmp_path / "broken", tmp_path / "disk") == {}


def test_a_copy_of_the_file_is_read_not_trusted(tmp_path: Path) -> None:
    with spilled_shard(tmp_path / "s") as shard:
        first = shard.snapshot("a").info
    copy = tmp_path / "new" / "disk"
    copy.mkdir(parents=True)
    listed = read_manifest(first.path)["files"]
    entries = [e for e in listed if e.endswith(".sst")]
    for entry in entries:  # equal bytes, another inode
        (copy / entry.rpartition("/")[2]).write_bytes((first.path / entry).read_bytes())
    assert snapshot.reused_sums(first.path, copy) == {}
    linked = tmp_path / "linked" / "disk"
    linked.mkdir(parents=True)
    for entry in entries:
        (linked / entry.rpartition("/")[2]).hardlink_to(first.path / entry)
    got = snapshot.reused_sums(first.path, linked)
    assert {p.name: s for p, s in got.items()} == {
        e.rpartition("/")[2]: (listed[e]["size"], listed[e]["crc32"]) for e in entries
    }
