"""The wire codec: exact round trips, the fp16 accuracy bound, every malformed tensor."""

from __future__ import annotations

import lz4.frame
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embeddb import wire
from embeddb.errors import InvalidArgumentError
from embeddb.v1 import embeddb_pb2 as pb


@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.sampled_from([0, 1, 64]))
def test_ids_round_trip_exactly(values: list[int], lz4_min: int) -> None:
    ids = np.array(values, dtype=np.uint64)
    tensor = wire.encode_ids(ids, lz4_min_bytes=lz4_min)
    assert tensor.compression == (
        pb.LZ4 if lz4_min and ids.nbytes >= lz4_min else pb.COMPRESSION_NONE
    )
    np.testing.assert_array_equal(
        wire.decode_ids(pb.Tensor.FromString(tensor.SerializeToString()), "ids"), ids
    )


def test_float32_round_trip_is_exact_and_lz4_shrinks_redundant_data() -> None:
    values = np.repeat(np.arange(8, dtype=np.float32)[None, :], 1000, axis=0)
    plain = wire.encode_matrix(values)
    packed = wire.encode_matrix(values, lz4_min_bytes=1024)
    assert packed.compression == pb.LZ4 and len(packed.data) < len(plain.data) / 10
    for tensor in (plain, packed):
        np.testing.assert_array_equal(wire.decode_matrix(tensor, "v", 1000, 8), values)


def test_fp16_with_row_scaling_bounds_the_error_at_every_magnitude() -> None:
    rng = np.random.default_rng(0)
    magnitudes = np.logspace(-12, 3, 300).astype(np.float32)  # plain fp16 flushes < 6e-8 to 0
    values = rng.normal(size=(300, 32)).astype(np.float32) * magnitudes[:, None]
    tensor = wire.encode_matrix(values, fp16=True)
    assert len(tensor.data) == values.size * 2  # half the bytes of float32
    decoded = wire.decode_matrix(tensor, "v", 300, 32)
    peak = np.abs(values).max(axis=1, keepdims=True)
    assert np.all(np.abs(decoded - values) <= 2.0**-11 * peak)
    unscaled = values.astype(np.float16).astype(np.float32)
    assert np.any(np.abs(unscaled - values) > 2.0**-11 * peak)  # scaling is what makes it hold


def test_fp16_keeps_zero_rows_and_marks_non_finite_rows() -> None:
    values = np.zeros((3, 4), np.float32)
    values[1, 2] = np.nan
    values[2] = [1, -2, 3, -4]
    decoded = wire.decode_matrix(wire.encode_matrix(values, fp16=True), "g")
    np.testing.assert_array_equal(decoded[0], np.zeros(4, np.float32))
    assert np.isnan(decoded[1]).any()  # a NaN gradient stays visibly non-finite
    np.testing.assert_allclose(decoded[2], values[2], rtol=2**-11)


def _tensor(**kw: object) -> pb.Tensor:
    base = {"dtype": pb.UINT64, "shape": [2], "data": b"\0" * 16}
    base.update(kw)
    return pb.Tensor(**base)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (_tensor(dtype=pb.FLOAT32, data=b"\0" * 8), "ids must be UINT64"),
        (_tensor(shape=[2, 1]), "rank 1"),
        (_tensor(data=b"\0" * 15), "holds 15 bytes.*needs 16"),
        (_tensor(shape=[-2]), "negative"),
        (_tensor(data=b"garbage", compression=pb.LZ4), "corrupt LZ4"),
        (
            _tensor(data=lz4.frame.compress(b"\0" * 10**6), compression=pb.LZ4),
            "does not decompress",
        ),
        (_tensor(compression=7), "unknown compression"),
        (_tensor(shape=[10**6], data=b""), "more than the limit"),
    ],
)
def test_malformed_ids_are_rejected_with_the_field_named(tensor: pb.Tensor, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        wire.decode_ids(tensor, "ids", max_items=1000)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (pb.Tensor(dtype=pb.UINT64, shape=[1, 1], data=b"\0" * 8), "FLOAT32 or FLOAT16"),
        (pb.Tensor(dtype=pb.FLOAT32, shape=[4], data=b"\0" * 16), "rank 2"),
        (pb.Tensor(dtype=pb.FLOAT32, shape=[2, 3], data=b"\0" * 24), r"shape \[2, 4\]"),
        (pb.Tensor(dtype=pb.FLOAT16, shape=[2, 4], data=b"\0" * 16), "row_scales"),
        (
            pb.Tensor(dtype=pb.FLOAT16, shape=[1, 4], data=b"\0" * 8, row_scales=b"\0" * 4),
            "finite and positive",
        ),
    ],
)
def test_malformed_matrices_are_rejected(tensor: pb.Tensor, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        wire.decode_matrix(tensor, "grads", rows=2 if tensor.shape[:1] == [2] else None, dim=4)
