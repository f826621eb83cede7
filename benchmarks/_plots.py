"""PNG figures of the benchmarks: bar, percentile and line charts, and the ``plots`` JSON keys.

Every benchmark computes its figures as numbers (printed, and kept in its JSON line); this module
draws some of them as PNG files with matplotlib on the Agg backend (``_report.pyplot``). The
plots are optional: without matplotlib nothing is drawn and the benchmark's JSON says why in
``plot_note``. Each chart function returns ``(png_path, None)`` once the file is written, or
``(None, note)`` when nothing was drawn.

The shape every bar chart takes, ``groups``, maps a category (one position on the category axis)
to its series values (one bar per series, side by side or stacked)::

    {"lookup": {"embeddb": 2.1e6, "numpy": 1.9e6},     # two bars at "lookup"
     "adagrad": {"embeddb": 1.4e6, "numpy": 1.2e6}}    # two bars at "adagrad"

Values that are missing (``None``) or not finite are left out, so a JSON key that is ``null``
in a run simply has no bar.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from _report import pyplot

logger = logging.getLogger(__name__)

PlotResult = tuple[Path | None, str | None]
"""``(png_path, None)`` once a PNG is written; ``(None, note)`` when nothing was drawn."""

NO_MATPLOTLIB = "matplotlib is not installed (pip install -e '.[bench]'): no PNG drawn"
FIGSIZE = (7.2, 3.6)
DPI = 100


def add_out_dir_argument(parser: argparse.ArgumentParser, bench: str) -> None:
    """Add ``--out-dir`` (default ``benchmarks/results/<bench>``) to a benchmark's parser."""
    default = Path("benchmarks/results") / bench
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=default,
        help=f"where the PNG figures are written (default {default})",
    )


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, null, NaN, infinite, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _clean(groups: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """``groups`` without the missing values and without the categories left empty."""
    cleaned: dict[str, dict[str, float]] = {}
    for category, series in groups.items():
        kept = {name: v for name, raw in series.items() if (v := _number(raw)) is not None}
        if kept:
            cleaned[category] = kept
    return cleaned


def _legend(ax: Any) -> None:
    """A legend beside the axes when it is long enough to hide the lines, else inside."""
    if len(ax.get_legend_handles_labels()[1]) > 3:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")


def _save(plt: Any, fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def bar_chart(
    path: Path,
    title: str,
    groups: Mapping[str, Mapping[str, Any]],
    *,
    ylabel: str,
    stacked: bool = False,
    horizontal: bool = False,
    reference: tuple[float, str] | None = None,
    log: bool = False,
) -> PlotResult:
    """Draw grouped (or stacked) bars, one group per category, and write them to ``path``.

    Args:
        path: the PNG to write (its folder is created).
        title: the figure's title.
        groups: category -> series name -> value (see the module docstring).
        ylabel: the label of the value axis (the x axis when ``horizontal``).
        stacked: stack each category's series instead of placing them side by side.
        horizontal: bars along the x axis, categories down the y axis (a timeline).
        reference: ``(value, label)`` of a dashed line across the chart (a target, a baseline).
        log: a logarithmic value axis.

    Returns:
        ``(path, None)``, or ``(None, note)`` when matplotlib is absent or no value is usable.
    """
    plt = pyplot()
    if plt is None:
        return None, NO_MATPLOTLIB
    data = _clean(groups)
    if not data:
        return None, f"{path.name}: no values to draw"
    categories = list(data)
    names = list(dict.fromkeys(name for series in data.values() for name in series))
    fig, ax = plt.subplots(figsize=FIGSIZE)
    width = (0.5 if horizontal else 0.8) if stacked else 0.8 / len(names)
    draw = ax.barh if horizontal else ax.bar
    base = [0.0] * len(categories)
    palette = list(plt.get_cmap("tab20").colors) if len(names) > 10 else [None] * len(names)
    for i, (name, color) in enumerate(zip(names, palette, strict=False)):
        values = [data[c].get(name, 0.0) for c in categories]
        if stacked:
            where = [float(k) for k in range(len(categories))]
            extra: dict[str, Any] = {"left" if horizontal else "bottom": list(base)}
            base = [b + v for b, v in zip(base, values, strict=True)]
        else:
            where = [k - 0.4 + width * (i + 0.5) for k in range(len(categories))]
            extra = {}
        size = {"height" if horizontal else "width": width}
        draw(where, values, label=name or None, color=color, **size, **extra)
    ticks = list(range(len(categories)))
    if horizontal:
        ax.set_yticks(ticks, categories)
        ax.set_ylim(len(categories), -1)  # first category on top, room for the legend
        ax.set_xlabel(ylabel)
    else:
        tilted = len(categories) > 4
        ax.set_xticks(
            ticks, categories, rotation=20 if tilted else 0, ha="right" if tilted else "center"
        )
        ax.set_ylabel(ylabel)
    if reference is not None:
        line = ax.axvline if horizontal else ax.axhline
        line(reference[0], color="black", linestyle="--", linewidth=1, label=reference[1])
    if log:
        (ax.set_xscale if horizontal else ax.set_yscale)("log")
    if any(names) or reference is not None:
        _legend(ax)
    ax.set_title(title)
    ax.grid(axis="x" if horizontal else "y", alpha=0.3)
    return _save(plt, fig, path), None


def percentile_chart(
    path: Path,
    title: str,
    series: Mapping[str, Mapping[str, Any]],
    *,
    ylabel: str = "latency (ms)",
    target: tuple[float, str] | None = None,
) -> PlotResult:
    """Draw latency percentiles, one line of markers per series, on a log scale.

    Args:
        path: the PNG to write.
        title: the figure's title.
        series: series name (a phase, a client) -> percentile label (``"p50"``, ``"p99"``...)
            -> value; the percentile labels form the x axis in their first-seen order.
        ylabel: the label of the value axis.
        target: ``(value, label)`` of a dashed target line.

    Returns:
        ``(path, None)``, or ``(None, note)`` when matplotlib is absent or no value is usable.
    """
    plt = pyplot()
    if plt is None:
        return None, NO_MATPLOTLIB
    data = _clean(series)
    if not data:
        return None, f"{path.name}: no values to draw"
    labels = list(dict.fromkeys(q for values in data.values() for q in values))
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for name, values in data.items():
        xs = [labels.index(q) for q in values]
        ax.plot(xs, list(values.values()), marker="o", label=name)
    ax.set_xticks(list(range(len(labels))), labels)
    if target is not None:
        ax.axhline(target[0], color="black", linestyle="--", linewidth=1, label=target[1])
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(plt, fig, path), None


def line_chart(
    path: Path,
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    markers: bool = False,
    reference: tuple[float, str] | None = None,
) -> PlotResult:
    """Draw one line per series from ``(xs, ys)`` pairs (a value over time, or against size).

    ``logx`` and ``logy`` put an axis on a log scale, ``markers`` marks each point (for a few
    measured sizes), ``reference`` is ``(value, label)`` of a dashed horizontal line (a target).

    Returns:
        ``(path, None)``, or ``(None, note)`` when matplotlib is absent or every series is empty.
    """
    plt = pyplot()
    if plt is None:
        return None, NO_MATPLOTLIB
    usable = {name: xy for name, xy in series.items() if len(xy[0]) and len(xy[0]) == len(xy[1])}
    if not usable:
        return None, f"{path.name}: no values to draw"
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for name, (xs, ys) in usable.items():
        ax.plot(list(xs), list(ys), label=name, marker="o" if markers else None)
    if reference is not None:
        ax.axhline(reference[0], color="black", linestyle="--", linewidth=1, label=reference[1])
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(plt, fig, path), None


def attach(result: dict[str, Any], drawn: Iterable[PlotResult]) -> dict[str, Any]:
    """Record the figures in a benchmark's JSON: ``plots`` (PNG paths) and ``plot_note``.

    ``plot_note`` is None when every figure was drawn, else the distinct reasons joined by
    ``"; "``. Returns ``result`` (changed in place).
    """
    paths: list[str] = []
    notes: list[str] = []
    for png, note in drawn:
        if png is not None:
            paths.append(str(png))
        if note is not None and note not in notes:
            notes.append(note)
    result["plots"] = paths
    result["plot_note"] = "; ".join(notes) or None
    for note in notes:
        logger.info("plot: %s", note)
    return result
