"""Progress of long commands (train, reshard, snapshot, restore, populate), TTY-aware.

On a terminal, :class:`Progress` draws a `tqdm <https://tqdm.github.io>`_ bar (count, rate,
ETA when the total is known, the fields after it). Anywhere else (a log file, a pipe, a
container's log) it writes one plain line every ``interval_s`` seconds and one when it closes,
never a carriage return::

    reshard: 131,072/524,288 rows (25%), 61,234 rows/s, loss=0.41

``embeddb --quiet`` (or ``EMBEDDB_QUIET=1``) silences every progress report: the group exports
``EMBEDDB_QUIET`` (:func:`export_quiet`) so that the processes a command starts (the training
ranks) are quiet too, and :func:`progress_enabled` reads it. This module imports neither the
CLI nor the trainer; both use it.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TextIO

__all__ = ["QUIET_ENV", "Progress", "export_quiet", "progress_enabled"]

QUIET_ENV = "EMBEDDB_QUIET"
_TRUE = frozenset({"1", "true", "yes", "on"})


def progress_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when the command runs quiet (``embeddb --quiet`` or ``EMBEDDB_QUIET=1``).

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    return env.get(QUIET_ENV, "").strip().lower() not in _TRUE


def export_quiet(quiet: bool) -> Callable[[], None]:
    """Make this process and the ones it starts quiet (``EMBEDDB_QUIET=1``) when ``quiet``.

    Args:
        quiet: whether ``--quiet`` was given; False leaves the environment as it is.

    Returns:
        A function that puts ``EMBEDDB_QUIET`` back as it was (the CLI calls it when the
        command ends, so a host running the CLI in-process keeps its environment).
    """
    before = os.environ.get(QUIET_ENV)
    if quiet:
        os.environ[QUIET_ENV] = "1"

    def restore() -> None:
        if before is None:
            os.environ.pop(QUIET_ENV, None)
        else:
            os.environ[QUIET_ENV] = before

    return restore


def _format_field(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class Progress:
    """A progress report: a tqdm bar on a terminal, periodic plain lines elsewhere.

    Args:
        desc: what progresses (``reshard``), the start of every line.
        total: the count at completion, if known (percent and ETA are shown then).
        unit: what is counted (``rows``, ``bytes``, ``shards``, ``steps``).
        stream: where to write (default ``sys.stderr``, looked up when created).
        enabled: False writes nothing; None: :func:`progress_enabled`.
        interval_s: seconds between plain lines when ``stream`` is not a terminal (0: a line
            on every :meth:`update`).
        clock: the time source (seconds, monotonic).

    Example (a file is not a terminal: plain lines, here one per update)::

        with Progress("reshard", total=4, unit="rows", stream=log, interval_s=0) as p:
            p.update(2, loss=0.41)  # reshard: 2/4 rows (50%), 3 rows/s, loss=0.41
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        unit: str = "rows",
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desc = desc
        self.total = total
        self.unit = unit
        self.interval_s = interval_s
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = progress_enabled() if enabled is None else enabled
        self._clock = clock
        self._count = 0
        self._fields: dict[str, object] = {}
        self._started = clock()
        self._last_line = self._started
        self._shown: tuple[int, str] | None = None  # what the last plain line said
        self._closed = False
        self._bar: Any = None  # a tqdm bar on a terminal
        if self._enabled and _is_tty(self._stream):
            # through importlib: tqdm ships no type stubs (types-tqdm is not a dependency)
            tqdm = importlib.import_module("tqdm").tqdm
            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=f" {unit}",
                file=self._stream,
                dynamic_ncols=True,
                leave=True,
            )

    @property
    def count(self) -> int:
        """The count so far (the sum of :meth:`update`'s ``n``)."""
        return self._count

    def update(self, n: int = 1, **fields: object) -> None:
        """Add ``n`` to the count; ``fields`` are shown after it (``loss=0.41, auc=0.77``) and
        replace those given before (a field left out keeps its last value)."""
        if self._closed:
            return
        self._count += n
        self._fields.update(fields)
        if not self._enabled:
            return
        if self._bar is not None:
            if fields:
                self._bar.set_postfix_str(self._fields_text(), refresh=False)
            self._bar.update(n)
            return
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self._write_line(now)

    def report(self, done: int, total: int | None) -> None:
        """Move to ``done`` of ``total``: the callback shape of the reshard and restore
        progress hooks, which report absolute counts."""
        if total != self.total:
            self.set_total(total)
        self.update(done - self._count)

    def set_total(self, total: int | None) -> None:
        """Set (or clear) the count at completion once it is known."""
        self.total = total
        if self._bar is not None and not self._closed:
            self._bar.total = total
            self._bar.refresh()

    def close(self) -> None:
        """Close the bar, or write the final plain line (unless the last one said the same).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._enabled and self._shown != (self._count, self._fields_text()):
            self._write_line(self._clock())

    def line(self, now: float | None = None) -> str:
        """The plain line for the current state, e.g. ``restore: 1,024/4,096 bytes (25%),
        512 bytes/s, file=ids.npy``.

        Args:
            now: the time to compute the rate at (default: the clock's).
        """
        elapsed = (self._clock() if now is None else now) - self._started
        count = f"{self._count:,}"
        if self.total is not None:
            count += f"/{self.total:,} {self.unit}"
            if self.total > 0:
                count += f" ({100 * self._count / self.total:.0f}%)"
        else:
            count += f" {self.unit}"
        parts = [count]
        if elapsed > 0:
            parts.append(f"{self._count / elapsed:,.0f} {self.unit}/s")
        fields = self._fields_text()
        if fields:
            parts.append(fields)
        return f"{self.desc}: " + ", ".join(parts)

    def _fields_text(self) -> str:
        return ", ".join(f"{k}={_format_field(v)}" for k, v in self._fields.items())

    def _write_line(self, now: float) -> None:
        self._shown = (self._count, self._fields_text())
        try:
            self._stream.write(self.line(now) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth a crash
            self._enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
