"""Splitting a chunk of delimited text into rows of fields, with RFC 4180 quoting.

A chunk is whole lines, each ending in ``\\n``. Every ``\\n`` ends a line (a line break inside
a quoted field is an error, see below), so a chunk, and a byte range of a file, can start at
any line start: the streaming partition of files into byte ranges stays exact.

Unquoted text (the fast path, taken whenever a chunk holds no quote byte) finds every
delimiter and newline in one pass and reshapes them into a ``(columns, rows)`` block of field
offsets. Quoted text (``quote`` given and present in the chunk) follows RFC 4180, as pandas,
R and spreadsheets write it::

    id,"name","note"
    7,"Smith, J.","a ""quoted"" word"    -> 7 | Smith, J. | a "quoted" word

A field is quoted when its first byte is the quote (after blanks, with ``strip``); inside it
the delimiter is text and a doubled quote is one quote; the closing quote ends the field (only
blanks may follow it, with ``strip``). It is vectorised over the quote positions of the chunk:

* a delimiter is inside quotes when an odd number of quotes precede it (one binary search of
  the delimiters among the quotes; every line holds an even number of quotes);
* by their index ``k`` among the quotes, even quotes open a quoted part and odd ones close it,
  unless an odd quote is directly followed by the next (a doubled quote); an opening quote
  must follow a delimiter or a line start, a closing one must precede a delimiter or a line
  end (checked by looking at one byte each);
* a quoted field's offsets move inside its quotes; only fields holding doubled quotes are
  copied (without the first quote of each pair) to the end of the buffer.

Errors (:class:`QuoteError`, with the line): a line with an odd number of quotes (a quoted
field that does not close on its line: **line breaks inside quoted fields are not supported**),
a quote inside an unquoted field (``5'10"``: set ``quote`` to None to read quotes as text), and
text after a closing quote.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embeddb.common.arrays import I64, U8, Bool
from embeddb.features._fields import Fields

__all__ = ["Lines", "QuoteError", "blank_lines_and_comments", "split_lines", "split_record"]

_NL, _CR, _SPACE, _TAB = 10, 13, 32, 9
_UNBALANCED = (
    "unbalanced quotes: a quoted field must close on the line it starts on "
    "(line breaks inside quoted fields are not supported)"
)


class QuoteError(ValueError):
    """A line whose quoting is malformed; ``line`` is its 0-based index in the chunk."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(message)


@dataclass(frozen=True)
class Lines:
    """A chunk of text split into rows of fields (see :func:`split_lines`).

    Attributes:
        buf: the chunk's bytes, then the unquoted copies of fields that held doubled quotes,
            then 8 zero bytes (so 8-byte loads never run past the end).
        starts, ends: ``(columns, rows)`` field offsets, one contiguous array per column.
        rows: the 0-based line index (within the chunk) of each row.
        line_count: lines in the chunk, kept or not.
        bad: ``(line index, field count)`` of each kept line with the wrong number of fields
            (then ``starts`` and ``ends`` are empty).
        line_starts, line_ends: each row's line in ``buf`` (without its line end), as read.
    """

    buf: U8
    starts: I64
    ends: I64
    rows: I64
    line_count: int
    bad: I64
    line_starts: I64
    line_ends: I64


def blank_lines_and_comments(
    buf: U8, line_starts: I64, line_ends: I64, comment: int | None
) -> Bool:
    """Lines to keep: not empty and not starting with ``comment``."""
    keep: Bool = line_ends > line_starts
    if comment is not None and buf.size:
        keep &= buf[np.minimum(line_starts, buf.size - 1)] != comment
    return keep


def split_lines(
    chunk: bytes,
    delimiter: int,
    columns: int,
    comment: int | None,
    quote: int | None = None,
    *,
    strip: bool = False,
) -> Lines:
    """Split a chunk of complete lines (each ending in ``\\n``) into fields.

    Empty lines, lines starting with ``comment`` and a ``\\r`` before each ``\\n`` are dropped.

    Args:
        chunk: whole lines.
        delimiter: the byte between fields.
        columns: fields per line.
        comment: lines starting with this byte are skipped (quotes in them are text).
        quote: the quote byte of RFC 4180 quoted fields; None: quotes are ordinary text.
        strip: blanks may stand around a quoted field (they are stripped later).

    Raises:
        QuoteError: a line whose quotes are malformed (see the module docstring), unless an
            earlier line has the wrong number of fields (``bad``).
    """
    buf = np.frombuffer(chunk + bytes(8), dtype=np.uint8)
    text = buf[:-8]
    is_nl = text == _NL
    marks = np.flatnonzero((text == delimiter) | is_nl)
    mark_is_nl = is_nl[marks]
    nl = marks[mark_is_nl]
    line_starts = np.empty_like(nl)
    if nl.size:
        line_starts[0] = 0
        line_starts[1:] = nl[:-1] + 1
    line_ends = nl - ((nl > line_starts) & (buf[np.maximum(nl - 1, 0)] == _CR))
    keep = blank_lines_and_comments(buf, line_starts, line_ends, comment)
    if quote is None or chunk.find(bytes((quote,))) < 0:
        return _fields(buf, marks, mark_is_nl, line_starts, line_ends, keep, columns)
    quotes = np.flatnonzero(text == quote)
    skipped = np.flatnonzero(~keep)
    if skipped.size:  # comment lines: their quotes are text
        quotes = _outside(quotes, line_starts[skipped], nl[skipped])
    inside = np.searchsorted(quotes, marks) % 2 == 1
    odd_line = inside[mark_is_nl]  # true from the first line with an odd number of quotes
    outside = ~inside | mark_is_nl  # every newline ends a line
    marks, mark_is_nl = marks[outside], mark_is_nl[outside]
    lines = _fields(buf, marks, mark_is_nl, line_starts, line_ends, keep, columns)
    # The first problem of the chunk: a line with the wrong number of fields (returned in
    # ``bad``), a line with an odd number of quotes, or a misplaced quote before that line.
    problems: list[tuple[int, str]] = []
    if lines.bad.size:
        problems.append((int(lines.bad[0, 0]), ""))
    if odd_line.any():
        first_odd = int(np.argmax(odd_line))
        problems.append((first_odd, _UNBALANCED))
        quotes = quotes[: np.searchsorted(quotes, line_starts[first_odd])]
    roles = _roles(quotes)
    misplaced = _check_quotes(buf, quotes, roles, delimiter, strip)
    if misplaced is not None:
        at, what = misplaced
        text_of = f"{what} {_field_text(buf, marks, at)!r}{_HINTS[what]}"
        problems.append((int(np.searchsorted(nl, at)), text_of))
    if problems:
        line, message = min(problems, key=lambda p: (p[0], not p[1]))  # quotes explain counts
        if message:
            raise QuoteError(line, message)
        return lines
    return _unquote(lines, quotes[roles[2]], quote, strip) if quotes.size else lines


def split_record(
    line: bytes, delimiter: int, quote: int | None, *, strip: bool = False
) -> tuple[str, ...]:
    """The fields of one line (a header), unquoted, as text (not stripped).

    Raises:
        QuoteError: malformed quoting (``line`` 0).
    """
    data = line.rstrip(b"\r\n") + b"\n"
    text = np.frombuffer(data, dtype=np.uint8)
    delims = np.flatnonzero(text == delimiter)
    if quote is not None:
        quotes = np.flatnonzero(text == quote)
        delims = delims[np.searchsorted(quotes, delims) % 2 == 0]
    lines = split_lines(data, delimiter, delims.size + 1, None, quote, strip=strip)
    return tuple(
        bytes(lines.buf[s:e]).decode("utf-8", errors="replace")
        for s, e in zip(lines.starts[:, 0].tolist(), lines.ends[:, 0].tolist(), strict=True)
    )


# --------------------------------------------------------------------------------------------


def _fields(
    buf: U8,
    marks: I64,
    mark_is_nl: Bool,
    line_starts: I64,
    line_ends: I64,
    keep: Bool,
    columns: int,
) -> Lines:
    """The ``(columns, rows)`` field offsets of the kept lines, from the positions of the
    field-ending marks (delimiters and newlines, in order)."""
    nl_count = line_starts.size
    rows = np.flatnonzero(keep)
    fast = (
        rows.size == nl_count
        and marks.size == nl_count * columns
        and bool(mark_is_nl[columns - 1 :: columns].all())
    )
    spans = (line_starts, line_ends) if rows.size == nl_count else (
        line_starts[rows], line_ends[rows]
    )  # fmt: skip
    if not fast:
        line_of_mark: I64 = np.cumsum(mark_is_nl) - mark_is_nl
        delims_per_line = np.bincount(line_of_mark[~mark_is_nl], minlength=nl_count)
        wrong = keep & (delims_per_line != columns - 1)
        if wrong.any():
            bad_lines = np.flatnonzero(wrong)
            empty = np.zeros((columns, 0), dtype=np.int64)
            bad = np.stack([bad_lines, delims_per_line[bad_lines] + 1], axis=1)
            return Lines(buf, empty, empty, rows, nl_count, bad, *spans)
        marks = marks[keep[line_of_mark]]
    ends = np.empty((columns, rows.size), dtype=np.int64)
    ends[:] = marks.reshape(rows.size, columns).T
    ends[-1] = spans[1]
    starts = np.empty_like(ends)
    starts[0] = spans[0]
    starts[1:] = ends[:-1] + 1
    return Lines(buf, starts, ends, rows, nl_count, np.zeros((0, 2), dtype=np.int64), *spans)


def _outside(quotes: I64, starts: I64, ends: I64) -> I64:
    """``quotes`` without those in the ranges ``[starts[i], ends[i])`` (sorted, disjoint)."""
    lo, hi = np.searchsorted(quotes, starts), np.searchsorted(quotes, ends)
    if not (hi > lo).any():
        return quotes
    depth = np.zeros(quotes.size + 1, dtype=np.int64)
    np.add.at(depth, lo, 1)
    np.add.at(depth, hi, -1)
    out: I64 = quotes[np.cumsum(depth[:-1]) == 0]
    return out


_OPEN = "a quote inside the unquoted field"
_CLOSE = "text after the closing quote of the field"
_HINTS = {
    _OPEN: (
        " (RFC 4180: quote the whole field and double the quotes inside it, or set "
        "quote: false to read quotes as text)"
    ),
    _CLOSE: "",
}


def _roles(quotes: I64) -> tuple[Bool, Bool, Bool]:
    """``(opening, closing, first of a doubled pair)`` of each quote, by its index ``k``:
    even quotes open, odd ones close, unless directly followed by the next quote."""
    odd = np.zeros(quotes.size, dtype=bool)
    odd[1::2] = True
    pair_first = np.zeros(quotes.size, dtype=bool)
    pair_first[:-1] = odd[:-1] & (quotes[1:] == quotes[:-1] + 1)
    pair_second = np.zeros(quotes.size, dtype=bool)
    pair_second[1:] = pair_first[:-1]
    return ~odd & ~pair_second, odd & ~pair_first, pair_first


def _check_quotes(
    buf: U8, quotes: I64, roles: tuple[Bool, Bool, Bool], delimiter: int, strip: bool
) -> tuple[int, str] | None:
    """``(position, problem)`` of the first quote that neither opens a field (after a
    delimiter or line start) nor closes one (before a delimiter or line end), else None.

    A delimiter next to such a quote has an even number of quotes before it: it is a real
    field boundary, not one inside quotes.
    """
    opening, closing, _ = roles
    blanks = tuple(b for b in (_SPACE, _TAB) if b != delimiter) if strip else ()
    before = _skip(buf, quotes[opening] - 1, -1, blanks)
    prev = buf[np.maximum(before, 0)]
    bad_open = (before >= 0) & (prev != delimiter) & (prev != _NL)
    after = _skip(buf, quotes[closing] + 1, 1, blanks)
    nxt, next2 = buf[after], buf[np.minimum(after + 1, buf.size - 1)]
    bad_close = (nxt != delimiter) & (nxt != _NL) & ~((nxt == _CR) & (next2 == _NL))
    found = [
        (int(quotes[which][np.argmax(bad)]), problem)
        for which, bad, problem in ((opening, bad_open, _OPEN), (closing, bad_close, _CLOSE))
        if bad.any()
    ]
    return min(found) if found else None


def _skip(buf: U8, at: I64, step: int, blanks: tuple[int, ...]) -> I64:
    """Positions moved by ``step`` past runs of ``blanks`` (a few whole-array passes)."""
    if not blanks:
        return at
    at = at.copy()
    while True:
        inside = (at >= 0) & (at < buf.size)
        probe = buf[np.clip(at, 0, buf.size - 1)]
        move = inside & np.isin(probe, blanks)
        if not move.any():
            break
        at[move] += step
    return at


def _field_text(buf: U8, marks: I64, at: int) -> str:
    """The raw field around byte ``at`` (for an error message)."""
    i = int(np.searchsorted(marks, at))
    start = int(marks[i - 1]) + 1 if i > 0 else 0
    end = int(marks[i]) if i < marks.size else buf.size - 8
    return bytes(buf[start:end]).rstrip(b"\r").decode("utf-8", errors="replace")


def _unquote(lines: Lines, doubled: I64, quote: int, strip: bool) -> Lines:
    """``lines`` (checked) with quoted fields unquoted (see the module docstring);
    ``doubled``: the first quote of each doubled pair."""
    buf, starts, ends = lines.buf, lines.starts, lines.ends
    if strip:
        trimmed = Fields(buf, starts, ends).strip()
        first, last = trimmed.starts, trimmed.ends
    else:
        first, last = starts, ends
    quoted = (last > first) & (buf[np.minimum(first, buf.size - 1)] == quote)
    starts = np.where(quoted, first + 1, starts)
    ends = np.where(quoted, last - 1, ends)
    if doubled.size:
        buf, starts, ends = _undouble(buf, starts, ends, doubled)
    return Lines(
        buf, starts, ends, lines.rows, lines.line_count, lines.bad, lines.line_starts,
        lines.line_ends,
    )  # fmt: skip


def _undouble(buf: U8, starts: I64, ends: I64, dropped: I64) -> tuple[U8, I64, I64]:
    """Copy the fields holding the quotes ``dropped`` (the first of each doubled pair), without
    them, to the end of the buffer, and point the fields at their copies."""
    columns = starts.shape[0]
    flat_starts, flat_ends = starts.T.ravel(), ends.T.ravel()  # fields in byte order
    owner = np.searchsorted(flat_starts, dropped, side="right") - 1
    fields = np.unique(owner)
    lo, hi = flat_starts[fields], flat_ends[fields]
    lengths = hi - lo
    offsets = np.zeros(fields.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    positions = np.repeat(lo - offsets[:-1], lengths) + np.arange(offsets[-1])
    keep = np.ones(positions.size, dtype=bool)
    keep[np.searchsorted(positions, dropped)] = False
    copied = buf[positions[keep]]
    new_lengths = lengths - np.bincount(np.searchsorted(fields, owner), minlength=fields.size)
    new_ends = buf.size + np.cumsum(new_lengths)
    rows, cols = np.divmod(fields, columns)
    starts, ends = starts.copy(), ends.copy()
    starts[cols, rows] = new_ends - new_lengths
    ends[cols, rows] = new_ends
    return np.concatenate([buf, copied, np.zeros(8, np.uint8)]), starts, ends
