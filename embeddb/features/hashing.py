"""Deterministic 64-bit ids of strings, vectorised over arrays (never Python's ``hash()``).

Ids are stored in embeddb's tables, so the hash is part of the data format: the same bytes give
the same id in every process, run, machine and version. It chains embeddb's SplitMix64
finaliser (:func:`embeddb.common.routing.mix64`, a bijection) over the bytes taken 8 at a time::

    h = seed(namespace)
    for each 8-byte word w of the UTF-8 bytes (little-endian; the last word zero-padded):
        h = mix64(h ^ w)
    id = mix64(h ^ number_of_bytes)

    b"abc"  ->  one word 0x0000000000636261, length 3

A namespace (by default the feature's name) seeds the chain, so equal strings of different
features get different ids unless they share a namespace on purpose. The seed of a namespace is
the hash of its name under the root seed 0. Any byte string hashes the same whether it comes
from a text file, an Arrow column or :func:`hash_strings`. (A numpy ``bytes_`` array drops
trailing NUL bytes, so strings ending in ``\\x00`` should be hashed from a list.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import U64
from embeddb.features._fields import Fields

__all__ = ["hash_fields", "hash_strings", "namespace_seed"]

_ROOT_SEED = np.uint64(0)
_WIDE = 256  # characters: a wider str_ array is encoded value by value (numpy's cast is slow)


def hash_fields(fields: Fields, seed: np.uint64) -> U64:
    """Ids of byte-range fields (see the module docstring); empty fields hash too.

    One compiled pass over the bytes (:mod:`._hash_kernel`): O(total bytes) whatever the
    fields' lengths (a 4 MB field hashes in milliseconds).
    """
    from embeddb.features._hash_kernel import hash_ranges  # numba: loaded on the first hash only

    starts = np.ascontiguousarray(fields.starts.ravel(), dtype=np.int64)
    ends = np.ascontiguousarray(fields.ends.ravel(), dtype=np.int64)
    out: U64 = np.empty(starts.size, dtype=np.uint64)
    if starts.size:
        buf = np.ascontiguousarray(fields.buf, dtype=np.uint8)
        hash_ranges(buf, starts, ends, np.uint64(seed), out)
    return out.reshape(fields.shape)


@functools.lru_cache(maxsize=1024)
def namespace_seed(namespace: str) -> np.uint64:
    """The chain seed of a namespace: the hash of its UTF-8 name under the root seed."""
    seed: np.uint64 = _hash_bytes_list([namespace.encode("utf-8")], _ROOT_SEED)[0]
    return seed


def hash_strings(values: Iterable[str | bytes] | npt.ArrayLike, namespace: str = "") -> U64:
    """Ids of strings (UTF-8 encoded) or byte strings in ``namespace``.

    Args:
        values: a sequence or numpy array (``str_`` or ``bytes_``) of strings.
        namespace: the id space; readers use the feature's name unless told otherwise.

    Returns:
        ``uint64`` ids, one per value, in the shape of ``values``.

    Example:
        >>> int(hash_strings(["abc"], "x")[0]) == int(hash_strings(np.array([b"abc"]), "x")[0])
        True
    """
    seed = namespace_seed(namespace)
    if isinstance(values, (str, bytes)):
        values = [values]
    if not isinstance(values, np.ndarray):
        items = list(values)  # type: ignore[arg-type]
        if all(isinstance(v, (str, bytes)) for v in items):
            # one bytes object per value: no fixed-width array as wide as the longest value
            return _hash_bytes_list([_utf8(v) for v in items], seed)
        values = np.asarray(items)
    arr = np.asarray(values)
    if arr.dtype.kind == "U" and arr.dtype.itemsize <= 4 * _WIDE:
        try:
            arr = arr.astype(np.bytes_)  # ASCII: a C loop
        except UnicodeEncodeError:
            arr = np.strings.encode(arr, "utf-8")
    if arr.dtype.kind != "S":  # objects, or strings too wide for numpy's casts (slow there)
        return _hash_bytes_list([_utf8(v) for v in arr.ravel().tolist()], seed).reshape(arr.shape)
    return _hash_bytes_array(arr, seed)


def _utf8(value: object) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)  # type: ignore[call-overload]


def _hash_bytes_array(arr: npt.NDArray[np.bytes_], seed: np.uint64) -> U64:
    flat = np.ascontiguousarray(arr.ravel())
    width = flat.dtype.itemsize
    buf = flat.view(np.uint8) if width else np.zeros(0, np.uint8)
    starts = np.arange(flat.size, dtype=np.int64) * width
    ends = starts + np.strings.str_len(flat).astype(np.int64)
    return hash_fields(Fields(buf, starts, ends), seed).reshape(arr.shape)


def _hash_bytes_list(items: list[bytes], seed: np.uint64) -> U64:
    lengths = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
    ends = np.cumsum(lengths)
    buf = np.frombuffer(b"".join(items), dtype=np.uint8)
    return hash_fields(Fields(buf, ends - lengths, ends), seed)
