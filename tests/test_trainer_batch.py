"""embeddb.features.batch: the layout of ID features, and validation at construction."""

from __future__ import annotations

import numpy as np
import pytest

from embeddb.errors import InvalidArgumentError
from embeddb.features.batch import (
    Batch,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
    PersiaBatch,
)


def _label(n: int) -> Label:
    return Label(np.zeros((n, 1), np.float32), name="click")


def test_ragged_feature_layout_of_the_module_docstring() -> None:
    user = IDTypeFeature("user", [[7, 9], [], np.array([9, 4], np.uint64)])
    assert user.values.dtype == np.uint64 and user.values.tolist() == [7, 9, 9, 4]
    assert user.offsets.dtype == np.int64 and user.offsets.tolist() == [0, 2, 2, 4]
    assert user.batch_size == 3 and user.counts().tolist() == [2, 0, 2]
    assert user.sample(1).tolist() == [] and user.sample(2).tolist() == [9, 4]
    assert not user.single_id
    csr = IDTypeFeature.from_csr("user", np.array([7, 9, 9, 4], np.uint64), [0, 2, 2, 4])
    assert (csr.values == user.values).all() and (csr.offsets == user.offsets).all()
    empty = IDTypeFeature("user", [[], []])
    assert empty.values.size == 0 and empty.offsets.tolist() == [0, 0, 0]


def test_single_id_fast_path() -> None:
    item = IDTypeFeatureWithSingleID("item", np.array([3, 3, 8], np.uint64))
    assert item.offsets.tolist() == [0, 1, 2, 3] and item.single_id
    assert isinstance(item, IDTypeFeature) and item.sample(2).tolist() == [8]
    assert IDTypeFeature("item", [[3], [3], [8]]).single_id  # detected on the ragged type
    big = IDTypeFeatureWithSingleID("item", [2**64 - 1, 2**63])  # exact above 2**63
    assert big.values.tolist() == [2**64 - 1, 2**63]


def test_ids_and_offsets_are_validated() -> None:
    for bad in ([1.5, 2.0], [-1, 2], np.array([[1, 2]])):
        with pytest.raises(InvalidArgumentError):
            IDTypeFeatureWithSingleID("f", bad)
    with pytest.raises(InvalidArgumentError):
        IDTypeFeature("f", [[1], [-2]])
    values = np.array([1, 2, 3], np.uint64)
    for offsets in ([1, 2, 3], [0, 2, 1, 3], [0, 1, 2], [[0, 3]], [0.0, 3.0], []):
        with pytest.raises(InvalidArgumentError, match="offsets"):
            IDTypeFeature.from_csr("f", values, offsets)
    for name in ("", None, 3):
        with pytest.raises(InvalidArgumentError, match="name"):
            IDTypeFeatureWithSingleID(name, [1])  # type: ignore[arg-type]


def test_non_id_features_and_labels_are_validated() -> None:
    dense = NonIDTypeFeature(np.ones((2, 13), np.float32), name="dense")
    assert dense.data.shape == (2, 13)
    with pytest.raises(InvalidArgumentError, match="batch dimension"):
        NonIDTypeFeature(np.float32(1.0))
    with pytest.raises(InvalidArgumentError, match="object"):
        NonIDTypeFeature(np.array([object(), object()]))
    assert Label([True, False]).data.dtype == np.bool_
    for bad in (np.array(["a", "b"]), np.float32(1.0)):
        with pytest.raises(InvalidArgumentError, match="label"):
            Label(bad)


def test_batch_validation() -> None:
    ids = IDTypeFeatureWithSingleID("item", [1, 2])
    dense = NonIDTypeFeature(np.zeros((2, 3), np.float32))
    batch = Batch([ids], [dense], [_label(2)], meta=b"x")
    assert batch.batch_size == 2 and batch.feature("item") is batch.id_type_features[0]
    assert isinstance(batch.id_type_features, tuple) and PersiaBatch is Batch
    assert Batch([], [dense], requires_grad=False).batch_size == 2  # dense only
    with pytest.raises(InvalidArgumentError, match="no ID feature 'user'"):
        batch.feature("user")
    with pytest.raises(InvalidArgumentError, match="at least one feature"):
        Batch([], [], [_label(2)])
    with pytest.raises(InvalidArgumentError, match="batch sizes disagree"):
        Batch([ids, IDTypeFeatureWithSingleID("user", [1, 2, 3])], labels=[_label(2)])
    with pytest.raises(InvalidArgumentError, match="batch sizes disagree"):
        Batch([ids], [dense], [_label(3)])
    twins = [Label(np.zeros(2), name="y"), Label(np.zeros(3), name="y")]
    with pytest.raises(InvalidArgumentError, match="batch sizes disagree"):
        Batch([IDTypeFeatureWithSingleID("item", [1, 2, 3])], labels=twins)  # same-named labels
    with pytest.raises(InvalidArgumentError, match="requires_grad"):
        Batch([ids], [dense])
    assert not Batch([ids], requires_grad=False).labels
    with pytest.raises(InvalidArgumentError, match="duplicate"):
        Batch([ids, IDTypeFeatureWithSingleID("item", [5, 6])], labels=[_label(2)])
    with pytest.raises(InvalidArgumentError, match="meta"):
        Batch([ids], labels=[_label(2)], meta="text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="holds a"):
        Batch([dense], labels=[_label(2)])  # type: ignore[list-item]
