"""JSON request bodies of the model server, bounded before they are parsed.

A body's cost is set by its shape more than by its size: a 4 MB string id, one 50 MB record,
arrays nested 100,000 deep. So every JSON body (HTTP ``POST /v1/predict``, gRPC
``records_json``, a TorchServe request) is measured first, on its bytes, by whole-array numpy
operations (:class:`JsonScan`), and refused, before ``json.loads`` builds anything, when::

    arrays and objects nest deeper than MAX_JSON_DEPTH (32)          400 INVALID_ARGUMENT
    a string (key or value, escapes included) is over max_string_bytes  413 RESOURCE_EXHAUSTED
    one record (its JSON text) is over max_record_bytes                 413 RESOURCE_EXHAUSTED

(the whole body's size, ``max_body_bytes``, is checked before it is even read). The message
names the limit, the size found and, where it can, the record's index and the field.
Defaults (:class:`BodyLimits`): 64 MiB per body, 1 MiB per record, 64 KiB per string; a body
no larger than the two smaller limits skips the scan (nothing in it can exceed them).

How the scan works: quotes preceded by an odd run of backslashes are escaped; the others pair
up into strings (their lengths are the gaps); brackets between a pair are inside a string and
dropped; the running sum of the remaining openers (+1) and closers (-1) is the depth, and a
record at depth ``L`` spans from an opener that reaches ``L`` to the next closer that leaves it.
Exact for valid JSON; for invalid JSON some numbers (``json.loads`` then says what is wrong).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from embeddb.common.arrays import I64
from embeddb.errors import ConfigError, InvalidArgumentError, ResourceExhaustedError

__all__ = [
    "MAX_JSON_DEPTH",
    "BodyLimits",
    "JsonScan",
    "check_json",
    "json_depth",
    "loads",
    "parse_json",
]

MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects a body may have. A request nests 5 levels plus
the dimensions of a non-ID input (``{"hashed_records": [{"non_id": {"x": [[...]]}}]}``)."""

_QUOTE, _BACKSLASH, _COMMA, _COLON = 0x22, 0x5C, 0x2C, 0x3A
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))


@dataclass(frozen=True)
class BodyLimits:
    """The bounds of a request body (see the module docstring).

    Attributes:
        max_body_bytes: the largest body (HTTP; gRPC messages have ``max_message_bytes``).
        max_record_bytes: the largest record, as JSON text.
        max_string_bytes: the longest JSON string (an id, a value, a key), as sent (escapes
            included; never shorter than its UTF-8 bytes once decoded).

    Raises:
        ConfigError: a limit below 1.
    """

    max_body_bytes: int = 64 << 20
    max_record_bytes: int = 1 << 20
    max_string_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_record_bytes", "max_string_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be an integer >= 1, got {value!r}")

    def check_body_size(self, length: int) -> None:
        """Raises ResourceExhaustedError: a body of ``length`` bytes is over the limit."""
        if length > self.max_body_bytes:
            raise ResourceExhaustedError(
                f"the body is {length} bytes, more than this server accepts (max_body_bytes "
                f"{self.max_body_bytes}); split the request"
            )


def json_depth(text: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``text``, without parsing it.

    ``json.loads`` recurses once per level (a RecursionError far below a body size limit:
    ``[`` * 100,000 is 100 KB), so the depth is measured first, by C-speed byte operations:
    escape pairs (``\\\\``, ``\\"``) are dropped, then every byte but quotes and brackets; of
    what remains, brackets inside strings (between two quotes) are dropped; the depth is the
    highest running count of openers minus closers. Exact for valid JSON; for invalid JSON
    some number (``json.loads`` then says what is wrong).

    Args:
        text: UTF-8 JSON (no byte of a multi-byte UTF-8 sequence is a quote or bracket).

    Returns:
        0 for a scalar, 1 for ``[1, 2]``, 2 for ``{"a": [1]}``.
    """
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    # removing two adjacent quotes (an empty string, or the end of one string and the start
    # of the next) leaves every other byte as much inside or outside a string as before
    marks = text.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in marks:  # brackets inside strings: keep those outside (even parts)
        marks = b"".join(marks.split(b'"')[::2])
    if not marks:
        return 0
    codes = np.frombuffer(marks, dtype=np.uint8)
    opens = (codes == ord("[")) | (codes == ord("{"))
    steps = np.where(opens, np.int32(1), np.int32(-1))
    return max(0, int(np.cumsum(steps, dtype=np.int32).max()))


class JsonScan:
    """Where the strings and the arrays and objects of a JSON text are, found without
    parsing it (see the module docstring).

    Attributes:
        depth: how deep arrays and objects nest (0 for a scalar).
    """

    def __init__(self, body: bytes) -> None:
        self.body = body
        arr = np.frombuffer(body, dtype=np.uint8)
        self._arr = arr
        quotes = np.flatnonzero(arr == _QUOTE)
        if quotes.size and b"\\" in body:
            quotes = quotes[~_escaped(quotes, np.flatnonzero(arr == _BACKSLASH))]
        self.quotes = quotes
        n = quotes.size // 2
        self._opens, self._closes = quotes[0 : 2 * n : 2], quotes[1 : 2 * n : 2]
        brackets = np.flatnonzero(_STEP[arr])
        outside = (np.searchsorted(quotes, brackets) & 1) == 0
        self.brackets = brackets[outside]
        self.steps = _STEP[arr[self.brackets]].astype(np.int32)
        self.depths = np.cumsum(self.steps, dtype=np.int32)  # the depth after each bracket
        self.depth = max(0, int(self.depths.max())) if self.depths.size else 0

    def longest_string(self) -> tuple[int, int]:
        """``(bytes, position of its opening quote)`` of the longest string (``(0, -1)``
        for none)."""
        if not self._opens.size:
            return 0, -1
        lengths = self._closes - self._opens - 1
        k = int(np.argmax(lengths))
        return int(lengths[k]), int(self._opens[k])

    def records(self, level: int) -> tuple[I64, I64]:
        """``(starts, ends)`` (the opening and closing bracket, inclusive) of the arrays and
        objects that open to depth ``level``, in order."""
        starts = self.brackets[(self.steps > 0) & (self.depths == level)]
        ends = self.brackets[(self.steps < 0) & (self.depths == level - 1)]
        n = min(starts.size, ends.size)  # unequal only in invalid JSON
        return starts[:n], ends[:n]

    def record_index(self, position: int, level: int) -> int:
        """The index, in its array, of the element at depth ``level`` that starts at
        ``position`` (its array's elements before it: commas at depth ``level - 1``)."""
        before = self.brackets < position
        arrays = self.brackets[before & (self.steps > 0) & (self.depths == level - 1)]
        first = int(arrays[-1]) + 1 if arrays.size else 0
        commas = first + np.flatnonzero(self._arr[first:position] == _COMMA)
        commas = commas[(np.searchsorted(self.quotes, commas) & 1) == 0]
        last = np.searchsorted(self.brackets, commas) - 1
        depth = np.where(last >= 0, self.depths[np.maximum(last, 0)], 0)
        return int(np.count_nonzero(depth == level - 1))

    def field_of(self, quote: int) -> str | None:
        """The key of the string value that opens at ``quote`` (None: not a value of an
        object, or a key itself)."""
        k = int(np.searchsorted(self._opens, quote))
        if k == 0 or k > self._closes.size:
            return None
        key_end = int(self._closes[k - 1])
        if self.body[key_end + 1 : quote].strip(b" \t\r\n") != b":":
            return None
        key = self.body[int(self._opens[k - 1]) + 1 : key_end]
        return key[:60].decode("utf-8", errors="replace")

    def check(self, limits: BodyLimits, level: int | None) -> None:
        """Refuse a body whose strings, or records at depth ``level`` (None: not known
        yet, see :meth:`check_records`), are over ``limits``.

        Raises:
            ResourceExhaustedError: naming the limit, the size, and the record (and field).
        """
        length, at = self.longest_string()
        if length > limits.max_string_bytes:
            where = self._where(at, level)
            if self.body[at + length + 2 :].lstrip(b" \t\r\n")[:1] == b":":
                what = "a key"
            else:
                key = self.field_of(at)
                what = "a string" if key is None else f"{key!r}: a string"
            raise ResourceExhaustedError(
                f"{where}{what} of {length} bytes, longer than this server accepts "
                f"(max_string_bytes {limits.max_string_bytes})"
            )
        if level is not None:
            self.check_records(limits, level)

    def check_records(self, limits: BodyLimits, level: int) -> None:
        """Refuse a record (an object or array opening to depth ``level``) over
        ``limits.max_record_bytes``.

        Raises:
            ResourceExhaustedError: naming the limit, the size and the record's index.
        """
        starts, ends = self.records(level)
        sizes = ends - starts + 1
        if not sizes.size or int(sizes.max()) <= limits.max_record_bytes:
            return
        k = int(np.argmax(sizes > limits.max_record_bytes))
        index = self.record_index(int(starts[k]), level)
        raise ResourceExhaustedError(
            f"record {index} is {int(sizes[k])} bytes of JSON, more than this server accepts "
            f"(max_record_bytes {limits.max_record_bytes})"
        )

    def _where(self, position: int, level: int | None) -> str:
        if level is None:
            return ""
        starts, ends = self.records(level)
        k = int(np.searchsorted(starts, position)) - 1
        if k < 0 or int(ends[k]) < position:
            return ""
        return f"record {self.record_index(int(starts[k]), level)}: "


def check_json(body: bytes, limits: BodyLimits, level: int | None) -> JsonScan | None:
    """Check ``body`` against :data:`MAX_JSON_DEPTH` and ``limits`` before it is parsed
    (records at depth ``level``; None: checked later with the returned scan).

    Returns:
        The scan, or None for a body too small to exceed the string and record limits (its
        depth only was measured, by :func:`json_depth`).

    Raises:
        InvalidArgumentError: nested deeper than :data:`MAX_JSON_DEPTH`.
        ResourceExhaustedError: a string or a record over ``limits``.
    """
    small = len(body) <= min(limits.max_string_bytes, limits.max_record_bytes)
    scan = None if small else JsonScan(body)
    depth = json_depth(body) if scan is None else scan.depth
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgumentError(
            f"the body nests arrays and objects {depth} deep, more than {MAX_JSON_DEPTH}"
        )
    if scan is not None:
        scan.check(limits, level)
    return scan


def loads(body: bytes) -> object:
    """The JSON document of ``body`` (after :func:`check_json`).

    Raises:
        InvalidArgumentError: not UTF-8, not JSON, ``NaN``, ``Infinity`` or ``-Infinity``,
            or an integer of more digits than Python converts.
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"the body is not UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError, _no_constant, too many digits
        raise InvalidArgumentError(f"the body is not valid JSON: {exc}") from None


def parse_json(body: bytes, limits: BodyLimits | None = None, level: int | None = None) -> object:
    """The JSON document of a request body, checked first (:func:`check_json`).

    Args:
        body: the bytes.
        limits: the bounds (default: :class:`BodyLimits`'s defaults).
        level: the depth at which records open (3 in ``{"records": [{...}]}``, 2 in
            ``[{...}]``), or None to check no record's size.

    Raises:
        InvalidArgumentError: not UTF-8, nested more than :data:`MAX_JSON_DEPTH` deep, not
            JSON, holding ``NaN``, ``Infinity`` or ``-Infinity``, or an integer of more digits
            than Python converts.
        ResourceExhaustedError: a string or a record over ``limits``.
    """
    check_json(body, limits or BodyLimits(), level)
    return loads(body)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _escaped(quotes: I64, backslashes: I64) -> np.ndarray:
    """Which quotes follow an odd run of backslashes (``\\"`` but not ``\\\\"``)."""
    if not backslashes.size:
        return np.zeros(quotes.size, dtype=bool)
    first = np.ones(backslashes.size, dtype=bool)
    first[1:] = backslashes[1:] != backslashes[:-1] + 1
    run_start = backslashes[np.maximum.accumulate(np.where(first, np.arange(first.size), 0))]
    last = np.searchsorted(backslashes, quotes) - 1  # the last backslash before each quote
    safe = np.maximum(last, 0)
    adjacent = (last >= 0) & (backslashes[safe] == quotes - 1)
    run = np.where(adjacent, quotes - run_start[safe], 0)
    escaped: np.ndarray = (run & 1) == 1
    return escaped
