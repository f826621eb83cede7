"""Copying a table's RAM tier out for a snapshot, while mutations pause.

A snapshot must hold exactly the mutations up to its seq, so the shard takes every stripe lock
of every table and copies the stripes' resident rows out before it lets mutations go on
(:meth:`embeddb.engine.snapshots.ShardSnapshots.take`). A snapshot costs what the table holds,
not what it could hold: a stripe of a million slots holding ten thousand rows copies ten
thousand rows. To keep the pause short, the copy is split in three:

1. :func:`capture_buffers`, before the locks: allocate one :class:`StripeCapture` per stripe,
   sized to the stripe's resident rows now plus some slack (rows created before the locks are
   taken fit in the slack), and touch it so that its pages are faulted in;
2. :func:`capture_into`, under the locks: one compiled pass over each stripe's flags gathers
   its occupied slots — a slot is occupied exactly when its flags are non-zero (every resident
   row is ``DIRTY`` or ``ON_DISK``; a freed slot's flags are zeroed) — compactly into the
   buffer (the shard runs one stripe per pool thread). A stripe that outgrew its buffer gets
   an exact one then; :func:`disk_rows` reads the disk-tier row count then;
3. :func:`captured_parts`, after: each stripe's ``(ids, rows, flags)``, views of its buffer,
   which the snapshot writes part by part (:func:`captured` concatenates them).

The flags scan is O(capacity) over one byte per slot (about 0.1 ms for a million slots); the
copies and the memory are O(resident rows). Loading the rows back at a restore is
:meth:`~embeddb.engine.storage.table.TieredTable.load_ram`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, U64
from embeddb.engine.storage.ram_tier import RamStripe

__all__ = [
    "Buffers",
    "StripeCapture",
    "capture_buffers",
    "capture_into",
    "capture_ram",
    "captured",
    "captured_parts",
    "disk_rows",
]

_SLACK = 1024  # extra rows per stripe buffer, beyond 1/8 of its resident rows


@dataclass
class StripeCapture:
    """One stripe's captured rows: ``rows``, ``flags`` and ``ids`` have room for at least the
    rows captured; the first ``n`` are valid once :func:`capture_into` ran."""

    rows: F32
    flags: npt.NDArray[np.uint8]
    ids: U64
    n: int = 0

    @classmethod
    def sized(cls, room: int, width: int) -> StripeCapture:
        """Empty buffers with room for ``room`` rows of ``width`` floats, faulted in."""
        rows = np.empty((room, width), dtype=np.float32)
        rows.fill(0.0)  # writes fault the pages in now, not under the locks
        flags = np.zeros(room, dtype=np.uint8)
        ids = np.empty(room, dtype=np.uint64)
        ids.fill(0)
        return cls(rows, flags, ids)


Buffers = list[StripeCapture]


@numba.njit(nogil=True, cache=True)
def _gather(
    src_rows: F32,
    src_flags: npt.NDArray[np.uint8],
    src_ids: U64,
    rows: F32,
    flags: npt.NDArray[np.uint8],
    ids: U64,
) -> int:  # pragma: no cover - compiled
    """Copy the occupied slots of ``src_*`` compactly to the front of ``rows, flags, ids``,
    as far as they have room; return how many slots are occupied (copied or not)."""
    room = rows.shape[0]
    width = rows.shape[1]
    n = 0
    for s in range(src_flags.shape[0]):
        f = src_flags[s]
        if f != 0:
            if n < room:
                for c in range(width):
                    rows[n, c] = src_rows[s, c]
                flags[n] = f
                ids[n] = src_ids[s]
            n += 1
    return n


def capture_buffers(stripes: Sequence[RamStripe]) -> Buffers:
    """Buffers for :func:`capture_into`, allocated and touched now — before the caller takes
    the stripe locks — with room for each stripe's resident rows plus slack (read without
    the lock: an estimate, which :func:`capture_into` corrects if the stripe outgrew it)."""
    bufs = []
    for stripe in stripes:
        size = stripe.size
        room = min(stripe.capacity, size + size // 8 + _SLACK)
        bufs.append(StripeCapture.sized(room, stripe.width))
    return bufs


def capture_into(stripes: Sequence[RamStripe], bufs: Buffers, first: int = 0) -> None:
    """Gather the resident rows of stripes ``first, first + 1, ...`` into ``bufs`` (one per
    stripe); the caller holds their locks."""
    for stripe, buf in zip(stripes[first:], bufs, strict=False):
        if stripe.size > buf.rows.shape[0]:  # it grew past the slack since the buffers
            fresh = StripeCapture.sized(stripe.size, stripe.width)
            buf.rows, buf.flags, buf.ids = fresh.rows, fresh.flags, fresh.ids
        n = int(_gather(stripe.rows, stripe.flags, stripe.ids, buf.rows, buf.flags, buf.ids))
        if n > buf.rows.shape[0]:  # flags disagree with the live count: never expected
            fresh = StripeCapture.sized(n, stripe.width)
            buf.rows, buf.flags, buf.ids = fresh.rows, fresh.flags, fresh.ids
            n = int(_gather(stripe.rows, stripe.flags, stripe.ids, buf.rows, buf.flags, buf.ids))
        buf.n = n


def captured(bufs: Buffers) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
    """``(ids, rows, flags)`` of the resident rows in captured buffers (see the module
    docstring)."""
    if len(bufs) == 1:  # no concatenation: the capture's own arrays, trimmed
        b = bufs[0]
        return b.ids[: b.n], b.rows[: b.n], b.flags[: b.n]
    ids = np.concatenate([b.ids[: b.n] for b in bufs])
    rows = np.concatenate([b.rows[: b.n] for b in bufs])
    flags = np.concatenate([b.flags[: b.n] for b in bufs])
    return ids, rows, flags


def captured_parts(bufs: Buffers) -> list[tuple[U64, F32, npt.NDArray[np.uint8]]]:
    """The ``(ids, rows, flags)`` of each stripe's captured rows (views of the buffers, no
    copy): what :meth:`~embeddb.engine.durability.snapshot.SnapshotWriter.write_table_parts`
    writes, in the order :func:`captured` concatenates them."""
    return [(b.ids[: b.n], b.rows[: b.n], b.flags[: b.n]) for b in bufs]


def capture_ram(stripes: Sequence[RamStripe]) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
    """``(ids, rows, flags)`` of every resident row. The caller holds every stripe lock."""
    bufs = capture_buffers(stripes)
    capture_into(stripes, bufs)
    return captured(bufs)


def disk_rows(stripes: Sequence[RamStripe]) -> int:
    """The table's disk-tier row count; the caller holds every stripe lock."""
    return sum(s.counters.disk_rows for s in stripes)
