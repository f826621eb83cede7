"""``embeddb train``'s start-up timeline: wall-clock marks from the command's start to the first
training step, across the processes of a job (torch-free).

The launcher records when its process started (:func:`process_started`: the kernel's record of
it, so the interpreter's start and the CLI's imports count), when the validation step ended,
when the shards were up and when torchrun was started, and hands the marks to the ranks in
:data:`MARKS_ENV` (JSON ``{mark: epoch seconds}``). A rank adds its own: its process start,
its imports done (torch), its data loader started, its embedding worker ready, and the first
training step done. ``startup_s`` is the first step's mark less the first mark; a rank that
torchrun started by hand (no launcher marks) counts from its own process start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

__all__ = ["MARKS_ENV", "marks_from", "phases", "process_started", "startup_s"]

MARKS_ENV = "EMBEDDB_STARTUP_MARKS"


def process_started() -> float:
    """When this process started (epoch seconds, about 10 ms resolution); now where the
    kernel does not say (no ``/proc``)."""
    try:
        with open("/proc/self/stat") as fh:
            stat = fh.read()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        # field 22 (starttime, clock ticks after boot) counted after the ")" that ends comm
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(age, 0.0)


def marks_from(environ: Mapping[str, str]) -> dict[str, float]:
    """The launcher's marks in ``environ`` (none when unset or unreadable)."""
    try:
        doc = json.loads(environ.get(MARKS_ENV, "") or "{}")
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): float(v) for k, v in doc.items() if isinstance(v, int | float)}


def phases(marks: Mapping[str, float]) -> dict[str, float]:
    """Each mark's seconds since the previous one, in time order (the first mark is 0 s)."""
    ordered = sorted(marks.items(), key=lambda kv: kv[1])
    out: dict[str, float] = {}
    for i, (name, at) in enumerate(ordered):
        out[name] = at - ordered[i - 1][1] if i else 0.0
    return out


def startup_s(marks: Mapping[str, float], end: str = "first_step") -> float | None:
    """Seconds from the first mark to ``end`` (``None`` without that mark)."""
    if end not in marks:
        return None
    return marks[end] - min(marks.values())
