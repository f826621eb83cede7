"""Where the time of a one-sample predict goes (``benchmarks/serve.py --profile``).

Two measurements, both in the measuring process, against the shards the benchmark started:

``profile_infer``
    ``InferCtx.predict`` of one sample, back to back, each step timed by wrapping it (batch
    checks, planning the lookup, the lookup itself, pooling, the TorchScript forward, the
    rest), plus the collector's pauses (``gc.callbacks``) while it ran.

``profile_server``
    a model server built in this process (:func:`build_model_server`, gRPC only) served to
    the benchmark's load process at 100 requests/s; per request the servicer's own time
    (decode → batcher → predict → encode) is recorded, so the client's latency splits into
    transport and thread hand-offs (client latency minus the servicer's time) and the
    servicer's steps; collector pauses and how many requests they overlapped.

Both return plain dicts of milliseconds (p50 / p99 / max per step) for the JSON ``profile``
key and the README breakdown.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from _report import say

__all__ = ["gc_pauses", "profile_infer", "profile_server"]


def _stats(values_s: list[float]) -> dict[str, float]:
    if not values_s:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "count": 0}
    ms = np.asarray(values_s) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "count": int(ms.size),
    }


@contextmanager
def gc_pauses() -> Iterator[list[tuple[float, float, int]]]:
    """Record every collection while the block runs: ``(start, seconds, generation)``."""
    pauses: list[tuple[float, float, int]] = []
    began: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            began[0] = now
        else:
            pauses.append((began[0], now - began[0], info["generation"]))

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def _gc_summary(pauses: list[tuple[float, float, int]]) -> dict[str, Any]:
    by_gen = {g: [s for _, s, gen in pauses if gen == g] for g in (0, 1, 2)}
    return {
        f"gen{g}": {"count": len(v), "max_ms": max(v, default=0.0) * 1e3} for g, v in by_gen.items()
    }


class _Timed:
    """Wraps a callable; records the seconds of each call in ``times``."""

    def __init__(self, fn: Callable[..., Any], times: list[float]) -> None:
        self.fn, self.times = fn, times

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.times.append(time.perf_counter() - start)


@contextmanager
def instrumented(infer: Any) -> Iterator[dict[str, list[float]]]:
    """Time each step of ``infer.predict`` (an ``InferCtx``) while the block runs; yields
    step name → seconds of each call (``checks`` holds two entries per call)."""
    from embeddb.serving import infer as infer_module

    steps: dict[str, list[float]] = {k: [] for k in ("checks", "plan", "lookup", "pool", "dense")}
    saved = (infer_module.plan_lookup, infer_module.pool_lookup, infer._client, infer._dense)
    client = saved[2]

    class _Client:
        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        lookup_many = _Timed(client.lookup_many, steps["lookup"])

    infer._id_features = _Timed(infer._id_features, steps["checks"])
    infer._non_id_tensors = _Timed(infer._non_id_tensors, steps["checks"])
    infer_module.plan_lookup = _Timed(saved[0], steps["plan"])
    infer_module.pool_lookup = _Timed(saved[1], steps["pool"])
    infer._client = _Client()
    infer._dense = _Timed(saved[3], steps["dense"])
    try:
        yield steps
    finally:
        infer_module.plan_lookup, infer_module.pool_lookup, infer._client, infer._dense = saved
        del infer._id_features, infer._non_id_tensors


def _step_stats(steps: dict[str, list[float]], skip: int) -> dict[str, Any]:
    checks = steps["checks"]
    merged = {**steps, "checks": [a + b for a, b in zip(checks[::2], checks[1::2], strict=True)]}
    return {name: _stats(values[skip:]) for name, values in merged.items()}


def profile_infer(infer: Any, one: Any, calls: int) -> dict[str, Any]:
    """Step times of ``infer.predict(one)`` (an ``InferCtx``, one sample), ``calls`` times."""
    total: list[float] = []
    with instrumented(infer) as steps:
        for _ in range(20):
            infer.predict(one)
        with gc_pauses() as pauses:
            for _ in range(calls):
                start = time.perf_counter()
                infer.predict(one)
                total.append(time.perf_counter() - start)
    out = _step_stats(steps, 20)
    out["total"] = _stats(total)
    out["gc"] = _gc_summary(pauses)
    return out


def profile_server(
    infer: Any,
    pools: dict[int, list[bytes]],
    load_process: Callable[..., None],
    seconds: float,
    *,
    rate: float = 100.0,
    freeze: bool = False,
) -> dict[str, Any]:
    """A model server over ``infer`` in this process, loaded at ``rate`` 1-sample requests/s
    by ``load_process`` (serve.py's) in a process of its own; the split of its latency."""
    from embeddb.serving import server as server_module

    servicer_times: list[tuple[float, float]] = []  # (start, seconds) of each Predict
    predict_times: list[float] = []
    original = server_module._Servicer.Predict

    def timed(self: Any, request: Any, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, request, context)
        finally:
            servicer_times.append((start, time.perf_counter() - start))

    server_module._Servicer.Predict = timed  # type: ignore[method-assign]
    infer.predict = _Timed(infer.predict, predict_times)
    instrument = instrumented(infer)
    steps = instrument.__enter__()
    config = server_module.ModelServerConfig(http_port=None, workers=64)
    served = server_module.build_model_server(infer, config)
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    load = ctx.Process(
        target=load_process, args=(theirs, f"127.0.0.1:{served.port}", pools), daemon=True
    )
    try:
        load.start()
        theirs.close()
        if freeze:
            gc.collect()
            gc.freeze()
        waited = _run_delay()
        with gc_pauses() as pauses:
            ours.send({"kind": "open", "size": 1, "rate": rate, "seconds": seconds})
            client = ours.recv()
        waited = _run_delay() - waited
        ours.send(None)
        load.join(30)
    finally:
        if load.is_alive():
            load.kill()
        served.stop(1.0)
        server_module._Servicer.Predict = original  # type: ignore[method-assign]
        del infer.predict
        instrument.__exit__(None, None, None)
        if freeze:
            gc.unfreeze()
    measured = servicer_times[int(0.5 * rate) :]
    service = [s for _, s in measured]
    long_pauses = [(t, s) for t, s, _ in pauses if s > 0.001]
    hit = sum(any(t <= p + d and p <= t + s for p, d in long_pauses) for t, s in measured)
    return {
        "client_p50_ms": client["p50_ms"],
        "client_p99_ms": client["p99_ms"],
        "client_max_ms": client["max_ms"],
        "servicer": _stats(service),
        "predict": _stats(predict_times[int(0.5 * rate) :]),
        "steps": _step_stats(steps, int(0.5 * rate)),
        "transport_p50_ms": client["service_p50_ms"] - float(np.percentile(service, 50) * 1e3),
        "gc": _gc_summary(pauses),
        "requests_overlapping_gc_over_1ms": int(hit),
        "freeze": freeze,
        "run_queue_ms_per_request": waited * 1e3 / max(1, client["requests"]),
    }


def _run_delay() -> float:
    """Seconds this process's threads have waited for a CPU while runnable (schedstat)."""
    total = 0
    for task in Path("/proc/self/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(task.read_text().split()[1])
    return total / 1e9


def run_profile(
    model_dir: Path,
    follower: list[str],
    checkpoints: Path,
    one: Any,
    pools: dict[int, list[bytes]],
    load_process: Callable[..., None],
    seconds: float,
) -> dict[str, Any]:
    """Both profiles, lookups over gRPC to ``follower`` and to the shards of ``checkpoints``
    opened in this process; the server one with and without ``gc.freeze()``. Prints them."""
    import torch

    from embeddb.serving import InferCtx

    torch.set_num_threads(1)  # as embeddb serve-model runs (ModelDaemonOptions.threads)
    result: dict[str, Any] = {}
    for backend in ("follower", "local"):
        infer = (
            InferCtx(model_dir, follower)
            if backend == "follower"
            else InferCtx.from_checkpoint(model_dir, checkpoints)
        )
        with infer:
            infer.warm_up()
            steps = result[f"infer_{backend}"] = profile_infer(infer, one, 1000)
            say(
                f"(p) InferCtx.predict steps ({backend}), p50/p99 ms: "
                + ", ".join(
                    f"{k} {v['p50_ms']:.3f}/{v['p99_ms']:.3f}"
                    for k, v in steps.items()
                    if k != "gc"
                )
                + f"; gc {steps['gc']}"
            )
            for freeze in (False, True) if backend == "follower" else (True,):
                key = f"server_{backend}{'_frozen' if freeze else ''}"
                s = result[key] = profile_server(infer, pools, load_process, seconds, freeze=freeze)
                say(
                    f"(p) in-process model server at 100/s ({key}): client p50 "
                    f"{s['client_p50_ms']:.2f} p99 {s['client_p99_ms']:.2f} max "
                    f"{s['client_max_ms']:.1f} ms; servicer p50 {s['servicer']['p50_ms']:.2f} "
                    f"p99 {s['servicer']['p99_ms']:.2f}; predict p50 {s['predict']['p50_ms']:.2f} "
                    f"p99 {s['predict']['p99_ms']:.2f}; transport p50 "
                    f"{s['transport_p50_ms']:.2f}; gc {s['gc']}, "
                    f"{s['requests_overlapping_gc_over_1ms']} requests overlapped a pause > 1 ms;"
                    f" waited for a CPU {s['run_queue_ms_per_request']:.2f} ms per request;"
                    " steps "
                    + ", ".join(
                        f"{k} {v['p50_ms']:.3f}/{v['p99_ms']:.3f}" for k, v in s["steps"].items()
                    )
                )
    return result
