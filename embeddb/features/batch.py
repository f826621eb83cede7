"""The training batch: ID features, non-ID features, labels and meta, validated once.

Pure numpy (no torch): readers build batches anywhere, the embedding worker reads their ids,
the NN worker turns the rest into tensors. PERSIA users will recognise ``PersiaBatch``,
``IDTypeFeature``, ``IDTypeFeatureWithSingleID``, ``NonIDTypeFeature`` and ``Label`` (same
names, same roles).

Layout of a batch of 3 samples with two ID features, one numeric feature and one label::

    IDTypeFeature "user"   (ragged: any number of ids per sample, empty allowed)
        values  = [ 7, 9, 9, 4 ]                 uint64, every id of every sample, in order
        offsets = [ 0, 2, 2, 4 ]                 sample i owns values[offsets[i]:offsets[i+1]]
                   sample 0 -> [7, 9]   sample 1 -> []   sample 2 -> [9, 4]
    IDTypeFeatureWithSingleID "item"   (exactly one id per sample: the fast path)
        values  = [ 3, 3, 8 ]                    offsets are implicitly 0, 1, 2, 3
    NonIDTypeFeature "dense"  data = float32 array of shape (3, 13)   (any dtype and shape[1:])
    Label "click"             data = float32 array of shape (3, 1)
    requires_grad = True      (a training batch: labels required)
    meta = b"..."             optional opaque bytes, passed through untouched
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import I64, U64
from embeddb.common.routing import as_ids
from embeddb.errors import InvalidArgumentError

__all__ = [
    "Batch",
    "IDTypeFeature",
    "IDTypeFeatureWithSingleID",
    "Label",
    "NonIDTypeFeature",
    "PersiaBatch",
]


class IDTypeFeature:
    """One ID feature of a batch: ragged uint64 ids per sample.

    Args:
        name: the feature's name (a feature of the embedding config).
        samples: one 1-D array (or sequence) of ids per sample; empty samples allowed. Use
            :meth:`from_csr` for the ``(values, offsets)`` layout without a per-sample list.

    Raises:
        InvalidArgumentError: ids that are not non-negative integers.
    """

    __slots__ = ("name", "offsets", "values")

    def __init__(self, name: str, samples: Sequence[object]) -> None:
        self.name = _check_name(name, "IDTypeFeature")
        arrays = [as_ids(np.asarray(s, dtype=np.uint64) if _is_empty(s) else s) for s in samples]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        self.values: U64 = np.concatenate(arrays) if arrays else np.zeros(0, np.uint64)
        self.offsets: I64 = offsets

    @classmethod
    def from_csr(cls, name: str, values: object, offsets: object) -> IDTypeFeature:
        """A feature from all ids in order plus ``offsets`` (``batch_size + 1`` entries).

        Raises:
            InvalidArgumentError: offsets not starting at 0, decreasing, or not ending at the
                number of ids.
        """
        feature = cls.__new__(cls)
        feature.name = _check_name(name, "IDTypeFeature")
        feature.values = as_ids(values)
        offs = np.asarray(offsets)
        if offs.ndim != 1 or offs.size < 1 or not np.issubdtype(offs.dtype, np.integer):
            raise InvalidArgumentError(f"feature {name!r}: offsets must be 1-D integers")
        offs = offs.astype(np.int64)
        if offs[0] != 0 or offs[-1] != feature.values.size or np.any(np.diff(offs) < 0):
            raise InvalidArgumentError(
                f"feature {name!r}: offsets must start at 0, never decrease and end at "
                f"{feature.values.size} (the number of ids)"
            )
        feature.offsets = offs
        return feature

    @property
    def batch_size(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def single_id(self) -> bool:
        """Whether every sample has exactly one id."""
        return bool(self.values.size == self.batch_size and np.all(np.diff(self.offsets) == 1))

    def counts(self) -> I64:
        """Ids per sample."""
        return np.diff(self.offsets)

    def sample(self, i: int) -> U64:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"{kind}({self.name!r}, {self.batch_size} samples, {self.values.size} ids)"


class IDTypeFeatureWithSingleID(IDTypeFeature):
    """An ID feature with exactly one id per sample (the fast path: no offsets to build).

    Args:
        name: the feature's name.
        data: 1-D array of one id per sample.
    """

    __slots__ = ()

    def __init__(self, name: str, data: object) -> None:
        self.name = _check_name(name, "IDTypeFeatureWithSingleID")
        self.values = as_ids(data)
        self.offsets = np.arange(self.values.size + 1, dtype=np.int64)

    @property
    def single_id(self) -> bool:
        return True


@dataclass(frozen=True)
class NonIDTypeFeature:
    """A numeric (or any dtype) feature: ``data.shape[0]`` is the batch size."""

    data: npt.NDArray[np.generic]
    name: str | None = None

    def __post_init__(self) -> None:
        arr = np.asarray(self.data)
        if arr.ndim == 0:
            raise InvalidArgumentError(f"non-ID feature {self.name!r} needs a batch dimension")
        if arr.dtype == object:
            raise InvalidArgumentError(f"non-ID feature {self.name!r} has dtype object")
        object.__setattr__(self, "data", arr)


@dataclass(frozen=True)
class Label:
    """A label: ``data.shape[0]`` is the batch size (numeric dtype)."""

    data: npt.NDArray[np.generic]
    name: str | None = None

    def __post_init__(self) -> None:
        arr = np.asarray(self.data)
        if arr.ndim == 0 or not (
            np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
        ):
            raise InvalidArgumentError(
                f"label {self.name!r} must be a numeric array with a batch dimension, got "
                f"dtype {arr.dtype} and shape {arr.shape}"
            )
        object.__setattr__(self, "data", arr)


@dataclass(frozen=True)
class Batch:
    """A training (or evaluation) batch; see the module docstring for the layout.

    Raises:
        InvalidArgumentError: no features; features or labels whose batch sizes disagree;
            duplicate feature names; ``requires_grad`` without labels; meta that is not bytes.
    """

    id_type_features: Sequence[IDTypeFeature]
    non_id_type_features: Sequence[NonIDTypeFeature] = ()
    labels: Sequence[Label] = ()
    requires_grad: bool = True
    meta: bytes | None = None

    def __post_init__(self) -> None:
        ids = list(self.id_type_features)
        dense = list(self.non_id_type_features)
        labels = list(self.labels)
        for f in ids:
            if not isinstance(f, IDTypeFeature):
                raise InvalidArgumentError(f"id_type_features holds a {type(f).__name__}")
        if not ids and not dense:
            raise InvalidArgumentError("a batch needs at least one feature")
        names = [f.name for f in ids]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"duplicate ID feature names: {names}")
        # A list, not a dict: two labels (or non-ID features) of one name must not hide a size.
        sizes = [(f"id feature {f.name!r}", f.batch_size) for f in ids]
        sizes += [(f"non-ID feature {f.name or i}", f.data.shape[0]) for i, f in enumerate(dense)]
        sizes += [(f"label {lb.name or i}", lb.data.shape[0]) for i, lb in enumerate(labels)]
        if len({size for _, size in sizes}) > 1:
            detail = ", ".join(f"{k}: {v}" for k, v in sizes)
            raise InvalidArgumentError(f"batch sizes disagree ({detail})")
        if self.requires_grad and not labels:
            raise InvalidArgumentError("a batch with requires_grad=True needs at least one label")
        if self.meta is not None and not isinstance(self.meta, bytes):
            raise InvalidArgumentError(f"meta must be bytes, got {type(self.meta).__name__}")
        object.__setattr__(self, "id_type_features", tuple(ids))
        object.__setattr__(self, "non_id_type_features", tuple(dense))
        object.__setattr__(self, "labels", tuple(labels))

    @property
    def batch_size(self) -> int:
        if self.id_type_features:
            return self.id_type_features[0].batch_size
        return int(self.non_id_type_features[0].data.shape[0])

    def feature(self, name: str) -> IDTypeFeature:
        for f in self.id_type_features:
            if f.name == name:
                return f
        raise InvalidArgumentError(f"the batch has no ID feature {name!r}")


PersiaBatch = Batch  # PERSIA's name


def _check_name(name: object, kind: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"{kind} needs a non-empty name, got {name!r}")
    return name


def _is_empty(sample: object) -> bool:
    try:
        return len(sample) == 0  # type: ignore[arg-type]
    except TypeError:
        return False
