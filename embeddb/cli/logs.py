"""How the command line logs: plain text or one JSON object per line, on stderr.

``--log-format json`` (or ``EMBEDDB_LOG_FORMAT=json``) writes each record as one line::

    {"time": "2025-01-31T12:00:00.123Z", "level": "INFO", "logger": "embeddb.server.daemon",
     "message": "serving on 127.0.0.1:7070"}

with ``"exception"`` (the formatted traceback, newlines escaped) when the record carries one and
``"stack"`` for ``stack_info``. Only the standard library is used. ``--quiet`` raises the level
to at least ``warning`` and turns progress reports off (:mod:`embeddb.common.progress`).

The handler is installed on the root logger only when nothing else configured logging (a real
``embeddb`` process); a host that did (pytest, an application embedding the CLI) keeps its own.

Under ``json`` every line the command writes is a JSON object: its fatal error too (a record of
level ``ERROR``, logger ``embeddb``, instead of the ``Error: ...`` line;
:class:`embeddb.cli.app`), and what ``embeddb train`` relays of its children (:func:`json_line`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, TextIO

__all__ = [
    "LOG_FORMATS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "configure_logging",
    "json_line",
    "json_record",
    "json_shard_line",
]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_SHARD_PREFIX = re.compile(r"^\[shard (\d+)\] (.*)$", re.DOTALL)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time (UTC, ISO 8601, milliseconds), level, logger,
    message, and exception / stack text when present."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (newlines inside values are escaped)."""
        doc: dict[str, Any] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def utc_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{whole}.{int(created % 1 * 1000):03d}Z"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record (like
    ``logging.lastResort``), so a replaced stderr never leaves it writing to a closed stream."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always the current sys.stderr


def configure_logging(level: str, log_format: str) -> None:
    """Set the root logger's level and this CLI's handler's format.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` or ``json`` (:data:`LOG_FORMATS`).
    """
    root = logging.getLogger()
    root.setLevel(level.upper())
    ours = [h for h in root.handlers if isinstance(h, _StderrHandler)]
    if not ours and root.handlers:
        return  # the host configured logging: leave its handlers alone
    handler = ours[0] if ours else _StderrHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    if not ours:
        root.addHandler(handler)
        logging.captureWarnings(True)  # warnings become records: one JSON line each


def json_record(message: str, *, logger: str = "embeddb", level: str = "INFO") -> str:
    """``message`` as one JSON record (the :class:`JsonFormatter` keys, time now), without
    a newline."""
    doc = {"time": utc_time(time.time()), "level": level, "logger": logger, "message": message}
    return json.dumps(doc, ensure_ascii=False)


def json_line(line: str, logger: str, level: str) -> str:
    """A line a child process wrote (``embeddb train`` relays its ranks', its validation
    step's and its cluster's) as one JSON line: a JSON object passes as it is; any other
    text (a plain log line, gRPC's C core, a traceback's line) becomes a record of
    ``logger`` at ``level`` whose message is the text."""
    text = line.rstrip("\r\n")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        return json.dumps(doc, ensure_ascii=False) + "\n"
    return json_record(text, logger=logger, level=level) + "\n"


def json_shard_line(line: str) -> str:
    """A line ``embeddb cluster`` relays from a shard (``[shard i] ...``) as one JSON line:
    a JSON object gains ``"shard": i``; any other text becomes a record of logger
    ``embeddb.engine.shard`` whose message is the text."""
    found = _SHARD_PREFIX.match(line.rstrip("\n"))
    shard, text = (int(found.group(1)), found.group(2)) if found else (None, line.rstrip("\n"))
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = {
            "time": utc_time(time.time()),
            "level": "INFO",
            "logger": "embeddb.engine.shard",
            "message": text,
        }
    if shard is not None:
        doc["shard"] = shard
    return json.dumps(doc, ensure_ascii=False) + "\n"
