"""Key paths of the ``dataset:`` node for error messages, and the checks of its scalar values.

Every check raises a :class:`~embeddb.errors.ConfigError` at the key path
(``dataset.numeric[1].transform``) whose message ends with where that key is in the job file
(``(job.yaml:14)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from embeddb.errors import ConfigError

__all__ = ["Keys", "as_bool", "as_int", "as_list", "as_string", "message_of"]


@dataclass(frozen=True)
class Keys:
    """Key paths for error messages and where they are in the job file."""

    where: Callable[[str], str] = field(default=lambda key: "", compare=False)
    legacy: bool = False  # a preset given by the old top-level keys (dataset, data_dir, ...)

    def path(self, key: str) -> str:
        """The key path of ``dataset.KEY...`` (legacy presets: the old top-level keys)."""
        full = f"dataset.{key}" if key else "dataset"
        if self.legacy:
            head = key.split(".", 1)[0].split("[", 1)[0]
            if head in ("data_dir", "train_rows", "split"):
                return key
            if head in ("preset", ""):
                return "dataset"
        return full

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError at ``dataset.KEY`` whose message ends with the key's file:line."""
        path = self.path(key)
        at = self.where(path)
        return ConfigError(path, f"{message} ({at})" if at else message)


def message_of(exc: ConfigError) -> str:
    """The message of ``exc`` without its ``key: `` prefix."""
    text = str(exc)
    prefix = f"{exc.key}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def as_list(value: object, key: str, keys: Keys) -> Sequence[Any]:
    """``value`` if it is a list (else a ConfigError at ``key``)."""
    if not isinstance(value, (list, tuple)):
        raise keys.error(key, f"must be a list, got {value!r}")
    return value


def as_string(value: object, key: str, keys: Keys) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise keys.error(key, f"must be a non-empty string, got {value!r}")
    return value


def as_bool(value: object, key: str, keys: Keys) -> bool:
    """``value`` if it is true or false."""
    if not isinstance(value, bool):
        raise keys.error(key, f"must be true or false, got {value!r}")
    return value


def as_int(value: object, key: str, keys: Keys, minimum: int) -> int:
    """``value`` if it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise keys.error(key, f"must be an integer >= {minimum}, got {value!r}")
    return value
