"""Validators shared by the config dataclasses and the YAML parser.

Each field validator checks one value, returns it normalised, or raises
``ConfigError(key, ...)``; the feature-group rules check ``feature_groups`` against the features
the same way whether the groups come from YAML (:mod:`embeddb.config.schema`) or from code
(:class:`~embeddb.config.model.EmbeddingConfig`). The module is internal to
:mod:`embeddb.config`; its names are public so that both sides import them as such.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import math
import numbers
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

from embeddb.errors import ConfigError

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_PREFIX_BITS",
    "KindT",
    "as_bool",
    "as_bytes",
    "as_float",
    "as_int",
    "as_kind",
    "as_name",
    "describe",
    "detail",
    "did_you_mean",
    "group_indices",
    "group_of",
    "set_field",
]

KindT = TypeVar("KindT", bound=enum.Enum)

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
# Names become file and directory names (snapshot files ``<table>.rows``, export directories,
# RocksDB column families ``table.<table>``): far below the usual 255-byte limit of one name.
MAX_NAME_CHARS = 128
MAX_PREFIX_BITS = 32


# --------------------------------------------------------------------------------------------
# Field validators: each checks one value, returns it normalised, or raises ConfigError(key, ...)
# --------------------------------------------------------------------------------------------


def describe(value: object) -> str:
    """``value`` with its type, for error messages: ``int 3``, ``str 'x'``."""
    return f"{type(value).__name__} {value!r}"


def did_you_mean(word: str, choices: Collection[str]) -> str:
    """A `` (did you mean 'x'?)`` hint naming the choice closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def detail(exc: ConfigError) -> str:
    """The message of ``exc`` without its ``"key: "`` prefix."""
    return str(exc).removeprefix(f"{exc.key}: ") if exc.key else str(exc)


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def as_bytes(value: object, key: str, *, minimum: int = 1) -> int:
    """``value`` as a byte count >= ``minimum``: an integer, or a string of a number and a
    unit (``"4GiB"``, ``"512 MiB"``, ``"1.5GB"``; B, KB/MB/GB/TB are powers of 1000,
    KiB/MiB/GiB/TiB of 1024; case-insensitive), rounded down to whole bytes."""
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _BYTE_UNITS:
            raise ConfigError(
                key,
                f"must be a byte count: an integer or a number with a unit (B, KB, MB, GB, TB, "
                f"KiB, MiB, GiB, TiB) such as 4GiB, got {value!r}",
            )
        number = float(match.group(1)) * _BYTE_UNITS[unit]
        if not math.isfinite(number):
            raise ConfigError(key, f"must be a finite byte count, got {value!r}")
        value = int(number)
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            key,
            f"must be a byte count (an integer or a string such as 4GiB), got {describe(value)}",
        )
    count = int(value)
    if count < minimum:
        raise ConfigError(key, f"must be at least {minimum} bytes, got {count}")
    return count


def as_int(value: object, key: str, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (a bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(key, f"must be an integer, got {describe(value)}")
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


def as_float(
    value: object,
    key: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite ``float`` within the given (open or closed) bounds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(key, f"must be a number, got {describe(value)}")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        bounds = _interval(low, high, low_open, high_open)
        raise ConfigError(key, f"must be a finite number{bounds}, got {number!r}")
    return number


def as_bool(value: object, key: str) -> bool:
    """``value``, which must be a ``bool``."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {describe(value)}")
    return value


def as_name(value: object, key: str, what: str) -> str:
    """``value`` as a name: a non-empty string of ``[A-Za-z0-9_.-]``, not ``.`` or ``..``, of
    at most :data:`MAX_NAME_CHARS` characters."""
    if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
        raise ConfigError(
            key,
            f"{what} must be at most {MAX_NAME_CHARS} characters, got {len(value)} "
            f"({value[:40]!r}...)",
        )
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in {".", ".."}:
        raise ConfigError(
            key,
            f"{what} must be a non-empty string of letters, digits, '_', '.' and '-' "
            f"(not '.' or '..'), got {value!r}",
        )
    return value


def as_kind(kind_type: type[KindT], value: object, key: str, what: str) -> KindT:
    """``value`` as a member of the enum ``kind_type`` (a member or its string value)."""
    if isinstance(value, kind_type):
        return value
    choices = [str(member.value) for member in kind_type]
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return kind_type(value)
    hint = did_you_mean(str(value), choices)
    raise ConfigError(key, f"unknown {what} {value!r}{hint}; expected one of: {', '.join(choices)}")


def set_field(obj: object, name: str, value: object) -> None:
    """Store a normalised value on a frozen dataclass during ``__post_init__``."""
    object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------------------------
# Feature-group rules shared by EmbeddingConfig and the parser
# --------------------------------------------------------------------------------------------


def group_of(feature_groups: Mapping[Any, Any], features: Collection[str]) -> dict[str, str]:
    """Validate ``feature_groups`` against the feature names; return feature -> its group."""
    groups: dict[str, str] = {}
    for group, members in feature_groups.items():
        as_name(group, "feature_groups", "feature group name")
        path = f"feature_groups.{group}"
        if group in features:
            raise ConfigError(path, f"{group!r} is both a feature group and a feature; rename one")
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
            raise ConfigError(path, f"must be a list of feature names, got {describe(members)}")
        if not members:
            raise ConfigError(path, "empty group: list at least one feature")
        for member in members:
            if not isinstance(member, str) or member not in features:
                hint = did_you_mean(str(member), features)
                raise ConfigError(path, f"unknown feature {member!r}{hint}")
            if member in groups:
                raise ConfigError(
                    path, f"feature {member!r} is already in group {groups[member]!r}"
                )
            groups[member] = group
    return groups


def group_indices(
    groups: Collection[str],
    group_by_feature: Mapping[str, str],
    features: Collection[str],
    prefix_bits: int,
) -> dict[str, int]:
    """Number the groups: ``groups`` in order, then the ungrouped features in order.

    Args:
        groups: the ``feature_groups`` names, in file order.
        group_by_feature: what :func:`group_of` returned.
        features: every feature name, in file order.
        prefix_bits: ``feature_index_prefix_bit``; 0 puts no limit on the number of groups.
    """
    names = [*groups, *(name for name in features if name not in group_by_feature)]
    if prefix_bits and len(names) > 1 << prefix_bits:
        raise ConfigError(
            "feature_index_prefix_bit",
            f"{len(names)} feature groups ({len(groups)} in feature_groups, "
            f"{len(names) - len(groups)} ungrouped features) do not fit in {prefix_bits} prefix "
            f"bits (at most {1 << prefix_bits})",
        )
    return {name: index for index, name in enumerate(names)}
