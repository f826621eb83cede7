"""One process at a time in a data directory, with real processes: a running ``embeddb serve``
holds its directory's lock, so ``embeddb restore``, ``embeddb reshard`` and a second ``embeddb
serve`` refuse with one ``Error:`` line naming the directory and the holder's pid, and change
nothing; the kernel releases the lock when the holder dies (``kill -9`` leaves none behind).
A restore or reshard that was interrupted half way stops the next start with the command that
finishes it, and that command works."""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client, ClientOptions
from embeddb.config import EmbeddingConfig
from embeddb.engine.durability import reshard as reshard_module
from embeddb.engine.durability import snapshot_dirs
from embeddb.engine.durability.dirlock import DirectoryInUseError, DirectoryLock
from embeddb.engine.shard import Shard
from embeddb.errors import StorageError
from tests.support import ServeProcess, StartServe, run_cli, serve_processes

CONFIG = "tables: {t: {dim: 4, capacity: 64, optimizer: {type: sgd, lr: 0.1}}}\n"
ONES = np.ones((1, 4), np.float32)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


cli = run_cli


def error_line(stderr: str) -> str:
    """The one ``Error:`` line of a refused command (log lines may precede it)."""
    errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


def vector(process: ServeProcess, i: int) -> list[float]:
    with Client([process.address]) as client:
        return list(client.lookup("t", [i], train=False)[0])


@pytest.mark.slow
def test_a_running_shard_refuses_restore_and_a_second_serve(
    serve: StartServe, tmp_path: Path, config_file: Path
) -> None:
    data = tmp_path / "shard"
    running = serve("--data-dir", str(data), "--config", str(config_file))
    with Client([running.address]) as client:
        client.assign("t", [7], ONES)
        client.snapshot("s1")
        client.assign("t", [7], 2 * ONES)
    holder = f"is in use by process {running.process.pid} (embeddb serve"

    restore = cli(
        "restore", "--config", str(config_file), "--data-dir", str(data), "--snapshot", "s1"
    )
    assert restore.returncode == 1, restore.stderr
    line = error_line(restore.stderr)
    assert restore.stderr.splitlines() == [line]  # the one line, nothing before it
    assert line.startswith(f"Error: data directory {data} {holder}"), line
    second = serve("--data-dir", str(data), "--config", str(config_file), expect_exit=True)
    assert second.process.returncode == 1
    assert f"data directory {data} {holder}" in error_line(second.stderr())
    assert vector(running, 7) == [2.0] * 4  # untouched, still serving

    running.stop()
    restore = cli(
        "restore", "--config", str(config_file), "--data-dir", str(data), "--snapshot", "s1"
    )
    assert restore.returncode == 0, restore.stderr
    again = serve("--data-dir", str(data), "--config", str(config_file))
    assert vector(again, 7) == [1.0] * 4  # the snapshot's


@pytest.mark.slow
def test_kill_9_leaves_no_stale_lock(serve: StartServe, tmp_path: Path, config_file: Path) -> None:
    data = tmp_path / "shard"
    first = serve("--data-dir", str(data), "--config", str(config_file))
    with Client([first.address]) as client:
        client.assign("t", [3], ONES)
    first.process.send_signal(signal.SIGKILL)
    assert first.process.wait(timeout=30) == -signal.SIGKILL
    second = serve("--data-dir", str(data), "--config", str(config_file))  # recovers
    assert vector(second, 3) == [1.0] * 4


@pytest.mark.slow
def test_reshard_refuses_a_running_source(
    serve: StartServe, tmp_path: Path, config_file: Path
) -> None:
    root = tmp_path / "cluster"
    running = serve("--data-dir", str(root / "shard-0"), "--config", str(config_file))
    with Client([running.address]) as client:
        client.assign("t", [1, 2, 3], np.ones((3, 4), np.float32))
        client.snapshot("ck")
    args = ["reshard", "--from", str(root), "--to", str(tmp_path / "out"), "--num-shards", "2"]
    refused = cli(*args, "--snapshot", "ck")
    assert refused.returncode == 1, refused.stderr
    line = error_line(refused.stderr)
    assert f"source shard directory {root / 'shard-0'} is in use by process " in line
    assert str(running.process.pid) in line
    assert not (tmp_path / "out").exists()
    running.stop()
    done = cli(*args, "--snapshot", "ck")
    assert done.returncode == 0, done.stderr


def test_the_lock_names_its_holder_in_process_and_is_released(tmp_path: Path) -> None:
    config = EmbeddingConfig.from_yaml_text(CONFIG, source="test")
    with Shard(config, tmp_path / "d"):
        with pytest.raises(DirectoryInUseError, match=f"in use by process {os.getpid()}"):
            Shard(config, tmp_path / "d")
        with pytest.raises(DirectoryInUseError):
            DirectoryLock.acquire(tmp_path / "d")
    DirectoryLock.acquire(tmp_path / "d").release()  # closed: free again
    with Shard(config, tmp_path / "d"):
        pass


# ------------------------------------------------------------------ interrupted operations
@pytest.mark.slow
def test_an_interrupted_restore_names_the_command_that_finishes_it(
    serve: StartServe, tmp_path: Path, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EmbeddingConfig.from_yaml_text(CONFIG, source="test")
    data = tmp_path / "shard"
    with Shard(config, data) as shard:
        shard.assign("t", [5], ONES)
        shard.snapshot("s1")
        shard.assign("t", [5], 3 * ONES)

    def fail(source: Path, target: Path) -> None:
        raise OSError("No space left on device")  # after the log was set aside

    with monkeypatch.context() as patch:
        patch.setattr(snapshot_dirs, "copy_disk", fail)
        with pytest.raises(StorageError, match="No space left"):
            Shard(config, data, restore="s1")
    refused = serve("--data-dir", str(data), "--config", str(config_file), expect_exit=True)
    assert refused.process.returncode == 1
    line = error_line(refused.stderr())
    assert f"{data} is half restored: a restore of snapshot 's1' was interrupted" in line
    hinted = f"embeddb restore --data-dir {shlex.quote(str(data))} --snapshot s1"
    assert hinted in line
    finish = cli(*shlex.split(hinted)[1:], "--config", str(config_file))
    assert finish.returncode == 0, finish.stderr
    started = serve("--data-dir", str(data), "--config", str(config_file))
    assert vector(started, 5) == [1.0] * 4


@pytest.mark.slow
def test_an_interrupted_reshard_names_the_command_that_finishes_it(
    serve: StartServe, tmp_path: Path, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EmbeddingConfig.from_yaml_text(CONFIG, source="test")
    source, target = tmp_path / "src", tmp_path / "out"
    ids = np.arange(1, 41, dtype=np.uint64)
    with Shard(config, source / "shard-0") as shard:
        shard.assign("t", ids, np.ones((ids.size, 4), np.float32))
        shard.snapshot("ck")

    def crash(self: object, src: object) -> None:
        raise KeyboardInterrupt  # as a kill would stop it: mid-way, nothing undone

    with monkeypatch.context() as patch:
        patch.setattr(reshard_module._Mover, "move_shard", crash)
        patch.setattr(reshard_module, "remove_output", lambda target, existed: None)
        with pytest.raises(KeyboardInterrupt):
            reshard_module.reshard(source, target, 2, "ck")
    assert (target / "shard-1").is_dir()  # left half written
    args = ["--data-dir", str(target / "shard-1"), "--config", str(config_file)]
    refused = serve(*args, "--shard-index", "1", "--num-shards", "2", expect_exit=True)
    assert refused.process.returncode == 1
    line = error_line(refused.stderr())
    assert "was being written by an embeddb reshard that did not finish" in line
    hinted = line[line.index("embeddb reshard --from") :]
    assert f"--to {shlex.quote(str(target.resolve()))} --num-shards 2 --snapshot ck" in hinted
    finish = cli(*shlex.split(hinted)[1:])  # replaces the unfinished output
    assert finish.returncode == 0, finish.stderr
    started = serve(*args, "--shard-index", "1", "--num-shards", "2")
    with Client([started.address], ClientOptions(verify_topology=False)) as client:
        stats = client.stats()[0]
    assert 0 < stats["tables"]["t"]["rows"] < ids.size


def test_a_read_only_source_is_locked_through_a_read_only_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that may not create the lock file (a read-only copy of snapshots) locks an
    existing one read-only and refuses when it is held; without one, nothing could hold it."""
    from embeddb.engine.durability import dirlock

    real_open = os.open

    def no_create(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, mode)

    (tmp_path / "empty").mkdir()
    holder = DirectoryLock.acquire(tmp_path)  # creates the lock file, before the patch
    with monkeypatch.context() as patch:
        patch.setattr(dirlock.os, "open", no_create)
        assert not DirectoryLock.acquire(tmp_path / "empty", read_only_ok=True).held
        with pytest.raises(StorageError, match="cannot lock"):
            DirectoryLock.acquire(tmp_path / "empty")
        with pytest.raises(DirectoryInUseError, match=f"process {os.getpid()}"):
            DirectoryLock.acquire(tmp_path, read_only_ok=True)
        holder.release()
        again = DirectoryLock.acquire(tmp_path, read_only_ok=True)
        assert again.held
        again.release()
