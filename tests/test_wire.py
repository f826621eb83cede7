"""The wire codec: exact round trips, the fp16 accuracy bound, every malformed tensor."""

from __future__ import annotations

import re

import lz4.frame
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from embeddb.errors import InvalidArgumentError, ResourceExhaustedError
from embeddb.transport import wire, wire_decode
from embeddb.v1 import embeddb_pb2 as pb


@pytest.mark.slow
@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.sampled_from([0, 1, 64]))
def test_ids_round_trip_exactly(values: list[int], lz4_min: int) -> None:
    ids = np.array(values, dtype=np.uint64)
    tensor = wire.encode_ids(ids, lz4_min_bytes=lz4_min)
    assert tensor.compression == (
        pb.COMPRESSION_LZ4 if lz4_min and ids.nbytes >= lz4_min else pb.COMPRESSION_UNSPECIFIED
    )
    np.testing.assert_array_equal(
        wire.decode_ids(pb.Tensor.FromString(tensor.SerializeToString()), "ids"), ids
    )


def test_float32_round_trip_is_exact_and_lz4_shrinks_redundant_data() -> None:
    values = np.repeat(np.arange(8, dtype=np.float32)[None, :], 1000, axis=0)
    plain = wire.encode_matrix(values)
    packed = wire.encode_matrix(values, lz4_min_bytes=1024)
    assert packed.compression == pb.COMPRESSION_LZ4 and len(packed.data) < len(plain.data) / 10
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
    base = {"dtype": pb.D_TYPE_UINT64, "shape": [2], "data": b"\0" * 16}
    base.update(kw)
    return pb.Tensor(**base)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (_tensor(dtype=pb.D_TYPE_FLOAT32, data=b"\0" * 8), "ids must be UINT64"),
        (_tensor(shape=[2, 1]), "rank 1"),
        (_tensor(data=b"\0" * 15), "holds 15 bytes.*needs 16"),
        (_tensor(shape=[-2]), "negative"),
        (_tensor(data=b"garbage", compression=pb.COMPRESSION_LZ4), "corrupt LZ4"),
        (
            _tensor(data=lz4.frame.compress(b"\0" * 10**6), compression=pb.COMPRESSION_LZ4),
            "does not decompress",
        ),
        (_tensor(compression=7), "ids.compression: 7 is not a Compression"),
        (_tensor(dtype=99), "ids.dtype: 99 is not a DType"),
        (_tensor(shape=[10**6], data=b""), "more than the limit"),
        (_tensor(shape=[1 << 40, 1 << 40], data=b""), "rank 1"),
    ],
)
def test_malformed_ids_are_rejected_with_the_field_named(tensor: pb.Tensor, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        wire.decode_ids(tensor, "ids", max_items=1000)


def test_an_lz4_tensor_is_not_decompressed_beyond_the_bound() -> None:
    """The size its shape claims is checked before decompression (a 4 MiB frame of zeros
    that would decompress to 32 MiB)."""
    packed = lz4.frame.compress(b"\0" * (32 << 20))
    tensor = pb.Tensor(
        dtype=pb.D_TYPE_UINT64, shape=[4 << 20], data=packed, compression=pb.COMPRESSION_LZ4
    )
    with pytest.raises(ResourceExhaustedError, match="decompresses to 33554432 bytes"):
        wire.decode_ids(tensor, "ids", max_lz4_bytes=16 << 20)
    assert wire.decode_ids(tensor, "ids", max_lz4_bytes=32 << 20).size == 4 << 20
    grads = pb.Tensor(
        dtype=pb.D_TYPE_FLOAT32, shape=[1 << 20, 8], data=packed, compression=pb.COMPRESSION_LZ4
    )
    with pytest.raises(ResourceExhaustedError, match="max_response_bytes 1024"):
        wire.decode_matrix(grads, "grads", max_lz4_bytes=1024)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (pb.Tensor(dtype=pb.D_TYPE_UINT64, shape=[1, 1], data=b"\0" * 8), "FLOAT32 or FLOAT16"),
        (pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=[4], data=b"\0" * 16), "rank 2"),
        (pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=[2, 3], data=b"\0" * 24), r"shape \[2, 4\]"),
        (pb.Tensor(dtype=pb.D_TYPE_FLOAT16, shape=[2, 4], data=b"\0" * 16), "row_scales"),
        (
            pb.Tensor(dtype=pb.D_TYPE_FLOAT16, shape=[1, 4], data=b"\0" * 8, row_scales=b"\0" * 4),
            "finite and positive",
        ),
    ],
)
def test_malformed_matrices_are_rejected(tensor: pb.Tensor, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        wire.decode_matrix(tensor, "grads", rows=2 if tensor.shape[:1] == [2] else None, dim=4)


# ------------------------------------------------------------- hand-written LookupResponse codec
@pytest.mark.parametrize(
    ("rows", "dim", "fp16", "lz4_min"),
    [(0, 4, False, 0), (1, 1, False, 0), (37, 16, False, 0), (37, 16, True, 0),
     (300, 8, False, 64), (300, 8, True, 64), (5, 3, True, 1)],
)  # fmt: skip
def test_encoded_lookup_response_is_byte_identical_to_protobuf(
    rows: int, dim: int, fp16: bool, lz4_min: int
) -> None:
    rng = np.random.default_rng(rows * dim)
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    values[: rows // 3] = 0.5  # compressible rows, so the LZ4 path really compresses
    ours = wire.encode_lookup_response(values, fp16=fp16, lz4_min_bytes=lz4_min)
    reference = pb.LookupResponse(
        vectors=wire.encode_matrix(values, fp16=fp16, lz4_min_bytes=lz4_min)
    ).SerializeToString()
    assert ours.SerializeToString() == reference
    assert ours.ByteSize() == len(reference)
    parsed = wire.parse_lookup_response(reference)
    got = wire.decode_matrix(parsed.vectors, "vectors", rows, dim)
    want = wire.decode_matrix(pb.LookupResponse.FromString(reference).vectors, "v", rows, dim)
    np.testing.assert_array_equal(got, want)


def test_parsed_vectors_are_a_view_of_the_received_bytes() -> None:
    values = np.arange(64, dtype=np.float32).reshape(16, 4)
    data = wire.encode_lookup_response(values).SerializeToString()
    parsed = wire.parse_lookup_response(data)
    assert isinstance(parsed.vectors.data, memoryview) and parsed.vectors.data.obj is data
    decoded = wire.decode_matrix(parsed.vectors, "vectors", 16, 4)
    assert not decoded.flags.owndata  # no copy was made
    np.testing.assert_array_equal(decoded, values)


_unknown = st.sampled_from(
    [b"", b"\x30\x07", b"\x39" + bytes(8), b"\x45" + bytes(4), b"\x52\x03abc"]
)  # unknown fields 6-10 of every wire type


@pytest.mark.slow
@given(
    dtype=st.integers(0, 5),
    shape=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    data=st.binary(max_size=40),
    compression=st.integers(0, 3),
    row_scales=st.binary(max_size=12),
    unknown=_unknown,
    packed=st.booleans(),
)
def test_parser_agrees_with_protobuf(
    dtype: int,
    shape: list[int],
    data: bytes,
    compression: int,
    row_scales: bytes,
    unknown: bytes,
    packed: bool,
) -> None:
    tensor = pb.Tensor(
        dtype=dtype, shape=shape, data=data, compression=compression, row_scales=row_scales
    )
    inner = tensor.SerializeToString() + unknown
    if not packed and shape:  # the same shape written unpacked, as a proto2 writer would
        without = pb.Tensor(dtype=dtype, data=data, compression=compression, row_scales=row_scales)
        unpacked = b"".join(b"\x10" + wire._varint(d) for d in shape)
        inner = without.SerializeToString() + unpacked + unknown
    message = b"\x0a" + wire._varint(len(inner)) + inner + unknown
    want = pb.LookupResponse.FromString(message).vectors
    got = wire.parse_lookup_response(message).vectors
    assert (got.dtype, got.shape, bytes(got.data)) == (want.dtype, list(want.shape), want.data)
    assert (got.compression, bytes(got.row_scales)) == (want.compression, want.row_scales)


def test_a_repeated_embedded_message_is_merged_as_protobuf_does() -> None:
    first = pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=[2], data=b"abcdefgh").SerializeToString()
    second = pb.Tensor(shape=[1], compression=pb.COMPRESSION_LZ4).SerializeToString()
    message = b"".join(b"\x0a" + wire._varint(len(t)) + t for t in (first, second))
    want = pb.LookupResponse.FromString(message).vectors
    got = wire.parse_lookup_response(message).vectors
    assert got.shape == list(want.shape) == [2, 1]
    assert (got.dtype, got.compression, bytes(got.data)) == (
        want.dtype,
        want.compression,
        want.data,
    )


@pytest.mark.parametrize(
    "message",
    [b"\x0a\x05\x08\x02", b"\x0a\x80", b"\x0a\x03\x1a\x09ab", b"\x0b", b"\x00\x01",
     b"\x0a" + b"\xff" * 11],
    ids=["truncated-message", "truncated-length", "field-past-end", "wire-type-3",
         "field-zero", "overlong-varint"],
)  # fmt: skip
def test_malformed_responses_raise(message: bytes) -> None:
    with pytest.raises(ValueError):
        wire.parse_lookup_response(message)
    with pytest.raises(DecodeError):  # protobuf rejects them too
        pb.LookupResponse.FromString(message)


# --------------------------------------------------------- hand-written LookupManyResponse codec
@pytest.mark.parametrize(
    "parts",
    [[], [(0, 4, False, 0)], [(3, 2, False, 0), (0, 5, False, 0), (37, 16, True, 0)],
     [(300, 8, False, 64), (300, 8, True, 64), (5, 3, True, 1), (1, 1, False, 0)]],
    ids=["empty", "one-empty-part", "mixed", "compressed"],
)  # fmt: skip
def test_encoded_lookup_many_response_is_byte_identical_to_protobuf(
    parts: list[tuple[int, int, bool, int]],
) -> None:
    rng = np.random.default_rng(len(parts))
    values = [rng.standard_normal((rows, dim)).astype(np.float32) for rows, dim, _, _ in parts]
    for v in values:
        v[: v.shape[0] // 3] = 0.5  # compressible rows
    encoded = [
        wire.encode_lookup_response(v, fp16=fp16, lz4_min_bytes=lz4)
        for v, (_, _, fp16, lz4) in zip(values, parts, strict=True)
    ]
    ours = wire.encode_lookup_many_response(encoded)
    reference = pb.LookupManyResponse(
        results=[
            pb.LookupResponse(vectors=wire.encode_matrix(v, fp16=fp16, lz4_min_bytes=lz4))
            for v, (_, _, fp16, lz4) in zip(values, parts, strict=True)
        ]
    ).SerializeToString()
    assert ours.SerializeToString() == reference
    assert ours.ByteSize() == len(reference)
    want = pb.LookupManyResponse.FromString(reference).results
    for small_bytes in (0, None):  # the zero-copy walk, and protobuf's parser for small answers
        parsed = wire.parse_lookup_many_response(reference, small_bytes)
        assert len(parsed.results) == len(want) == len(parts)
        for got, want_part, (rows, dim, _, _) in zip(parsed.results, want, parts, strict=True):
            np.testing.assert_array_equal(
                wire.decode_matrix(got.vectors, "vectors", rows, dim),
                wire.decode_matrix(want_part.vectors, "vectors", rows, dim),
            )


def test_parsed_many_vectors_are_views_of_the_received_bytes() -> None:
    a = np.arange(64, dtype=np.float32).reshape(16, 4)
    b = -np.arange(6, dtype=np.float32).reshape(2, 3)
    parts = [wire.encode_lookup_response(a), wire.encode_lookup_response(b)]
    data = wire.encode_lookup_many_response(parts).SerializeToString()
    parsed = wire.parse_lookup_many_response(data)  # small: protobuf copied them until issue 25
    for result, values in zip(parsed.results, (a, b), strict=True):
        assert isinstance(result.vectors.data, memoryview) and result.vectors.data.obj is data
        decoded = wire.decode_matrix(result.vectors, "vectors", *values.shape)
        assert not decoded.flags.owndata  # no copy was made
        np.testing.assert_array_equal(decoded, values)


_tensors = st.builds(
    pb.Tensor,
    dtype=st.integers(0, 5),
    shape=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
    data=st.binary(max_size=24),
    compression=st.integers(0, 3),
    row_scales=st.binary(max_size=8),
)


@pytest.mark.slow
@given(
    results=st.lists(st.tuples(st.lists(_tensors, max_size=2), _unknown, _unknown), max_size=4),
    trailer=_unknown,
)
def test_many_parser_agrees_with_protobuf(
    results: list[tuple[list[pb.Tensor], bytes, bytes]], trailer: bytes
) -> None:
    """Each result: zero, one or two ``vectors`` occurrences (merged), unknown fields inside it
    and between results."""
    message = b""
    for tensors, inside, between in results:
        inner = b"".join(
            b"\x0a" + wire._varint(t.ByteSize()) + t.SerializeToString() for t in tensors
        )
        inner += inside
        message += b"\x0a" + wire._varint(len(inner)) + inner + between
    message += trailer
    want = pb.LookupManyResponse.FromString(message).results
    for small_bytes in (0, None):
        got = wire.parse_lookup_many_response(message, small_bytes).results
        assert len(got) == len(want) == len(results)
        for g, w in zip(got, want, strict=True):
            v, u = g.vectors, w.vectors
            assert (v.dtype, v.shape, bytes(v.data)) == (u.dtype, list(u.shape), u.data)
            assert (v.compression, bytes(v.row_scales)) == (u.compression, u.row_scales)


def _part(tensor: bytes) -> bytes:
    inner = b"\x0a" + wire._varint(len(tensor)) + tensor
    return b"\x0a" + wire._varint(len(inner)) + inner


@pytest.mark.parametrize(
    "message",
    [b"\x0a\x05\x0a\x03\x08", b"\x0a\x80", b"\x0a\x02\x0a\x09", b"\x0a\x01\x0b", b"\x00\x01",
     b"\x0a\x04\x0a\x02\x1a\x09", b"\x0a" + b"\xff" * 11,
     # where the shards' layout is walked (wire_decode): each hands over to the general walk
     b"\x0a\x80\x01" + _part(b"\x08\x02"), _part(b"\x08\x80") + _part(b""),
     _part(b"\x12\x01\x80\x08\x02"), _part(b"\x12\x03\x80\x80\x80\x08\x02"),
     _part(b"\x1a\x05abc") + _part(b""), _part(b"\x08" + b"\xff" * 10 + b"\x01"),
     _part(b"\x08\x02\x2a\x09abc") + _part(b"\x08\x02"), _part(b"\x08\x02")[:-1]],
    ids=["truncated-message", "truncated-length", "inner-past-end", "inner-wire-type-3",
         "field-zero", "tensor-field-past-end", "overlong-varint",
         "two-byte-length-past-end", "dtype-varint-past-part", "shape-varint-past-field",
         "long-shape-varint-past-field", "data-past-part", "overlong-dtype-varint",
         "row-scales-past-part", "truncated-last-part"],
)  # fmt: skip
def test_malformed_many_responses_raise(message: bytes) -> None:
    with pytest.raises(ValueError) as general:  # the general walk's precise error
        wire_decode._walk_lookup_many(message)
    assert wire_decode._parse_canonical_lookup_many(message) is None
    for small_bytes in (0, None):
        with pytest.raises(ValueError, match=re.escape(str(general.value))):
            wire.parse_lookup_many_response(message, small_bytes)
    with pytest.raises(ValueError):  # and protobuf's path, where a caller asks for it
        wire.parse_lookup_many_response(message, len(message))
    with pytest.raises(DecodeError):  # protobuf rejects them too
        pb.LookupManyResponse.FromString(message)
