"""Fields as byte ranges of one buffer, and their vectorised conversion to numbers and ids.

Readers never loop over rows in Python. A chunk of text (or an Arrow string column) is one
``uint8`` array; field ``i`` is ``buf[starts[i]:ends[i]]``::

    buf    = b"0\\t12\\t\\t68fd1e64\\n1\\t-3\\t7\\t\\n"
    starts = [2, 17]    ends = [4, 19]          (column 1 of the two lines: b"12", b"-3")

Hex and decimal fields are parsed 8 bytes per ``uint64`` operation (SWAR): one unaligned load
per field and word (:func:`u64_at`), bytes past the field masked off, every byte checked to be
a digit with carry-free byte-wise comparisons, then the digits packed or combined with a few
shifts and multiplies. Plain numbers (``12.47``, ``-3``) are parsed in one compiled pass
(:mod:`._number_kernel`); longer integers by SWAR, other numbers (``1.5e-3``) through a byte
matrix, one row per field.

Empty fields (``starts == ends``) and nulls (``valid`` false, from Parquet) are "missing";
each parser reports them in a mask and leaves the choice of a fill value to its caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F64, I64, U8, U64, Bool

__all__ = ["BYTE_MASKS", "Fields", "ParseError", "u64_at", "warm_up_numbers"]


_SPACE, _TAB, _PLUS, _MINUS, _DOT, _ZERO = 32, 9, 43, 45, 46, 48

_POW10_U64 = np.array([10**k for k in range(20)], dtype=np.uint64)
_POW10_F64 = np.array([10.0**k for k in range(23)], dtype=np.float64)  # exact powers


class ParseError(ValueError):
    """Some fields could not be parsed; ``rows`` are their positions (flattened); ``what`` says
    what each should have been ("a number")."""

    def __init__(self, what: str, rows: npt.NDArray[np.intp]) -> None:
        self.what = what
        self.rows = rows
        super().__init__(f"{rows.size} fields are not {what}")


@dataclass(frozen=True)
class Fields:
    """``n`` byte strings in one buffer: field ``i`` is ``buf[starts[i]:ends[i]]``.

    ``starts`` and ``ends`` may have any shape (a chunk's ``(rows, columns)`` block of fields);
    results of the parsers have that shape. ``valid`` marks non-null fields (None: all).
    """

    buf: U8
    starts: I64
    ends: I64
    valid: Bool | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.starts.shape)

    @property
    def lengths(self) -> I64:
        lengths: I64 = self.ends - self.starts
        return lengths

    def flat(self) -> Fields:
        """The same fields as 1-D arrays."""
        valid = None if self.valid is None else self.valid.ravel()
        return Fields(self.buf, self.starts.ravel(), self.ends.ravel(), valid)

    def present(self) -> Bool:
        """Fields that are neither null nor empty."""
        present: Bool = self.ends > self.starts
        return present if self.valid is None else present & self.valid

    def text(self, index: int) -> str:
        """One field as text (for error messages)."""
        s, e = int(self.starts.flat[index]), int(self.ends.flat[index])
        return bytes(self.buf[s:e]).decode("utf-8", errors="replace")

    def strip(self) -> Fields:
        """The same fields without leading and trailing spaces and tabs."""
        starts, ends, buf = self.starts.copy(), self.ends.copy(), self.buf
        for at_start in (True, False):
            while True:
                blank = starts < ends
                probe = buf[starts[blank]] if at_start else buf[ends[blank] - 1]
                blank[blank] = (probe == _SPACE) | (probe == _TAB)
                if not blank.any():
                    break
                if at_start:
                    starts[blank] += 1
                else:
                    ends[blank] -= 1
        return Fields(buf, starts, ends, self.valid)

    def split(self, separator: int) -> tuple[Fields, I64]:
        """Split every field at ``separator`` into tokens, dropping empty tokens.

        ``starts`` must be 1-D, increasing, with fields that do not overlap (a column).

        Returns:
            ``(tokens, offsets)``: the tokens of field ``i`` are
            ``tokens[offsets[i]:offsets[i + 1]]``; null fields have none.
        """
        starts, ends, buf = self.starts, self.ends, self.buf
        seps = np.flatnonzero(buf == separator)
        owner = np.searchsorted(starts, seps, side="right") - 1
        inside = owner >= 0
        inside[inside] = seps[inside] < ends[owner[inside]]
        seps = seps[inside]
        tok_starts = np.sort(np.concatenate([starts, seps + 1]))
        tok_ends = np.sort(np.concatenate([seps, ends]))
        tok_owner = np.searchsorted(starts, tok_starts, side="right") - 1
        # An empty field at position p yields the token (p, p); tok_owner then names the last
        # field starting at p, which is that field or an empty one before it: dropped anyway.
        keep = tok_ends > tok_starts
        if self.valid is not None:
            keep &= self.valid[tok_owner]
        tok_owner = tok_owner[keep]
        offsets = np.zeros(starts.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(tok_owner, minlength=starts.size), out=offsets[1:])
        return Fields(buf, tok_starts[keep], tok_ends[keep]), offsets

    # ----------------------------------------------------------------------------------------
    # Byte matrices
    # ----------------------------------------------------------------------------------------

    def _matrix(self, width: int, right: bool) -> tuple[U8, Bool]:
        """Bytes of every field in a ``(n, width)`` matrix, left- or right-aligned, zero-padded."""
        starts, ends = self.starts.ravel(), self.ends.ravel()
        cols = np.arange(width, dtype=np.int64)
        idx = (ends[:, None] - width + cols) if right else (starts[:, None] + cols)
        mask = (idx >= starts[:, None]) & (idx < ends[:, None])
        if self.buf.size == 0:
            return np.zeros(idx.shape, np.uint8), mask
        mat = self.buf[np.clip(idx, 0, self.buf.size - 1)]
        mat[~mask] = 0
        return mat, mask

    # ----------------------------------------------------------------------------------------
    # Parsers
    # ----------------------------------------------------------------------------------------

    def parse_hex(self) -> tuple[U64, Bool]:
        """Hexadecimal fields (at most 16 digits, either case) as ``uint64``.

        Returns:
            ``(values, present)``: missing fields have value 0 and ``present`` false.

        Raises:
            ParseError: a non-empty field that is not 1 to 16 hex digits.
        """
        return self._parse_unsigned(hexadecimal=True)

    def parse_uint(self) -> tuple[U64, Bool]:
        """Decimal non-negative integers below 2**64 as ``uint64``.

        Returns:
            ``(values, present)``: missing fields have value 0 and ``present`` false.

        Raises:
            ParseError: a non-empty field that is not 1 to 20 decimal digits below 2**64.
        """
        return self._parse_unsigned(hexadecimal=False)

    def _parse_unsigned(self, hexadecimal: bool) -> tuple[U64, Bool]:
        present = self.present()
        flat = present.ravel()
        values, ok = _swar_unsigned(self.buf, self.starts.ravel(), self.ends.ravel(), hexadecimal)
        bad = flat & ~ok
        if bad.any():
            what = (
                "a hexadecimal number of at most 16 digits"
                if hexadecimal
                else "a decimal integer in [0, 2**64)"
            )
            raise ParseError(what, np.flatnonzero(bad))
        values[~flat] = 0
        return values.reshape(self.shape), present

    def parse_float(self) -> tuple[F64, Bool]:
        """Decimal numbers (``-12``, ``3.5``, ``.5``, ``1e-3``, ``nan``, ``inf``) as float64.

        Plain numbers of up to 15 digits are converted in one compiled pass, integers of up to
        19 digits and decimals of up to 15 digits with exponents within ±22 in whole-array
        operations (one correctly rounded division or multiplication by an exact power of
        ten); the rare other forms (longer mantissas, huge exponents, ``nan``, ``inf``) go
        to Python's ``float``, so every value equals ``float(text)``.

        Returns:
            ``(values, present)``: missing fields are NaN with ``present`` false.

        Raises:
            ParseError: a non-empty field that is not a number.
        """
        present = self.present()
        flat_present = present.ravel()
        out, ok = self.flat()._plain()
        ok &= flat_present
        out[~ok] = np.nan
        rest = np.flatnonzero(flat_present & ~ok)
        for form in (Fields._integers, Fields._decimals):
            if rest.size:
                sub = Fields(self.buf, self.starts.ravel()[rest], self.ends.ravel()[rest])
                values, ok = form(sub)
                out[rest[ok]] = values[ok]
                rest = rest[~ok]
        if rest.size:  # nan, inf, or a malformed field: Python decides, row by row
            full = Fields(self.buf, self.starts.ravel(), self.ends.ravel())
            out[rest] = _python_floats(full, rest)
        return out.reshape(self.shape), present

    def _plain(self) -> tuple[F64, Bool]:
        """``[sign] digits [. digits]`` of at most 15 digits, the common form (ids, counts,
        prices), in one compiled pass (:mod:`._number_kernel`); ``ok`` marks them."""
        from embeddb.features._number_kernel import (
            plain_numbers,  # numba: loaded on the first parse only
        )

        values = np.empty(self.starts.size)
        ok = np.empty(self.starts.size, dtype=bool)
        plain_numbers(self.buf, self.starts.ravel(), self.ends.ravel(), values, ok)
        return values, ok

    def _integers(self) -> tuple[F64, Bool]:
        """Fields of an optional sign and at most 19 digits, exactly; ``ok`` marks them."""
        starts, ends = self.starts.ravel(), self.ends.ravel()
        first = self.buf[np.minimum(starts, self.buf.size - 1)]
        negative = (first == _MINUS) & (ends > starts)
        signed = negative | ((first == _PLUS) & (ends > starts))
        digits_from = starts + signed
        magnitude, ok = _swar_unsigned(self.buf, digits_from, ends, hexadecimal=False)
        values = magnitude.astype(np.float64)  # one correctly rounded conversion
        values[negative] = -values[negative]
        return values, ok & (ends - digits_from <= 19)

    def _decimals(self) -> tuple[F64, Bool]:
        """``[sign] digits [. digits] [e [sign] digits]``; ``ok`` marks fields of that form."""
        lengths = self.lengths
        width = int(lengths.max()) if lengths.size else 0
        mat, mask = self._matrix(width, right=False)
        col = np.arange(width)
        sign0 = (mat[:, 0] == _MINUS) | (mat[:, 0] == _PLUS) if width else np.zeros(0, bool)
        is_e = ((mat == ord("e")) | (mat == ord("E"))) & mask
        has_e = is_e.any(axis=1)
        e_pos = np.where(has_e, np.argmax(is_e, axis=1), lengths)
        in_mant = mask & (col >= sign0[:, None]) & (col < e_pos[:, None])
        in_exp = mask & (col > e_pos[:, None])
        digits = mat - np.uint8(_ZERO)
        is_digit = digits <= 9
        is_dot = (mat == _DOT) & in_mant
        mant_digit = is_digit & in_mant
        exp_sign = in_exp & (col == (e_pos + 1)[:, None]) & ((mat == _MINUS) | (mat == _PLUS))
        exp_digit = is_digit & in_exp
        ok = (
            ~(in_mant & ~mant_digit & ~is_dot).any(axis=1)
            & (is_dot.sum(axis=1) <= 1)
            & mant_digit.any(axis=1)
            & ~(in_exp & ~exp_digit & ~exp_sign).any(axis=1)
            & (~has_e | exp_digit.any(axis=1))
            & (exp_digit.sum(axis=1) <= 4)
        )
        n_digits = mant_digit.sum(axis=1)
        rank = np.cumsum(mant_digit, axis=1) - 1
        weight = np.clip(n_digits[:, None] - 1 - rank, 0, 19)
        terms = np.where(mant_digit, digits.astype(np.uint64) * _POW10_U64[weight], 0)
        mant = terms.sum(axis=1, dtype=np.uint64).astype(np.float64)  # exact below 2**53
        dot_pos = np.where(is_dot.any(axis=1), np.argmax(is_dot, axis=1), e_pos)
        frac = (mant_digit & (col > dot_pos[:, None])).sum(axis=1)
        e_rank = np.cumsum(exp_digit, axis=1) - 1
        e_weight = np.where(exp_digit, exp_digit.sum(axis=1)[:, None] - 1 - e_rank, 0)
        exponent = np.where(exp_digit, digits.astype(np.int64) * 10**e_weight, 0).sum(axis=1)
        exponent[(exp_sign & (mat == _MINUS)).any(axis=1)] *= -1
        scale = exponent - frac
        # Exact (one rounding) for mantissas of at most 15 digits; Python decides the rest.
        ok &= ((n_digits <= 15) | ((n_digits <= 19) & (scale == 0))) & (np.abs(scale) <= 22)
        scale = np.clip(scale, -22, 22)
        values = np.where(scale >= 0, mant * _POW10_F64[scale], mant / _POW10_F64[-scale])
        values[sign0 & (mat[:, 0] == _MINUS)] *= -1.0
        return values, ok


_HI = np.uint64(0x8080_8080_8080_8080)
_ONES = np.uint64(0x0101_0101_0101_0101)
_LOW_NIBBLES = np.uint64(0x0F0F_0F0F_0F0F_0F0F)
BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
_U64_MAX = np.uint64(2**64 - 1)
_LOWER = np.uint64(0x2020_2020_2020_2020)
_SHIFT4 = np.arange(0, 33, 4, dtype=np.uint64)  # 4 bits per hex digit


def u64_at(buf: U8, positions: I64) -> U64:
    """The 8 bytes of ``buf`` at each position as a little-endian ``uint64`` (zero past the end).

    One unaligned 8-byte load per position, through a strided view of the buffer.
    """
    if positions.size == 0:
        return np.zeros(0, dtype=np.uint64)
    src = buf if buf.flags.c_contiguous else np.ascontiguousarray(buf)
    if src.size < 8 or int(positions.max()) > src.size - 8:
        src = np.concatenate([src, np.zeros(8, dtype=np.uint8)])
    words = np.ndarray(shape=(src.size - 7,), dtype="<u8", buffer=src, strides=(1,))
    out: U64 = np.asarray(words[positions], dtype=np.uint64)
    return out


def _byte_range(word: U64, low: int, high: int) -> U64:
    """High bit of each byte set where the byte's low 7 bits are in ``[low, high]``."""
    with np.errstate(over="ignore"):
        at_least_low = ((word | _HI) - np.uint64(low) * _ONES) & _HI
        above_high = ((word | _HI) - np.uint64(high + 1) * _ONES) & _HI
    out: U64 = at_least_low & ~above_high
    return out


def _swar_unsigned(buf: U8, starts: I64, ends: I64, hexadecimal: bool) -> tuple[U64, Bool]:
    """Parse each field as an unsigned hex or decimal number, 8 bytes per uint64 operation.

    Returns:
        ``(values, ok)``: ``ok`` false for an empty field, a byte that is not a digit, more
        than 16 hex digits, or a decimal value of 2**64 or more.
    """
    lengths = ends - starts
    ok = (lengths > 0) & (lengths <= (16 if hexadecimal else 20))
    values = np.zeros(starts.size, dtype=np.uint64)
    longest = int(lengths.max(initial=0))
    for k in range(min((longest + 7) // 8, 3)):
        if k == 0:
            rows: slice | npt.NDArray[np.intp] = slice(None)
            word_len = np.minimum(lengths, 8)
            positions = np.where(word_len > 0, starts, 0)
        else:
            rows = np.flatnonzero(lengths > 8 * k)
            word_len = np.minimum(lengths[rows] - 8 * k, 8)
            positions = starts[rows] + 8 * k
        masks = BYTE_MASKS[word_len]
        word = u64_at(buf, positions) & masks
        needed = masks & _HI
        if hexadecimal:
            valid = _byte_range(word, 0x30, 0x39) | _byte_range(word | _LOWER, 0x61, 0x66)
            shift = _SHIFT4[word_len]
            part = _pack_hex(word) >> (np.uint64(32) - shift)
            combined = (values[rows] << shift) | part
            good = ((word & _HI) == 0) & ((valid & needed) == needed)
        else:
            valid = _byte_range(word, 0x30, 0x39)
            part = _pack_decimal(word) // _POW10_U64[8 - word_len]
            scale = _POW10_U64[word_len]
            prev = values[rows]
            with np.errstate(over="ignore"):
                combined = prev * scale + part
            good = ((word & _HI) == 0) & ((valid & needed) == needed)
            if k == 2:  # 17 to 20 digits: the only case that can pass 2**64
                good &= prev <= (_U64_MAX - part) // scale
        ok[rows] &= good
        values[rows] = combined
    return values, ok


def _pack_hex(word: U64) -> U64:
    """Eight hex digit characters (first in the lowest byte) -> their 32-bit value."""
    nibbles = (word & _LOW_NIBBLES) + np.uint64(9) * ((word >> np.uint64(6)) & _ONES)
    m16 = np.uint64(0x000F_000F_000F_000F)
    pairs = ((nibbles & m16) << np.uint64(4)) | ((nibbles >> np.uint64(8)) & m16)
    m32 = np.uint64(0x0000_00FF_0000_00FF)
    quads = ((pairs & m32) << np.uint64(8)) | ((pairs >> np.uint64(16)) & m32)
    out: U64 = ((quads & np.uint64(0xFFFF)) << np.uint64(16)) | (
        (quads >> np.uint64(32)) & np.uint64(0xFFFF)
    )
    return out


def _pack_decimal(word: U64) -> U64:
    """Eight decimal digit characters (first in the lowest byte; zero bytes count as 0 digits
    at the end) -> their value (the classic SWAR atoi)."""
    d = word & _LOW_NIBBLES
    with np.errstate(over="ignore"):
        d = d * np.uint64(10) + (d >> np.uint64(8))
        m = np.uint64(0x0000_00FF_0000_00FF)
        d = (
            (d & m) * np.uint64(100 + (1_000_000 << 32))
            + ((d >> np.uint64(16)) & m) * np.uint64(1 + (10_000 << 32))
        ) >> np.uint64(32)
    out: U64 = d
    return out


def warm_up_numbers() -> None:
    """Compile (or load from numba's cache) the plain-number kernel of :meth:`Fields.parse_float`
    for fields of a read-only buffer (raw records' and files' text), so that a model server's
    first request does not pay for it (:mod:`embeddb.serving.warmup`)."""
    Fields(
        np.frombuffer(b"-12.5" + bytes(8), np.uint8), np.zeros(1, np.int64), np.full(1, 5)
    ).parse_float()


def _python_floats(fields: Fields, rows: npt.NDArray[np.intp]) -> F64:
    out = np.empty(rows.size)
    bad = []
    for k, i in enumerate(rows.tolist()):  # only fields the vectorised paths rejected
        try:
            out[k] = float(fields.text(i))
        except ValueError:
            bad.append(i)
    if bad:
        raise ParseError("a number", np.array(bad, dtype=np.intp))
    return out
