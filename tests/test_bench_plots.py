"""benchmarks/_plots.py and _figures.py: the PNG charts of the benchmarks, drawn from given
numbers (never by running a benchmark), and the ``plots`` / ``plot_note`` JSON keys."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(BENCHMARKS))  # the modules import their sibling ``_report``
    try:
        yield importlib.import_module("_plots"), importlib.import_module("_figures")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture()
def plots(modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return modules[0]


@pytest.fixture()
def figures(modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return modules[1]


@pytest.fixture()
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import matplotlib`` fail as it does where it is not installed."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > len(PNG_SIGNATURE)


@pytest.mark.slow
def test_bar_chart_writes_a_png_of_grouped_bars(plots: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    groups = {"lookup": {"embeddb": 2.1, "numpy": 1.9}, "adagrad": {"embeddb": 1.4, "numpy": 1.2}}
    png, note = plots.bar_chart(
        tmp_path / "sub" / "bars.png", "t", groups, ylabel="M ids/s", reference=(1.0, "target")
    )
    assert note is None
    assert png == tmp_path / "sub" / "bars.png"
    assert_png(png)


@pytest.mark.slow
@pytest.mark.parametrize("horizontal", [False, True])
def test_stacked_bars_and_timelines_are_drawn(
    plots: ModuleType, tmp_path: Path, horizontal: bool
) -> None:
    pytest.importorskip("matplotlib")
    timeline = {"warm": {"start -> SERVING": 800.0, "first lookup": 20.0, "first push": None}}
    png, note = plots.bar_chart(
        tmp_path / "t.png", "t", timeline, ylabel="ms", stacked=True, horizontal=horizontal
    )
    assert note is None
    assert_png(png)


@pytest.mark.slow
def test_percentile_and_line_charts_write_pngs(plots: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    series = {"lookup": {"p50": 0.5, "p99": 4.7, "max": 8.3}, "service": {"p50": 0.5, "p99": 3.2}}
    png, note = plots.percentile_chart(tmp_path / "p.png", "t", series, target=(2.0, "p99"))
    assert note is None
    assert_png(png)
    lines = {"worker": ([0.0, 0.2, 0.4], [100.0, 250.0, 240.0])}
    png, note = plots.line_chart(tmp_path / "l.png", "t", lines, xlabel="s", ylabel="MiB")
    assert note is None
    assert_png(png)


def test_missing_values_draw_nothing_and_say_so(plots: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    nothing = {"a": {"x": None, "y": float("nan")}, "b": {}}
    png, note = plots.bar_chart(tmp_path / "none.png", "t", nothing, ylabel="v")
    assert png is None
    assert note == "none.png: no values to draw"
    assert not (tmp_path / "none.png").exists()
    png, note = plots.line_chart(tmp_path / "l.png", "t", {"x": ([], [])}, xlabel="", ylabel="")
    assert png is None and note is not None


def test_without_matplotlib_every_chart_returns_a_note(
    plots: ModuleType, tmp_path: Path, no_matplotlib: None
) -> None:
    calls = [
        plots.bar_chart(tmp_path / "b.png", "t", {"a": {"": 1.0}}, ylabel="v"),
        plots.percentile_chart(tmp_path / "p.png", "t", {"a": {"p50": 1.0}}),
        plots.line_chart(tmp_path / "l.png", "t", {"a": ([0.0], [1.0])}, xlabel="", ylabel=""),
    ]
    assert calls == [(None, plots.NO_MATPLOTLIB)] * 3
    assert list(tmp_path.iterdir()) == []


def test_attach_records_paths_and_distinct_notes(plots: ModuleType, tmp_path: Path) -> None:
    result: dict[str, Any] = {"bench": "x", "kept": 1}
    drawn = [(tmp_path / "a.png", None), (None, "why"), (None, "why"), (None, "other")]
    assert plots.attach(result, drawn) is result
    assert result == {
        "bench": "x",
        "kept": 1,
        "plots": [str(tmp_path / "a.png")],
        "plot_note": "why; other",
    }
    assert plots.attach({}, [(tmp_path / "a.png", None)])["plot_note"] is None


def test_out_dir_defaults_under_benchmarks_results(plots: ModuleType) -> None:
    parser = argparse.ArgumentParser()
    plots.add_out_dir_argument(parser, "rpc")
    assert parser.parse_args([]).out_dir == Path("benchmarks/results/rpc")
    assert parser.parse_args(["--out-dir", "x"]).out_dir == Path("x")


def test_draw_adds_the_plots_of_a_durability_result(figures: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result: dict[str, Any] = {
        "bench": "durability",
        "update_ratio_interval": 0.31,
        "updates": {"off": {"ratio": 1.0}, "interval": {"ratio": 0.31}},
        "targets": {"update_ratio_interval": 0.6},
        "follower": {"lag_p50_ms": 184.0, "lag_p99_ms": 321.0, "lag_max_ms": 334.0},
    }
    figures.draw(result, tmp_path)
    assert result["update_ratio_interval"] == 0.31  # every key stays
    assert result["plot_note"] is None
    assert [Path(p).name for p in result["plots"]] == [
        "durability_updates.png",
        "durability_follower.png",
    ]
    for path in result["plots"]:
        assert_png(Path(path))


def test_draw_without_matplotlib_keeps_the_numbers(
    figures: ModuleType, tmp_path: Path, no_matplotlib: None
) -> None:
    result: dict[str, Any] = {"bench": "ownership", "ownership_rpc_ratio": 0.98}
    figures.draw(result, tmp_path)
    assert result["plots"] == []
    assert "matplotlib is not installed" in result["plot_note"]
    assert result["ownership_rpc_ratio"] == 0.98


def test_a_failing_figure_becomes_the_note(figures: ModuleType, tmp_path: Path) -> None:
    def broken(result: Any, out_dir: Path) -> list[Any]:
        raise KeyError("missing")

    result = figures.draw({"bench": "rpc"}, tmp_path, broken)
    assert result["plots"] == []
    assert result["plot_note"] == "drawing failed: KeyError: 'missing'"
    unknown = figures.draw({"bench": "nope"}, tmp_path)
    assert unknown["plot_note"] == "no figures defined for bench 'nope'"


def test_the_capacity_series_is_drawn_against_distinct_ids(
    figures: ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")

    def point(n: int, lookup: float, share: float, ideal: float) -> dict[str, Any]:
        return {
            "distinct_ids": n,
            "ram_capacity": 1_000_000,
            "lookup_ids_per_s": lookup,
            "populate_rows_per_s": 3.0e5,
            "disk_share": share,
            "ideal_disk_share": ideal,
        }

    result: dict[str, Any] = {
        "bench": "storage",
        "capacity": [
            point(10**6, 1.1e7, 0.001, 0.0),
            point(10**7, 1.1e6, 0.141, 0.094),
            point(10**8, 3.45e5, 0.215, 0.166),
        ],
        "capacity_skipped": [{"distinct_ids": 10**9, "reason": "no room"}],
        "targets": {"spill_lookup_ids_per_s_100m": 1e6},
    }
    drawn = figures.capacity_figures(result, tmp_path)
    assert [(png.name, note) for png, note in drawn] == [
        ("storage_capacity.png", None),
        ("storage_capacity_disk.png", None),
    ]
    for png, _ in drawn:
        assert_png(png)
    assert figures.capacity_figures({"capacity": []}, tmp_path) == []
    skipped_only = {"capacity": [{"distinct_ids": 10**9, "skipped": "no room"}]}
    assert figures.capacity_figures(skipped_only, tmp_path) == []
