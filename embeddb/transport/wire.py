"""Tensors on the wire: numpy arrays ⇄ ``embeddb.v1.Tensor`` messages.

Used by the server and the client alike (docs/architecture.md §4):

* ids are raw little-endian ``uint64`` bytes, vectors raw little-endian ``float32`` bytes, both
  with an explicit shape, decoded with ``numpy.frombuffer`` (no per-element work);
* optional lossy float16 transfer with per-row scaling: each row is multiplied by
  ``KAPPA / max|row|`` before the cast and divided by it after, so small rows keep their
  relative precision instead of flushing to float16 zeros. Each element's error is at most
  ``2**-11 * max|row|`` (half an ulp of float16 at the row's scale);
* optional LZ4 framing of large payloads; decompression is bounded by the size the shape
  implies, and (``max_lz4_bytes``, the server's ``max_response_bytes``) that size is checked
  before anything is decompressed, so a small message cannot expand into a huge allocation.

Every malformed tensor raises :class:`~embeddb.errors.InvalidArgumentError` naming the field
(an unknown dtype or compression value included); a tensor that would decompress beyond
``max_lz4_bytes`` raises :class:`~embeddb.errors.ResourceExhaustedError`.

The lookup answers are written here and read by :mod:`embeddb.transport.wire_decode`, whose
public names (``parse_lookup_response``, ``parse_lookup_many_response``, the views) are
re-exported from this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import lz4.frame
import numpy as np
import numpy.typing as npt

from embeddb.errors import InvalidArgumentError, ResourceExhaustedError
from embeddb.transport.wire_decode import (
    SMALL_RESPONSE_BYTES,
    LookupManyResponseView,
    LookupResponseView,
    TensorView,
    parse_lookup_many_response,
    parse_lookup_response,
)
from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "KAPPA",
    "LEGACY_SERVICE_NAME",
    "SERVICE_NAME",
    "SMALL_RESPONSE_BYTES",
    "LookupManyResponseView",
    "LookupResponseView",
    "TensorFields",
    "TensorView",
    "decode_ids",
    "decode_matrix",
    "encode_id_parts",
    "encode_ids",
    "encode_lookup_many_response",
    "encode_lookup_response",
    "encode_matrix",
    "encode_matrix_parts",
    "parse_lookup_many_response",
    "parse_lookup_response",
    "row_bytes",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbeddingStoreService"].full_name
"""The shard's gRPC service (health checks, metrics, reflection name it)."""

LEGACY_SERVICE_NAME = "embeddb.v1.EmbeddingStore"
"""The service's name before buf's STANDARD lint renames: still served (same methods, same
handlers, same checks) so that clients and followers of the previous release keep working
during a rolling upgrade. Deprecated; not reflected."""

KAPPA = 16384.0  # rows are scaled so that max|row| == KAPPA (float16 max is 65504)

_ITEMSIZE: dict[int, int] = {
    pb.D_TYPE_UINT64: 8,
    pb.D_TYPE_FLOAT32: 4,
    pb.D_TYPE_FLOAT16: 2,
}
_NUMPY: dict[int, np.dtype[np.generic]] = {
    pb.D_TYPE_UINT64: np.dtype("<u8"),
    pb.D_TYPE_FLOAT32: np.dtype("<f4"),
    pb.D_TYPE_FLOAT16: np.dtype("<f2"),
}


def row_bytes(dim: int, fp16: bool) -> int:
    """Bytes of one vector of ``dim`` on the wire: float32, or scaled float16 with its float32
    row scale. A server bounds an answer by ids x this before gathering; a client sizes its
    requests by it."""
    return dim * 2 + 4 if fp16 else dim * 4


def encode_ids(ids: npt.NDArray[np.uint64], lz4_min_bytes: int = 0) -> pb.Tensor:
    """A ``UINT64`` tensor of shape ``[n]``."""
    data = _byte_view(np.ascontiguousarray(ids, dtype="<u8"))
    f = _maybe_lz4(pb.D_TYPE_UINT64, [ids.size], data, lz4_min_bytes)
    return pb.Tensor(dtype=f.dtype, shape=f.shape, data=bytes(f.data), compression=f.compression)


def encode_matrix(
    values: npt.NDArray[np.float32], fp16: bool = False, lz4_min_bytes: int = 0
) -> pb.Tensor:
    """A ``FLOAT32`` (or per-row scaled ``FLOAT16``) tensor of shape ``[n, dim]``."""
    f = _matrix_fields(values, fp16, lz4_min_bytes)
    tensor = pb.Tensor(dtype=f.dtype, shape=f.shape, data=bytes(f.data), compression=f.compression)
    if f.row_scales:
        tensor.row_scales = f.row_scales
    return tensor


TensorFields = dict[str, Any]
"""A ``Tensor``'s fields by name, for a message constructor (``pb.LookupRequest(ids=fields)``):
several times cheaper than a ``Tensor``, which the constructor would copy."""


def encode_id_parts(
    ids: npt.NDArray[np.uint64], bounds: Sequence[int], lz4_min_bytes: int = 0
) -> list[TensorFields]:
    """The fields of :func:`encode_ids` of each slice ``ids[bounds[i]:bounds[i + 1]]`` (the same
    messages), from one conversion of ``ids`` to bytes (a request's many small parts)."""
    arr = np.ascontiguousarray(ids, dtype="<u8")
    if lz4_min_bytes:
        return [
            _as_dict(_maybe_lz4(pb.D_TYPE_UINT64, [b - a], _byte_view(arr[a:b]), lz4_min_bytes))
            for a, b in itertools.pairwise(bounds)
        ]
    data = arr.tobytes()
    uint64 = pb.D_TYPE_UINT64
    return [
        {"dtype": uint64, "shape": (b - a,), "data": data[8 * a : 8 * b]}
        for a, b in itertools.pairwise(bounds)
    ]


def encode_matrix_parts(
    values: npt.NDArray[np.float32],
    bounds: Sequence[int],
    fp16: bool = False,
    lz4_min_bytes: int = 0,
) -> list[TensorFields]:
    """The fields of :func:`encode_matrix` of each row slice ``values[bounds[i]:bounds[i +
    1]]`` (the same messages: float16 row scales are per row, so scaling the whole matrix at
    once changes nothing), with one conversion and one copy of the whole matrix."""
    values = np.ascontiguousarray(values, dtype="<f4")
    if lz4_min_bytes or values.ndim != 2:
        pairs = itertools.pairwise(bounds)
        return [_as_dict(_matrix_fields(values[a:b], fp16, lz4_min_bytes)) for a, b in pairs]
    dim = values.shape[1]
    if not fp16:
        data, width = values.tobytes(), 4 * dim
        float32 = pb.D_TYPE_FLOAT32
        return [
            {"dtype": float32, "shape": (b - a, dim), "data": data[width * a : width * b]}
            for a, b in itertools.pairwise(bounds)
        ]
    half, scales = _half_rows(values)
    data, scale_bytes, width = half.tobytes(), scales.astype("<f4").tobytes(), 2 * dim
    float16 = pb.D_TYPE_FLOAT16
    return [
        {
            "dtype": float16,
            "shape": (b - a, dim),
            "data": data[width * a : width * b],
            "row_scales": scale_bytes[4 * a : 4 * b],
        }
        for a, b in itertools.pairwise(bounds)
    ]


def _as_dict(f: _Fields) -> TensorFields:
    out: TensorFields = {"dtype": f.dtype, "shape": f.shape, "data": bytes(f.data)}
    if f.compression:
        out["compression"] = f.compression
    if f.row_scales:
        out["row_scales"] = f.row_scales
    return out


def encode_lookup_response(
    values: npt.NDArray[np.float32], fp16: bool = False, lz4_min_bytes: int = 0
) -> Encoded:
    """A serialized ``LookupResponse`` of ``values``, built with a single copy of the payload.

    Equivalent to ``LookupResponse(vectors=encode_matrix(...))`` byte for byte, but the float32
    rows go from the array straight into the output buffer, instead of through ``tobytes``, the
    message's own copy and serialization (three copies of a 4 MiB answer).
    """
    tensor = _tensor_bytes(_matrix_fields(values, fp16, lz4_min_bytes))
    size = sum(len(p) for p in tensor)
    return Encoded([_key(1, _LEN) + _varint(size), *tensor])


def encode_lookup_many_response(results: Sequence[Encoded]) -> Encoded:
    """A serialized ``LookupManyResponse`` of parts made by :func:`encode_lookup_response`.

    Equivalent to ``LookupManyResponse(results=[...])`` byte for byte. The parts' buffers are
    referenced, not copied: serializing the answer copies every part's vectors once, into one
    buffer.
    """
    parts: list[bytes | memoryview] = []
    for result in results:
        parts.append(_key(1, _LEN) + _varint(result.ByteSize()))
        parts += result._parts
    return Encoded(parts)


def decode_ids(
    tensor: pb.Tensor | TensorView,
    field: str,
    max_items: int | None = None,
    *,
    max_lz4_bytes: int | None = None,
) -> npt.NDArray[np.uint64]:
    """Decode a ``UINT64`` tensor of shape ``[n]``.

    Raises:
        InvalidArgumentError: wrong dtype or rank, byte length not matching the shape, too many
            items, or a corrupt LZ4 frame.
        ResourceExhaustedError: an LZ4 payload that would decompress beyond ``max_lz4_bytes``.
    """
    if tensor.dtype != pb.D_TYPE_UINT64:
        raise InvalidArgumentError(f"{field} must be UINT64, got {_dtype_name(tensor, field)}")
    if len(tensor.shape) != 1:
        raise InvalidArgumentError(f"{field} must have rank 1, got shape {list(tensor.shape)}")
    data = _payload(tensor, field, max_items, max_lz4_bytes)
    return np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=False)


def decode_matrix(
    tensor: pb.Tensor | TensorView,
    field: str,
    rows: int | None = None,
    dim: int | None = None,
    *,
    max_lz4_bytes: int | None = None,
) -> npt.NDArray[np.float32]:
    """Decode a ``FLOAT32`` or scaled ``FLOAT16`` tensor of shape ``[rows, dim]`` to float32.

    Args:
        tensor: the message.
        field: its name, for errors.
        rows, dim: the expected shape, when known.
        max_lz4_bytes: the most bytes an LZ4 payload may decompress to (checked first).

    Raises:
        InvalidArgumentError: wrong dtype, rank or shape, byte length not matching the shape,
            missing or malformed row scales, or a corrupt LZ4 frame.
        ResourceExhaustedError: an LZ4 payload that would decompress beyond ``max_lz4_bytes``.
    """
    if tensor.dtype not in (pb.D_TYPE_FLOAT32, pb.D_TYPE_FLOAT16):
        raise InvalidArgumentError(
            f"{field} must be FLOAT32 or FLOAT16, got {_dtype_name(tensor, field)}"
        )
    shape = list(tensor.shape)
    if len(shape) != 2:
        raise InvalidArgumentError(f"{field} must have rank 2, got shape {shape}")
    if (rows is not None and shape[0] != rows) or (dim is not None and shape[1] != dim):
        want = [rows if rows is not None else shape[0], dim if dim is not None else shape[1]]
        raise InvalidArgumentError(
            f"{field} must have shape {want} (one row of dim {want[1]} per id), got {shape}"
        )
    data = _payload(tensor, field, None, max_lz4_bytes)
    values = np.frombuffer(data, dtype=_NUMPY[tensor.dtype]).reshape(shape)
    if tensor.dtype == pb.D_TYPE_FLOAT32:
        exact: npt.NDArray[np.float32] = values.astype(np.float32, copy=False)
        return exact
    if len(tensor.row_scales) != 4 * shape[0]:
        raise InvalidArgumentError(
            f"{field}.row_scales must hold {shape[0]} float32, got {len(tensor.row_scales)} bytes"
        )
    scales = np.frombuffer(tensor.row_scales, dtype="<f4")
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        raise InvalidArgumentError(f"{field}.row_scales must be finite and positive")
    out: npt.NDArray[np.float32] = values.astype(np.float32) / scales[:, None]
    return out


@dataclass(frozen=True)
class _Fields:
    dtype: pb.DType
    shape: list[int]
    data: bytes | memoryview
    compression: pb.Compression = pb.COMPRESSION_UNSPECIFIED
    row_scales: bytes = b""


def _matrix_fields(values: npt.NDArray[np.float32], fp16: bool, lz4_min_bytes: int) -> _Fields:
    values = np.ascontiguousarray(values, dtype="<f4")
    shape = list(values.shape)
    if not fp16:
        return _maybe_lz4(pb.D_TYPE_FLOAT32, shape, _byte_view(values), lz4_min_bytes)
    half, scales = _half_rows(values)
    fields = _maybe_lz4(pb.D_TYPE_FLOAT16, shape, _byte_view(half), lz4_min_bytes)
    return replace(fields, row_scales=scales.astype("<f4").tobytes())


def _half_rows(
    values: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.float16], npt.NDArray[np.float32]]:
    """Rows scaled to ``max|row| == KAPPA`` as float16, and the float32 scales."""
    with np.errstate(invalid="ignore", over="ignore"):
        peak = np.max(np.abs(values), axis=1) if values.size else np.zeros(values.shape[0])
    scales = np.ones(values.shape[0], dtype=np.float32)
    usable = np.isfinite(peak) & (peak > 0)
    scales[usable] = (KAPPA / peak[usable]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        half = (values * scales[:, None]).astype("<f2")
    return half, scales


def _byte_view(arr: npt.NDArray[np.generic]) -> memoryview:
    """The bytes of a C-contiguous array, without a copy (empty arrays included)."""
    return arr.reshape(-1).view(np.uint8).data


def _maybe_lz4(dtype: pb.DType, shape: list[int], data: memoryview, lz4_min_bytes: int) -> _Fields:
    if lz4_min_bytes and len(data) >= lz4_min_bytes:
        return _Fields(dtype, shape, lz4.frame.compress(data), pb.COMPRESSION_LZ4)
    return _Fields(dtype, shape, data)


def _dtype_name(tensor: pb.Tensor | TensorView, field: str) -> str:
    """The name of ``tensor.dtype``; InvalidArgumentError naming the field for a value that is
    no ``DType`` (a proto3 enum field parses any number)."""
    try:
        return str(pb.DType.Name(tensor.dtype))
    except ValueError:
        raise InvalidArgumentError(
            f"{field}.dtype: {tensor.dtype} is not a DType (UINT64 = 1, FLOAT32 = 2, FLOAT16 = 3)"
        ) from None


def _payload(
    tensor: pb.Tensor | TensorView,
    field: str,
    max_items: int | None,
    max_lz4_bytes: int | None = None,
) -> bytes | memoryview:
    """The raw bytes of ``tensor``, checked against its shape (and decompressed)."""
    if any(d < 0 for d in tensor.shape):
        raise InvalidArgumentError(f"{field} has a negative dimension: {list(tensor.shape)}")
    items = 1
    for d in tensor.shape:  # Python ints: a product of huge dimensions cannot wrap around
        items *= int(d)
    items = items if tensor.shape else 0
    if max_items is not None and items > max_items:
        raise InvalidArgumentError(f"{field} has {items} items, more than the limit {max_items}")
    expected = items * _ITEMSIZE[tensor.dtype]
    data = tensor.data
    if tensor.compression == pb.COMPRESSION_LZ4:
        if max_lz4_bytes is not None and expected > max_lz4_bytes:
            raise ResourceExhaustedError(
                f"{field}: an LZ4 payload of shape {list(tensor.shape)} decompresses to {expected} "
                f"bytes, more than this server's max_response_bytes {max_lz4_bytes}; split the "
                f"request"
            )
        try:
            decompressor = lz4.frame.LZ4FrameDecompressor()
            data = decompressor.decompress(data, max_length=expected)
            complete = decompressor.eof
        except RuntimeError as exc:
            raise InvalidArgumentError(f"{field} holds a corrupt LZ4 frame: {exc}") from exc
        if not complete:
            raise InvalidArgumentError(
                f"{field}: the LZ4 frame does not decompress to the {expected} bytes of its shape"
            )
    elif tensor.compression != pb.COMPRESSION_UNSPECIFIED:
        raise InvalidArgumentError(
            f"{field}.compression: {tensor.compression} is not a Compression "
            f"(COMPRESSION_NONE = 0, LZ4 = 1)"
        )
    if len(data) != expected:
        raise InvalidArgumentError(
            f"{field} holds {len(data)} bytes, its shape {list(tensor.shape)} of "
            f"{pb.DType.Name(tensor.dtype)} needs {expected}"
        )
    return data


# ----------------------------------------------------------------- protobuf wire format, by hand
# The hot messages, LookupResponse and LookupManyResponse (a repeated LookupResponse), are
# written and read here directly in the protobuf wire format
# (https://protobuf.dev/programming-guides/encoding/), so their payload is copied once when sent
# and not at all when received. Everything else goes through the generated classes.

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values take ten bytes, as two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _tensor_bytes(f: _Fields) -> list[bytes | memoryview]:
    """The fields of a ``Tensor`` message, in field order, defaults omitted (as proto3 does)."""
    parts: list[bytes | memoryview] = []
    if f.dtype:
        parts.append(_key(1, _VARINT) + _varint(f.dtype))
    if f.shape:
        packed = b"".join(_varint(d) for d in f.shape)
        parts.append(_key(2, _LEN) + _varint(len(packed)) + packed)
    if len(f.data):
        parts += [_key(3, _LEN) + _varint(len(f.data)), f.data]
    if f.compression:
        parts.append(_key(4, _VARINT) + _varint(f.compression))
    if f.row_scales:
        parts.append(_key(5, _LEN) + _varint(len(f.row_scales)) + f.row_scales)
    return parts


class Encoded:
    """A message serialized ahead of time; a gRPC handler may return it in place of the message.

    The server registers ``SerializeToString`` as every method's response serializer, so this
    and generated messages go through the same path; ``ByteSize`` serves the metrics.
    """

    __slots__ = ("_parts", "_size")

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self._parts = parts
        self._size = sum(len(p) for p in parts)

    def ByteSize(self) -> int:
        return self._size

    def SerializeToString(self) -> bytes:
        return b"".join(self._parts)
