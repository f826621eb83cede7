"""The compiled parser of plain numbers for :meth:`embeddb.features._fields.Fields.parse_float`.

Apart from :mod:`._fields` so that importing the data package does not load numba: the kernel
is imported on the first float parse (as :mod:`._hash_kernel` on the first hash).

One pass over the bytes of every field. It takes only ``[sign] digits [. digits]`` with 1 to 15
digits in all (so the integer mantissa is exact in a float64) and computes ``mantissa / 10**k``
(``k`` <= 15: an exact power of ten), one correctly rounded division: the value equals
Python's ``float(text)``. Any other field (an exponent, more digits, blanks, ``nan``) is left
to the slower exact paths (``ok`` false).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["plain_numbers"]

_POW10 = np.array([10.0**k for k in range(16)], dtype=np.float64)  # exact powers


@numba.njit(nogil=True, cache=True)
def plain_numbers(buf, starts, ends, values, ok):  # type: ignore[no-untyped-def]
    """``values[i]``, ``ok[i]``: the number in ``buf[starts[i]:ends[i]]`` when plain (see the
    module docstring); ``ok[i]`` false (``values[i]`` undefined) otherwise."""
    for i in range(starts.size):
        p = starts[i]
        end = ends[i]
        negative = False
        if p < end and (buf[p] == 45 or buf[p] == 43):  # - +
            negative = buf[p] == 45
            p += 1
        mantissa = np.int64(0)
        digits = 0
        fraction = 0
        dot = False
        good = True
        while p < end:
            c = buf[p]
            if 48 <= c <= 57:
                mantissa = mantissa * 10 + (c - 48)
                digits += 1
                if dot:
                    fraction += 1
                if digits > 15:
                    good = False
                    break
            elif c == 46 and not dot:  # .
                dot = True
            else:
                good = False
                break
            p += 1
        if good and digits > 0:
            value = np.float64(mantissa) / _POW10[fraction]
            values[i] = -value if negative else value
            ok[i] = True
        else:
            ok[i] = False
