"""The scan that opens an update log: every record checked, an invalid tail cut or refused.

The layout of segments and records is drawn in :mod:`embeddb.engine.durability.log_format`; this
module validates it. :func:`scan_log` runs once when an
:class:`~embeddb.engine.durability.log.UpdateLog`
opens: it checks every record of every segment, and decides what to do when the last segment
ends in bytes that are not an intact record.

Telling a torn write from corruption
------------------------------------
Only the end of the **last** segment can hold an interrupted write. From the first invalid
byte offset to the end of the file (the *tail*), the tail is **torn** (a prefix of the next
record, never acknowledged) when it is:

- fewer than 21 bytes (an incomplete record header; for a new segment, fewer than the 24 bytes
  of its header),
- all zero bytes (pages a power loss left unwritten), or
- a plausible header (``seq`` is the next seq, ``flags``, ``stored`` and ``length`` agree)
  whose ``stored`` payload bytes run past the end of the file.

Anything else is **corrupt**: a complete record (header and payload within the file) that
fails its checksum, a header that is present but implausible, a complete segment header that
fails its checks, or an invalid record followed by an intact one. A corrupt tail may hold
acknowledged records.

What happens to the tail follows :class:`TailPolicy`:

=================================  ==========================  ==========================
tail                               ``absolute_consistency``    ``point_in_time``
=================================  ==========================  ==========================
torn                               cut (WARNING)               cut (WARNING)
corrupt, nothing intact after it   refuse (CorruptDataError)   cut (ERROR)
corrupt, an intact record after    refuse                      refuse
any, with ``cut_corrupt``          cut (ERROR if corrupt)      cut (ERROR if corrupt)
=================================  ==========================  ==========================

The policy comes from :class:`~embeddb.engine.durability.log.LogConfig`. Its ``recovery`` follows
RocksDB's WAL recovery modes: ``absolute_consistency`` (the default under the ``always`` fsync
policy) refuses to open with a :class:`~embeddb.errors.CorruptDataError` naming the file, the
byte offset and the seq; ``point_in_time`` (the default under ``interval`` and ``never``, whose
power-loss window allows it) cuts the tail, logged at ERROR. Its ``cut_corrupt_tail``
(``embeddb serve --cut-corrupt-log-tail``) sets ``cut_corrupt``: the operator accepts losing the
records of a corrupt tail; it is also the only way past a hole (invalid bytes, then intact
records).

Every cut is recorded before the file is truncated (:func:`_record_cut`): one JSON line in
``<record_dir>/log-cuts.jsonl`` and the cut bytes in ``<record_dir>/log-cuts/<segment
name>-<offset>.bin`` (not for an all-zero tail), both mode 0600, so that nothing is destroyed
silently; ``record_dir`` is ``LogConfig.cuts_dir`` (the log's directory by default), and
:attr:`UpdateLog.cuts <embeddb.engine.durability.log.UpdateLog.cuts>` lists the cuts of an opening.
Anything else is corruption whatever the policy: an invalid record or header in an earlier
segment, a gap or repeat in the seqs between records or segments, a segment header that does
not match its name.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from embeddb.config import LogRecovery
from embeddb.engine.durability.log_format import (
    FILE_MODE,
    FORMATS,
    LZ4,
    RECORD_HEADER,
    SEGMENT_HEADER,
    SEGMENT_NAME,
    SEQ_AT,
    Segment,
    check_segment_header,
    os_error,
    plausible,
    read_record,
    segment_header,
)
from embeddb.errors import CorruptDataError, StorageError

__all__ = ["CUTS_DIR", "CUTS_FILE", "CutKind", "LogCut", "TailPolicy", "scan_log"]

logger = logging.getLogger(
    "embeddb.engine.durability.log"
)  # the log's own logger: one place to tune

CUTS_FILE = "log-cuts.jsonl"
CUTS_DIR = "log-cuts"

CutKind = Literal["corrupt", "torn"]


@dataclass(frozen=True)
class TailPolicy:
    """What opening a log does with an invalid tail (see the module docstring).

    Attributes:
        recovery: ``ABSOLUTE_CONSISTENCY`` or ``POINT_IN_TIME`` (``AUTO`` resolved already).
        cut_corrupt: the operator's explicit consent to cut a corrupt tail of the last segment
            (``embeddb serve --cut-corrupt-log-tail``), whatever ``recovery`` says.
        record_dir: where cuts are recorded (``log-cuts.jsonl``, ``log-cuts/``).
    """

    recovery: LogRecovery
    cut_corrupt: bool
    record_dir: Path


@dataclass(frozen=True)
class LogCut:
    """A tail cut off the last segment of an update log when it was opened.

    Attributes:
        segment: the segment file.
        offset: where the file was cut (its new size; 0: the segment header was rewritten).
        bytes: the number of bytes cut off.
        first_seq: the first seq lost: the seq the first cut record would have had.
        kind: ``"torn"`` (a write a crash interrupted: never acknowledged) or ``"corrupt"``
            (complete bytes that fail their checks: acknowledged records may be lost).
        reason: what was wrong, e.g. ``"checksum mismatch"``.
        recovery: the recovery mode in force (``absolute_consistency`` or ``point_in_time``).
        forced: whether the operator's ``cut_corrupt`` consent was given.
        saved: the file holding the cut bytes (None for an all-zero or empty tail).
        time: when the cut was made (``time.time()``).
    """

    segment: Path
    offset: int
    bytes: int
    first_seq: int
    kind: CutKind
    reason: str
    recovery: LogRecovery
    forced: bool
    saved: Path | None
    time: float


class _Tail(NamedTuple):
    """The invalid end of a segment, from ``offset`` to the end of the file."""

    offset: int
    seq: int  # the seq the first record there should have
    data: bytes
    kind: CutKind
    reason: str
    hole: bool  # an intact record follows the invalid bytes


# ------------------------------------------------------------------------------------ scan


def scan_log(directory: Path, policy: TailPolicy) -> tuple[list[Segment], int, list[LogCut]]:
    """Validate every segment of the log in ``directory``, handling the last one's tail.

    Returns:
        The segments in seq order (none for a directory without a log), the seq after the
        last record (0 without a log), and the cuts made.

    Raises:
        CorruptDataError: a gap or repeat in the seqs, an invalid record or header in an earlier
            segment, or a corrupt tail ``policy`` does not cut (see the module docstring).
        StorageError: a segment cannot be read, cut or recorded, or has another format version.
    """
    try:
        names = sorted(
            (int(m[1]), name)
            for name in os.listdir(directory)
            if (m := SEGMENT_NAME.fullmatch(name)) is not None
        )
    except OSError as exc:
        raise os_error(f"cannot list update log directory {directory}", exc) from exc
    segments: list[Segment] = []
    cuts: list[LogCut] = []
    expected = names[0][0] if names else 0
    for i, (first_seq, name) in enumerate(names):
        path = directory / name
        if first_seq != expected:
            raise CorruptDataError(
                f"update log segment {path} starts at seq {first_seq}, but the segment "
                f"before it ends at seq {expected - 1}"
            )
        last = i == len(names) - 1
        segment = Segment(path, first_seq, 0, sealed=not last)
        expected, tail = _scan(segment, last)
        if tail is not None:
            cuts.append(_cut(segment, tail, policy))
        segments.append(segment)
    return segments, expected, cuts


def _scan(segment: Segment, last: bool) -> tuple[int, _Tail | None]:
    """Validate every record of ``segment``, setting its size and index.

    Returns:
        The seq after its last intact record, and the invalid tail of the last segment (to cut
        or refuse), if any.

    Raises:
        CorruptDataError: a record out of seq order, or an invalid record in an earlier segment.
    """
    path, first_seq = segment.path, segment.first_seq
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            header = check_segment_header(path, f.read(SEGMENT_HEADER.size), first_seq)
            problem = header if isinstance(header, str) else None
            offset, seq = 0, first_seq
            if problem is None:
                segment.version = int(header)
                crc = segment.crc
                offset = SEGMENT_HEADER.size
                while offset < file_size:
                    record = read_record(f, offset, file_size, crc)
                    if isinstance(record, str):
                        problem = record
                        break
                    if record[0] != seq:
                        raise CorruptDataError(
                            f"update log segment {path}: the record at offset {offset} has seq "
                            f"{record[0]}, expected {seq}"
                        )
                    segment.mark(seq, offset)
                    offset += RECORD_HEADER.size + len(record[3])
                    seq += 1
            segment.size = offset
            if problem is None:
                return seq, None
            if not last:
                raise CorruptDataError(f"update log segment {path}: {problem} at offset {offset}")
            f.seek(offset)
            data = f.read()
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        raise os_error(f"cannot read update log segment {path}", exc) from exc
    found = _find_record(data, seq)
    if found is not None:
        kind: CutKind = "corrupt"
        reason = f"{problem}, followed by an intact record at offset {offset + found}"
    else:
        kind, reason = _classify(data, seq, at_segment_header=offset == 0)
    return seq, _Tail(offset, seq, data, kind, reason, hole=found is not None)


def _classify(tail: bytes, seq: int, at_segment_header: bool) -> tuple[CutKind, str]:
    """Whether an invalid ``tail`` with no intact record in it is torn or corrupt, and why."""
    if tail.count(0) == len(tail):
        return "torn", "zero-filled tail (pages never written)" if tail else "empty segment"
    if at_segment_header:
        if len(tail) < SEGMENT_HEADER.size:
            return "torn", "incomplete segment header"
        return "corrupt", "invalid segment header"
    if len(tail) < RECORD_HEADER.size:
        return "torn", "incomplete record header"
    _, stored, got, length, flags = RECORD_HEADER.unpack_from(tail)
    if got != seq:
        return "corrupt", f"invalid record header (seq {got}, expected {seq})"
    if not plausible(stored, length, flags):
        return "corrupt", (
            f"invalid record header (stored {stored}, length {length}, flags {flags:#x})"
        )
    if RECORD_HEADER.size + stored > len(tail):
        return "torn", "incomplete record payload"
    return "corrupt", "checksum mismatch"


def _cut(segment: Segment, tail: _Tail, policy: TailPolicy) -> LogCut:
    """Cut ``tail`` off the last segment if ``policy`` allows it, recording it first.

    Raises:
        CorruptDataError: a corrupt tail that ``policy`` does not cut.
        StorageError: the cut cannot be recorded or made.
    """
    path, offset = segment.path, tail.offset
    if not (
        tail.kind == "torn"
        or policy.cut_corrupt
        or (policy.recovery is LogRecovery.POINT_IN_TIME and not tail.hole)
    ):
        what = "segment header" if offset == 0 else "record"
        why = "intact records follow it" if tail.hole else "no interrupted write explains it"
        raise CorruptDataError(
            f"update log segment {path}: corrupt {what} at offset {offset} (seq {tail.seq}): "
            f"{tail.reason}. As {why}, it may hold acknowledged updates: the log refuses to "
            f"open (log_recovery {policy.recovery.value}). Restore "
            f"from a snapshot, or accept losing the records from seq {tail.seq} on and cut the "
            f"log at offset {offset} with cut_corrupt_tail=True (embeddb serve "
            f"--cut-corrupt-log-tail); the cut bytes are then kept in "
            f"{policy.record_dir / CUTS_DIR}"
        )
    cut = _record_cut(path, tail, policy)
    logger.log(
        logging.WARNING if tail.kind == "torn" else logging.ERROR,
        "update log segment %s: cut a %s tail of %d bytes at offset %d (%s): seq %d on cut, "
        "%d records kept; log_recovery %s%s; recorded in %s",
        path, tail.kind, cut.bytes, offset, tail.reason, tail.seq, tail.seq - segment.first_seq,
        policy.recovery.value, " with --cut-corrupt-log-tail" if policy.cut_corrupt else "",
        policy.record_dir / CUTS_FILE,
    )  # fmt: skip
    try:
        with open(path, "r+b") as f:
            f.truncate(offset)
            if offset == 0:
                f.write(segment_header(segment.first_seq))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise os_error(f"cannot cut the tail of update log segment {path}", exc) from exc
    segment.size = max(offset, SEGMENT_HEADER.size)
    return cut


def _record_cut(path: Path, tail: _Tail, policy: TailPolicy) -> LogCut:
    """Save the bytes of ``tail`` and append its JSON line to ``log-cuts.jsonl``, both fsynced.

    The bytes go to ``log-cuts/<segment name>-<offset>.bin`` (``.1.bin``, ``.2.bin``, ... when
    an earlier cut at the same offset is there); an all-zero tail is only described.

    Raises:
        StorageError: a file cannot be written (nothing has been cut then).
    """
    record_dir = policy.record_dir
    saved: Path | None = None
    try:
        record_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if tail.data.count(0) != len(tail.data):
            saved = _save_bytes(record_dir / CUTS_DIR, f"{path.stem}-{tail.offset}", tail.data)
        cut = LogCut(
            segment=path,
            offset=tail.offset,
            bytes=len(tail.data),
            first_seq=tail.seq,
            kind=tail.kind,
            reason=tail.reason,
            recovery=policy.recovery,
            forced=policy.cut_corrupt,
            saved=saved,
            time=time.time(),
        )
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cut.time)),
            "segment": str(path),
            "offset": cut.offset,
            "bytes": cut.bytes,
            "first_seq_lost": cut.first_seq,
            "kind": cut.kind,
            "reason": cut.reason,
            "log_recovery": cut.recovery.value,
            "cut_corrupt_log_tail": cut.forced,
            "saved": None if saved is None else str(saved),
        }
        fd = os.open(
            record_dir / CUTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE
        )
        with os.fdopen(fd, "ab") as f:
            f.write(json.dumps(line).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_directory(record_dir)
    except OSError as exc:
        raise os_error(
            f"cannot record the cut of update log segment {path} in {record_dir}; nothing was cut",
            exc,
        ) from exc
    return cut


def _save_bytes(directory: Path, stem: str, data: bytes) -> Path:
    """Write ``data`` to a new file ``<stem>[.N].bin`` in ``directory`` (created), fsynced."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    n = 0
    while True:
        target = directory / (f"{stem}.bin" if n == 0 else f"{stem}.{n}.bin")
        try:
            fd = os.open(target, flags, FILE_MODE)
            break
        except FileExistsError:
            n += 1
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return target


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _find_record(buf: bytes, min_seq: int) -> int | None:
    """The offset (> 0) in ``buf`` of the first intact record with a seq of at least ``min_seq``,
    or None: what tells a tail with nothing intact after it from a hole in the log.

    Any record after a failure point has a seq in ``[min_seq, min_seq + len(buf) // 21]``, so
    candidates are the offsets where such a value sits (found with numpy, 8 alignments of u64);
    the header fields of each are checked, vectorized, and the survivors' checksums verified
    under every format version (the tail may follow a damaged segment header).
    """
    n, h = len(buf), RECORD_HEADER.size
    if n <= h:
        return None
    max_seq = min_seq + n // h
    found: list[npt.NDArray[np.int64]] = []
    for r in range(8):
        count = (n - r) // 8
        if count <= 0:
            continue
        seqs = np.frombuffer(buf, dtype="<u8", count=count, offset=r)
        hit = np.flatnonzero((seqs >= min_seq) & (seqs <= max_seq)).astype(np.int64)
        found.append(hit * 8 + (r - SEQ_AT))
    starts = np.sort(np.concatenate(found))
    starts = starts[(starts >= 1) & (starts <= n - h)]
    if starts.size == 0:
        return None
    raw = np.frombuffer(buf, dtype=np.uint8)
    stored = _u32_at(raw, starts + 4)
    length = _u32_at(raw, starts + 16)
    flags = raw[starts + 20]
    plausible = (((flags == 0) & (stored == length)) | ((flags == LZ4) & (length > 0))) & (
        starts + h + stored.astype(np.int64) <= n
    )
    view = memoryview(buf)
    for start in starts[plausible].tolist():
        crc, size = struct.unpack_from("<II", buf, start)
        body = view[start + h : start + h + size]
        if any(f(view[start + 4 : start + h], f(body, 0)) == crc for f in FORMATS.values()):
            return int(start)
    return None


def _u32_at(raw: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    out = raw[at].astype(np.uint32)
    for k in range(1, 4):
        out |= raw[at + k].astype(np.uint32) << np.uint32(8 * k)
    return out
