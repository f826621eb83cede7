"""A real full disk under a real ``embeddb serve`` primary with a follower (issue 23).

The primary's data directory is a small tmpfs, ``fsync: always``; a client assigns 2,000 new
ids per call until the disk is full. Before: the failing call answered INTERNAL with the
server's log path in its message, yet 518–1,001 of its rows were readable on the primary, about
500 survived a restart, the follower sometimes held part of it, and the shutdown failed with
"disk tier close failed: No space left on device". Now: RESOURCE_EXHAUSTED naming no path, no
row of the failed call anywhere, the shutdown succeeds and every acknowledged row survives it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client, ClientOptions
from embeddb.errors import EmbeddbError
from embeddb.transport.status import code_of
from tests.support import START_TIMEOUT_S, StartServe, eventually, serve_processes

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

CONFIG = (
    "tables: {t: {dim: 16, capacity: 200000, optimizer: {type: sgd, lr: 0.1}}}\n"
    "store: {fsync: always, log_lz4_min_bytes: 0}\n"
)
BATCH = 2000
NO_RETRY = ClientOptions(retries=0)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MB tmpfs (tests run as root; skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_no_trace_of_the_failed_call_anywhere(
    serve: StartServe, tmp_path: Path, small_disk: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    data = small_disk / "p"
    primary = serve("--config", str(config), "--data-dir", str(data))
    follower = serve("--follow", primary.address, "--data-dir", str(tmp_path / "f"))
    rng = np.random.default_rng(0)
    acked: list[tuple[np.ndarray, np.ndarray]] = []
    failed: tuple[np.ndarray, np.ndarray] | None = None
    with Client([primary.address], NO_RETRY) as client:
        for k in range(200):  # 6 MB holds about 40 calls of 144 KB
            ids = np.arange(k * BATCH, (k + 1) * BATCH, dtype=np.uint64)
            vectors = rng.standard_normal((BATCH, 16)).astype(np.float32) + 5.0  # never zero
            try:
                client.assign("t", ids, vectors)
            except EmbeddbError as exc:
                assert code_of(exc).name == "RESOURCE_EXHAUSTED", exc
                assert str(small_disk) not in str(exc)  # the path is in the server log only
                failed = (ids, vectors)
                break
            acked.append((ids, vectors))
        assert failed is not None and acked, "the disk never filled"
        # Nothing of the failed call is visible on the primary; everything acknowledged is.
        assert not client.lookup("t", failed[0], train=False).any()
        for ids, vectors in acked:
            assert np.array_equal(client.lookup("t", ids, train=False), vectors)

    with Client([follower.address], NO_RETRY) as reader:
        last_ids, last_vectors = acked[-1]
        eventually(
            lambda: np.array_equal(reader.lookup("t", last_ids, train=False), last_vectors),
            START_TIMEOUT_S,
            "the follower to apply the last acknowledged call",
        )
        assert not reader.lookup("t", failed[0], train=False).any()

    primary.stop()  # exit code 0: a shutdown on a full disk succeeds
    grown = subprocess.run(
        ["mount", "-o", "remount,size=64m", str(small_disk)], capture_output=True, check=False
    )
    assert grown.returncode == 0, grown.stderr
    restarted = serve("--config", str(config), "--data-dir", str(data))
    with Client([restarted.address], NO_RETRY) as client:
        assert not client.lookup("t", failed[0], train=False).any()
        for ids, vectors in acked:
            assert np.array_equal(client.lookup("t", ids, train=False), vectors)
    restarted.stop()
