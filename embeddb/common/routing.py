"""Id arithmetic shared by the server, the client and the trainer.

All functions work on whole ``numpy.uint64`` arrays and are exact (integer arithmetic modulo
2**64), so a client and a shard always agree on where an id lives.

* :func:`mix64` is the SplitMix64 finaliser (its constants: :mod:`embeddb.common.splitmix`): a
  bijective, well-mixed 64-bit hash. Keys that differ in one bit differ in about half the output
  bits, so sequential ids, ids sharing a feature-group prefix, and ids that are multiples of a
  power of two all spread uniformly.
* :func:`shard_of` picks the shard of each id from ``mix64(id ^ SHARD_SALT)``. The salt keeps
  shard routing independent of the in-shard hashing (stripes and hash buckets use other salts,
  see ``embeddb.engine.storage.hash_index``), so the ids of one shard still spread evenly over that
  shard's stripes. The algorithm (:data:`ROUTING_ALGORITHM`) is specified language-neutrally in
  ``embeddb/proto/embeddb/v1/embeddb.proto``, with test vectors in
  ``routing_test_vectors.json`` there.
* :class:`Topology` is one shard's place in its cluster; :meth:`Topology.check_owned` refuses a
  batch holding an id of another shard (one compiled pass, no temporaries).
* :func:`with_group_prefix` puts a feature group's index in the top ``prefix_bits`` bits of its
  ids (PERSIA's ``feature_index_prefix_bit``); :func:`hash_stack` maps one id to several bucket
  rows (PERSIA's ``hash_stack_config``).

Worked example (``prefix_bits=8``, group index 3)::

    id            0x00000000_0000002a
    prefixed      0x03000000_0000002a   top 8 bits = 3, low 56 bits = the id's low 56 bits
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import U64
from embeddb.common.splitmix import GAMMA, MULTIPLIER_1, MULTIPLIER_2, SHIFT_1, SHIFT_2, SHIFT_3
from embeddb.errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "ROUTING_ALGORITHM",
    "SHARD_SALT",
    "STRIPE_SALT",
    "Topology",
    "as_ids",
    "first_foreign",
    "hash_stack",
    "mix64",
    "shard_of",
    "split_by_shard",
    "with_group_prefix",
]


ROUTING_ALGORITHM = "splitmix64-lemire-v1"
"""The name of :func:`shard_of`'s algorithm, as servers report it (``DescribeShard``)."""
SHARD_SALT = np.uint64(0x5D1C_E0DB_5EED_0001)
STRIPE_SALT = np.uint64(0x3C6E_F372_FE94_F82B)
_HASH_STACK_SALT = np.uint64(0xA076_1D64_78BD_642F)


def as_ids(ids: object, name: str = "ids") -> U64:
    """Validate and return ``ids`` as a contiguous 1-D ``uint64`` array.

    Accepts any integer array of non-negative values (a copy is made when the dtype differs)
    and Python sequences of ints. A sequence mixing ids at or above 2**63 with others is
    converted exactly (numpy alone would turn it into float64 and lose the low bits).

    Raises:
        InvalidArgumentError: not 1-D, not integers, negative or wider than 64 bits.
    """
    arr = np.asarray(ids)
    if not isinstance(ids, np.ndarray) and arr.dtype.kind in "fO" and arr.size:
        arr = _exact_from_sequence(ids, arr, name)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr)
    if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64
        return np.empty(0, dtype=np.uint64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(
            f"{name} must be an integer array (uint64), got dtype {arr.dtype}"
        )
    if np.issubdtype(arr.dtype, np.signedinteger) and arr.size and arr.min() < 0:
        raise InvalidArgumentError(f"{name} must be non-negative")
    return arr.astype(np.uint64)


def _exact_from_sequence(ids: object, arr: np.ndarray, name: str) -> np.ndarray:
    """Convert a Python sequence that numpy read as float or object, if it holds only ints."""
    if arr.ndim != 1:
        return arr
    items = list(ids)  # type: ignore[call-overload]
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in items):
        return arr  # genuinely non-integer: rejected by the caller with its dtype
    try:
        return np.array([int(x) for x in items], dtype=np.uint64)
    except OverflowError:
        raise InvalidArgumentError(f"{name} must be non-negative and below 2**64") from None


_NO_SALT = np.uint64(0)


def mix64(ids: U64, salt: np.uint64 = _NO_SALT) -> U64:
    """SplitMix64 finaliser of ``ids ^ salt`` (a bijection on uint64)."""
    with np.errstate(over="ignore"):
        z = (ids ^ salt) + GAMMA
        z = (z ^ (z >> SHIFT_1)) * MULTIPLIER_1
        z = (z ^ (z >> SHIFT_2)) * MULTIPLIER_2
        out: U64 = z ^ (z >> SHIFT_3)
        return out


def shard_of(ids: U64, num_shards: int) -> npt.NDArray[np.int64]:
    """Return the shard index in ``[0, num_shards)`` of each id.

    Uses Lemire's multiply-shift on the top 32 mixed bits, which is uniform for any shard
    count (not only powers of two) and avoids a 64-bit modulo.

    Raises:
        InvalidArgumentError: ``num_shards`` is not positive.
    """
    if num_shards < 1:
        raise InvalidArgumentError(f"num_shards must be >= 1, got {num_shards}")
    hi = mix64(as_ids(ids), SHARD_SALT) >> np.uint64(32)
    shards: npt.NDArray[np.int64] = ((hi * np.uint64(num_shards)) >> np.uint64(32)).astype(np.int64)
    return shards


def first_foreign(ids: U64, shard_index: int, num_shards: int) -> int:
    """The position of the first of ``ids`` that :func:`shard_of` does not put on shard
    ``shard_index`` of ``num_shards``, or -1 when every id belongs there.

    One compiled pass (no temporaries), about 1 ns per id; free with one shard.
    """
    if num_shards == 1 or ids.size == 0:
        return -1
    from embeddb.common._routing_kernel import first_foreign_kernel  # numba loads on first use only

    return int(first_foreign_kernel(ids, SHARD_SALT, num_shards, shard_index))


@dataclass(frozen=True)
class Topology:
    """One shard's place in its cluster: it owns the ids :func:`shard_of` gives ``shard_index``.

    Raises:
        InvalidArgumentError: ``num_shards`` below 1 or at least 2**32, or ``shard_index``
            outside ``[0, num_shards)``.
    """

    shard_index: int = 0
    num_shards: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.num_shards < 1 << 32:
            raise InvalidArgumentError(f"num_shards must be in [1, 2**32), got {self.num_shards}")
        if not 0 <= self.shard_index < self.num_shards:
            raise InvalidArgumentError(
                f"shard_index must be in [0, {self.num_shards}), got {self.shard_index}"
            )

    def __str__(self) -> str:
        return f"shard {self.shard_index} of {self.num_shards}"

    def check_owned(self, ids: U64, field: str = "ids") -> None:
        """Refuse ``ids`` unless every one belongs to this shard.

        Raises:
            FailedPreconditionError: naming the first foreign id, its position, its owner and
                the topology (the client routes with another shard count or address order).
        """
        at = first_foreign(ids, self.shard_index, self.num_shards)
        if at < 0:
            return
        foreign = ids[at : at + 1]
        owner = int(shard_of(foreign, self.num_shards)[0])
        raise FailedPreconditionError(
            f"{field}[{at}] = {int(foreign[0])} belongs to shard {owner} of {self.num_shards}, "
            f"not to this server ({self}): route ids with {ROUTING_ALGORITHM} (see "
            f"embeddb.proto) and list the shards' addresses in shard order; nothing of the "
            f"request was applied"
        )


def split_by_shard(
    ids: U64, num_shards: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Group positions of ``ids`` by shard.

    Returns:
        ``(order, bounds)``: ``ids[order[bounds[k]:bounds[k + 1]]]`` are the ids of shard ``k``,
        in their original relative order.
    """
    shards = shard_of(ids, num_shards)
    if num_shards <= np.iinfo(np.int16).max:
        shards = shards.astype(np.int16)  # numpy's stable sort of 16-bit keys is a radix sort
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    return order.astype(np.int64), bounds.astype(np.int64)


def with_group_prefix(ids: U64, group_index: int, prefix_bits: int) -> U64:
    """Put ``group_index`` in the top ``prefix_bits`` bits of each id.

    The id's own top ``prefix_bits`` bits are dropped (as PERSIA does), so two features of
    different groups never share a row while features of one group share one id space.
    ``prefix_bits == 0`` returns the ids unchanged.

    Raises:
        InvalidArgumentError: ``group_index`` does not fit in ``prefix_bits`` bits.
    """
    if not 0 <= prefix_bits < 64:
        raise InvalidArgumentError(f"prefix_bits must be in [0, 64), got {prefix_bits}")
    ids = as_ids(ids)
    if prefix_bits == 0:
        return ids
    if not 0 <= group_index < (1 << prefix_bits):
        raise InvalidArgumentError(
            f"group index {group_index} does not fit in {prefix_bits} prefix bits"
        )
    shift = np.uint64(64 - prefix_bits)
    low_mask = np.uint64((1 << (64 - prefix_bits)) - 1)
    prefixed: U64 = (ids & low_mask) | (np.uint64(group_index) << shift)
    return prefixed


def hash_stack(ids: U64, rounds: int, embedding_size: int) -> U64:
    """Map each id to ``rounds`` bucket ids (PERSIA's hash stack).

    Round ``r`` hashes the id with its own salt into ``[0, embedding_size)`` and offsets it by
    ``r * embedding_size``, so the rounds address disjoint ranges of one table of
    ``rounds * embedding_size`` rows; a trainer sums the ``rounds`` vectors. Two ids collide in
    every round only with probability about ``embedding_size ** -rounds``.

    Returns:
        ``uint64`` array of shape ``(len(ids), rounds)``.

    Raises:
        InvalidArgumentError: non-positive ``rounds`` or ``embedding_size``.
    """
    if rounds < 1 or embedding_size < 1:
        raise InvalidArgumentError(
            f"hash stack needs rounds >= 1 and embedding_size >= 1, got {rounds}, {embedding_size}"
        )
    ids = as_ids(ids)
    out = np.empty((ids.size, rounds), dtype=np.uint64)
    size = np.uint64(embedding_size)
    for r in range(rounds):  # rounds is a small constant; each round is vectorised over ids
        with np.errstate(over="ignore"):
            salt = _HASH_STACK_SALT * np.uint64(r + 1)
        hi = mix64(ids, salt) >> np.uint64(32)
        out[:, r] = ((hi * size) >> np.uint64(32)) + np.uint64(r) * size
    return out
