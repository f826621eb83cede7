"""Snapshot files stay inside their directory and private (docs/architecture.md §6).

A snapshot's manifest is data: whoever can write ``snapshots/`` (where a checkpoint is imported)
or answers as a primary can put anything in it, and its checksum is a CRC anyone can recompute.
These tests plant such manifests — listing ``../../../secret``, an absolute path, a symbolic
link out, a file under a linked directory — and check that every reader refuses them:
FetchSnapshot of a real ``embeddb serve`` process, restore, crash recovery, reshard, a
follower's bootstrap, ``copy_disk`` and the read-only disk tier. Also: FetchSnapshot checks
every file's size and CRC32 while it streams, snapshot ids are matched whole, and snapshot
files are 0600 in 0700 directories whatever the umask.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from embeddb.cli import main
from embeddb.client import Client
from embeddb.common.routing import shard_of
from embeddb.config import EmbeddingConfig
from embeddb.engine.durability import snapshot, snapshot_dirs
from embeddb.engine.durability.reshard import reshard
from embeddb.engine.durability.snapshot_transfer import Chunk, SnapshotReader, SnapshotReceiver
from embeddb.engine.shard import Shard
from embeddb.engine.storage import DiskTier
from embeddb.engine.storage.paths import confined_root, resolve_inside, walk_inside
from embeddb.errors import CorruptDataError, InvalidArgumentError
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc
from tests.conftest import one_table_config
from tests.support import eventually, serve_processes

DIM = 4
IDS = np.arange(1, 201, dtype=np.uint64)
MARKER = b"embeddb-test-secret-7f3a91"
ESCAPES = ("dotdot", "absolute", "file-link", "dir-link")
CONFIG_YAML = """
slots_config:
  t: {dim: 4}
defaults:
  optimizer: {type: sgd, lr: 0.1}
  capacity: 64
"""


def config() -> EmbeddingConfig:
    return one_table_config(dim=DIM, capacity=64, stripes=2)


def vectors(n: int, value: float) -> np.ndarray:
    return np.full((n, DIM), value, dtype=np.float32)


def make_secret(directory: Path) -> Path:
    """A file outside every data directory, holding ``MARKER``."""
    path = directory / "secret"
    path.write_bytes(b"private key material: " + MARKER + b"\n")
    return path


def listing(path: Path) -> dict[str, int]:
    """The manifest entry that makes ``path``'s content pass size and CRC32 checks."""
    data = path.read_bytes()
    return {"size": len(data), "crc32": zlib.crc32(data)}


def edit_manifest(snap: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the manifest of ``snap`` and recompute its checksum, as anyone can."""
    file = snap / "manifest.json"
    manifest = json.loads(file.read_bytes())
    edit(manifest)
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    manifest["checksum"] = zlib.crc32(json.dumps(body, sort_keys=True).encode())
    file.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def add_escape(snap: Path, escape: str, secret: Path, base: Path | None = None) -> str:
    """Make the manifest of ``snap`` also list ``secret``, reached in the way ``escape``; the
    entry is relative to ``base`` (default: ``snap``). Returns the entry."""
    if escape == "dotdot":
        entry = os.path.relpath(secret, base or snap)
        assert entry.startswith("../")
    elif escape == "absolute":
        entry = str(secret)
    elif escape == "file-link":
        entry = "ram/leak"
        os.symlink(secret, snap / "ram" / "leak")
    else:  # dir-link: a directory link out, and a file under it
        entry = f"outside/{secret.name}"
        os.symlink(secret.parent, snap / "outside")
    edit_manifest(snap, lambda m: m["files"].__setitem__(entry, listing(secret)))
    return entry


def plant(good: Path, name: str, escape: str, secret: Path) -> tuple[Path, str]:
    """A copy of snapshot ``good`` named ``name`` (newer than it) that also lists ``secret``."""
    snap = good.parent / name
    shutil.copytree(good, snap)

    def rename(m: dict[str, Any]) -> None:
        m["snapshot_id"] = name
        m["created"] = m["created"] + 1.0

    edit_manifest(snap, rename)
    return snap, add_escape(snap, escape, secret)


def files_under(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """``{path: (mode, size, content)}`` of every file and link under ``root`` (links not
    followed): what a refused call must leave unchanged."""
    found = {}
    for current, _, names in os.walk(root):
        for name in names:
            path = Path(current) / name
            st = path.lstat()
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, content)
    return found


def fetch(
    stub: pb_grpc.EmbeddingStoreServiceStub, snapshot_id: str
) -> tuple[list[pb.FetchSnapshotResponse], grpc.RpcError | None]:
    """The chunks a FetchSnapshot call sent, and the error it ended with (None: it completed)."""
    chunks: list[pb.FetchSnapshotResponse] = []
    try:
        request = pb.FetchSnapshotRequest(snapshot_id=snapshot_id)
        for chunk in stub.FetchSnapshot(request, timeout=60):
            chunks.append(chunk)
    except grpc.RpcError as exc:
        return chunks, exc
    return chunks, None


def receive(chunks: list[pb.FetchSnapshotResponse], root: Path) -> Path:
    receiver = SnapshotReceiver(root, chunks[0].snapshot_id)
    for c in chunks:
        receiver.write(Chunk(c.path, c.offset, c.data))
    return receiver.commit().path


# ------------------------------------------------------------------------------ a real server
@dataclass
class Served:
    process: subprocess.Popen[bytes]
    address: str
    data_dir: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """``embeddb serve`` in a process of its own on 127.0.0.1 (port 0), data in tmp_path/data."""
    cfg = tmp_path / "embeddb.yaml"
    cfg.write_text(CONFIG_YAML)
    starts = serve_processes(tmp_path)
    started = next(starts)("--config", str(cfg), "--data-dir", str(tmp_path / "data"))
    yield Served(started.process, started.address, tmp_path / "data")
    next(starts, None)


def take_good_snapshot(served: Served) -> Path:
    with Client([served.address]) as client:
        client.assign("t", IDS, vectors(IDS.size, 0.5))  # more rows than RAM: some spill
        client.snapshot("good")
    return served.data_dir / "snapshots" / "good"


@pytest.mark.slow
def test_fetch_snapshot_never_sends_a_file_outside_the_snapshot(
    served: Served, tmp_path: Path
) -> None:
    secret = make_secret(tmp_path)
    good = take_good_snapshot(served)
    planted = {escape: plant(good, escape, escape, secret)[1] for escape in ESCAPES}
    before = files_under(served.data_dir / "snapshots")
    with grpc.insecure_channel(served.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        for name, entry in planted.items():
            chunks, error = fetch(stub, name)
            assert error is not None, f"{name}: the snapshot was sent whole"
            assert error.code() == grpc.StatusCode.DATA_LOSS, (name, error)
            details = error.details() or ""
            assert repr(entry) in details and f"snapshots/{name}" in details, details
            assert MARKER.decode() not in details
            assert not any(MARKER in c.data for c in chunks), name
        assert served.process.poll() is None  # still serving
        chunks, error = fetch(stub, "good")  # its own snapshots still fetch fine
    assert error is None
    assert snapshot.verify(receive(chunks, tmp_path / "received"))["snapshot_id"] == "good"
    assert files_under(served.data_dir / "snapshots") == before
    assert MARKER in secret.read_bytes()


@pytest.mark.slow
def test_fetch_snapshot_checks_sizes_and_crcs_while_streaming(
    served: Served, tmp_path: Path
) -> None:
    good = take_good_snapshot(served)
    rows = "ram/t.rows"
    data = (good / rows).read_bytes()
    assert len(data) > 16
    listed = {}  # snapshot -> the size its manifest gives ram/t.rows

    def relist(size: int, crc: int) -> Callable[[dict[str, Any]], None]:
        return lambda m: m["files"].__setitem__(rows, {"size": size, "crc32": crc})

    for name, size, crc in (
        ("grown", len(data) - 8, zlib.crc32(data[:-8])),  # the file holds more than listed
        ("shrunk", len(data) + 8, zlib.crc32(data + bytes(8))),  # less than listed
        ("flipped", len(data), zlib.crc32(data)),  # as listed, but a byte changed
    ):
        shutil.copytree(good, good.parent / name)
        edit_manifest(good.parent / name, relist(size, crc))
        listed[name] = size
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    (good.parent / "flipped" / rows).write_bytes(bytes(flipped))
    with grpc.insecure_channel(served.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        for name, size in listed.items():
            chunks, error = fetch(stub, name)
            assert error is not None, f"{name}: sent without an error"
            assert error.code() == grpc.StatusCode.DATA_LOSS, (name, error)
            assert "t.rows" in (error.details() or "")
            assert chunks and chunks[0].path != rows  # it failed mid-stream, at ram/t.rows
            sent = b"".join(c.data for c in chunks if c.path == rows)
            assert len(sent) <= size and sent == data[: len(sent)], name
            assert all(c.path != "manifest.json" for c in chunks)
        assert fetch(stub, "good")[1] is None


@pytest.mark.slow
def test_snapshot_ids_are_matched_whole(served: Served) -> None:
    for bad in ("evil\n", "good\n", "a\nb"):
        with pytest.raises(InvalidArgumentError, match="snapshot id"):
            snapshot.check_id(bad)
    with Client([served.address]) as client, pytest.raises(InvalidArgumentError):
        client.snapshot("evil\n")
    with grpc.insecure_channel(served.address) as channel:
        stub = pb_grpc.EmbeddingStoreServiceStub(channel)
        with pytest.raises(grpc.RpcError) as taken:
            stub.Snapshot(pb.SnapshotRequest(snapshot_id="evil\n"), timeout=30)
        assert taken.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        chunks, error = fetch(stub, "evil\n")
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not chunks
    cli = CliRunner().invoke(main, ["snapshot", "--addresses", served.address, "--id", "evil\n"])
    assert cli.exit_code == 1 and "snapshot id" in cli.output
    snapshots = served.data_dir / "snapshots"
    assert not snapshots.exists() or list(snapshots.iterdir()) == []


def test_other_entry_points_refuse_an_id_with_a_newline(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with Shard(config(), data) as shard:
        shard.assign("t", IDS, vectors(IDS.size, 1.0))
        good = shard.snapshot("good").info.path
        with pytest.raises(InvalidArgumentError, match="snapshot id"):
            shard.open_snapshot("good\n")
        expected = shard.peek("t", IDS)
    shutil.copytree(good, good.parent / "evil\n")  # a planted directory with that very name
    with pytest.raises(InvalidArgumentError, match="snapshot id"):
        Shard(config(), data, restore="evil\n")
    with pytest.raises(InvalidArgumentError, match="snapshot id"):
        reshard(tmp_path, tmp_path / "out", 2, "evil\n")
    with pytest.raises(InvalidArgumentError, match="snapshot id"):
        SnapshotReceiver(tmp_path / "received", "evil\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "received").exists()
    with Shard(config(), data) as reopened:
        assert reopened.recovery.source == "clean"
        np.testing.assert_array_equal(reopened.peek("t", IDS)[1], expected[1])


# ------------------------------------------------------------------------------ readers
@pytest.mark.parametrize("change", ["append", "truncate", "overwrite"])
def test_a_file_changed_after_the_reader_opened_it_ends_the_stream(
    tmp_path: Path, change: str
) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        shard.assign("t", IDS, vectors(IDS.size, 2.0))
        info = shard.snapshot("s").info
    rows = info.path / "ram" / "t.rows"
    original = rows.read_bytes()
    reader = SnapshotReader.open(info)
    with open(rows, "r+b") as f:  # the same inode the reader holds open
        if change == "append":
            f.seek(0, os.SEEK_END)
            f.write(b"appended")
        elif change == "truncate":
            f.truncate(len(original) - 8)
        else:
            f.seek(len(original) - 4)
            f.write(bytes(b ^ 0xFF for b in original[-4:]))
    sent: list[Chunk] = []
    with reader, pytest.raises(CorruptDataError, match=r"t\.rows"):
        for chunk in reader.chunks(64):
            sent.append(chunk)
    got = b"".join(c.data for c in sent if c.path == "ram/t.rows")
    assert len(got) < len(original) and got == original[: len(got)]
    assert all(c.path != "manifest.json" for c in sent)


@pytest.mark.parametrize("escape", ESCAPES)
def test_restore_refuses_a_manifest_that_leads_out(tmp_path: Path, escape: str) -> None:
    secret = make_secret(tmp_path)
    data = tmp_path / "s"
    with Shard(config(), data) as shard:
        shard.assign("t", IDS, vectors(IDS.size, 1.0))
        good = shard.snapshot("good").info.path
        shard.assign("t", IDS[:10], vectors(10, 3.0))  # the state a refused restore must keep
        expected = shard.peek("t", IDS)
    _, entry = plant(good, "planted", escape, secret)
    before = files_under(data)
    with pytest.raises(CorruptDataError) as refused:
        Shard(config(), data, restore="planted")
    assert repr(entry) in str(refused.value) and "snapshots/planted" in str(refused.value)
    assert MARKER.decode() not in str(refused.value)
    cfg = tmp_path / "embeddb.yaml"
    cfg.write_text(CONFIG_YAML)
    cli = CliRunner().invoke(
        main, ["restore", "--config", str(cfg), "--data-dir", str(data), "--snapshot", "planted"]
    )
    assert cli.exit_code == 1 and repr(entry) in cli.output
    assert files_under(data) == before  # no log set aside, nothing loaded
    with Shard(config(), data) as reopened:
        assert reopened.recovery.source == "clean"
        np.testing.assert_array_equal(reopened.peek("t", IDS)[1], expected[1])


@pytest.mark.parametrize("escape", ESCAPES)
def test_crash_recovery_refuses_a_snapshot_that_leads_out(tmp_path: Path, escape: str) -> None:
    secret = make_secret(tmp_path)
    data = tmp_path / "s"
    shard = Shard(config(), data)
    shard.assign("t", IDS, vectors(IDS.size, 1.0))
    good = shard.snapshot("good").info.path
    shard.assign("t", IDS[:10], vectors(10, 3.0))
    expected = shard.peek("t", IDS)
    shard.discard()  # a crash: recovery must pick the newest snapshot and replay the log
    _, entry = plant(good, "planted", escape, secret)  # the newest snapshot
    with pytest.raises(CorruptDataError, match="fallback") as refused:
        Shard(config(), data)
    assert repr(entry) in str(refused.value)
    with Shard(config(), data, fallback=True) as recovered:
        assert recovered.recovery.snapshot_id == "good"
        np.testing.assert_array_equal(recovered.peek("t", IDS)[1], expected[1])


def test_verify_does_not_follow_an_unlisted_link_out(tmp_path: Path) -> None:
    with Shard(config(), tmp_path / "s") as shard:
        good = shard.snapshot("good").info.path
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "t.ids").write_bytes(MARKER)
    os.symlink(outside, good / "ram" / "more")
    with pytest.raises(CorruptDataError, match="ram/more"):
        snapshot.verify(good)


def test_a_snapshot_directory_may_be_a_link_but_its_files_stay_inside_it(tmp_path: Path) -> None:
    data = tmp_path / "s"
    with Shard(config(), data) as shard:
        shard.assign("t", IDS, vectors(IDS.size, 1.0))
        taken = shard.snapshot("ckpt-1").info.path
        at_snapshot = shard.peek("t", IDS)
        shard.assign("t", IDS, vectors(IDS.size, 4.0))
    backups = tmp_path / "backups"
    backups.mkdir()
    shutil.move(taken, backups / "ckpt-1")  # an imported checkpoint: a link to a backup
    os.symlink(backups / "ckpt-1", data / "snapshots" / "ckpt-1")
    with Shard(config(), data, restore="ckpt-1") as restored:
        np.testing.assert_array_equal(restored.peek("t", IDS)[1], at_snapshot[1])
    # inside snapshots/ckpt-1 as the link names it, outside the directory it resolves to
    secret = make_secret(backups)
    entry = add_escape(backups / "ckpt-1", "file-link", secret)
    with pytest.raises(CorruptDataError, match=re.escape(repr(entry))):
        Shard(config(), data, restore="ckpt-1")
    with pytest.raises(CorruptDataError, match=re.escape(repr(entry))):
        snapshot.verify(data / "snapshots" / "ckpt-1")


def test_copy_disk_copies_no_file_from_outside(tmp_path: Path) -> None:
    secret = make_secret(tmp_path)
    with Shard(config(), tmp_path / "s") as shard:
        shard.assign("t", IDS, vectors(IDS.size, 1.0))
        good = shard.snapshot("good").info.path
    os.symlink(secret, good / "disk" / "000999.sst")
    with pytest.raises(CorruptDataError, match=r"000999\.sst"):
        snapshot_dirs.copy_disk(good, tmp_path / "copy")
    copied = tmp_path / "copy"
    assert not any(MARKER in p.read_bytes() for p in copied.rglob("*") if p.is_file())


def test_a_read_only_disk_tier_refuses_a_link_out(tmp_path: Path) -> None:
    secret = make_secret(tmp_path)
    db = tmp_path / "db"
    tier = DiskTier(db, {"t": DIM})
    tier.put("t", IDS[:5], vectors(5, 1.5))
    tier.close()
    os.symlink(db, tmp_path / "db-link")  # the directory may be a link itself
    reader = DiskTier(tmp_path / "db-link", {"t": DIM}, read_only=True)
    try:
        found, rows = reader.get("t", IDS[:5])
    finally:
        reader.close()
    assert found.all() and (rows == 1.5).all()
    os.symlink(secret, db / "LEAK")
    with pytest.raises(CorruptDataError, match="LEAK"):
        DiskTier(db, {"t": DIM}, read_only=True)


@pytest.mark.parametrize("escape", ["dotdot", "dir-link"])
def test_reshard_refuses_a_checkpoint_that_leads_out(tmp_path: Path, escape: str) -> None:
    secret = make_secret(tmp_path)
    src = tmp_path / "src"
    for i in range(2):
        with Shard(config(), src / f"shard-{i}", shard_index=i, num_shards=2) as shard:
            owned = IDS[shard_of(IDS, 2) == i]
            shard.assign("t", owned, vectors(owned.size, 1.0))
            shard.snapshot("ckpt")
    snap = src / "shard-1" / "snapshots" / "ckpt"
    entry = add_escape(snap, escape, secret)
    before = files_under(src)
    with pytest.raises(CorruptDataError, match=re.escape(repr(entry))):
        reshard(src, tmp_path / "out", 3, "ckpt")
    assert not (tmp_path / "out").exists()
    assert files_under(src) == before


# ------------------------------------------------------------------------------ followers
def forged_chunks(tmp_path: Path, escape: str, secret: Path) -> tuple[list[Chunk], str]:
    """A real snapshot's chunks whose manifest also lists ``secret`` (checksum recomputed);
    the ``dotdot`` entry is relative to a receiver's temporary directory under
    ``tmp_path/follower/replica-1/snapshots``."""
    with Shard(config(), tmp_path / "primary") as shard:
        shard.assign("t", IDS, vectors(IDS.size, 1.0))
        info = shard.snapshot("s").info
    with SnapshotReader.open(info) as reader:
        chunks = list(reader.chunks())
    receiving = tmp_path / "follower" / "replica-1" / "snapshots" / ".tmp-s-x"
    entry = os.path.relpath(secret, receiving) if escape == "dotdot" else str(secret)
    manifest = json.loads(b"".join(c.data for c in chunks if c.path == "manifest.json"))
    manifest["files"][entry] = listing(secret)
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    manifest["checksum"] = zlib.crc32(json.dumps(body, sort_keys=True).encode())
    forged = [c for c in chunks if c.path != "manifest.json"]
    forged.append(Chunk("manifest.json", 0, json.dumps(manifest).encode()))
    return forged, entry


@pytest.mark.parametrize("escape", ["dotdot", "absolute"])
def test_a_received_manifest_that_leads_out_is_refused(tmp_path: Path, escape: str) -> None:
    secret = make_secret(tmp_path)
    chunks, entry = forged_chunks(tmp_path, escape, secret)
    root = tmp_path / "follower" / "replica-1" / "snapshots"
    receiver = SnapshotReceiver(root, "s")
    for chunk in chunks:
        receiver.write(chunk)
    with pytest.raises(CorruptDataError, match=re.escape(repr(entry))):
        receiver.commit()
    assert list(root.iterdir()) == []  # nothing kept


class ForgedPrimary(pb_grpc.EmbeddingStoreServiceServicer):
    """A primary that answers every FetchSnapshot with the same forged snapshot."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.calls = 0
        self.lock = threading.Lock()

    def FetchSnapshot(
        self, request: pb.FetchSnapshotRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchSnapshotResponse]:
        with self.lock:
            self.calls += 1
        for c in self.chunks:
            yield pb.FetchSnapshotResponse(
                snapshot_id="s", seq=1, path=c.path, offset=c.offset, data=c.data
            )


def test_a_follower_refuses_a_primary_whose_snapshot_leads_out(tmp_path: Path) -> None:
    secret = make_secret(tmp_path)
    chunks, _ = forged_chunks(tmp_path, "absolute", secret)
    primary = ForgedPrimary(chunks)
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_EmbeddingStoreServiceServicer_to_server(primary, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    options = FollowerOptions(f"127.0.0.1:{port}", backoff=0.02, max_backoff=0.1)
    follower = Follower(config(), tmp_path / "follower", options)
    try:
        follower.start()
        # a second FetchSnapshot means the first snapshot was received and refused
        eventually(
            lambda: primary.calls >= 2 or follower.bootstraps or follower.error,
            30,
            "a second FetchSnapshot",
        )
        assert follower.bootstraps == 0 and follower.served.current is None
    finally:
        follower.stop()
        server.stop(grace=0)
    assert follower.error is None  # refused and retried, not stopped
    kept = [p for p in (tmp_path / "follower").rglob("*") if p.is_file()]
    assert not any(MARKER in p.read_bytes() for p in kept)


# ------------------------------------------------------------------------------ privacy
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_snapshot_files_are_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with Shard(config(), tmp_path / "s") as shard:
            shard.assign("t", IDS, vectors(IDS.size, 1.0))  # more rows than RAM: SST files
            info = shard.snapshot("s").info
            with shard.open_snapshot("s") as reader:
                chunks = list(reader.chunks())
        received = receive(
            [pb.FetchSnapshotResponse(snapshot_id="s", path=c.path, offset=c.offset, data=c.data)
             for c in chunks],
            tmp_path / "follower" / "snapshots",
        )  # fmt: skip
    finally:
        os.umask(old)
    for root in (info.path, received):
        entries = [root, *root.rglob("*")]
        assert any(p.parent.name == "disk" for p in entries)
        for path in entries:
            mode = stat.S_IMODE(path.lstat().st_mode)
            want = 0o700 if path.is_dir() else 0o600
            assert mode == want, f"{path.relative_to(root)} is {mode:o}"


# ------------------------------------------------------------------------------ the resolver
@pytest.mark.parametrize(
    "entry", ["../x", "/etc/passwd", "a/../../x", "a\\b", "a//b", "", "./a", "a/", "a/..", "a\0b"]
)
def test_resolve_inside_refuses_names_that_are_not_plain(tmp_path: Path, entry: str) -> None:
    root = confined_root(tmp_path, "test dir")
    with pytest.raises(CorruptDataError, match="not a relative path inside it"):
        resolve_inside(root, entry, "test dir")


def test_resolve_inside_follows_links_only_within_the_root(tmp_path: Path) -> None:
    real = tmp_path / "backups" / "ckpt"
    (real / "ram").mkdir(parents=True)
    (real / "ram" / "t.ids").write_bytes(b"12345678")
    os.symlink("t.ids", real / "ram" / "alias")  # inside: fine
    os.symlink("../..", real / "ram" / "up")  # to backups/: outside
    os.symlink(real, tmp_path / "ckpt")  # the root itself is a link
    root = confined_root(tmp_path / "ckpt", "snapshot ckpt")
    assert root == real.resolve()
    assert resolve_inside(root, "ram/alias", "snapshot ckpt") == root / "ram" / "t.ids"
    assert resolve_inside(root, "ram/up/ckpt/ram/t.ids", "snapshot ckpt") == root / "ram" / "t.ids"
    for entry in ("ram/up", "ram/up/secret"):  # backups/ and a file in it
        with pytest.raises(CorruptDataError, match="resolves outside"):
            resolve_inside(root, entry, "snapshot ckpt")
    with pytest.raises(CorruptDataError, match="ram/up"):
        list(walk_inside(root, "snapshot ckpt"))
