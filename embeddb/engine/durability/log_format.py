"""The update log on disk: segment files, their header, and the framing of one record.

A log is a directory of **segments**, each named after the seq of its first record; appends go
to the last (the *active*) segment, a new one starts when the active one would exceed
``segment_bytes``, and a record never spans two segments::

    <directory>/
        00000000000000000001.log        seqs 1 .. 41236          (sealed: complete and fsynced)
        00000000000000041237.log        seqs 41237 .. last_seq   (active)

A segment is a 24-byte header followed by records (all integers little-endian)::

    segment header
    0          8          12                    20         24
    ┌──────────┬──────────┬─────────────────────┬──────────┐
    │ magic    │ version  │ first_seq  u64      │ crc of   │
    │"EMBDBLOG"│ u32 = 2  │ (= the file's name) │ 0:20     │
    └──────────┴──────────┴─────────────────────┴──────────┘

    record: a 21-byte header, then the stored payload
    0          4          8                     16         20     21
    ┌──────────┬──────────┬─────────────────────┬──────────┬──────┬─────────────────────┐
    │ crc      │ stored   │ seq  u64            │ length   │ flags│ stored payload      │
    │          │ u32      │                     │ u32      │ u8   │ (`stored` bytes)    │
    └──────────┴──────────┴─────────────────────┴──────────┴──────┴─────────────────────┘
    crc    = CRC(stored payload ‖ header bytes 4:21)
    flags  bit 0 (LZ4): the stored payload is one LZ4 frame of the `length` payload bytes;
           without it, stored == length and the payload is stored as is. Other bits: reserved, 0.

The segment's ``version`` names the checksum ``CRC`` of its header and of all its records:

- **version 2** (written since issue 14): CRC-32C (Castagnoli, iSCSI), computed with the
  CPU's CRC32 instruction by the ``crc32c`` package: about 6x faster than zlib's CRC-32 on the
  megabytes a gradient push logs, and a stronger code for the same 4 bytes.
- **version 1** (written before): CRC-32 (ISO-HDLC, ``zlib.crc32``); read, never written.

Migration: a log of version-1 segments opens and reads as before; :class:`UpdateLog
<embeddb.engine.durability.log.UpdateLog>` never appends to a version-1 segment but starts a
version-2
one at the next seq when it opens (replacing the active segment when it holds no record yet),
so one log may hold both. Segments of an unknown version (a newer embeddb) are refused with
:class:`~embeddb.errors.StorageError`; an older embeddb refuses version-2 segments the same way.

For example the record of seq 7 with the 5-byte payload ``hello`` is 26 bytes: a header with
``stored = 5, seq = 7, length = 5, flags = 0`` and its crc, then ``hello``. A payload of at least
``lz4_min_bytes`` is stored LZ4-compressed when that makes it smaller; reading decompresses into
at most ``length`` bytes and checks that the frame ends there.

This module holds the layout and the functions that write and read it:
:class:`~embeddb.engine.durability.log.UpdateLog` appends with them, :mod:`.log_scan` validates a
log
with them when it opens, :class:`~.log_read.LogReader` reads records back.
"""

from __future__ import annotations

import errno
import heapq
import os
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple, TypeAlias

import crc32c
import lz4.frame

from embeddb.engine.durability.fileio import REAL, FileIO
from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = [
    "FILE_MODE",
    "FORMATS",
    "LZ4",
    "RECORD_HEADER",
    "SEGMENT_HEADER",
    "SEGMENT_NAME",
    "SEQ_AT",
    "VERSION",
    "Checksum",
    "Framed",
    "PayloadPart",
    "Segment",
    "check_segment_header",
    "checksum",
    "create_segment",
    "decode",
    "frame",
    "os_error",
    "plausible",
    "read_record",
    "record_header",
    "segment_header",
    "segment_name",
    "write_all",
]

PayloadPart: TypeAlias = bytes | bytearray | memoryview
Checksum: TypeAlias = Callable[[PayloadPart, int], int]
"""``crc(data, previous)``: the checksum of ``previous``'s data followed by ``data``."""


def _crc32c(data: PayloadPart, value: int = 0) -> int:
    return crc32c.crc32c(data, value)


MAGIC = b"EMBDBLOG"
VERSION = 2  # the format version written
FORMATS: dict[int, Checksum] = {1: zlib.crc32, 2: _crc32c}  # the versions read: their CRC
SEGMENT_HEADER = struct.Struct("<8sIQI")  # magic, version, first_seq, crc of those 20 bytes
RECORD_HEADER = struct.Struct("<IIQIB")  # crc, stored, seq, length, flags
FIELDS = struct.Struct("<IQIB")  # the record header after its crc
SEQ_AT = 8  # offset of seq in a record header
LZ4 = 0x01
FILE_MODE = 0o600  # segments and cut records: the rows are nobody else's business
SEGMENT_NAME = re.compile(r"(\d{20})\.log")
_MAX_LENGTH = 0xFFFF_FFFF
_PROBE_BYTES = 64 << 10  # payloads of 4x this are probed before a full LZ4 attempt
_IOV_MAX = 1000  # below the kernel's 1024 buffers per writev
_MARK_BYTES = 256 << 10  # a segment remembers the offset of a record every 256 KiB, for read()


class Segment:
    """One segment file. ``size`` counts complete records only (readers stop there)."""

    __slots__ = ("first_seq", "mark_offsets", "mark_seqs", "path", "sealed", "size", "version")

    def __init__(
        self, path: Path, first_seq: int, size: int, sealed: bool, version: int = VERSION
    ) -> None:
        self.path = path
        self.first_seq = first_seq
        self.size = size
        self.sealed = sealed
        self.version = version  # the format; set from the header when the segment is scanned
        # Sparse index: record ``mark_seqs[i]`` starts at byte ``mark_offsets[i]``.
        self.mark_seqs: list[int] = []
        self.mark_offsets: list[int] = []

    @property
    def crc(self) -> Checksum:
        """The checksum of the segment's format version."""
        return FORMATS[self.version]

    def mark(self, seq: int, offset: int) -> None:
        """Remember that record ``seq`` starts at ``offset`` if the last mark is far enough."""
        last = self.mark_offsets[-1] if self.mark_offsets else 0
        if offset - last >= _MARK_BYTES:
            self.mark_seqs.append(seq)
            self.mark_offsets.append(offset)


def os_error(message: str, exc: OSError) -> StorageError:
    """``StorageError("message: [Errno N] strerror")`` carrying the errno of ``exc``."""
    reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
    err = StorageError(f"{message}: {reason}")
    err.errno = exc.errno
    return err


# -------------------------------------------------------------------------------- segments


def segment_name(first_seq: int) -> str:
    """The file name of the segment whose first record is ``first_seq``."""
    return f"{first_seq:020d}.log"


def checksum(version: int) -> Checksum:
    """The checksum of format ``version`` (a key of :data:`FORMATS`)."""
    return FORMATS[version]


def segment_header(first_seq: int, version: int = VERSION) -> bytes:
    """The 24-byte header of the segment whose first record is ``first_seq``."""
    body = struct.pack("<8sIQ", MAGIC, version, first_seq)
    return body + struct.pack("<I", FORMATS[version](body, 0))


def check_segment_header(path: Path, head: bytes, first_seq: int) -> int | str:
    """The format version of segment ``path`` from its header ``head``, or why ``head`` is not
    its header when a torn write could explain it (a string).

    Raises:
        StorageError: an intact header of a format version this embeddb does not read.
        CorruptDataError: an intact header of another segment.
    """
    if len(head) < SEGMENT_HEADER.size:
        return "incomplete segment header"
    magic, version, got, crc = SEGMENT_HEADER.unpack(head)
    if magic != MAGIC:
        return "invalid segment header"
    crc_of = FORMATS.get(version)
    if crc_of is None:
        # Another format's header, intact under one of the checksums we know, or damage.
        if all(f(head[:-4], 0) != crc for f in FORMATS.values()):
            return "invalid segment header"
        known = ", ".join(str(v) for v in FORMATS)
        raise StorageError(
            f"update log segment {path} has format version {version}; this embeddb reads "
            f"versions {known}"
        )
    if crc_of(head[:-4], 0) != crc:
        return "invalid segment header"
    if got != first_seq:
        raise CorruptDataError(
            f"update log segment {path}: its header says first seq {got}, its name {first_seq}"
        )
    return int(version)


def create_segment(
    directory: Path,
    dir_fd: int,
    first_seq: int,
    fail: Callable[[StorageError], None],
    io: FileIO = REAL,
) -> tuple[Segment, int]:
    """Create an empty segment of format :data:`VERSION` (header written, directory fsynced);
    returns it and its fd.

    Args:
        directory: the log's directory, open as ``dir_fd``.
        first_seq: the seq of the segment's first record.
        fail: called with the error before it is raised when the segment could not be written
            and cannot be removed either: a stray segment would break the seq order on reopen.
        io: the file layer (:mod:`.fileio`).

    Raises:
        StorageError: the segment could not be created.
    """
    path = directory / segment_name(first_seq)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        raise os_error(f"cannot create update log segment {path}", exc) from exc
    try:
        header = segment_header(first_seq)
        write_all(fd, [header], len(header), io)
        io.fsync_dir(dir_fd)
    except OSError as exc:
        os.close(fd)
        err = os_error(f"cannot create update log segment {path}", exc)
        try:
            path.unlink()
        except OSError:
            # A stray segment would break the seq order on reopen.
            fail(err)
        raise err from exc
    return Segment(path, first_seq, len(header), sealed=False), fd


# ---------------------------------------------------------------------------- writing records


class Framed(NamedTuple):
    """A payload framed as a record of format :data:`VERSION`, all but its seq (see
    :func:`record_header`)."""

    parts: list[bytes | memoryview]  # the stored payload, written after the header
    length: int  # of the payload
    stored: int  # of the stored payload
    flags: int
    crc: int  # CRC-32C of the stored payload


def frame(payload_parts: Sequence[PayloadPart], lz4_min_bytes: int) -> Framed:
    """Frame the concatenation of ``payload_parts`` (bytes, or C-contiguous buffers such as
    ``memoryview(array)``): compressed if it has at least ``lz4_min_bytes`` (0: never) and that
    shrinks it, and checksummed (CRC-32C, format :data:`VERSION`). The parts are not copied
    (unless compressed, or more than the kernel's 1,024 buffers of one ``writev``).

    Raises:
        InvalidArgumentError: a part is not C-contiguous, or the payload exceeds 4 GiB - 1.
    """
    parts = [_byte_view(p) for p in payload_parts]
    length = sum(len(p) for p in parts)
    if length > _MAX_LENGTH:
        raise InvalidArgumentError(f"an update log payload is at most 4 GiB - 1, got {length}")
    flags = 0
    if lz4_min_bytes and length >= lz4_min_bytes:
        packed = _compress(parts, length)
        if packed is not None:
            parts, flags = [packed], LZ4
    if len(parts) > _IOV_MAX:
        parts = [b"".join(parts)]
    stored = len(parts[0]) if flags else length
    crc = 0
    for p in parts:
        crc = _crc32c(p, crc)
    return Framed(parts, length, stored, flags, crc)


def record_header(record: Framed, seq: int) -> bytes:
    """The 21-byte header of ``record`` as record ``seq``."""
    stored, length, flags = record.stored, record.length, record.flags
    fields = FIELDS.pack(stored, seq, length, flags)
    return RECORD_HEADER.pack(_crc32c(fields, record.crc), stored, seq, length, flags)


def _flat(part: bytes | memoryview) -> memoryview:
    return part.cast("B") if isinstance(part, memoryview) else memoryview(part)


def _byte_view(part: PayloadPart) -> bytes | memoryview:
    if isinstance(part, bytes):
        return part
    view = memoryview(part)
    if view.ndim == 1 and view.format == "B" and view.c_contiguous:
        return view
    try:
        return view.cast("B")
    except TypeError as exc:
        raise InvalidArgumentError(f"an update log payload part must be contiguous: {exc}") from exc


def _compress(parts: list[bytes | memoryview], length: int) -> bytes | None:
    """The payload as one LZ4 frame, or None when that would not shrink it by 10%.

    A large payload is probed first: three windows (start, middle, end) of its largest part
    (for a shard's records, the rows) are compressed — or, when no part is that large (a call
    spanning many tables logs one smaller rows part per table), the first window of each of
    its three largest parts — and if they do not shrink by 10% the full attempt is skipped:
    float vectors and optimizer state rarely compress.
    """
    if length >= 4 * _PROBE_BYTES:
        window = _PROBE_BYTES // 4
        largest = [_flat(p) for p in heapq.nlargest(3, parts, key=len)]
        view = largest[0]
        if len(view) >= _PROBE_BYTES:
            starts = (0, (len(view) - window) // 2, len(view) - window)
            sample = b"".join(view[a : a + window] for a in starts)
        else:
            sample = b"".join(v[:window] for v in largest)
        if len(sample) >= window and len(lz4.frame.compress(sample)) >= 0.9 * len(sample):
            return None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    packed: bytes = lz4.frame.compress(data)
    return packed if len(packed) < 0.9 * length else None


def write_all(fd: int, buffers: list[bytes | memoryview], total: int, io: FileIO = REAL) -> None:
    """``writev`` all of ``buffers``, resuming after short writes."""
    done = io.writev(fd, buffers)
    while done < total:
        if done == 0:
            raise OSError(errno.EIO, "write(2) wrote nothing")
        rest: list[bytes | memoryview] = []
        for b in buffers:
            if done >= len(b):
                done -= len(b)
                continue
            rest.append(memoryview(b)[done:])
            done = 0
        buffers = rest
        total = sum(len(b) for b in rest)
        done = io.writev(fd, buffers)


# ---------------------------------------------------------------------------- reading records


def plausible(stored: int, length: int, flags: int) -> bool:
    """Whether a record header's ``stored``, ``length`` and ``flags`` agree."""
    if flags == 0:
        return stored == length
    return flags == LZ4 and length > 0


def read_record(
    f: BinaryIO, offset: int, end: int, crc: Checksum
) -> tuple[int, int, int, bytes] | str:
    """Read the record at ``offset`` (``f`` is positioned there), which must end by ``end``;
    ``crc`` is the checksum of its segment's format (:attr:`Segment.crc`).

    Returns:
        ``(seq, flags, length, stored bytes)``, or why the bytes there are not an intact record.
    """
    head = f.read(RECORD_HEADER.size)
    if len(head) < RECORD_HEADER.size or offset + RECORD_HEADER.size > end:
        return "incomplete record header"
    want, stored, seq, length, flags = RECORD_HEADER.unpack(head)
    if not plausible(stored, length, flags):
        return "invalid record header"
    if offset + RECORD_HEADER.size + stored > end:
        return "incomplete record payload"
    data = f.read(stored)
    if len(data) < stored:
        return "incomplete record payload"
    if crc(memoryview(head)[4:], crc(data, 0)) != want:
        return "checksum mismatch"
    return seq, flags, length, data


def decode(path: Path, offset: int, flags: int, length: int, stored: bytes) -> bytes:
    """The payload of a record read by :func:`read_record` (LZ4 frames decompressed).

    Raises:
        CorruptDataError: the LZ4 frame is invalid or does not decompress to ``length`` bytes.
    """
    if not flags & LZ4:
        return stored
    try:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        payload: bytes = decompressor.decompress(stored, max_length=length)
        complete = decompressor.eof
    except RuntimeError as exc:
        raise CorruptDataError(
            f"update log segment {path}: corrupt LZ4 frame in the record at offset {offset}: {exc}"
        ) from exc
    if not complete or len(payload) != length:
        raise CorruptDataError(
            f"update log segment {path}: the LZ4 frame of the record at offset {offset} does "
            f"not decompress to its {length} bytes"
        )
    return payload
