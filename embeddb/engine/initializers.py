"""Deterministic row initialisers.

A new row's vector depends only on ``(table seed, table name, id)``, never on arrival order, the
shard count or the thread that created it: element ``j`` of row ``id`` is drawn from a
counter-based generator (SplitMix64 of ``id``, the table's key and ``j``). Two shards, two runs, or
a restore that recreates a deleted row all produce the same first value.

* uniform: ``low + (high - low) * u`` with ``u`` in ``[0, 1)`` on a 2**-24 grid;
* normal: Box-Muller on two such draws per element (``mean + std * z``);
* zeros.
"""

from __future__ import annotations

import zlib

import numba
import numpy as np
import numpy.typing as npt

from embeddb.common._routing_kernel import mix as _mix
from embeddb.config import InitializerConfig, InitializerKind

__all__ = ["fill_row", "initial_vectors", "initializer_args", "table_key"]

_S40 = np.uint64(40)
_ONE = np.uint64(1)
_TWO = np.uint64(2)
_INV24 = 1.0 / 16777216.0

_KIND_CODE = {InitializerKind.UNIFORM: 0, InitializerKind.NORMAL: 1, InitializerKind.ZEROS: 2}


def table_key(name: str, seed: int) -> np.uint64:
    """The 64-bit key mixed into every draw of one table (stable across processes)."""
    key: np.uint64 = np.uint64(((seed & 0xFFFFFFFF) << 32) | zlib.crc32(name.encode()))
    return key


@numba.njit(nogil=True, cache=True, inline="always")
def fill_row(row_id, key, kind, a, b, out, i, dim):  # type: ignore[no-untyped-def]
    """Write the initial vector of ``row_id`` into ``out[i, :dim]`` (``out`` may be wider).

    The one definition of the values: :func:`initial_vectors` and the kernel that creates a
    lookup's new rows (:mod:`embeddb.engine.storage.creation`) both inline it, so a row is
    bit-identical whichever path made it.
    """
    base = _mix(row_id ^ key)
    for j in range(dim):
        c = base + np.uint64(j) * _TWO
        if kind == 0:
            u = np.float64(_mix(c) >> _S40) * _INV24
            out[i, j] = a + (b - a) * u
        elif kind == 1:
            u1 = (np.float64(_mix(c) >> _S40) + 1.0) * _INV24  # (0, 1]
            u2 = np.float64(_mix(c + _ONE) >> _S40) * _INV24
            z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
            out[i, j] = a + b * z
        else:
            out[i, j] = 0.0


@numba.njit(nogil=True, cache=True)
def _fill(ids, key, kind, a, b, out):  # type: ignore[no-untyped-def]
    n, dim = out.shape
    for i in range(n):
        fill_row(ids[i], key, kind, a, b, out, i, dim)


def initializer_args(config: InitializerConfig) -> tuple[int, float, float]:
    """``(kind code, a, b)``: the initializer as the kernels take it (uniform: low, high;
    normal: mean, std)."""
    kind = _KIND_CODE[config.kind]
    if kind == 1:
        return kind, float(config.mean), float(config.std)
    return kind, float(config.low), float(config.high)


def initial_vectors(
    ids: npt.NDArray[np.uint64], dim: int, config: InitializerConfig, key: np.uint64
) -> npt.NDArray[np.float32]:
    """Return the initial ``(len(ids), dim)`` float32 vectors of ``ids``.

    Args:
        ids: uint64 ids.
        dim: vector width.
        config: the table's initializer.
        key: :func:`table_key` of the table.
    """
    out = np.empty((ids.size, dim), dtype=np.float32)
    kind, a, b = initializer_args(config)
    _fill(np.ascontiguousarray(ids, dtype=np.uint64), key, kind, a, b, out)
    return out
