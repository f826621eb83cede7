"""What a shard writes into its update log: the resulting rows of each mutation.

A log record is the payload of one :meth:`UpdateLog.append` and holds one or more **changes**,
each for one table::

    change := op u8 | name_len u16 | n u32 | width u32 | name | ids | rows
              name: name_len bytes (UTF-8); ids: n x u64; rows: n x width x f32 (PUT only);
              all little-endian

    op PUT     the full rows [vector | optimizer state] of ``ids`` after the mutation
    op DELETE  ``ids`` no longer exist

A gradient push, an assignment and the rows created by a training lookup all log PUT changes;
a delete logs DELETE. A record holds every change of one call — all its stripes and, for the
many-table calls, all its tables — so recovery and followers, which apply whole records, see
a call entirely or not at all. Because a change carries resulting rows rather than the operation,
replaying a record is idempotent and needs neither the optimizer nor the initializer, and a
record applied twice (a follower that reconnects) does no harm.

:func:`encode` returns the record as a list of buffers — small headers plus zero-copy views of
the id and row arrays — so the log copies the payload once, into its file.
"""

from __future__ import annotations

import struct

import numpy as np

from embeddb.engine.storage.changes import Change, Op
from embeddb.errors import CorruptDataError

__all__ = ["Change", "Op", "decode", "encode"]

_HEADER = struct.Struct("<BHII")


def encode(changes: list[Change]) -> list[bytes | memoryview]:
    """The buffers of a record holding ``changes`` (views of their arrays, not copies)."""
    parts: list[bytes | memoryview] = []
    for c in changes:
        name = c.table.encode()
        ids = np.ascontiguousarray(c.ids, dtype="<u8")
        if c.op is Op.PUT:
            if c.rows is None or c.rows.ndim != 2 or c.rows.shape[0] != ids.size:
                raise ValueError("a PUT change needs one row per id")
            rows = np.ascontiguousarray(c.rows, dtype="<f4")
            width = rows.shape[1]
        else:
            rows, width = None, 0
        parts.append(_HEADER.pack(c.op, len(name), ids.size, width) + name)
        if ids.size:
            parts.append(ids.reshape(-1).view(np.uint8).data)
            if rows is not None and rows.size:
                parts.append(rows.reshape(-1).view(np.uint8).data)
    return parts


def decode(payload: bytes | memoryview, where: str = "record") -> list[Change]:
    """The changes of a record; the arrays are read-only views of ``payload``.

    Raises:
        CorruptDataError: the payload does not parse (``where`` names it in the message).
    """
    buf = memoryview(payload)
    changes: list[Change] = []
    pos = 0
    while pos < len(buf):
        if pos + _HEADER.size > len(buf):
            raise CorruptDataError(f"{where}: truncated change header at byte {pos}")
        op, name_len, n, width = _HEADER.unpack_from(buf, pos)
        pos += _HEADER.size
        try:
            kind = Op(op)
        except ValueError:
            raise CorruptDataError(f"{where}: unknown change op {op} at byte {pos}") from None
        if kind is Op.DELETE and width:
            raise CorruptDataError(f"{where}: a DELETE change with row width {width}")
        end = pos + name_len + 8 * n + 4 * n * width
        if end > len(buf):
            raise CorruptDataError(f"{where}: change of {end - pos} bytes runs past the record")
        try:
            table = bytes(buf[pos : pos + name_len]).decode()
        except UnicodeDecodeError as exc:
            raise CorruptDataError(f"{where}: table name is not UTF-8: {exc}") from None
        pos += name_len
        ids = np.frombuffer(buf, dtype="<u8", count=n, offset=pos).astype(np.uint64, copy=False)
        pos += 8 * n
        rows = None
        if kind is Op.PUT:
            flat = np.frombuffer(buf, dtype="<f4", count=n * width, offset=pos)
            rows = flat.astype(np.float32, copy=False).reshape(n, width)
            pos += 4 * n * width
        changes.append(Change(kind, table, ids, rows))
    return changes
