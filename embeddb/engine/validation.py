"""Validation of a shard's requests: every argument checked once, at the shard's boundary.

The layers below the :class:`~embeddb.engine.shard.Shard` trust what they are given; these
checks raise from :mod:`embeddb.errors` instead (``INVALID_ARGUMENT``, ``NOT_FOUND``,
``FAILED_PRECONDITION`` on the wire), naming the request's field::

    find_table({"user": t}, "item")           TableNotFoundError, naming the tables there are
    owned_ids(topology, [7, -1], "ids")       InvalidArgumentError: ids must be non-negative
    owned_ids(topology, [7, 9], "ids")        FailedPreconditionError naming the first id
                                              another shard owns
    matrix(grads, n=3, dim=2, field="grads")  float32 of shape (3, 2), C-contiguous
    distinct_tables(["user", "user"])         InvalidArgumentError: merge its ids into one part
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from embeddb.common.routing import Topology, as_ids
from embeddb.engine.storage import TieredTable
from embeddb.errors import InvalidArgumentError, TableNotFoundError

__all__ = ["distinct_tables", "find_table", "finite", "matrix", "owned_ids"]


def find_table(tables: Mapping[str, TieredTable], name: str) -> TieredTable:
    """The table named ``name``.

    Raises:
        TableNotFoundError: no such table (naming the shard's tables).
    """
    try:
        return tables[name]
    except (KeyError, TypeError):
        raise TableNotFoundError(str(name), tuple(tables)) from None


def owned_ids(topology: Topology, ids: object, field: str = "ids") -> npt.NDArray[np.uint64]:
    """``ids`` validated, if the shard of ``topology`` owns every one.

    Raises:
        InvalidArgumentError: not 1-D non-negative integers.
        FailedPreconditionError: naming the first id another shard owns.
    """
    id_arr = as_ids(ids, field)
    topology.check_owned(id_arr, field)
    return id_arr


def matrix(values: object, n: int, dim: int, field: str) -> npt.NDArray[np.float32]:
    """``values`` as a C-contiguous float32 ``(n, dim)`` array: one row of ``dim`` per id.

    Raises:
        InvalidArgumentError: another dtype or shape.
    """
    arr = np.asarray(values)
    if arr.dtype != np.float32:
        raise InvalidArgumentError(f"{field} must be float32, got dtype {arr.dtype}")
    if arr.shape != (n, dim):
        raise InvalidArgumentError(
            f"{field} must have shape ({n}, {dim}) (one row of dim {dim} per id), got {arr.shape}"
        )
    return np.ascontiguousarray(arr)


def finite(values: npt.NDArray[np.float32], field: str) -> None:
    """Raises InvalidArgumentError if ``values`` holds a NaN or an Inf."""
    if not np.isfinite(values).all():
        raise InvalidArgumentError(f"{field} must be finite (found NaN or Inf)")


def distinct_tables(tables: Iterable[str]) -> None:
    """Raises InvalidArgumentError if a table is named by more than one part of a request."""
    seen: set[str] = set()
    for table in tables:
        if table in seen:
            raise InvalidArgumentError(
                f"table {table!r} is named by more than one part of the request; merge "
                f"its ids into one part"
            )
        seen.add(table)
