"""Field validators shared by the config dataclasses and the YAML parser.

Each checks one value, returns it normalised, or raises ``ConfigError(key, ...)``.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import math
import numbers
import re
from collections.abc import Collection
from typing import TypeVar

from embeddb.errors import ConfigError

_KindT = TypeVar("_KindT", bound=enum.Enum)

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_MAX_PREFIX_BITS = 32
_MAX_STRIPES = 64
# routing.hash_stack multiplies 32-bit hashes by the bucket count in uint64 arithmetic.
_MAX_HASH_STACK_SIZE = 1 << 32
_ADAM_DEFAULT_EPS = 1e-8
_TEMPLATE_TABLE = "defaults"  # name of the placeholder table that holds the parsed `defaults:`


# --------------------------------------------------------------------------------------------
# Field validators: each checks one value, returns it normalised, or raises ConfigError(key, ...)
# --------------------------------------------------------------------------------------------


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _as_int(value: object, key: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(key, f"must be an integer, got {_describe(value)}")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(key, f"must be an integer {bounds}, got {number}")
    return number


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def _as_float(
    value: object,
    key: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(key, f"must be a number, got {_describe(value)}")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        bounds = _interval(low, high, low_open, high_open)
        raise ConfigError(key, f"must be a finite number{bounds}, got {number!r}")
    return number


def _as_bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {_describe(value)}")
    return value


def _as_name(value: object, key: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in {".", ".."}:
        raise ConfigError(
            key,
            f"{what} must be a non-empty string of letters, digits, '_', '.' and '-' "
            f"(not '.' or '..'), got {value!r}",
        )
    return value


def _as_kind(kind_type: type[_KindT], value: object, key: str, what: str) -> _KindT:
    if isinstance(value, kind_type):
        return value
    choices = [str(member.value) for member in kind_type]
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return kind_type(value)
    hint = _did_you_mean(str(value), choices)
    raise ConfigError(key, f"unknown {what} {value!r}{hint}; expected one of: {', '.join(choices)}")


def _set(obj: object, name: str, value: object) -> None:
    """Store a normalised value on a frozen dataclass during ``__post_init__``."""
    object.__setattr__(obj, name, value)
