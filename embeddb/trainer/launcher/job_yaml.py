"""The job file's YAML with line marks: every error names the key *and* where it is.

:func:`load_with_lines` parses a job file once into plain Python values and, from the same
text, a map of key paths to line numbers (``yaml.compose``: each node's ``start_mark``)::

    model: builtin:deepfm          # "model"             -> line 1
    dataset:                       # "dataset"           -> line 2
      ids: [user, item]            # "dataset.ids"       -> line 3, "dataset.ids[1]" -> line 3
      numeric:
        - {column: price}          # "dataset.numeric[0]" -> line 5, "...[0].column" -> line 5

:class:`Where` turns a key path into ``"job.yaml:3"`` (the nearest enclosing key that has a
line: ``dataset.ids[7]`` of a 2-entry list is reported at ``dataset.ids``), and
:func:`with_line` appends it to a :class:`~embeddb.errors.ConfigError`. PyYAML only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from embeddb.errors import ConfigError

__all__ = ["Where", "load_with_lines", "with_line"]

_INDEX = re.compile(r"\[(\d+)\]")
_HAS_LINE = re.compile(r":\d+\)?$")


@dataclass(frozen=True)
class Where:
    """``where(key_path) -> "job.yaml:14"``: the line of a key of the job file.

    Attributes:
        source: the file's name as shown in messages.
        lines: key path (``a.b.0.c``: list indexes as components) -> 1-based line.
    """

    source: str = ""
    lines: dict[str, int] = field(default_factory=dict)

    def line(self, key_path: str) -> int | None:
        """The line of ``key_path`` or of its nearest enclosing key; None when unknown."""
        parts = [p for p in _INDEX.sub(r".\1", key_path).split(".") if p]
        for candidate in (parts, ["dataset", *parts]):
            for end in range(len(candidate), 0, -1):
                line = self.lines.get(".".join(candidate[:end]))
                if line is not None:
                    return line
        return None

    def __call__(self, key_path: str) -> str:
        line = self.line(key_path)
        if line is None:
            return self.source
        return f"{self.source}:{line}"


def load_with_lines(path: Path, shown: str) -> tuple[Any, Where]:
    """Parse the YAML file ``path``: its value and a :class:`Where` naming it ``shown``.

    Raises:
        ConfigError: unreadable, or not valid YAML (the message names the line).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(shown, f"cannot read the training job file: {exc}") from exc
    try:
        value = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{shown}:{mark.line + 1}" if mark is not None else shown
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(at, f"is not valid YAML: {problem}") from exc
    lines: dict[str, int] = {}
    if node is not None:
        _walk(node, "", lines)
    return value, Where(shown, lines)


def _walk(node: yaml.Node, prefix: str, lines: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, child in node.value:
            name = f"{prefix}.{key.value}" if prefix else str(key.value)
            lines.setdefault(name, key.start_mark.line + 1)
            _walk(child, name, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            name = f"{prefix}.{i}" if prefix else str(i)
            lines.setdefault(name, child.start_mark.line + 1)
            _walk(child, name, lines)


def with_line(exc: ConfigError, where: Where) -> ConfigError:
    """``exc`` with `` (job.yaml:N)`` appended (the line of its key), unless its message
    already ends with a place (``file:line``)."""
    message = str(exc)
    if not where.source or _HAS_LINE.search(message) or where.source in message:
        return exc
    key = getattr(exc, "key", "")
    detail = message[len(key) + 2 :] if key and message.startswith(f"{key}: ") else message
    new = ConfigError(key, f"{detail} ({where(key or '')})")
    new.__cause__ = exc.__cause__
    return new
