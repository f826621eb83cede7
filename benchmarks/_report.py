"""Printing shared by the benchmark scripts: progress lines, rates, verdicts, the final report.

Every benchmark prints a readable table as it goes and, as its last line, exactly one JSON
object (also written to ``--json-out`` when given).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def say(text: str = "") -> None:
    print(text, flush=True)


def fmt_rate(value: float) -> str:
    if value >= 1e9:
        return f"{value / 1e9:.2f}G"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    return f"{value / 1e3:.0f}K"


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def finish(
    result: dict[str, Any], started: float, summary: Iterable[str], json_out: Path | None
) -> int:
    """Stamp the wall time, print the summary and the JSON line (last); return exit code 0."""
    result["seconds"] = time.perf_counter() - started
    say()
    for line in summary:
        say(line)
    say(f"total {result['seconds']:.1f} s")
    line = json.dumps(result)
    if json_out is not None:
        json_out.write_text(line + "\n")
    say(line)
    return 0


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None without matplotlib
    (plots are optional: every benchmark writes its figures to CSV/JSON as well)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
