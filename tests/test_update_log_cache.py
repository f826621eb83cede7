"""The update log frees the page cache of what it has fsynced (all but the active tail)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embeddb.config import FsyncPolicy
from embeddb.engine.durability import log_sync
from embeddb.engine.durability.fileio import FileIO
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from tests.support import eventually

KEEP = 1000
RECORD = 500  # payload bytes: a 21-byte header makes each record 521 bytes


class Recording(FileIO):
    """The real file layer, noting each page-cache drop as (fd, offset, length)."""

    def __init__(self) -> None:
        self.drops: list[tuple[int, int, int]] = []

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        self.drops.append((fd, offset, length))
        super().drop_cache(fd, offset, length)


@pytest.fixture(autouse=True)
def small_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_sync, "CACHE_KEEP_BYTES", KEEP)


def payload(k: int) -> bytes:
    return np.random.default_rng(k).bytes(RECORD)


def test_a_sync_drops_the_fsynced_part_but_the_kept_tail_then_continues(tmp_path: Path) -> None:
    io = Recording()
    with UpdateLog(tmp_path, LogConfig(fsync=FsyncPolicy.NEVER), io=io) as log:
        log.append([payload(1)])
        log.sync()
        assert io.drops == []  # 24 + 521 bytes: all within the kept tail
        for k in range(2, 7):
            log.append([payload(k)])
        log.sync()
        end = log._segments[-1].size
        assert end == 24 + 6 * 521
        ((fd, offset, length),) = io.drops
        assert (offset, length) == (0, end - KEEP)
        log.append([payload(7)])
        log.sync()
        assert io.drops[1] == (fd, end - KEEP, 521)  # from where the last drop ended
        assert [r.payload for r in log.read(0)] == [payload(k) for k in range(1, 8)]


def test_a_sealed_segment_is_dropped_whole_once_fsynced(tmp_path: Path) -> None:
    io = Recording()
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=4096)
    with UpdateLog(tmp_path, config, io=io) as log:
        for k in range(1, 9):  # 7 records fill the first segment, the 8th starts the next
            log.append([payload(k)])
        assert len(log._segments) == 2
        log.sync()
        assert [(o, n) for _, o, n in io.drops] == [(0, 0)]  # the sealed one; the active is short
        log.append([payload(9)])
        log.sync()
        assert [(o, n) for _, o, n in io.drops[1:]] == [(0, 24 + 2 * 521 - KEEP)]
        assert [r.payload for r in log.read(0)] == [payload(k) for k in range(1, 10)]


def test_the_interval_policy_drops_in_the_background(tmp_path: Path) -> None:
    io = Recording()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1)
    with UpdateLog(tmp_path, config, io=io) as log:
        for k in range(1, 5):
            log.append([payload(k)])
        eventually(lambda: io.drops, what="the syncer's first drop")
        assert io.drops[0][1:] == (0, 24 + 4 * 521 - KEEP)
