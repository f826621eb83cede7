"""The changes a table's mutations make, as handed to its journal (the shard's update log).

Each mutating call of :class:`~embeddb.storage.TieredTable` passes, per stripe and while it
still holds the stripe's lock, the **resulting rows** it wrote (``PUT``) or the ids it removed
(``DELETE``) to ``table.journal``. Journaling under the lock keeps the journal's order of the
changes of a row equal to the order they were applied in, so replaying it rebuilds each row.
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
