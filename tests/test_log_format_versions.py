"""Update log format versions: version 2 (CRC-32C) is written, version-1 logs (zlib CRC-32)
still open, read, detect damage, and continue in a version-2 segment."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from embeddb.config import FsyncPolicy
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.durability.log_config import LogConfig
from embeddb.errors import CorruptDataError

NEVER = LogConfig(fsync=FsyncPolicy.NEVER)
Crc = Callable[[bytes, int], int]


def header(version: int, first_seq: int, crc: Crc) -> bytes:
    body = b"EMBDBLOG" + struct.pack("<IQ", version, first_seq)
    return body + struct.pack("<I", crc(body, 0))


def record(seq: int, payload: bytes, crc: Crc) -> bytes:
    """A record as drawn in log_format: crc of (payload ‖ header bytes 4:21), uncompressed."""
    fields = struct.pack("<IQIB", len(payload), seq, len(payload), 0)
    return struct.pack("<I", crc(fields, crc(payload, 0))) + fields + payload


def v1_segment(directory: Path, first_seq: int, payloads: list[bytes]) -> Path:
    path = directory / f"{first_seq:020d}.log"
    body = b"".join(record(first_seq + i, p, zlib.crc32) for i, p in enumerate(payloads))
    path.write_bytes(header(1, first_seq, zlib.crc32) + body)
    return path


def versions(directory: Path) -> dict[int, int]:
    return {
        int(p.stem): struct.unpack_from("<I", p.read_bytes(), 8)[0]
        for p in sorted(directory.glob("*.log"))
    }


def payloads(log: UpdateLog, after_seq: int = 0) -> list[bytes]:
    return [r.payload for r in log.read(after_seq)]


def test_records_are_written_as_documented_with_crc32c(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, NEVER) as log:
        assert log.append([b"hello"]) == 1
    [path] = tmp_path.glob("*.log")
    crc = crc32c.crc32c
    assert path.read_bytes() == header(2, 1, crc) + record(1, b"hello", crc)


def test_a_version_1_log_is_read_and_continued_in_a_version_2_segment(tmp_path: Path) -> None:
    old = [b"one", b"two", b"three", b"four", b"five"]
    v1_segment(tmp_path, 1, old[:3])
    v1_segment(tmp_path, 4, old[3:])
    with UpdateLog(tmp_path, NEVER) as log:
        assert log.last_seq == 5
        assert payloads(log) == old
        assert log.append([b"six"]) == 6
        assert payloads(log, 4) == [b"five", b"six"]
    assert versions(tmp_path) == {1: 1, 4: 1, 6: 2}
    with UpdateLog(tmp_path, NEVER) as log:  # mixed versions reopen, append in place
        assert payloads(log) == [*old, b"six"]
        assert log.append([b"seven"]) == 7
    assert versions(tmp_path) == {1: 1, 4: 1, 6: 2}


def test_an_empty_version_1_active_segment_is_replaced(tmp_path: Path) -> None:
    v1_segment(tmp_path, 1, [b"a", b"b"])
    v1_segment(tmp_path, 3, [])  # sealed 1..2, nothing appended since
    with UpdateLog(tmp_path, NEVER) as log:
        assert log.append([b"c"]) == 3
        assert payloads(log) == [b"a", b"b", b"c"]
    assert versions(tmp_path) == {1: 1, 3: 2}
    assert not list(tmp_path.glob(".*"))  # no staged file left behind


def test_a_torn_version_1_tail_is_cut_before_the_new_segment(tmp_path: Path) -> None:
    path = v1_segment(tmp_path, 1, [b"a" * 40, b"b" * 40])
    path.write_bytes(path.read_bytes()[:-7])
    with UpdateLog(tmp_path, NEVER) as log:
        assert [c.kind for c in log.cuts] == ["torn"]
        assert log.append([b"next"]) == 2
        assert payloads(log) == [b"a" * 40, b"next"]
    assert versions(tmp_path) == {1: 1, 2: 2}


def test_a_flipped_byte_in_a_version_1_record_is_corruption(tmp_path: Path) -> None:
    path = v1_segment(tmp_path, 1, [b"a" * 40, b"b" * 40, b"c" * 40])
    data = bytearray(path.read_bytes())
    second = 24 + 21 + 40
    data[second + 30] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=f"{path.name}.*at offset {second}"):
        UpdateLog(tmp_path, NEVER)
    assert path.read_bytes() == bytes(data)  # refused, nothing cut


def test_intact_version_1_records_after_a_damaged_header_are_a_hole(tmp_path: Path) -> None:
    path = v1_segment(tmp_path, 1, [b"a" * 40, b"b" * 40])
    data = bytearray(path.read_bytes())
    data[21] ^= 0x01  # the header's crc
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="intact record"):
        UpdateLog(tmp_path, NEVER)  # never: point_in_time, which cuts only a hole-free tail
    assert path.read_bytes() == bytes(data)
