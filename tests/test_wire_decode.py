"""The specialized walk of the shards' ``LookupManyResponse`` layout (issue 25): it reads every
answer the shards write, agrees with protobuf and the general walk, and hands every other layout
over to the general walk (malformed answers: tests/test_wire.py)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embeddb.transport import wire, wire_decode
from embeddb.v1 import embeddb_pb2 as pb


def _fields(view: wire.TensorView | pb.Tensor) -> tuple[object, ...]:
    return (
        view.dtype,
        list(view.shape),
        bytes(view.data),
        view.compression,
        bytes(view.row_scales),
    )


def _agrees_with_protobuf(data: bytes, parsed: wire.LookupManyResponseView) -> None:
    want = pb.LookupManyResponse.FromString(data).results
    assert len(parsed.results) == len(want)
    for got, expected in zip(parsed.results, want, strict=True):
        assert _fields(got.vectors) == _fields(expected.vectors)


# (rows, dim, fp16, lz4_min_bytes) of each part: one-byte and longer lengths, shapes and dims
@pytest.mark.parametrize(
    "parts",
    [[(60, 16, False, 0)] * 26, [(1, 1, False, 0), (0, 4, False, 0), (127, 127, False, 0)],
     [(128, 16, False, 0), (240, 16, True, 0), (16383, 2, False, 0)],
     [(16384, 1, False, 0), (3, 200, True, 0), (300, 8, False, 64)], [(65536, 16, False, 0)]],
    ids=["criteo-b128", "one-byte", "two-byte-rows", "long-varints", "one-large-part"],
)  # fmt: skip
def test_shard_answers_take_the_specialized_walk(
    parts: list[tuple[int, int, bool, int]],
) -> None:
    rng = np.random.default_rng(len(parts))
    values = [rng.standard_normal((rows, dim)).astype(np.float32) for rows, dim, _, _ in parts]
    for v in values:
        v[: v.shape[0] // 2] = 0.25  # compressible, where LZ4 is asked for
    data = wire.encode_lookup_many_response(
        [
            wire.encode_lookup_response(v, fp16=fp16, lz4_min_bytes=lz4)
            for v, (_, _, fp16, lz4) in zip(values, parts, strict=True)
        ]
    ).SerializeToString()
    results = wire_decode._parse_canonical_lookup_many(data)
    assert results is not None
    parsed = wire.parse_lookup_many_response(data)
    _agrees_with_protobuf(data, parsed)
    general = wire_decode._walk_lookup_many(data).results
    for got, walked, v in zip(parsed.results, general, values, strict=True):
        assert _fields(got.vectors) == _fields(walked.vectors)
        if v.size:  # an empty part has no data field
            assert isinstance(got.vectors.data, memoryview) and got.vectors.data.obj is data
        decoded = wire.decode_matrix(got.vectors, "vectors", *v.shape)
        np.testing.assert_allclose(decoded, v, rtol=2**-10, atol=0)


def _tensor(**fields: Any) -> bytes:
    data: bytes = pb.Tensor(**fields).SerializeToString()
    return data


_T = _tensor(dtype=pb.D_TYPE_FLOAT32, shape=[1, 2], data=b"abcdefgh")
_UNKNOWN = b"\x38\x07"  # field 7, VARINT: no such field in either message


def _wrap(*tensors: bytes, inside: bytes = b"") -> bytes:
    inner = b"".join(b"\x0a" + wire._varint(len(t)) + t for t in tensors) + inside
    return b"\x0a" + wire._varint(len(inner)) + inner


@pytest.mark.parametrize(
    "message",
    [_wrap(_T) + _UNKNOWN, _wrap(_T, inside=_UNKNOWN), _wrap(_T + _UNKNOWN),
     _wrap(b"\x1a\x08abcdefgh\x08\x02\x12\x02\x01\x02"), _wrap(b"\x08\x02\x10\x01\x10\x02"),
     _wrap(_T, _tensor(compression=pb.COMPRESSION_LZ4)), _wrap(b"\x08\x02\x08\x03"),
     _wrap(b"\x12\x02\x01\x02\x12\x01\x05"), _wrap(_tensor(shape=[-1, 2**40])),
     _UNKNOWN + _wrap(_T), _wrap() + b"\x0a\x02\x38\x07", _wrap(b"\x08\x02\x0a\x00")],
    ids=["unknown-between-parts", "unknown-in-part", "unknown-in-tensor", "fields-out-of-order",
         "unpacked-shape", "merged-vectors", "repeated-dtype", "two-packed-shapes",
         "negative-and-long-shape", "unknown-first", "part-without-vectors",
         "dtype-as-len-in-tensor"],
)  # fmt: skip
def test_other_layouts_hand_over_to_the_general_walk(message: bytes) -> None:
    """Valid answers in layouts other than the shards' (and odd shapes within it) parse as
    protobuf parses them, whichever walk reads them."""
    parsed = wire.parse_lookup_many_response(message)
    _agrees_with_protobuf(message, parsed)
    canonical = wire_decode._parse_canonical_lookup_many(message)
    if canonical is not None:  # read by the specialized walk: the same tensors
        assert [_fields(r.vectors) for r in canonical] == [
            _fields(r.vectors) for r in parsed.results
        ]


_SHARD_ANSWER = wire.encode_lookup_many_response(
    [
        wire.encode_lookup_response(
            np.arange(rows * dim, dtype=np.float32).reshape(rows, dim), fp16
        )
        for rows, dim, fp16 in ((3, 2, False), (1, 1, True), (0, 3, False), (130, 2, False))
    ]
).SerializeToString()


@pytest.mark.slow
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_SHARD_ANSWER)), st.sampled_from(["set", "cut", "insert"]),
                  st.sampled_from([0, 1, 0x08, 0x0A, 0x12, 0x1A, 0x20, 0x2A, 0x7F, 0x80, 0xFF])),
        min_size=1, max_size=3,
    )
)  # fmt: skip
def test_damaged_shard_answers_parse_as_the_general_walk_parses_them(
    edits: list[tuple[int, str, int]],
) -> None:
    """Whatever the specialized walk accepts, the general walk reads the same way; whatever the
    general walk rejects, the client's parser rejects with the same message."""
    data = bytearray(_SHARD_ANSWER)
    for at, edit, byte in edits:
        at = min(at, len(data))
        if edit == "set" and at < len(data):
            data[at] = byte
        elif edit == "cut":
            del data[at:]
        else:
            data.insert(at, byte)
    message = bytes(data)
    try:
        general: list[wire.LookupResponseView] | str = wire_decode._walk_lookup_many(
            message
        ).results
    except ValueError as exc:
        general = str(exc)
    canonical = wire_decode._parse_canonical_lookup_many(message)
    if canonical is not None:
        assert not isinstance(general, str)
        assert [_fields(r.vectors) for r in canonical] == [_fields(r.vectors) for r in general]
    if isinstance(general, str):
        with pytest.raises(ValueError, match=re.escape(general)):
            wire.parse_lookup_many_response(message)
