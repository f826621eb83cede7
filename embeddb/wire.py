"""Tensors on the wire: numpy arrays ⇄ ``embeddb.v1.Tensor`` messages.

Used by the server and the client alike (ARCHITECTURE.md §4):

* ids are raw little-endian ``uint64`` bytes, vectors raw little-endian ``float32`` bytes, both
  with an explicit shape, decoded with ``numpy.frombuffer`` (no per-element work);
* optional lossy float16 transfer with per-row scaling: each row is multiplied by
  ``KAPPA / max|row|`` before the cast and divided by it after, so small rows keep their
  relative precision instead of flushing to float16 zeros. Each element's error is at most
  ``2**-11 * max|row|`` (half an ulp of float16 at the row's scale);
* optional LZ4 framing of large payloads; decompression is bounded by the size the shape
  implies, so a small message cannot expand into a huge allocation.

Every malformed tensor raises :class:`~embeddb.errors.InvalidArgumentError` naming the field.
"""

from __future__ import annotations

import lz4.frame
import numpy as np
import numpy.typing as npt

from embeddb.errors import InvalidArgumentError
from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "KAPPA",
    "decode_ids",
    "decode_matrix",
    "encode_ids",
    "encode_matrix",
]

KAPPA = 16384.0  # rows are scaled so that max|row| == KAPPA (float16 max is 65504)

_ITEMSIZE = {pb.UINT64: 8, pb.FLOAT32: 4, pb.FLOAT16: 2}
_NUMPY: dict[int, np.dtype[np.generic]] = {
    pb.UINT64: np.dtype("<u8"),
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT16: np.dtype("<f2"),
}


def encode_ids(ids: npt.NDArray[np.uint64], lz4_min_bytes: int = 0) -> pb.Tensor:
    """A ``UINT64`` tensor of shape ``[n]``."""
    data = np.ascontiguousarray(ids, dtype="<u8").tobytes()
    return _pack(pb.UINT64, [ids.size], data, lz4_min_bytes)


def encode_matrix(
    values: npt.NDArray[np.float32], fp16: bool = False, lz4_min_bytes: int = 0
) -> pb.Tensor:
    """A ``FLOAT32`` (or per-row scaled ``FLOAT16``) tensor of shape ``[n, dim]``."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    shape = list(values.shape)
    if not fp16:
        return _pack(pb.FLOAT32, shape, values.astype("<f4", copy=False).tobytes(), lz4_min_bytes)
    with np.errstate(invalid="ignore", over="ignore"):
        peak = np.max(np.abs(values), axis=1) if values.size else np.zeros(values.shape[0])
    scales = np.ones(values.shape[0], dtype=np.float32)
    usable = np.isfinite(peak) & (peak > 0)
    scales[usable] = (KAPPA / peak[usable]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        half = (values * scales[:, None]).astype("<f2")
    tensor = _pack(pb.FLOAT16, shape, half.tobytes(), lz4_min_bytes)
    tensor.row_scales = scales.astype("<f4").tobytes()
    return tensor


def decode_ids(
    tensor: pb.Tensor, field: str, max_items: int | None = None
) -> npt.NDArray[np.uint64]:
    """Decode a ``UINT64`` tensor of shape ``[n]``.

    Raises:
        InvalidArgumentError: wrong dtype or rank, byte length not matching the shape, too many
            items, or a corrupt LZ4 frame.
    """
    if tensor.dtype != pb.UINT64:
        raise InvalidArgumentError(f"{field} must be UINT64, got {pb.DType.Name(tensor.dtype)}")
    if len(tensor.shape) != 1:
        raise InvalidArgumentError(f"{field} must have rank 1, got shape {list(tensor.shape)}")
    data = _payload(tensor, field, max_items)
    return np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=False)


def decode_matrix(
    tensor: pb.Tensor, field: str, rows: int | None = None, dim: int | None = None
) -> npt.NDArray[np.float32]:
    """Decode a ``FLOAT32`` or scaled ``FLOAT16`` tensor of shape ``[rows, dim]`` to float32.

    Args:
        tensor: the message.
        field: its name, for errors.
        rows, dim: the expected shape, when known.

    Raises:
        InvalidArgumentError: wrong dtype, rank or shape, byte length not matching the shape,
            missing or malformed row scales, or a corrupt LZ4 frame.
    """
    if tensor.dtype not in (pb.FLOAT32, pb.FLOAT16):
        raise InvalidArgumentError(
            f"{field} must be FLOAT32 or FLOAT16, got {pb.DType.Name(tensor.dtype)}"
        )
    shape = list(tensor.shape)
    if len(shape) != 2:
        raise InvalidArgumentError(f"{field} must have rank 2, got shape {shape}")
    if (rows is not None and shape[0] != rows) or (dim is not None and shape[1] != dim):
        want = [rows if rows is not None else shape[0], dim if dim is not None else shape[1]]
        raise InvalidArgumentError(
            f"{field} must have shape {want} (one row of dim {want[1]} per id), got {shape}"
        )
    data = _payload(tensor, field, None)
    values = np.frombuffer(data, dtype=_NUMPY[tensor.dtype]).reshape(shape)
    if tensor.dtype == pb.FLOAT32:
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


def _pack(dtype: pb.DType, shape: list[int], data: bytes, lz4_min_bytes: int) -> pb.Tensor:
    if lz4_min_bytes and len(data) >= lz4_min_bytes:
        return pb.Tensor(
            dtype=dtype, shape=shape, data=lz4.frame.compress(data), compression=pb.LZ4
        )
    return pb.Tensor(dtype=dtype, shape=shape, data=data)


def _payload(tensor: pb.Tensor, field: str, max_items: int | None) -> bytes:
    """The raw bytes of ``tensor``, checked against its shape (and decompressed)."""
    if any(d < 0 for d in tensor.shape):
        raise InvalidArgumentError(f"{field} has a negative dimension: {list(tensor.shape)}")
    items = int(np.prod(tensor.shape, dtype=np.int64)) if tensor.shape else 0
    if max_items is not None and items > max_items:
        raise InvalidArgumentError(f"{field} has {items} items, more than the limit {max_items}")
    expected = items * _ITEMSIZE[tensor.dtype]
    data = tensor.data
    if tensor.compression == pb.LZ4:
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
    elif tensor.compression != pb.COMPRESSION_NONE:
        raise InvalidArgumentError(f"{field} has an unknown compression {tensor.compression}")
    if len(data) != expected:
        raise InvalidArgumentError(
            f"{field} holds {len(data)} bytes, its shape {list(tensor.shape)} of "
            f"{pb.DType.Name(tensor.dtype)} needs {expected}"
        )
    return data
