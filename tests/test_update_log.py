"""The update log on real files: framing, segments, fsync policies, torn tails and corruption."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import crc32c
import numpy as np
import pytest

from embeddb.config import FsyncPolicy
from embeddb.engine.durability.log import LogRecord, LogTruncatedError, UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from embeddb.engine.durability.log_format import segment_name
from embeddb.errors import (
    CorruptDataError,
    InvalidArgumentError,
    StorageError,
    UnavailableError,
)
from embeddb.transport.status import code_of
from tests.support import blocked_in, eventually

SEGMENT_HEADER = 24
RECORD_HEADER = 21
NEVER = LogConfig(fsync=FsyncPolicy.NEVER)


def small(segment_bytes: int = 4096) -> LogConfig:
    return LogConfig(fsync=FsyncPolicy.NEVER, segment_bytes=segment_bytes)


def payload(seq: int, size: int = 40) -> bytes:
    """A payload that names its record, padded with bytes that do not compress."""
    head = f"record {seq};".encode()
    return head + np.random.default_rng(seq).bytes(max(0, size - len(head)))


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def read_all(log: UpdateLog, after_seq: int = 0) -> list[LogRecord]:
    return list(log.read(after_seq))


def fill(directory: Path, n: int, config: LogConfig = NEVER, size: int = 40) -> None:
    with UpdateLog(directory, config) as log:
        for seq in range(1, n + 1):
            assert log.append([payload(seq, size)]) == seq


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------- round trip


def test_round_trip_across_segment_rolls(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 700, size=400)
    expected: dict[int, bytes] = {}
    with UpdateLog(tmp_path, small()) as log:
        assert (log.last_seq, log.first_seq) == (0, 1)
        for i, size in enumerate(sizes.tolist()):
            vec = rng.standard_normal(size // 4).astype(np.float32)
            head = payload(i + 1, size % 4 + 12)
            seq = log.append([head, memoryview(vec)])  # bytes and a numpy array, zero-copy
            assert seq == i + 1
            expected[seq] = head + vec.tobytes()
        assert log.last_seq == 400
        files = segments(tmp_path)
        assert len(files) > 10
        assert all(f.stat().st_size <= 4096 for f in files)
        got = read_all(log)
        assert [r.seq for r in got] == list(range(1, 401))
        assert all(r.payload == expected[r.seq] for r in got)
        assert [r.seq for r in log.read(after_seq=237)] == list(range(238, 401))
        assert read_all(log, after_seq=400) == []
    # Each file is named after the seq of its first record.
    firsts = [int(f.stem) for f in files]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    with UpdateLog(tmp_path, small()) as log:
        assert (log.last_seq, log.durable_seq, log.first_seq) == (400, 400, 1)
        starts = {r.seq for r in read_all(log)}
        assert set(firsts) <= starts
        assert log.append([b"after reopen"]) == 401
        assert read_all(log, 399) == [
            LogRecord(400, expected[400]),
            LogRecord(401, b"after reopen"),
        ]


def test_large_payload_has_a_segment_of_its_own_and_reads_back(tmp_path: Path) -> None:
    big = np.random.default_rng(1).standard_normal(2 << 20).astype(np.float32)  # 8 MiB
    with UpdateLog(tmp_path, small(segment_bytes=1 << 20)) as log:
        log.append([b"a"])
        assert log.append([memoryview(big)]) == 2
        log.append([b"b"])
        got = read_all(log)
    assert got[1].payload == big.tobytes()
    assert [f.name for f in segments(tmp_path)] == [f"{s:020d}.log" for s in (1, 2, 3)]


def test_reopen_keeps_last_seq_and_an_empty_log_reopens_empty(tmp_path: Path) -> None:
    with UpdateLog(tmp_path / "empty", NEVER) as log:
        assert log.last_seq == 0
    with UpdateLog(tmp_path / "empty", NEVER) as log:
        assert (log.last_seq, log.first_seq) == (0, 1)
        assert read_all(log) == []
    fill(tmp_path / "full", 7)
    with UpdateLog(tmp_path / "full", NEVER) as log:
        assert log.last_seq == 7


def test_start_seq_numbers_a_new_log_after_a_snapshot(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, NEVER, start_seq=100) as log:
        assert (log.last_seq, log.first_seq) == (100, 101)
        assert read_all(log, after_seq=100) == []
        with pytest.raises(LogTruncatedError):
            log.read(after_seq=50)
        assert log.append([b"x"]) == 101
    with UpdateLog(tmp_path, NEVER) as log:  # the numbering survives a reopen
        assert (log.first_seq, log.last_seq) == (101, 101)
    with pytest.raises(StorageError, match="before start_seq 500"):
        UpdateLog(tmp_path, NEVER, start_seq=500)


def test_concurrent_appends_get_unique_contiguous_seqs(tmp_path: Path) -> None:
    written: dict[int, bytes] = {}
    lock = threading.Lock()
    with UpdateLog(tmp_path, small(segment_bytes=64 << 10)) as log:

        def work(t: int) -> None:
            for i in range(400):
                data = f"thread {t} item {i} ".encode() * (1 + i % 7)
                seq = log.append([data[:10], memoryview(data)[10:]])
                with lock:
                    written[seq] = data

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(written) == list(range(1, 1601))
        assert {r.seq: r.payload for r in read_all(log)} == written


@pytest.mark.slow
def test_read_while_another_thread_appends(tmp_path: Path) -> None:
    n = 3000
    done = threading.Event()
    with UpdateLog(tmp_path, small(segment_bytes=8 << 10)) as log:

        def writer() -> None:
            for seq in range(1, n + 1):
                log.append([payload(seq, 10 + seq % 90)])
            done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        seen: list[LogRecord] = []
        while True:
            finished = done.is_set()
            seen.extend(log.read(seen[-1].seq if seen else 0))
            if finished and len(seen) == n:
                break
        thread.join()
    assert [r.seq for r in seen] == list(range(1, n + 1))
    assert all(r.payload == payload(r.seq, 10 + r.seq % 90) for r in seen)


# ------------------------------------------------------------------------------ fsync policies


def test_always_returns_only_once_the_record_is_fsynced(tmp_path: Path) -> None:
    failures: list[str] = []
    with UpdateLog(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS)) as log:

        def work() -> None:
            for i in range(50):
                seq = log.append([b"x" * (i + 1)])
                log.wait_durable(seq)
                if log.durable_seq < seq:
                    failures.append(f"durable {log.durable_seq} < {seq}")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures
        assert log.durable_seq == log.last_seq == 200


def test_interval_catches_up_in_the_background(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=5)) as log:
        for _ in range(3):
            seq = log.append([b"y" * 1000])
            log.wait_durable(seq)  # returns at once
            eventually(
                lambda seq=seq: log.durable_seq >= seq, 30, f"the background fsync of seq {seq}"
            )


def test_never_fsyncs_only_on_sync_and_close(tmp_path: Path) -> None:
    log = UpdateLog(tmp_path, NEVER)
    seq = log.append([b"z"])
    log.wait_durable(seq)
    # No background thread that could sync (INTERVAL starts one): nothing to wait for.
    assert not [t for t in threading.enumerate() if t.name.startswith("embeddb-log-sync")]
    assert log.durable_seq == 0
    log.sync()
    assert log.durable_seq == seq
    seq = log.append([b"z"])
    log.close()
    assert log.durable_seq == seq
    log.close()  # idempotent
    with pytest.raises(UnavailableError):
        log.append([b"late"])
    with pytest.raises(InvalidArgumentError):
        log.wait_durable(seq + 1)


# ------------------------------------------------------------------------------- compression


def test_lz4_only_for_payloads_it_shrinks(tmp_path: Path) -> None:
    zeros = bytes(1 << 20)
    noise = np.random.default_rng(2).bytes(1 << 20)
    small_zeros = bytes(1000)
    with UpdateLog(tmp_path, LogConfig(fsync=FsyncPolicy.NEVER, lz4_min_bytes=4096)) as log:
        [path] = segments(tmp_path)
        sizes = []
        for data in (zeros, noise, small_zeros, bytes(8192)):
            before = path.stat().st_size
            log.append([data])
            sizes.append(path.stat().st_size - before - RECORD_HEADER)
        assert [r.payload for r in read_all(log)] == [zeros, noise, small_zeros, bytes(8192)]
    assert sizes[0] < 10_000  # compressed
    assert sizes[1] == len(noise)  # incompressible: stored as is
    assert sizes[2] == 1000  # below lz4_min_bytes
    assert sizes[3] < 1000
    with UpdateLog(tmp_path, NEVER) as log:  # and after reopening
        assert read_all(log)[0].payload == zeros


# ------------------------------------------------------------------- torn tails and corruption

RECORD = RECORD_HEADER + 40  # the records written by fill()
TAIL_START = SEGMENT_HEADER + 2 * RECORD  # the third (last) record of a three-record segment


@pytest.mark.parametrize("cut", range(TAIL_START, TAIL_START + RECORD))
def test_a_torn_last_record_is_cut_at_every_offset(
    tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    assert path.stat().st_size == TAIL_START + RECORD
    os.truncate(path, cut)
    with caplog.at_level(logging.WARNING), UpdateLog(tmp_path, NEVER) as log:
        assert log.last_seq == 2
        assert path.stat().st_size == TAIL_START
        assert log.append([b"next"]) == 3
        assert [r.payload for r in read_all(log)] == [payload(1), payload(2), b"next"]
    if cut > TAIL_START:
        assert path.name in caplog.text and f"{cut - TAIL_START} bytes" in caplog.text


@pytest.mark.parametrize("offset", [0, 3, 8, 15, 20, 21, 40, RECORD - 1])
def test_a_corrupt_final_record_is_cut_as_corruption_under_point_in_time(
    tmp_path: Path, offset: int
) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    flip(path, TAIL_START + offset)
    with UpdateLog(tmp_path, NEVER) as log:  # never: point_in_time (tests/test_log_scan.py)
        assert log.last_seq == 2
        assert [cut.kind for cut in log.cuts] == ["corrupt"]
        assert log.append([b"next"]) == 3


def test_a_torn_tail_in_the_last_of_several_segments(tmp_path: Path) -> None:
    fill(tmp_path, 30, small(segment_bytes=SEGMENT_HEADER + 5 * RECORD))
    files = segments(tmp_path)
    assert len(files) == 6
    os.truncate(files[-1], files[-1].stat().st_size - 7)
    with UpdateLog(tmp_path, NEVER) as log:
        assert log.last_seq == 29
        assert log.append([b"next"]) == 30


def segment_header(first_seq: int) -> bytes:
    """The documented segment header: magic, version 2, first seq, CRC-32C of those 20 bytes."""
    body = b"EMBDBLOG" + struct.pack("<IQ", 2, first_seq)
    return body + struct.pack("<I", crc32c.crc32c(body))


@pytest.mark.parametrize("size", [*range(SEGMENT_HEADER + 1), -1])
def test_a_torn_new_segment_header_is_rewritten(tmp_path: Path, size: int) -> None:
    fill(tmp_path, 10, small(segment_bytes=SEGMENT_HEADER + 5 * RECORD))
    files = segments(tmp_path)
    assert [int(f.stem) for f in files] == [1, 6]
    assert files[0].read_bytes()[:SEGMENT_HEADER] == segment_header(1)
    new = tmp_path / f"{11:020d}.log"  # a crash while sealing segment 6..10 left this
    # A prefix of its header, or (-1) a header and a record that came back as zeros.
    new.write_bytes(segment_header(11)[:size] if size >= 0 else bytes(SEGMENT_HEADER + RECORD))
    with UpdateLog(tmp_path, NEVER) as log:
        assert log.last_seq == 10
        assert log.append([b"next"]) == 11
    assert new.stat().st_size == SEGMENT_HEADER + RECORD_HEADER + 4


def test_a_segment_header_of_another_segment_or_version_is_refused(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    data = path.read_bytes()
    path.write_bytes(segment_header(2) + data[SEGMENT_HEADER:])
    with pytest.raises(CorruptDataError, match="header says first seq 2, its name 1"):
        UpdateLog(tmp_path, NEVER)
    for crc in (zlib.crc32, crc32c.crc32c):  # a newer format, whatever checksum it uses
        body = b"EMBDBLOG" + struct.pack("<IQ", 3, 1)
        path.write_bytes(body + struct.pack("<I", crc(body)) + data[SEGMENT_HEADER:])
        with pytest.raises(
            StorageError, match="format version 3; this embeddb reads versions 1, 2"
        ):
            UpdateLog(tmp_path, NEVER)


@pytest.mark.parametrize("offset", range(RECORD))
def test_a_flipped_byte_in_a_middle_record_is_corruption(tmp_path: Path, offset: int) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    at = SEGMENT_HEADER + RECORD + offset
    flip(path, at)
    with pytest.raises(
        CorruptDataError, match=f"{path.name}.* at offset {SEGMENT_HEADER + RECORD}"
    ):
        UpdateLog(tmp_path, NEVER)


@pytest.mark.parametrize("where", ["first record", "last record", "header", "truncated"])
def test_damage_in_an_earlier_segment_is_corruption(tmp_path: Path, where: str) -> None:
    fill(tmp_path, 15, small(segment_bytes=SEGMENT_HEADER + 5 * RECORD))
    first, second, _ = segments(tmp_path)
    target = {"first record": first, "last record": second, "header": second}.get(where, first)
    if where == "truncated":
        os.truncate(first, first.stat().st_size - 1)
    else:
        flip(target, {"first record": SEGMENT_HEADER + 30, "header": 2}.get(where, -5))
    with pytest.raises(CorruptDataError, match=target.name):
        UpdateLog(tmp_path, NEVER)


def test_a_missing_segment_is_a_gap(tmp_path: Path) -> None:
    fill(tmp_path, 15, small(segment_bytes=SEGMENT_HEADER + 5 * RECORD))
    segments(tmp_path)[1].unlink()
    with pytest.raises(CorruptDataError, match="ends at seq 5"):
        UpdateLog(tmp_path, NEVER)


def test_a_record_out_of_order_is_corruption(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    data = path.read_bytes()
    # An intact record 2 where record 3 belongs.
    path.write_bytes(data[:TAIL_START] + data[SEGMENT_HEADER + RECORD : TAIL_START])
    with pytest.raises(CorruptDataError, match="has seq 2, expected 3"):
        UpdateLog(tmp_path, NEVER)


def test_corruption_after_opening_is_found_by_read(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    [path] = segments(tmp_path)
    with UpdateLog(tmp_path, NEVER) as log:
        flip(path, SEGMENT_HEADER + RECORD + 30)
        records = log.read()
        assert next(records).seq == 1
        with pytest.raises(CorruptDataError, match=f"{path.name}: checksum mismatch at offset"):
            next(records)


# -------------------------------------------------------------------------------- truncation


def test_truncate_before_deletes_only_fully_covered_segments(tmp_path: Path) -> None:
    config = small(segment_bytes=SEGMENT_HEADER + 5 * RECORD)
    fill(tmp_path, 23, config)
    files = segments(tmp_path)
    assert [int(f.stem) for f in files] == [1, 6, 11, 16, 21]
    first_two = files[0].stat().st_size + files[1].stat().st_size
    with UpdateLog(tmp_path, config) as log:
        assert log.truncate_before(5) == 0  # segment 1..5 still holds seq 5
        assert log.truncate_before(13) == first_two
        assert [int(f.stem) for f in segments(tmp_path)] == [11, 16, 21]
        assert log.first_seq == 11
        assert [r.seq for r in log.read(after_seq=10)][:2] == [11, 12]
        with pytest.raises(LogTruncatedError, match="starts at seq 11") as info:
            log.read(after_seq=9)
        assert (info.value.after_seq, info.value.first_seq) == (9, 11)
        assert isinstance(info.value, StorageError)
        log.truncate_before(10**6)  # never the active segment
        assert [int(f.stem) for f in segments(tmp_path)] == [21]
        assert (log.first_seq, log.last_seq) == (21, 23)
        assert log.append([b"x"]) == 24
    with UpdateLog(tmp_path, config) as log:
        assert (log.first_seq, log.last_seq) == (21, 24)


def test_a_reader_overtaken_by_truncation_is_told_so(tmp_path: Path) -> None:
    config = small(segment_bytes=SEGMENT_HEADER + 5 * RECORD)
    fill(tmp_path, 23, config)
    with UpdateLog(tmp_path, config) as log:
        records = log.read()
        assert [next(records).seq for _ in range(5)] == [1, 2, 3, 4, 5]
        log.truncate_before(20)
        with pytest.raises(LogTruncatedError):
            next(records)


# --------------------------------------------------------------------------- failing storage


def test_a_second_log_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, NEVER), pytest.raises(StorageError, match="in use"):
        UpdateLog(tmp_path, NEVER)


def test_a_segment_that_cannot_be_created_leaves_the_log_usable(tmp_path: Path) -> None:
    """The next segment's name is taken (by a directory: permissions would not stop root)."""
    config = small(segment_bytes=SEGMENT_HEADER + 5 * RECORD)
    directory = tmp_path / "log"
    with UpdateLog(directory, config) as log:
        for seq in range(1, 6):
            log.append([payload(seq)])
        (directory / segment_name(6)).mkdir()  # where the next segment would be created
        with pytest.raises(StorageError, match=r"cannot create update log segment .*File exists"):
            log.append([payload(6)])  # needs a new segment
        assert [r.seq for r in read_all(log)] == [1, 2, 3, 4, 5]
        (directory / segment_name(6)).rmdir()
        assert log.append([payload(6)]) == 6
    with UpdateLog(directory, config) as log:
        assert log.last_seq == 6


_FILE_SIZE_LIMIT = """
import resource, signal, sys
from embeddb.config import FsyncPolicy
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from embeddb.errors import StorageError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
log = UpdateLog(sys.argv[1], LogConfig(fsync=FsyncPolicy.NEVER, lz4_min_bytes=0))
for i in range(3):
    log.append([bytes([i]) * 1000])
[segment] = log.directory.glob("*.log")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size + 2500, hard))
seqs = []
try:
    while True:
        seqs.append(log.append([b"b" * 1000]))
except StorageError as exc:
    print("error:", exc.errno, exc)
seqs.append(log.append([b"small"]))  # fits below the limit: the log is still usable
print("seqs:", seqs)
log.close()
"""


@pytest.mark.slow
def test_a_failed_write_raises_storage_error_and_leaves_no_partial_record(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT, str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "error: 27 " in out and "File too large" in out  # EFBIG
    assert f"{directory / f'{1:020d}.log'}: cannot append seq 6" in out
    assert "seqs: [4, 5, 6]" in out
    with UpdateLog(directory, NEVER) as log:  # no torn tail to cut: the file was cut back
        assert log.last_seq == 6
        assert [r.payload for r in read_all(log)][3:] == [b"b" * 1000, b"b" * 1000, b"small"]


def test_a_directory_that_is_a_file_is_a_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="cannot open update log directory"):
        UpdateLog(blocker, NEVER)


# ------------------------------------------------------------------------ tailing (followers)


def test_wait_appended_returns_at_once_when_the_record_exists(tmp_path: Path) -> None:
    with UpdateLog(tmp_path / "log", NEVER) as log:
        log.append([b"a"])
        assert log.wait_appended(0, timeout=0)  # no time to wait: it did not need to
        assert not log.wait_appended(1, timeout=0.05)  # times out: nothing after seq 1


def test_wait_appended_wakes_on_append(tmp_path: Path) -> None:
    with UpdateLog(tmp_path / "log", NEVER) as log:
        woke: list[bool] = []
        thread = threading.Thread(target=lambda: woke.append(log.wait_appended(0, timeout=60)))
        thread.start()
        eventually(lambda: blocked_in(thread, "wait_appended"), 10, "the waiter to block")
        log.append([b"wake up"])
        thread.join(30)
        assert woke == [True]  # woken by the append, long before its timeout


def test_wait_appended_returns_false_when_the_log_closes(tmp_path: Path) -> None:
    log = UpdateLog(tmp_path / "log", NEVER)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(log.wait_appended(0, timeout=60)))
    thread.start()
    eventually(lambda: blocked_in(thread, "wait_appended"), 10, "the waiter to block")
    log.close()
    thread.join(30)
    assert result == [False]  # woken by the close, long before its timeout
    assert not log.wait_appended(0, timeout=10)  # closed: returns at once


def test_append_time_is_known_for_recent_records_of_this_process(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 3)
    with UpdateLog(directory, NEVER) as log:
        before = time.time()
        seq = log.append([b"new"])
        after = time.time()
        at = log.append_time(seq)
        assert at is not None and before <= at <= after
        assert log.append_time(3) is None  # appended before this UpdateLog opened
        assert log.append_time(seq + 1) is None  # not appended yet


def test_a_truncated_reader_error_is_out_of_range(tmp_path: Path) -> None:
    from embeddb.errors import OutOfRangeError

    with UpdateLog(tmp_path / "log", small(segment_bytes=200)) as log:
        for seq in range(1, 30):
            log.append([payload(seq)])
        log.truncate_before(20)
        with pytest.raises(LogTruncatedError) as info:
            log.read(1)
        assert isinstance(info.value, OutOfRangeError) and isinstance(info.value, StorageError)
        assert code_of(info.value).name == "OUT_OF_RANGE"
