"""The changes a table's mutations make, as handed to its journal (the shard's update log).

Each mutating call of :class:`~embeddb.engine.storage.TieredTable` passes, once, while it holds the
locks of every stripe it touches and before any of it is visible, the **resulting rows** it
will write (``PUT``) or the ids it will remove (``DELETE``) to ``table.journal``
(:mod:`embeddb.engine.storage.writes`). Journaling under the locks keeps the journal's order of the
changes of a row equal to the order they are applied in, so replaying it rebuilds each row.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

__all__ = ["Change", "Op"]


class Op(IntEnum):
    PUT = 1
    DELETE = 2


@dataclass(frozen=True)
class Change:
    """One table's change: ``rows`` is ``(len(ids), width)`` for PUT (vector and optimizer
    state after the mutation), ``None`` for DELETE."""

    op: Op
    table: str
    ids: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.float32] | None = None
