"""Timestamps of text fields or numbers, and the calendar parts derived columns take of them.

Everything is whole-array: an ISO-8601 field is read from a ``(n, width)`` byte matrix at
fixed positions (date, time, seconds), its fraction and offset found by a per-row position;
days since 1970 come from the civil date by the usual closed formula (and back), so no Python
code runs per row::

    "2017-11-07 09:30:38"   -> 1510047038 s  -> hour 9, weekday 1 (Tuesday)
    "2017-11-07T09:30+02:00" -> 1510039800 s  -> hour 7 (UTC)
    1510047038 (a number)    -> itself (seconds; or milliseconds, floored)
"""

from __future__ import annotations

import numpy as np

from embeddb.common.arrays import F64, I64, U8, Bool
from embeddb.features._fields import Fields, ParseError
from embeddb.features.spec import DerivedColumn, TimePart, TimeUnit

__all__ = ["calendar_part", "decimal_fields", "parse_timestamps", "seconds_of_numbers"]

_WHAT = "a timestamp (unix time or ISO-8601 such as 2017-11-07 09:30:38)"
_MAX_WIDTH = 40
_DIGIT = np.uint8(ord("0"))
_LIMIT = 2.0**53  # numbers beyond are not exact seconds
_FIRST, _END = -62135596800, 253402300800  # 0001-01-01 and 10000-01-01 in unix seconds


def parse_timestamps(fields: Fields, unit: TimeUnit) -> tuple[I64, Bool]:
    """Seconds since 1970 (UTC) of every field: ISO-8601 text, or a number in ``unit``.

    Returns:
        ``(seconds, present)``: missing fields are 0 with ``present`` false.

    Raises:
        ParseError: a non-empty field that is neither (``rows`` flattened, as the parsers of
            :class:`Fields` report them).
    """
    flat = fields.flat()
    present = flat.present()
    starts, lengths = flat.starts, flat.lengths
    fourth = flat.buf[np.clip(starts + 4, 0, max(flat.buf.size - 1, 0))]
    iso = present & (lengths >= 10) & (fourth == ord("-"))
    out = np.zeros(starts.size, dtype=np.int64)
    rows = np.flatnonzero(iso)
    if rows.size:
        seconds, ok = _iso(Fields(flat.buf, starts[rows], flat.ends[rows]))
        if not ok.all():
            raise ParseError(_WHAT, rows[~ok])
        out[rows] = seconds
    rows = np.flatnonzero(present & ~iso)
    if rows.size:
        try:
            values, _ = Fields(flat.buf, starts[rows], flat.ends[rows]).parse_float()
        except ParseError as exc:
            raise ParseError(_WHAT, rows[exc.rows]) from None
        seconds, ok = seconds_of_numbers(values, unit)
        if not ok.all():
            raise ParseError(_WHAT, rows[~ok])
        out[rows] = seconds
    return out, present


def seconds_of_numbers(values: F64, unit: TimeUnit) -> tuple[I64, Bool]:
    """Unix times in ``unit`` as whole seconds (floored); ``ok`` false for NaN, infinities,
    magnitudes of 2**53 or more and instants outside the years 1 to 9999."""
    ok: Bool = np.isfinite(values) & (np.abs(values) < _LIMIT)
    safe = np.where(ok, values, 0.0)
    if unit is TimeUnit.MILLISECONDS:
        safe = np.floor_divide(safe, 1000.0)
    seconds = np.floor(safe).astype(np.int64)
    ok &= (seconds >= _FIRST) & (seconds < _END)
    return np.where(ok, seconds, 0), ok


def calendar_part(seconds: I64, column: DerivedColumn) -> I64:
    """``column.extract`` of the instants ``seconds`` shifted by ``column.utc_offset`` hours."""
    local = seconds + round(column.utc_offset * 3600)
    part = column.extract
    if part is TimePart.HOUR:
        out: I64 = (local // 3600) % 24
        return out
    days = local // 86400
    if part is TimePart.WEEKDAY:
        out = (days + 3) % 7  # 1970-01-01 was a Thursday (Monday = 0)
        return out
    year, month, day = _civil(days)
    return {TimePart.DAY: day, TimePart.MONTH: month, TimePart.YEAR: year}[part]


def decimal_fields(values: I64, present: Bool) -> Fields:
    """Non-negative integers as the decimal text of their own buffer; missing where not
    ``present`` (empty fields)."""
    values = np.where(present, values, 0)
    width = max(len(str(int(values.max(initial=0)))), 1)
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = ((values[:, None] // powers) % 10).astype(np.uint8) + _DIGIT
    count = np.ones(values.size, dtype=np.int64)
    for k in range(1, width):  # the number of digits of each value
        count += values >= 10**k
    buf: U8 = np.concatenate([digits.ravel(), np.zeros(8, np.uint8)])
    ends = (np.arange(values.size, dtype=np.int64) + 1) * width
    starts = np.where(present, ends - count, ends)
    return Fields(buf, starts, ends)


# --------------------------------------------------------------------------------------------


def _iso(fields: Fields) -> tuple[I64, Bool]:
    """ISO-8601 date or date-time fields (see :class:`~.spec.DerivedColumn`) as UTC seconds."""
    lengths = fields.lengths
    ok = lengths <= _MAX_WIDTH
    col = np.arange(max(int(lengths.max()), 20) + 8)  # zero bytes past each field's end
    idx = np.minimum(fields.starts[:, None] + col, fields.buf.size - 1)
    mat: U8 = np.where(col < np.minimum(lengths, _MAX_WIDTH)[:, None], fields.buf[idx], 0)
    n = mat.shape[0]
    digit = (mat >= _DIGIT) & (mat <= _DIGIT + 9)
    value = mat.astype(np.int64) - int(_DIGIT)

    def number(*cols: int) -> I64:
        out = np.zeros(n, dtype=np.int64)
        for c in cols:
            out = out * 10 + value[:, c]
        return out

    def digits(*cols: int) -> Bool:
        out: Bool = digit[:, list(cols)].all(axis=1)
        return out

    ok &= digits(0, 1, 2, 3, 5, 6, 8, 9) & (mat[:, 4] == ord("-")) & (mat[:, 7] == ord("-"))
    year, month, day = number(0, 1, 2, 3), number(5, 6), number(8, 9)
    has_time = lengths > 10
    sep = mat[:, 10]
    ok &= ~has_time | (
        ((sep == ord("T")) | (sep == ord("t")) | (sep == ord(" ")))
        & digits(11, 12, 14, 15)
        & (mat[:, 13] == ord(":"))
    )
    hour = np.where(has_time, number(11, 12), 0)
    minute = np.where(has_time, number(14, 15), 0)
    has_seconds = has_time & (mat[:, 16] == ord(":"))
    ok &= ~has_seconds | digits(17, 18)
    second = np.where(has_seconds, number(17, 18), 0)
    at = np.where(has_seconds, 19, np.where(has_time, 16, 10))
    rows = np.arange(n)
    # a fraction of a second: "." or "," and digits, ignored (seconds are floored)
    fraction = has_seconds & ((mat[rows, at] == ord(".")) | (mat[rows, at] == ord(",")))
    after = ~digit & (col[None, :] > at[:, None])
    end_of_fraction = np.argmax(after, axis=1)
    ok &= ~fraction | (end_of_fraction > at + 1)
    at = np.where(fraction, end_of_fraction, at)
    # the offset: none, "Z", "+HH", "+HHMM" or "+HH:MM"
    zone = mat[rows, at]
    utc = (zone == ord("Z")) | (zone == ord("z"))
    signed = (zone == ord("+")) | (zone == ord("-"))
    rest = lengths - at
    colon = mat[rows, np.minimum(at + 3, mat.shape[1] - 1)] == ord(":")
    hh = _pair(mat, digit, at + 1)
    mm_at = np.where(colon, at + 4, at + 3)
    mm = _pair(mat, digit, mm_at)
    offset_ok = hh[1] & (
        (rest == 3) | ((rest == 5) & ~colon & mm[1]) | ((rest == 6) & colon & mm[1])
    )
    offset = np.where(signed & offset_ok, hh[0] * 60 + np.where(rest > 3, mm[0], 0), 0)
    offset = np.where(zone == ord("-"), -offset, offset)
    ok &= (rest == 0) | (utc & (rest == 1)) | (signed & offset_ok)
    ok &= (month >= 1) & (month <= 12) & (day >= 1) & (day <= _month_days(year, month))
    ok &= (hour <= 23) & (minute <= 59) & (second <= 60) & (np.abs(offset) < 24 * 60)
    days = _days(year, month, day)
    seconds: I64 = days * 86400 + hour * 3600 + minute * 60 + second - offset * 60
    return seconds, ok


def _pair(mat: U8, digit: Bool, at: I64) -> tuple[I64, Bool]:
    """The two-digit number at column ``at`` of every row, and whether both are digits."""
    rows = np.arange(mat.shape[0])
    last = mat.shape[1] - 1
    a, b = np.minimum(at, last), np.minimum(at + 1, last)
    value = (mat[rows, a].astype(np.int64) - int(_DIGIT)) * 10 + mat[rows, b] - int(_DIGIT)
    ok: Bool = digit[rows, a] & digit[rows, b]
    return value, ok


def _month_days(year: I64, month: I64) -> I64:
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    table = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
    out: I64 = table[np.clip(month, 1, 12) - 1] + ((month == 2) & leap)
    return out


def _days(year: I64, month: I64, day: I64) -> I64:
    """Days since 1970-01-01 of proleptic Gregorian dates (Howard Hinnant's days_from_civil)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    out: I64 = era * 146097 + doe - 719468
    return out


def _civil(days: I64) -> tuple[I64, I64, I64]:
    """``(year, month, day)`` of days since 1970-01-01 (civil_from_days)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    return year, month, day
