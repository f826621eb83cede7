"""Opening an update log whose last segment ends badly: torn writes are cut, corruption is
refused (``absolute_consistency``) or cut and recorded (``point_in_time``, or on request)."""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig, FsyncPolicy, LogRecovery, StoreConfig
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_scan import LogCut
from embeddb.errors import ConfigError, CorruptDataError

SEGMENT_HEADER = 24
RECORD_HEADER = 21
SIZE = 40  # payload bytes of every record written by fill()
RECORD = RECORD_HEADER + SIZE
TAIL_START = SEGMENT_HEADER + 2 * RECORD  # the third (last) record of a three-record segment
ALWAYS = LogConfig(fsync=FsyncPolicy.ALWAYS)  # auto: absolute_consistency
NEVER = LogConfig(fsync=FsyncPolicy.NEVER)  # auto: point_in_time


def payload(seq: int) -> bytes:
    head = f"record {seq};".encode()
    return head + np.random.default_rng(seq).bytes(SIZE - len(head))


def fill(directory: Path, n: int = 3, config: LogConfig = ALWAYS) -> Path:
    """Write records 1..n; return the (only) segment file."""
    with UpdateLog(directory, config) as log:
        for seq in range(1, n + 1):
            assert log.append([payload(seq)]) == seq
    [path] = sorted(directory.glob("*.log"))
    assert path.stat().st_size == SEGMENT_HEADER + n * RECORD
    return path


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def cut_lines(directory: Path) -> list[dict[str, object]]:
    text = (directory / "log-cuts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------------------- corruption


@pytest.mark.parametrize("offset", [0, 8, RECORD_HEADER, RECORD_HEADER + 17, RECORD - 1])
def test_a_complete_corrupt_last_record_is_refused_under_absolute_consistency(
    tmp_path: Path, offset: int
) -> None:
    path = fill(tmp_path)
    flip(path, TAIL_START + offset)
    before = path.read_bytes()
    with pytest.raises(CorruptDataError) as caught:
        UpdateLog(tmp_path, ALWAYS)
    message = str(caught.value)
    assert str(path) in message
    assert f"at offset {TAIL_START} (seq 3)" in message
    assert "--cut-corrupt-log-tail" in message and "absolute_consistency" in message
    assert path.read_bytes() == before  # nothing cut, nothing recorded
    assert not (tmp_path / "log-cuts.jsonl").exists()


def test_point_in_time_cuts_a_corrupt_tail_at_error_and_records_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, umask_022: None
) -> None:
    path = fill(tmp_path, config=NEVER)
    flip(path, TAIL_START + RECORD_HEADER + 5)  # a payload byte: the record is complete
    bad = path.read_bytes()[TAIL_START:]
    with caplog.at_level(logging.WARNING), UpdateLog(tmp_path, NEVER) as log:
        assert log.last_seq == 2
        assert [r.payload for r in log.read()] == [payload(1), payload(2)]
        [cut] = log.cuts
        assert log.append([b"next"]) == 3
    assert isinstance(cut, LogCut)
    assert (cut.kind, cut.offset, cut.bytes, cut.first_seq) == ("corrupt", TAIL_START, RECORD, 3)
    assert cut.recovery is LogRecovery.POINT_IN_TIME and not cut.forced
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert path.name in error.getMessage() and "checksum mismatch" in error.getMessage()
    [line] = cut_lines(tmp_path)
    assert line["segment"] == str(path) and line["offset"] == TAIL_START
    assert line["bytes"] == RECORD and line["first_seq_lost"] == 3
    assert line["kind"] == "corrupt" and line["reason"] == "checksum mismatch"
    assert line["log_recovery"] == "point_in_time" and line["cut_corrupt_log_tail"] is False
    saved = tmp_path / "log-cuts" / f"{path.stem}-{TAIL_START}.bin"
    assert line["saved"] == str(saved) and cut.saved == saved
    assert saved.read_bytes() == bad
    assert mode(saved) == 0o600 and mode(tmp_path / "log-cuts.jsonl") == 0o600


def test_the_operator_flag_cuts_a_corrupt_tail_under_absolute_consistency(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = fill(tmp_path)
    flip(path, TAIL_START + RECORD - 1)
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, cut_corrupt_tail=True, cuts_dir=tmp_path / "d")
    (tmp_path / "d").mkdir()
    with caplog.at_level(logging.WARNING), UpdateLog(tmp_path, config) as log:
        assert log.last_seq == 2
        [cut] = log.cuts
    assert cut.kind == "corrupt" and cut.forced and cut.recovery.value == "absolute_consistency"
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    [line] = cut_lines(tmp_path / "d")  # recorded where cuts_dir says
    assert line["cut_corrupt_log_tail"] is True and line["first_seq_lost"] == 3
    assert (tmp_path / "d" / "log-cuts" / f"{path.stem}-{TAIL_START}.bin").exists()


def _header(stored: int, seq: int, length: int, flags: int) -> bytes:
    return struct.pack("<IIQIB", 0xDEADBEEF, stored, seq, length, flags)


@pytest.mark.parametrize(
    "header, keep",
    [
        (_header(SIZE, 7, SIZE, 0), RECORD),  # another seq
        (_header(SIZE, 7, SIZE, 0), RECORD_HEADER + 3),  # another seq, payload past the end
        (_header(SIZE + 1, 3, SIZE, 0), RECORD_HEADER + 3),  # stored != length, uncompressed
        (_header(SIZE, 3, SIZE, 0x02), RECORD_HEADER + 3),  # a reserved flag
        (_header(SIZE, 3, 0, 0x01), RECORD),  # LZ4 of nothing
    ],
    ids=["seq", "seq-short", "stored", "flags", "lz4-length"],
)
def test_an_implausible_header_is_corruption_not_a_torn_write(
    tmp_path: Path, header: bytes, keep: int
) -> None:
    path = fill(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:TAIL_START] + (header + data[TAIL_START + RECORD_HEADER :])[:keep])
    with pytest.raises(CorruptDataError, match=rf"{path.name}: corrupt record at offset "
                       rf"{TAIL_START} \(seq 3\): invalid record header"):  # fmt: skip
        UpdateLog(tmp_path, ALWAYS)
    with UpdateLog(tmp_path, NEVER) as log:  # point_in_time: cut
        assert log.last_seq == 2
        assert [c.kind for c in log.cuts] == ["corrupt"]


def test_a_hole_is_refused_under_point_in_time_and_cut_only_on_request(tmp_path: Path) -> None:
    path = fill(tmp_path, 4)
    flip(path, SEGMENT_HEADER + 2 * RECORD + 30)  # record 3 bad, record 4 intact
    with pytest.raises(CorruptDataError, match="followed by an intact record") as caught:
        UpdateLog(tmp_path, NEVER)
    assert "--cut-corrupt-log-tail" in str(caught.value)
    config = LogConfig(fsync=FsyncPolicy.NEVER, cut_corrupt_tail=True)
    with UpdateLog(tmp_path, config) as log:
        assert log.last_seq == 2
        [cut] = log.cuts
    assert (cut.first_seq, cut.bytes) == (3, 2 * RECORD)  # record 4 is lost too, but saved
    assert cut.saved is not None and cut.saved.stat().st_size == 2 * RECORD


# ----------------------------------------------------------------------------------- torn


@pytest.mark.parametrize("config", [ALWAYS, NEVER], ids=["absolute", "point_in_time"])
@pytest.mark.parametrize("keep", [1, RECORD_HEADER - 1, RECORD_HEADER, RECORD - 1])
def test_a_torn_prefix_is_cut_with_a_warning_in_both_modes(
    tmp_path: Path, config: LogConfig, keep: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = fill(tmp_path, config=config)
    os.truncate(path, TAIL_START + keep)
    with caplog.at_level(logging.WARNING), UpdateLog(tmp_path, config) as log:
        assert log.last_seq == 2
        [cut] = log.cuts
        assert log.append([b"next"]) == 3
    assert (cut.kind, cut.offset, cut.bytes, cut.first_seq) == ("torn", TAIL_START, keep, 3)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert f"{keep} bytes" in caplog.text
    assert [line["kind"] for line in cut_lines(tmp_path)] == ["torn"]


@pytest.mark.parametrize("zeros", [RECORD, 4096])
def test_an_all_zero_tail_is_torn(tmp_path: Path, zeros: int) -> None:
    path = fill(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:TAIL_START] + bytes(zeros))  # the last record's page never written
    with UpdateLog(tmp_path, ALWAYS) as log:
        assert log.last_seq == 2
        [cut] = log.cuts
    assert (cut.kind, cut.bytes, cut.saved) == ("torn", zeros, None)
    assert "zero" in cut.reason
    assert path.stat().st_size == TAIL_START


def test_an_intact_log_cuts_nothing(tmp_path: Path) -> None:
    fill(tmp_path)
    with UpdateLog(tmp_path, ALWAYS) as log:
        assert log.last_seq == 3 and log.cuts == ()
    assert not (tmp_path / "log-cuts.jsonl").exists()


# ------------------------------------------------------------------------------ file modes


def test_segments_are_created_0600_even_under_umask_022(tmp_path: Path, umask_022: None) -> None:
    config = LogConfig(fsync=FsyncPolicy.NEVER, segment_bytes=SEGMENT_HEADER + 2 * RECORD)
    with UpdateLog(tmp_path / "log", config) as log:
        for seq in range(1, 6):
            log.append([payload(seq)])
    files = sorted((tmp_path / "log").glob("*.log"))
    assert len(files) == 3
    assert [mode(f) for f in files] == [0o600] * 3


# ---------------------------------------------------------------------------------- config


def test_auto_recovery_follows_the_fsync_policy() -> None:
    assert ALWAYS.tail_recovery is LogRecovery.ABSOLUTE_CONSISTENCY
    assert NEVER.tail_recovery is LogRecovery.POINT_IN_TIME
    assert LogConfig().tail_recovery is LogRecovery.POINT_IN_TIME  # interval
    pinned = LogConfig(fsync=FsyncPolicy.ALWAYS, recovery="point_in_time")
    assert pinned.tail_recovery is LogRecovery.POINT_IN_TIME
    with pytest.raises(ConfigError, match="recovery"):
        LogConfig(recovery="sometimes")


def test_store_log_recovery_is_read_from_yaml_and_validated() -> None:
    base = "slots_config:\n  item: {dim: 4}\nstore: {fsync: always, log_recovery: %s}\n"
    config = EmbeddingConfig.from_yaml_text(base % "point_in_time")
    assert config.store.log.recovery is LogRecovery.POINT_IN_TIME
    assert EmbeddingConfig.from_dict(config.to_dict()) == config
    assert StoreConfig().log.recovery is LogRecovery.AUTO
    with pytest.raises(ConfigError, match=r"store\.log_recovery.*absolute_consistency"):
        EmbeddingConfig.from_yaml_text(base % "absolute")
