"""Which figures each benchmark draws, from the numbers already in its JSON object.

Each ``<bench>_figures(result, out_dir)`` picks figures out of a benchmark's final JSON object
and draws them with the chart helpers of ``_plots`` (no matplotlib call here); :func:`draw`
runs the one for ``result["bench"]`` and adds the ``plots`` / ``plot_note`` keys. A saved JSON
line can be drawn again without re-running the benchmark::

    python benchmarks/_figures.py benchmarks/results/rpc/rpc.json --out-dir /tmp/rpc
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from _plots import PlotResult, attach, bar_chart, line_chart, percentile_chart

logger = logging.getLogger(__name__)

Figures = Callable[[Mapping[str, Any], Path], list[PlotResult]]
MILLION = 1e6
MIB = 2**20
PERCENTILES = (("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"))


def _millions(value: Any) -> float | None:
    return value / MILLION if isinstance(value, int | float) else None


def _percentiles(stats: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"p50": ..., "p99": ..., "max": ...}`` from ``<prefix>p50_ms``-style keys present."""
    picked = {label: stats.get(prefix + key) for label, key in PERCENTILES}
    picked["max"] = stats.get(prefix + "max_ms")
    return picked


def storage_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """(i) ids/s of each operation beside its numpy baseline; (ii) spill; (iii) capacity."""
    ram = {
        name.replace("_", " "): {
            "lookup": _millions(r.get("lookup_ids_per_s")),
            "numpy gather": _millions(r.get("raw_gather_rows_per_s")),
            "adagrad": _millions(r.get("adagrad_ids_per_s")),
            "numpy scatter-update": _millions(r.get("raw_scatter_rows_per_s")),
        }
        for name, r in result.get("ram", {}).items()
    }
    drawn = [
        bar_chart(
            out_dir / "storage_ram.png",
            "storage (i): RAM-resident, embeddb vs numpy baselines",
            ram,
            ylabel="million ids (rows) per second",
        )
    ]
    target = result.get("targets", {}).get("spill_lookup_ids_per_s")
    spill = {
        f"{name} (disk share {r.get('disk_share', 0.0):.0%})": {
            "": _millions(r.get("lookup_ids_per_s"))
        }
        for name, r in result.get("spill", {}).items()
    }
    drawn.append(
        bar_chart(
            out_dir / "storage_spill.png",
            "storage (ii): training lookups with a disk tier (Zipf)",
            spill,
            ylabel="million ids per second",
            reference=(target / MILLION, "target") if target else None,
        )
    )
    drawn += capacity_figures(result, out_dir)
    return drawn


def capacity_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """(iii) against distinct ids (log x): lookup ids/s and populate rows/s; the disk share
    beside the ideal hottest-N share. Sizes that were skipped have no point."""
    points = [c for c in result.get("capacity") or [] if "lookup_ids_per_s" in c]
    if not points:
        return []
    xs = [float(c["distinct_ids"]) for c in points]
    ram_rows = points[0].get("ram_capacity")
    rows = f"{ram_rows / MILLION:g}M RAM rows" if isinstance(ram_rows, int | float) else "RAM"
    target = result.get("targets", {}).get("spill_lookup_ids_per_s_100m")
    rates = line_chart(
        out_dir / "storage_capacity.png",
        f"storage (iii): SGD dim 16, {rows}, as the table grows",
        {
            "Zipf training lookup ids/s": (xs, [c["lookup_ids_per_s"] / MILLION for c in points]),
            "populate rows/s": (xs, [c["populate_rows_per_s"] / MILLION for c in points]),
        },
        xlabel="distinct ids (log)",
        ylabel="million per second (log)",
        logx=True,
        logy=True,
        markers=True,
        reference=(target / MILLION, "lookup target at 100M") if target else None,
    )
    shares = line_chart(
        out_dir / "storage_capacity_disk.png",
        f"storage (iii): share of looked-up ids from disk, {rows}",
        {
            "measured": (xs, [100 * c["disk_share"] for c in points]),
            "ideal (hottest N ids in RAM)": (xs, [100 * c["ideal_disk_share"] for c in points]),
        },
        xlabel="distinct ids (log)",
        ylabel="% of ids",
        logx=True,
        markers=True,
    )
    return [rates, shares]


def rpc_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """(a) bytes/s of each lookup encoding against the raw echo; (b) latency percentiles."""
    mib = {k: v / MIB for k, v in result.items() if k.endswith("bytes_per_s") and v is not None}
    throughput = {
        "raw echo (baseline)": {"": mib.get("echo_bytes_per_s")},
        "raw gRPC + gather (floor)": {"": mib.get("gather_echo_bytes_per_s")},
        "lookup": {"": mib.get("lookup_bytes_per_s")},
        "training lookup": {"": mib.get("train_lookup_bytes_per_s")},
        "fp16": {"": mib.get("fp16_bytes_per_s")},
        "lz4": {"": mib.get("lz4_bytes_per_s")},
        "fp16+lz4": {"": mib.get("fp16_lz4_bytes_per_s")},
    }
    ratio = result.get("targets", {}).get("lookup_ratio")
    echo = mib.get("echo_bytes_per_s")
    latency = result.get("latency", {})
    targets = result.get("targets", {})
    return [
        bar_chart(
            out_dir / "rpc_throughput.png",
            "rpc (a): lookup vs raw gRPC echo, float32 bytes/s",
            throughput,
            ylabel="MiB/s",
            reference=(ratio * echo, f"target {ratio:g} x echo") if ratio and echo else None,
        ),
        percentile_chart(
            out_dir / "rpc_latency.png",
            f"rpc (b): 1-sample lookups at {result.get('rate', 0):g}/s (open loop)",
            {
                "answer - scheduled send": _percentiles(latency),
                "service (answer - send)": _percentiles(latency, "service_"),
            },
            target=(targets["p99_ms"], "p99 target") if "p99_ms" in targets else None,
        ),
    ]


def durability_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """(a) apply_gradients ids/s with the log ÷ without, per fsync policy; (d) follower lag."""
    updates = result.get("updates", {})
    target = result.get("targets", {}).get("update_ratio_interval")
    drawn = [
        bar_chart(
            out_dir / "durability_updates.png",
            "durability (a): apply_gradients with the update log / without",
            {policy: {"": m.get("ratio")} for policy, m in updates.items()},
            ylabel="update ratio",
            reference=(target, "target (interval)") if target else None,
        )
    ]
    follower = result.get("follower") or {}
    if follower.get("lag_p50_ms") is not None:
        drawn.append(
            percentile_chart(
                out_dir / "durability_follower.png",
                "durability (d): follower lag under a sustained push load",
                {"lag": _percentiles(follower, "lag_")},
            )
        )
    return drawn


def serve_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """Latency percentiles per open-loop phase and the baseline; samples/s per closed loop."""
    phases = result.get("phases", {})
    latency: dict[str, dict[str, Any]] = {
        f"{name} ({p.get('rate', 0):g}/s)": _percentiles(p)
        for name, p in phases.items()
        if "p50_ms" in p
    }
    latency["baseline InferCtx.predict"] = {
        "p50": result.get("baseline_infer_p50_ms"),
        "p99": result.get("baseline_infer_p99_ms"),
    }
    target = result.get("targets", {}).get("predict1_p99_ms")
    saturation = {
        name: {"": p["samples_per_s"] / 1e3}
        for name, p in phases.items()
        if "samples_per_s" in p and "p50_ms" not in p
    }
    return [
        percentile_chart(
            out_dir / "serve_latency.png",
            "serve: PredictEmbeddings latency per phase",
            latency,
            target=(target, "predict1 p99 target") if target else None,
        ),
        bar_chart(
            out_dir / "serve_saturation.png",
            "serve: closed-loop throughput (callers x samples per request)",
            saturation,
            ylabel="thousand samples per second",
        ),
    ]


def data_figures(
    result: Mapping[str, Any],
    out_dir: Path,
    timeline: Mapping[str, tuple[list[float], list[float]]] | None = None,
) -> list[PlotResult]:
    """RSS over time per process role when sampled (``timeline``), else the peak by process."""
    target = result.get("targets", {}).get("peak_rss_mb")
    if timeline:
        return [
            line_chart(
                out_dir / "data_rss.png",
                "data: RSS of the streaming `embeddb train` job, per process",
                timeline,
                xlabel="seconds since start",
                ylabel="RSS (MiB)",
            )
        ]
    return [
        bar_chart(
            out_dir / "data_rss.png",
            "data: RSS by process at the streaming job's peak",
            {"peak": dict(result.get("peak_processes_mb", {}))},
            ylabel="RSS (MiB)",
            stacked=True,
            reference=(target, "peak target") if target else None,
        )
    ]


def ownership_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """ids/s with and without the ownership check, in storage and over gRPC."""
    groups = {
        layer: {
            "unchecked": _millions(result.get(f"ownership_{layer}_ids_per_s", {}).get("unchecked")),
            "checked": _millions(result.get(f"ownership_{layer}_ids_per_s", {}).get("checked")),
        }
        for layer in ("storage", "rpc")
    }
    return [
        bar_chart(
            out_dir / "ownership.png",
            "ownership: lookups with and without the shard-ownership check",
            groups,
            ylabel="million ids per second",
        )
    ]


def cold_start_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """Start -> SERVING -> first lookup -> first push as a timeline, and first vs steady calls."""
    timeline = {
        "warm numba cache (median)": {
            "start -> SERVING": result.get("cold_serving_ms"),
            "SERVING -> first lookup": result.get("cold_first_lookup_ms"),
            "first lookup -> first push": result.get("cold_first_push_ms"),
        }
    }
    if "empty_cache_serving_ms" in result:
        timeline["empty numba cache"] = {
            "start -> SERVING": result.get("empty_cache_serving_ms"),
            "SERVING -> first lookup": result.get("empty_cache_first_lookup_ms"),
            "first lookup -> first push": result.get("empty_cache_first_push_ms"),
        }
    calls = {
        "lookup": {
            "first": result.get("cold_first_lookup_ms"),
            "steady": result.get("steady_lookup_ms"),
        },
        "push": {"first": result.get("cold_first_push_ms"), "steady": result.get("steady_push_ms")},
    }
    return [
        bar_chart(
            out_dir / "cold_start_timeline.png",
            "cold start: a fresh `embeddb serve` process",
            timeline,
            ylabel="ms since process start",
            stacked=True,
            horizontal=True,
        ),
        bar_chart(
            out_dir / "cold_start_calls.png",
            "cold start: first calls vs steady-state calls",
            calls,
            ylabel="ms",
        ),
    ]


def profile_step_figures(result: Mapping[str, Any], out_dir: Path) -> list[PlotResult]:
    """CPU ms per batch stacked by process, and the NN worker's wall ms stacked by stage."""
    models = result.get("models", {})
    return [
        bar_chart(
            out_dir / "profile_step_cpu.png",
            "profile_step: CPU ms per batch, by process",
            {name: dict(m.get("cpu_ms", {})) for name, m in models.items()},
            ylabel="CPU ms per batch",
            stacked=True,
        ),
        bar_chart(
            out_dir / "profile_step_nn.png",
            "profile_step: the NN worker's wall ms per batch, by stage",
            {
                name: {k: v for k, v in m.get("nn_ms", {}).items() if k != "wall per batch"}
                for name, m in models.items()
            },
            ylabel="ms per batch",
            stacked=True,
        ),
    ]


FIGURES: dict[str, Figures] = {
    "storage": storage_figures,
    "rpc": rpc_figures,
    "durability": durability_figures,
    "serve": serve_figures,
    "data": data_figures,
    "ownership": ownership_figures,
    "cold_start": cold_start_figures,
    "profile_step": profile_step_figures,
}


def draw(result: dict[str, Any], out_dir: Path, figures: Figures | None = None) -> dict[str, Any]:
    """Draw ``result``'s figures into ``out_dir`` and add ``plots`` and ``plot_note`` to it.

    A failure while drawing never loses the benchmark's numbers: it becomes the ``plot_note``.

    Args:
        result: a benchmark's final JSON object (``result["bench"]`` picks the figures).
        out_dir: the folder of the PNG files (created).
        figures: the figure function to use instead of ``FIGURES[result["bench"]]``.

    Returns:
        ``result``, changed in place.
    """
    chosen = figures or FIGURES.get(str(result.get("bench")))
    if chosen is None:
        return attach(result, [(None, f"no figures defined for bench {result.get('bench')!r}")])
    try:
        drawn = chosen(result, out_dir)
    except Exception as exc:  # a plot must not cost the measurement
        logger.exception("drawing the figures failed")
        drawn = [(None, f"drawing failed: {type(exc).__name__}: {exc}")]
    return attach(result, drawn)


def main(argv: list[str] | None = None) -> int:
    """Draw the figures of a saved JSON line again; print the PNG paths."""
    parser = argparse.ArgumentParser(description="redraw a benchmark's PNGs from its JSON line")
    parser.add_argument("json", type=Path, help="a file whose last line is a benchmark's JSON")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="default: benchmarks/results/<bench>"
    )
    args = parser.parse_args(argv)
    result = json.loads(args.json.read_text().strip().splitlines()[-1])
    out_dir = args.out_dir or Path("benchmarks/results") / str(result.get("bench"))
    draw(result, out_dir)
    for path in result["plots"]:
        print(path)
    if result["plot_note"]:
        print(f"note: {result['plot_note']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
