"""Copying a table's RAM tier out for a snapshot, while mutations pause.

A snapshot must hold exactly the mutations up to its seq, so the shard takes every stripe lock
of every table and copies the stripes' slots out before it lets mutations go on
(:meth:`embeddb.engine.snapshots.ShardSnapshots.take`). To keep that pause short, the copy is
split in three:

1. :func:`capture_buffers`, before the locks: allocate one ``(rows, flags, ids)`` buffer per
   stripe, of the stripe's shapes, and touch it (zeros fault the pages in);
2. :func:`capture_into`, under the locks: a plain memcpy of each stripe's arrays (the shard
   runs one stripe per pool thread); :func:`disk_rows` reads the disk-tier row count then;
3. :func:`captured`, after: keep the occupied slots only — a slot is occupied exactly when its
   flags are non-zero (every resident row is ``DIRTY`` or ``ON_DISK``; a freed slot's flags are
   zeroed) — as the ``(ids, rows, flags)`` a snapshot writes.

Loading the rows back at a restore is :meth:`~embeddb.engine.storage.table.TieredTable.load_ram`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, U64
from embeddb.engine.storage.ram_tier import RamStripe

__all__ = ["Buffers", "capture_buffers", "capture_into", "capture_ram", "captured", "disk_rows"]

Buffers = list[tuple[F32, npt.NDArray[np.uint8], U64]]


def capture_buffers(stripes: Sequence[RamStripe]) -> Buffers:
    """Buffers for :func:`capture_into`, allocated and touched now — before the caller takes
    the stripe locks — so that the copy under the locks is a plain memcpy."""
    bufs = []
    for stripe in stripes:
        rows = np.zeros_like(stripe.rows)  # zeros: the pages are faulted in here
        flags = np.zeros_like(stripe.flags)
        ids = np.zeros_like(stripe.ids)
        bufs.append((rows, flags, ids))
    return bufs


def capture_into(stripes: Sequence[RamStripe], bufs: Buffers, first: int = 0) -> None:
    """Copy the slots of stripes ``first, first + 1, ...`` into ``bufs`` (one per stripe);
    the caller holds their locks."""
    for stripe, (rows, flags, ids) in zip(stripes[first:], bufs, strict=False):
        np.copyto(rows, stripe.rows)
        np.copyto(flags, stripe.flags)
        np.copyto(ids, stripe.ids)


def captured(bufs: Buffers) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
    """``(ids, rows, flags)`` of the resident rows in captured buffers (see the module
    docstring)."""
    masks = [flags != 0 for _, flags, _ in bufs]
    ids = np.concatenate([i[m] for (_, _, i), m in zip(bufs, masks, strict=True)])
    rows = np.concatenate([r[m] for (r, _, _), m in zip(bufs, masks, strict=True)])
    flags = np.concatenate([f[m] for (_, f, _), m in zip(bufs, masks, strict=True)])
    return ids, rows, flags


def capture_ram(stripes: Sequence[RamStripe]) -> tuple[U64, F32, npt.NDArray[np.uint8]]:
    """``(ids, rows, flags)`` of every resident row. The caller holds every stripe lock."""
    bufs = capture_buffers(stripes)
    capture_into(stripes, bufs)
    return captured(bufs)


def disk_rows(stripes: Sequence[RamStripe]) -> int:
    """The table's disk-tier row count; the caller holds every stripe lock."""
    return sum(s.counters.disk_rows for s in stripes)
