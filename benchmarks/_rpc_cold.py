"""The cold-start phase of ``benchmarks/rpc.py``: a fresh ``embeddb serve`` process's first
lookup, measured by ``benchmarks/cold_start.py`` (:func:`measure_cold_first_lookup`: from
process start to answer, minus the time until the shard reports SERVING).

If that module cannot be imported or its measurement fails, the phase still reports its key,
``cold_first_lookup_ms``, as ``None``, with the reason in ``cold_start["note"]``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

COLD_START_MODULE = "cold_start"  # benchmarks/cold_start.py, next to this file


def cold_first_lookup(repeats: int, empty_cache: bool) -> dict[str, Any]:
    """``measure_cold_first_lookup(repeats)``'s figures, or ``cold_first_lookup_ms: None``
    and a ``note`` saying why there are none.

    Args:
        repeats: fresh server processes to measure (the median is reported).
        empty_cache: also time one start with an empty numba cache (about 30 s here), where
            ``cold_start.py`` offers it.
    """
    try:
        module = importlib.import_module(COLD_START_MODULE)
        measure = module.measure_cold_first_lookup
    except (ImportError, AttributeError) as exc:
        return {"cold_first_lookup_ms": None, "note": f"benchmarks/cold_start.py unusable: {exc}"}
    try:
        try:
            figures: dict[str, Any] = dict(measure(repeats=repeats, empty_cache=empty_cache))
        except TypeError:  # a version without the empty-cache start
            figures = dict(measure(repeats=repeats))
    except Exception as exc:  # a failed measurement must not lose the rest of the run
        logger.warning("cold-start measurement failed", exc_info=True)
        return {"cold_first_lookup_ms": None, "note": f"{type(exc).__name__}: {exc}"}
    figures.setdefault("cold_first_lookup_ms", None)
    figures["repeats"] = repeats
    return figures
