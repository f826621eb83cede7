"""Reading the hot answers, ``LookupResponse`` and ``LookupManyResponse``, without a copy.

Re-exported by :mod:`embeddb.transport.wire` (which writes them): the parsed tensors'
``data`` are views into the received bytes, decoded by ``wire.decode_matrix``. The messages are
read here directly in the protobuf wire format
(https://protobuf.dev/programming-guides/encoding/).

A ``LookupManyResponse`` is read in one of three ways, all giving the same tensors:

* answers in the layout the shards write (``wire.encode_lookup_many_response``: each part one
  ``vectors`` tensor, its fields in field-number order, no unknown fields): a walk specialized
  to that layout, a few Python operations per part (about 1.4 µs a part; the general walk took
  5.5 µs, and protobuf's C parser plus the conversion of its parts about 2.2 µs; see
  ``benchmarks/client_tables.py``, ``parse_us_*``);
* answers of at most ``small_bytes`` bytes, where a caller asks for it (none by default since
  the specialized walk): protobuf's C parser, copying the vectors;
* anything else (another writer's field order, unknown fields, merged parts, malformed bytes):
  the general walk, which follows all of protobuf's rules and raises the precise ``ValueError``.
  The specialized walk hands over to it at the first byte it does not expect, so both accept
  and reject the same messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "SMALL_RESPONSE_BYTES",
    "LookupManyResponseView",
    "LookupResponseView",
    "TensorView",
    "parse_lookup_many_response",
    "parse_lookup_response",
]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(slots=True)
class TensorView:
    """A ``Tensor`` read from the wire whose ``data`` is a view into the received bytes.

    Has the attributes :func:`decode_matrix` reads, like ``pb.Tensor``.
    """

    dtype: int = 0
    shape: list[int] = field(default_factory=list)
    data: bytes | memoryview = b""
    compression: int = 0
    row_scales: bytes | memoryview = b""


@dataclass(slots=True)
class LookupResponseView:
    """A parsed ``LookupResponse`` (see :func:`parse_lookup_response`)."""

    vectors: TensorView = field(default_factory=TensorView)


class _Reader:
    """Reads protobuf fields from a buffer; every malformation raises ``ValueError``."""

    def __init__(self, buffer: memoryview) -> None:
        self.buf = buffer
        self.pos = 0

    def varint(self) -> int:
        result = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= len(buf):
                raise ValueError("truncated varint")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result & ((1 << 64) - 1)
            shift += 7
            if shift >= 70:
                raise ValueError("varint longer than ten bytes")

    def fields(self) -> Iterator[tuple[int, int, int | memoryview]]:
        """``(field, wire type, value)``: an int for VARINT/I64/I32, a view for LEN."""
        while self.pos < len(self.buf):
            key = self.varint()
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise ValueError("field number 0")
            if wire_type == _VARINT:
                yield number, wire_type, self.varint()
            elif wire_type in (_I64, _I32):
                width = 8 if wire_type == _I64 else 4
                yield number, wire_type, int.from_bytes(self._take(width), "little")
            elif wire_type == _LEN:
                yield number, wire_type, self._take(self.varint())
            else:
                raise ValueError(f"unsupported wire type {wire_type} (field {number})")

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError(f"field of {n} bytes runs past the end of the message")
        view = self.buf[self.pos : end]
        self.pos = end
        return view


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _merge_tensor(tensor: TensorView, buffer: memoryview) -> None:
    for number, wire_type, value in _Reader(buffer).fields():
        if isinstance(value, memoryview):  # LEN
            if number == 2:  # packed repeated int64
                reader = _Reader(value)
                while reader.pos < len(reader.buf):
                    tensor.shape.append(_signed64(reader.varint()))
            elif number == 3:
                tensor.data = value
            elif number == 5:
                tensor.row_scales = value
        elif wire_type == _VARINT:
            if number == 1:
                tensor.dtype = value
            elif number == 2:  # unpacked repeated int64: parsers must accept both forms
                tensor.shape.append(_signed64(value))
            elif number == 4:
                tensor.compression = value
        # anything else is an unknown field (a newer server): skipped, as protobuf does


def parse_lookup_response(data: bytes) -> LookupResponseView:
    """Parse a serialized ``LookupResponse`` without copying the vectors.

    Follows protobuf's rules: fields in any order, unknown fields skipped, a repeated embedded
    message merged, packed or unpacked ``shape``. ``vectors.data`` is a view into ``data``.

    Raises:
        ValueError: malformed bytes (the gRPC client reports the call as failed).
    """
    return _parse_lookup(memoryview(data))


def _parse_lookup(buffer: memoryview) -> LookupResponseView:
    response = LookupResponseView()
    for number, _, value in _Reader(buffer).fields():
        if number == 1 and isinstance(value, memoryview):
            _merge_tensor(response.vectors, value)
    return response


@dataclass
class LookupManyResponseView:
    """A parsed ``LookupManyResponse`` (see :func:`parse_lookup_many_response`)."""

    results: list[LookupResponseView] = field(default_factory=list)


def parse_lookup_many_response(
    data: bytes, small_bytes: int | None = None
) -> LookupManyResponseView:
    """Parse a serialized ``LookupManyResponse`` without copying any part's vectors.

    Each occurrence of field 1 is one more result (a repeated message field), parsed as
    :func:`parse_lookup_response` parses a whole message; unknown fields are skipped. Every
    ``results[i].vectors.data`` is a view into ``data``.

    Answers of at most ``small_bytes`` bytes (default :data:`SMALL_RESPONSE_BYTES`, 0: none
    but the empty answer) are parsed by protobuf instead, copying their vectors.

    Raises:
        ValueError: malformed bytes (the gRPC client reports the call as failed).
    """
    if len(data) <= (SMALL_RESPONSE_BYTES if small_bytes is None else small_bytes):
        return _parse_small_lookup_many(data)
    results = _parse_canonical_lookup_many(data)
    if results is None:  # another writer's layout, or malformed: the general walk decides
        return _walk_lookup_many(data)
    return LookupManyResponseView(results)


def _walk_lookup_many(data: bytes) -> LookupManyResponseView:
    """The general walk: any field order, unknown fields, merged parts; precise errors."""
    response = LookupManyResponseView()
    for number, _, value in _Reader(memoryview(data)).fields():
        if number == 1 and isinstance(value, memoryview):
            response.results.append(_parse_lookup(value))
    return response


SMALL_RESPONSE_BYTES = 0
"""LookupMany answers up to this size are parsed by protobuf, copying the vectors. It was 64 KiB
(online lookups of a few ids in many tables) while the general walk cost 5.5 µs a part; the
specialized walk is faster than protobuf plus the conversion of its parts at every size
measured (1 to 26 parts, 76 B to 4 MiB), so by default every answer is walked without a
copy."""


def _parse_small_lookup_many(data: bytes) -> LookupManyResponseView:
    try:
        message = pb.LookupManyResponse.FromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise ValueError(f"malformed LookupManyResponse: {exc}") from exc
    return LookupManyResponseView(
        [
            LookupResponseView(
                TensorView(
                    dtype=r.vectors.dtype,
                    shape=list(r.vectors.shape),
                    data=r.vectors.data,
                    compression=r.vectors.compression,
                    row_scales=r.vectors.row_scales,
                )
            )
            for r in message.results
        ]
    )


# ----------------------------------------------------- the shards' own layout, specialized walk
# Keys of the fields the shards write, in the order they write them (field << 3 | wire type).
_RESULT = 0x0A  # LookupManyResponse.results / LookupResponse.vectors: field 1, LEN
_DTYPE, _SHAPE, _DATA, _COMPRESSION, _SCALES = 0x08, 0x12, 0x1A, 0x20, 0x2A


class _Unexpected(Exception):
    """Raised inside the specialized walk: hand the message to the general walk."""


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` (at most ten bytes, as the general walk allows) and the position
    after it; ``_Unexpected`` when longer, IndexError when it runs past the end."""
    result = shift = 0
    stop = pos + 10
    while pos < stop:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & ((1 << 64) - 1), pos
        shift += 7
    raise _Unexpected


def _packed_shape(data: bytes, pos: int, stop: int) -> list[int]:
    shape = []
    while pos < stop:
        value, pos = _varint_at(data, pos)
        shape.append(value - (1 << 64) if value >= 1 << 63 else value)
    if pos != stop:  # the last varint runs past the field
        raise _Unexpected
    return shape


def _parse_canonical_lookup_many(data: bytes) -> list[LookupResponseView] | None:
    """The parts of an answer in the shards' layout, or None where it departs from it."""
    try:
        return _canonical_parts(data)
    except (_Unexpected, IndexError):  # IndexError: a field running past the end of ``data``
        return None


def _canonical_parts(data: bytes) -> list[LookupResponseView] | None:
    # Lengths and values below 2**14 (one or two bytes) are read inline, longer ones by
    # _varint_at.
    # Every read past a part's end either fails the ``pos != part_end`` check or, past the
    # end of ``data``, raises IndexError.
    view = memoryview(data)
    end = len(data)
    results: list[LookupResponseView] = []
    append = results.append
    pos = 0
    while pos < end:
        if data[pos] != _RESULT:
            return None
        size = data[pos + 1]
        if size < 0x80:
            pos += 2
        elif data[pos + 2] < 0x80:
            size = (size & 0x7F) | data[pos + 2] << 7
            pos += 3
        else:
            size, pos = _varint_at(data, pos + 1)
        part_end = pos + size
        if part_end > end:
            return None
        if pos == part_end:
            append(LookupResponseView(TensorView()))
            continue
        if data[pos] != _RESULT:
            return None
        size = data[pos + 1]
        if size < 0x80:
            pos += 2
        elif data[pos + 2] < 0x80:
            size = (size & 0x7F) | data[pos + 2] << 7
            pos += 3
        else:
            size, pos = _varint_at(data, pos + 1)
        if pos + size != part_end:  # one vectors field filling the part, nothing else
            return None
        dtype = compression = 0
        shape: list[int] = []
        payload: bytes | memoryview = b""
        scales: bytes | memoryview = b""
        key = data[pos] if pos < part_end else 0
        if key == _DTYPE:
            dtype = data[pos + 1]
            if dtype < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                dtype = (dtype & 0x7F) | data[pos + 2] << 7
                pos += 3
            else:
                dtype, pos = _varint_at(data, pos + 1)
            key = data[pos] if pos < part_end else 0
        if key == _SHAPE:
            size = data[pos + 1]
            if size < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                size = (size & 0x7F) | data[pos + 2] << 7
                pos += 3
            else:
                size, pos = _varint_at(data, pos + 1)
            stop = pos + size
            if stop > part_end:
                return None
            # [rows, dim], each below 128, or rows below 2**14: inline
            if size == 2 and data[pos] < 0x80 and data[pos + 1] < 0x80:
                shape = [data[pos], data[pos + 1]]
            elif size == 3 and data[pos + 1] < 0x80 <= data[pos] and data[pos + 2] < 0x80:
                shape = [(data[pos] & 0x7F) | data[pos + 1] << 7, data[pos + 2]]
            else:
                shape = _packed_shape(data, pos, stop)
            pos = stop
            key = data[pos] if pos < part_end else 0
        if key == _DATA:
            size = data[pos + 1]
            if size < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                size = (size & 0x7F) | data[pos + 2] << 7
                pos += 3
            else:
                size, pos = _varint_at(data, pos + 1)
            stop = pos + size
            if stop > part_end:
                return None
            payload = view[pos:stop]
            pos = stop
            key = data[pos] if pos < part_end else 0
        if key == _COMPRESSION:
            compression = data[pos + 1]
            if compression < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                compression = (compression & 0x7F) | data[pos + 2] << 7
                pos += 3
            else:
                compression, pos = _varint_at(data, pos + 1)
            key = data[pos] if pos < part_end else 0
        if key == _SCALES:
            size = data[pos + 1]
            if size < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                size = (size & 0x7F) | data[pos + 2] << 7
                pos += 3
            else:
                size, pos = _varint_at(data, pos + 1)
            stop = pos + size
            if stop > part_end:
                return None
            scales = view[pos:stop]
            pos = stop
        if pos != part_end:  # a field out of order, an unknown one, or one past the part
            return None
        append(LookupResponseView(TensorView(dtype, shape, payload, compression, scales)))
    return results
