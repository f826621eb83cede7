"""embeddb reshard: a checkpoint of N shards rewritten into M shards keeps every row (vector
and optimizer state) exactly once, on the shard that owns it, with RAM winning over stale disk
copies; bad sources are refused before anything is written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from embeddb.cli import main
from embeddb.common.routing import shard_of
from embeddb.config import (
    EmbeddingConfig,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.engine.durability import snapshot
from embeddb.engine.durability.reshard import RESHARD_RECORD, ReshardProgress, reshard
from embeddb.engine.shard import Shard
from embeddb.engine.storage.ram_tier import DIRTY, ON_DISK
from embeddb.errors import CorruptDataError, InvalidArgumentError, NotFoundError

SNAP = "ckpt-1"
N = 2
UNIVERSE = np.arange(1, 1201, dtype=np.uint64)
TABLES = {"t": 4, "u": 3}  # name -> dim


def config() -> EmbeddingConfig:
    """Adagrad (state matters) and RAM tiers far smaller than the ids (rows spill to disk)."""
    adagrad = OptimizerConfig(kind=OptimizerKind.ADAGRAD, lr=0.5)
    tables = {
        name: TableConfig(name=name, dim=dim, capacity=96, optimizer=adagrad)
        for name, dim in TABLES.items()
    }
    return EmbeddingConfig(
        tables=tables,
        store=StoreConfig(ram=RamTierConfig(stripes=2, eviction_chunk=0.05, min_stripe_rows=1)),
    )


@dataclass
class Checkpoint:
    root: Path
    expected: dict[str, dict[int, np.ndarray]]  # table -> id -> row [vector | state]
    deleted: set[int]


def _train(shard: Shard, mine: np.ndarray, rng: np.random.Generator) -> set[int]:
    for name, dim in TABLES.items():
        shard.lookup(name, mine)  # creates every row; most spill to disk
        grads = rng.standard_normal((mine.size, dim)).astype(np.float32)
        shard.apply_gradients(name, mine, grads)  # on disk and in RAM: state changes
        hot = mine[-40:]
        shard.lookup(name, hot)  # promoted: resident with an equal disk copy (ON_DISK)
        shard.apply_gradients(name, hot[:25], np.ones((25, dim), np.float32))  # now DIRTY too
    gone = {int(mine[50]), int(mine[1])}  # one on disk, one resident
    for name in TABLES:
        shard.delete(name, np.array(sorted(gone), dtype=np.uint64))
    return gone


def _build(root: Path) -> tuple[list[Shard], Checkpoint]:
    rng = np.random.default_rng(7)
    owner = shard_of(UNIVERSE, N)
    shards: list[Shard] = []
    expected: dict[str, dict[int, np.ndarray]] = {name: {} for name in TABLES}
    deleted: set[int] = set()
    for i in range(N):
        shard = Shard(config(), root / f"shard-{i}", shard_index=i, num_shards=N)
        shards.append(shard)
        mine = UNIVERSE[owner == i]
        deleted |= _train(shard, mine, rng)
        shard.snapshot(SNAP)
        for name in TABLES:
            found, rows = shard.peek(name, mine)
            expected[name].update(
                {int(x): row.copy() for x, row, f in zip(mine, rows, found, strict=True) if f}
            )
        # Mutations after the snapshot are not part of it.
        shard.assign("t", mine[:5], np.full((5, TABLES["t"]), 9.0, np.float32))
    return shards, Checkpoint(root, expected, deleted)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkpoint]:
    """Two stopped shards holding the checkpoint (a running shard's directory is refused:
    test_a_running_source_or_target_is_refused)."""
    shards, ckpt = _build(tmp_path_factory.mktemp("source"))
    for shard in shards:
        shard.close()
    yield ckpt


def _copy(ckpt: Checkpoint, dest: Path) -> Path:
    for i in range(N):
        src = ckpt.root / f"shard-{i}" / "snapshots" / SNAP
        shutil.copytree(src, dest / f"shard-{i}" / "snapshots" / SNAP)
    return dest


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p), p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.glob("shard-*/snapshots/**/*")
        if p.is_file()
    )


def test_the_checkpoint_has_dirty_clean_and_ram_only_rows(checkpoint: Checkpoint) -> None:
    """The source exercises every case: RAM rows with a stale disk copy (DIRTY | ON_DISK), an
    equal one (ON_DISK) and none, plus rows only on disk."""
    path = checkpoint.root / "shard-0" / "snapshots" / SNAP
    manifest = snapshot.verify(path)
    width = manifest["tables"]["t"]["width"]
    _, _, flags = snapshot.load_table(path, "t", width)
    assert np.any(flags == (ON_DISK | DIRTY))
    assert np.any(flags == ON_DISK)
    assert np.any((flags & ON_DISK) == 0)
    assert manifest["tables"]["t"]["disk_rows"] > flags.size


@pytest.mark.parametrize("m", [3, 1, N])
def test_every_row_lands_once_on_its_new_shard(
    checkpoint: Checkpoint, tmp_path: Path, m: int
) -> None:
    before = _listing(checkpoint.root)
    seen: list[ReshardProgress] = []
    result = reshard(
        checkpoint.root, tmp_path / "out", m, SNAP, chunk_rows=100, progress=seen.append
    )

    assert _listing(checkpoint.root) == before  # the sources are read, never written
    total = sum(len(rows) for rows in checkpoint.expected.values())
    assert result.total_rows == total
    assert (result.source_shards, result.target_shards) == (N, m)
    assert result.stale > 0  # resident rows' disk copies were skipped
    assert seen and seen[-1].rows == seen[-1].total
    record = json.loads((tmp_path / "out" / RESHARD_RECORD).read_text())
    assert record["rows"] == total and record["num_shards"] == m

    for j in range(m):
        path = tmp_path / "out" / f"shard-{j}" / "snapshots" / SNAP
        manifest = snapshot.verify(path)
        assert (manifest["shard_index"], manifest["num_shards"], manifest["seq"]) == (j, m, 0)
        with Shard(config(), tmp_path / "out" / f"shard-{j}", shard_index=j, num_shards=m) as sh:
            assert (sh.recovery.source, sh.recovery.snapshot_id) == ("snapshot", SNAP)
            owned = UNIVERSE[shard_of(UNIVERSE, m) == j]
            for name, rows in checkpoint.expected.items():
                assert manifest["tables"][name]["disk_rows"] == result.rows[name][j]
                found, got = sh.peek(name, owned)
                want = {x for x in map(int, owned) if x in rows}
                assert {int(x) for x in owned[found]} == want
                assert len(want) == result.rows[name][j]
                for x, row in zip(owned[found], got[found], strict=True):
                    np.testing.assert_array_equal(row, rows[int(x)])
                assert not set(map(int, owned[found])) & checkpoint.deleted
                assert sh.stats().tables[name].rows == len(want)


def test_an_existing_target_must_be_empty(checkpoint: Checkpoint, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(InvalidArgumentError, match="not an empty directory"):
        reshard(checkpoint.root, tmp_path / "out", 3, SNAP)
    assert (tmp_path / "out" / "keep.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert reshard(checkpoint.root, empty, 2, SNAP).target_shards == 2


def test_bad_arguments_are_refused(checkpoint: Checkpoint, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="num_shards"):
        reshard(checkpoint.root, tmp_path / "out", 0, SNAP)
    with pytest.raises(NotFoundError, match="no-such-snapshot"):
        reshard(checkpoint.root, tmp_path / "out", 2, "no-such-snapshot")
    with pytest.raises(InvalidArgumentError, match="snapshot id"):
        reshard(checkpoint.root, tmp_path / "out", 2, "../x")
    with pytest.raises(NotFoundError, match="not a directory"):
        reshard(tmp_path / "nowhere", tmp_path / "out", 2, SNAP)
    assert not (tmp_path / "out").exists()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", ["ram-file", "sst-file", "missing-shard", "no-manifest", "manifest"]
)
def test_a_damaged_checkpoint_is_refused_before_writing(
    checkpoint: Checkpoint, tmp_path: Path, damage: str
) -> None:
    root = _copy(checkpoint, tmp_path / "src")
    snap1 = root / "shard-1" / "snapshots" / SNAP
    if damage == "ram-file":
        _flip(snap1 / "ram" / "t.rows")
        match = "t.rows fails its CRC32"
    elif damage == "sst-file":
        _flip(next((snap1 / "disk").glob("*.sst")))
        match = r"\.sst fails its CRC32"
    elif damage == "missing-shard":
        shutil.rmtree(snap1)
        match = r"incomplete: .* shard\(s\) \[1\]"
    elif damage == "no-manifest":
        (snap1 / snapshot.MANIFEST).unlink()
        match = "no manifest"
    else:
        text = (snap1 / snapshot.MANIFEST).read_text()
        (snap1 / snapshot.MANIFEST).write_text(text.replace('"seq": ', '"seq": 1'))
        match = "manifest.json is unreadable"
    with pytest.raises(CorruptDataError, match=match):
        reshard(root, tmp_path / "out", 3, SNAP)
    assert not (tmp_path / "out").exists()


def _edit_manifest(path: Path, **changes: object) -> None:
    """Rewrite a manifest as a shard of another layout would have written it (checksummed)."""
    file = path / snapshot.MANIFEST
    manifest = json.loads(file.read_text())
    manifest.update(changes)
    manifest["checksum"] = snapshot._manifest_crc(manifest)
    file.write_text(json.dumps(manifest))


def test_mismatched_manifests_are_refused(checkpoint: Checkpoint, tmp_path: Path) -> None:
    root = _copy(checkpoint, tmp_path / "src")
    snap1 = root / "shard-1" / "snapshots" / SNAP
    _edit_manifest(snap1, num_shards=3)
    with pytest.raises(CorruptDataError, match=r"disagree on the shard count \(shard-0: 2"):
        reshard(root, tmp_path / "out", 3, SNAP)
    _edit_manifest(snap1, num_shards=2, shard_index=0)
    with pytest.raises(CorruptDataError, match=r"shard_index 0 of 2, but it is in .*shard-1"):
        reshard(root, tmp_path / "out", 3, SNAP)
    _edit_manifest(snap1, shard_index=1, tables={"t": {"dim": 4, "width": 8, "disk_rows": 0}})
    with pytest.raises(CorruptDataError, match="disagree on the tables"):
        reshard(root, tmp_path / "out", 3, SNAP)
    assert not (tmp_path / "out").exists()


def test_a_row_on_the_wrong_shard_is_refused(tmp_path: Path) -> None:
    """A source that holds an id another shard owns would duplicate it: refused, and the
    partial output is removed."""
    ids = np.arange(1, 200, dtype=np.uint64)
    for i in range(N):
        # A live shard refuses foreign ids, so shard 0's rows are written by a one-shard
        # cluster and its manifest then claims the N-shard layout (a copied directory).
        count = 1 if i == 0 else N
        with Shard(
            config(), tmp_path / "src" / f"shard-{i}", shard_index=i, num_shards=count
        ) as sh:
            sh.lookup("t", ids if i == 0 else ids[:0])  # shard 0 holds every id
            sh.snapshot(SNAP)
    _edit_manifest(tmp_path / "src" / "shard-0" / "snapshots" / SNAP, num_shards=N)
    with pytest.raises(CorruptDataError, match="which belongs to shard 1"):
        reshard(tmp_path / "src", tmp_path / "out", 3, SNAP)
    assert not (tmp_path / "out").exists()


def test_cli_reshard(checkpoint: Checkpoint, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["reshard", "--from", str(checkpoint.root), "--to", str(tmp_path / "out")]
    result = runner.invoke(main, [*args, "--num-shards", "3", "--snapshot", SNAP])
    assert result.exit_code == 0, result.output
    total = sum(len(rows) for rows in checkpoint.expected.values())
    assert f"{total:,} rows from 2 shards to 3" in result.output
    assert "rows/s" in result.output and "table u: shard-0" in result.output
    for j in range(3):
        snapshot.verify(tmp_path / "out" / f"shard-{j}" / "snapshots" / SNAP)
    again = runner.invoke(main, [*args, "--num-shards", "3", "--snapshot", SNAP])
    assert again.exit_code == 1 and "not an empty directory" in again.output
