"""Model serving benchmark: ``embeddb serve-model`` over gRPC, embeddings read from a follower.

Arrangement (every server in a process of its own; all on this machine, loopback):

    primary shard     ``embeddb serve --config presets/adult.yaml`` (a subprocess)
    training          this process: the Adult example model (examples/adult/model.py) trained
                      briefly with TrainCtx against the primary (--quick: 40 batches of 256;
                      full: one epoch), exported with TrainCtx.export_model
    follower          ``embeddb serve --follow PRIMARY`` (a subprocess): bootstraps from the
                      primary's snapshot; every lookup of the model server goes to it
    model server      ``embeddb serve-model --shard FOLLOWER --no-http --workers 64`` (a
                      subprocess; default --max-batch 256 and --max-delay-ms 2)
    load generator    a separate process (multiprocessing spawn): a raw gRPC stub, requests
                      prepared in advance (test rows of Adult, encoded by ModelClient's codec)

Phases, each after 0.5 s of warm-up at its own rate:

(a) **Baseline**: ``InferCtx.predict`` of one sample in this process, against the same
    follower, back to back (no gRPC to a model server, no batching): what serving adds to.
(b) **Open loop** (the load process): requests sent at fixed times ``t0 + i / rate`` by one
    thread (sleep, then spin the last 0.2 ms) as non-blocking ``Predict.future`` calls, so a
    slow answer never delays later sends (no coordinated omission). Latency = answer time minus
    *scheduled* send time. 1-sample requests at 100/s (the target: p99 <= 5 ms) and 1000/s,
    256-sample requests at 20/s. Each phase: 15 s (--quick: 5 s).
(c) **Saturation** (closed loop): C callers each keep one request in flight (re-sent from its
    completion callback): 64 callers x 1 sample and 16 callers x 64 samples, 10 s each
    (--quick: 3 s); samples/s answered. ``max_samples_per_s`` is the larger.

(d) **In-process shards**: ``embeddb serve-model --from-checkpoint`` (the checkpoint saved after
    training, its shards opened read-only in the model server's process), 1-sample requests at
    100/s again (``predict1_local_*``).

``--profile`` first splits a 1-sample predict into its steps (``_serve_profile.py``).

``--http`` runs the same phases over HTTP/1.1 instead (``serve-model --http-port 0``; the load
process posts ``{"hashed_records": [...]}`` bodies of the same rows on persistent connections,
one per load thread: ``_serve_http.py``); the keys of the result are the same, with
``"transport": "http"``.

For every phase the model server's ``embeddb_model_batch_samples`` histogram (scraped from its
metrics endpoint before and after) gives the micro-batches run and their mean size.

The last line is one JSON object (keys in benchmarks/README.md). The target is printed, never
enforced. Usage::

    PYTHONPATH=. python benchmarks/serve.py --quick
    PYTHONPATH=. python benchmarks/serve.py --json-out serve.json
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, say, verdict

ROOT = Path(__file__).resolve().parents[1]
ADULT_YAML = ROOT / "embeddb" / "presets" / "adult.yaml"
TARGET_P99_MS = 5.0
SPIN_SECONDS = 0.0002
WARMUP_SECONDS = 0.5
OPEN_LOOP = (("predict1", 1, 100.0), ("predict1_1000", 1, 1000.0), ("predict256", 256, 20.0))
SATURATION = (("closed1", 1, 64), ("closed64", 64, 16))
SERVER_WORKERS = 64


# ------------------------------------------------------------------------- processes
def _wait_for(path: Path, process: subprocess.Popen[bytes], log: Path, what: str) -> str:
    deadline = time.monotonic() + 180
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return path.read_text()


@contextmanager
def subprocess_server(args: list[str], workdir: Path, name: str) -> Iterator[str]:
    """Run ``python -m embeddb.cli ARGS --port-file F``; yield the port file's text; SIGTERM."""
    port_file, log = workdir / f"{name}.port", workdir / f"{name}.log"
    cmd = [sys.executable, "-m", "embeddb.cli", *args, "--port-file", str(port_file)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield _wait_for(port_file, process, log, name)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def wait_serving(address: str, seconds: float = 180.0) -> None:
    """Until the gRPC health of ``address`` says SERVING (a follower: once bootstrapped)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            with suppress(grpc.RpcError):
                answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{address} did not become SERVING")


# ------------------------------------------------------------------------- load process
def _load_process(conn: Connection, address: str, requests: dict[int, list[bytes]]) -> None:
    """Runs phases sent over ``conn`` against ``address`` (``http://``: the HTTP port, with
    JSON bodies); answers with their measurements."""
    import grpc

    from embeddb.v1 import model_pb2 as mpb
    from embeddb.v1 import model_pb2_grpc as mpb_grpc

    if address.startswith("http://"):
        from _serve_http import HttpRequest, HttpStub

        http = HttpStub(address, SERVER_WORKERS)
        stub: Any = http
        pools: dict[int, list[Any]] = {
            size: [HttpRequest(r, size) for r in rs] for size, rs in requests.items()
        }
        channel: Any = http  # closed like the channel
    else:
        channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        stub = mpb_grpc.ModelServiceStub(channel)
        pools = {
            size: [mpb.PredictRequest.FromString(r) for r in rs] for size, rs in requests.items()
        }
    try:
        while True:
            task = conn.recv()
            if task is None:
                return
            if task["kind"] == "open":
                conn.send(_open_loop(stub, pools[task["size"]], task["rate"], task["seconds"]))
            else:
                conn.send(_closed_loop(stub, pools[task["size"]], task["callers"], task["seconds"]))
    finally:
        channel.close()
        conn.close()


def _open_loop(stub: Any, pool: list[Any], rate: float, seconds: float) -> dict[str, Any]:
    warm = int(WARMUP_SECONDS * rate)
    count = warm + int(seconds * rate)
    scheduled = np.zeros(count)
    sent = np.zeros(count)
    answered = np.full(count, np.nan)
    failed = [0]
    lock = threading.Lock()
    done = threading.Event()
    remaining = [count]

    def finished(i: int, future: Any) -> None:
        now = time.perf_counter()
        if future.exception() is not None:
            with lock:
                failed[0] += 1
        else:
            answered[i] = now
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    t0 = time.perf_counter() + 0.05
    for i in range(count):
        when = t0 + i / rate
        scheduled[i] = when
        wait = when - time.perf_counter() - SPIN_SECONDS
        if wait > 0:
            time.sleep(wait)
        while time.perf_counter() < when:
            pass
        sent[i] = time.perf_counter()
        future = stub.Predict.future(pool[i % len(pool)], timeout=30)
        future.add_done_callback(lambda f, i=i: finished(i, f))
    done.wait(60)
    measured = slice(warm, count)
    ok = ~np.isnan(answered[measured])
    latency = (answered[measured][ok] - scheduled[measured][ok]) * 1e3
    service = (answered[measured][ok] - sent[measured][ok]) * 1e3
    lag = (sent[measured] - scheduled[measured]) * 1e3
    span = scheduled[count - 1] - scheduled[warm]
    return {
        "rate": rate,
        "requests": int(count - warm),
        "errors": int(failed[0]),
        "achieved_rate": (count - warm - 1) / (sent[count - 1] - sent[warm]) if span else 0.0,
        **{f"p{q}_ms": float(np.percentile(latency, q)) for q in (50, 90, 99)},
        "p999_ms": float(np.percentile(latency, 99.9)),
        "max_ms": float(latency.max()),
        "service_p50_ms": float(np.percentile(service, 50)),
        "service_p99_ms": float(np.percentile(service, 99)),
        "send_lag_p99_ms": float(np.percentile(lag, 99)),
    }


def _closed_loop(stub: Any, pool: list[Any], callers: int, seconds: float) -> dict[str, Any]:
    size = int(pool[0].num_records)
    lock = threading.Lock()
    counts = {"answered": 0, "errors": 0, "in_flight": 0}
    measuring = {"on": False, "stop": False}
    idle = threading.Event()
    counter = itertools.count()

    def send() -> None:
        future = stub.Predict.future(pool[next(counter) % len(pool)], timeout=30)
        future.add_done_callback(completed)

    def completed(future: Any) -> None:
        with lock:
            if future.exception() is not None:
                counts["errors"] += 1
            elif measuring["on"]:
                counts["answered"] += 1
            if measuring["stop"]:
                counts["in_flight"] -= 1
                if counts["in_flight"] == 0:
                    idle.set()
                return
        send()

    with lock:
        counts["in_flight"] = callers
    for _ in range(callers):
        send()
    time.sleep(WARMUP_SECONDS)
    with lock:
        measuring["on"] = True
        started = time.perf_counter()
    time.sleep(seconds)
    with lock:
        measuring["on"] = False
        answered = counts["answered"]
        elapsed = time.perf_counter() - started
        measuring["stop"] = True
    idle.wait(60)
    return {
        "callers": callers,
        "request_samples": size,
        "requests": answered,
        "errors": counts["errors"],
        "seconds": elapsed,
        "requests_per_s": answered / elapsed,
        "samples_per_s": answered * size / elapsed,
    }


# ------------------------------------------------------------------------- measuring side
def batch_stats(metrics_port: int) -> tuple[float, float]:
    """(count, sum) of the model server's embeddb_model_batch_samples histogram."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("embeddb_model_batch_samples_count"):
            values["count"] = float(line.split()[-1])
        elif line.startswith("embeddb_model_batch_samples_sum"):
            values["sum"] = float(line.split()[-1])
    return values.get("count", 0.0), values.get("sum", 0.0)


def train_and_export(
    primary: str, model_dir: Path, checkpoints: Path, batches: int | None
) -> dict[str, Any]:
    import torch
    from torch import nn

    from embeddb.config import EmbeddingConfig
    from embeddb.features import AdultReader
    from embeddb.trainer import EmbeddingWorkerConfig, TrainCtx, TrainerConfig

    spec = importlib.util.spec_from_file_location("adult_model", ROOT / "examples/adult/model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.AdultModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    config = EmbeddingConfig.from_yaml(ADULT_YAML)
    started = time.perf_counter()
    steps = 0
    trainer = TrainerConfig(
        mode="hybrid", device="cpu", worker=EmbeddingWorkerConfig(max_staleness=4)
    )
    with TrainCtx(model, optimizer, config, [primary], trainer) as ctx:
        for prepared in itertools.islice(ctx.prepare(AdultReader(256, "train")), batches):
            output, labels = ctx.forward(prepared)
            ctx.backward(loss_fn(output, labels[0]))
            steps += 1
        ctx.flush()
        ctx.save_checkpoint(checkpoints)  # what --from-checkpoint serves
        ctx.export_model(model_dir)
    return {"train_steps": steps, "train_seconds": time.perf_counter() - started}


def baseline(model_dir: Path, shards: list[str] | Path, one: Any, calls: int) -> dict[str, float]:
    """``InferCtx.predict`` of ``one``, back to back: against shard addresses, or (a Path) the
    shards of the latest checkpoint of that directory opened in this process."""
    from embeddb.serving import InferCtx

    times = []
    infer = (
        InferCtx.from_checkpoint(model_dir, shards)
        if isinstance(shards, Path)
        else InferCtx(model_dir, shards)
    )
    with infer:
        infer.warm_up()
        for _ in range(20):
            infer.predict(one)
        for _ in range(calls):
            start = time.perf_counter()
            infer.predict(one)
            times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "calls": calls,
    }


def request_pools(seed: int, http: bool = False) -> tuple[dict[int, list[bytes]], Any]:
    """Encoded requests of test rows (``http``: JSON bodies): 512 of 1 sample, 32 of 64 and of
    256; one 1-row batch."""
    from _serve_http import json_body, slice_batch

    from embeddb.features import AdultReader
    from embeddb.serving.codec import encode_request

    test = next(iter(AdultReader(16384, "test", requires_grad=False)))
    rng = np.random.default_rng(seed)
    pools: dict[int, list[bytes]] = {}
    for size, count in ((1, 512), (64, 32), (256, 32)):
        pools[size] = []
        for _ in range(count):
            start = int(rng.integers(0, test.batch_size - size))
            part = slice_batch(test, start, size)
            pools[size].append(
                json_body(part) if http else encode_request(part).SerializeToString()
            )
    return pools, slice_batch(test, 0, 1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="< 60 s: shorter phases")
    add_out_dir_argument(parser, "serve")
    parser.add_argument("--json-out", type=Path, help="also write the final JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--http", action="store_true", help="load the HTTP port (JSON bodies) instead of gRPC"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also split a 1-sample predict into its steps (benchmarks/_serve_profile.py)",
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    seconds = 5.0 if args.quick else 15.0
    closed_seconds = 3.0 if args.quick else 10.0
    config = ["--config", str(ADULT_YAML)]
    checkpoints = workdir / "checkpoints"  # the primary keeps its data where a job's would
    primary_dir = checkpoints / "shards" / "shard-0"
    with subprocess_server(
        ["serve", *config, "--data-dir", str(primary_dir), "--port", "0"], workdir, "primary"
    ) as primary_port:
        primary = f"127.0.0.1:{int(primary_port)}"
        model_dir = workdir / "model"
        trained = train_and_export(primary, model_dir, checkpoints, 40 if args.quick else None)
        say(
            f"trained the Adult example model for {trained['train_steps']} batches of 256 "
            f"({trained['train_seconds']:.1f} s), checkpointed and exported it"
        )
        follow = ["serve", *config, "--follow", primary, "--ephemeral", "--port", "0"]
        with subprocess_server(follow, workdir, "follower") as follower_port:
            follower = f"127.0.0.1:{int(follower_port)}"
            wait_serving(follower)
            say(f"follower {follower} of {primary} bootstrapped")
            pools, one = request_pools(args.seed, args.http)
            base = baseline(model_dir, [follower], one, 300 if args.quick else 2000)
            say(
                f"(a) baseline InferCtx.predict, 1 sample, in-process: p50 {base['p50_ms']:.3f} "
                f"ms, p99 {base['p99_ms']:.3f} ms ({base['calls']} calls)"
            )
            local_base = baseline(model_dir, checkpoints, one, 300 if args.quick else 2000)
            say(
                f"(a) baseline InferCtx.from_checkpoint(...).predict (shards in-process): p50 "
                f"{local_base['p50_ms']:.3f} ms, p99 {local_base['p99_ms']:.3f} ms"
            )
            profile = None
            if args.profile:
                from _serve_profile import run_profile

                profile = run_profile(
                    model_dir, [follower], checkpoints, one, pools, _load_process, seconds
                )
            shards = ["--shard", follower]
            phases = serve_phases(
                model_dir, shards, workdir, pools, seconds, closed_seconds, args.http
            )
            say("the same model server, its shards opened in-process (--from-checkpoint):")
            local = serve_phases(
                model_dir,
                ["--from-checkpoint", str(checkpoints)],
                workdir,
                pools,
                seconds,
                None,
                args.http,
            )
    return {
        "trained": trained,
        "baseline": base,
        "baseline_local": local_base,
        "phases": phases,
        "local": local["predict1"],
        "profile": profile,
    }


def serve_phases(
    model_dir: Path,
    shards: list[str],
    workdir: Path,
    pools: dict[int, list[bytes]],
    seconds: float,
    closed_seconds: float | None,
    http: bool = False,
) -> dict[str, Any]:
    """``embeddb serve-model`` over ``shards`` (CLI arguments) in a process of its own, loaded
    by the load process: every open-loop phase, and the saturation phases unless
    ``closed_seconds`` is None (then only the 1-sample phase at 100/s)."""
    serve = ["serve-model", "--model", str(model_dir), *shards, "--port", "0",
             *(["--http-port", "0"] if http else ["--no-http"]),
             "--metrics-port", "0", "--workers", str(SERVER_WORKERS)]  # fmt: skip
    phases: dict[str, Any] = {}
    with subprocess_server(serve, workdir, "serve-model") as ports_text:
        ports = json.loads(ports_text)
        address = f"127.0.0.1:{ports['grpc']}"
        wait_serving(address)
        if http:
            address = f"http://127.0.0.1:{ports['http']}"
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        load = ctx.Process(target=_load_process, args=(theirs, address, pools), daemon=True)
        load.start()
        theirs.close()
        try:
            for name, size, rate in OPEN_LOOP if closed_seconds is not None else OPEN_LOOP[:1]:
                before = batch_stats(ports["metrics"])
                ours.send({"kind": "open", "size": size, "rate": rate, "seconds": seconds})
                r = ours.recv()
                r.update(_batches(before, batch_stats(ports["metrics"])))
                r["request_samples"] = size
                phases[name] = r
                say(
                    f"(b) {size}-sample requests at {rate:g}/s for {seconds:g} s: p50 "
                    f"{r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f}, p99 {r['p99_ms']:.2f}, "
                    f"max {r['max_ms']:.1f}; achieved {r['achieved_rate']:.1f}/s, "
                    f"{r['errors']} errors; {r['batches']:.0f} micro-batches of "
                    f"{r['mean_batch_samples']:.1f} samples on average"
                )
            for name, size, callers in SATURATION if closed_seconds is not None else ():
                before = batch_stats(ports["metrics"])
                task = {"kind": "closed", "size": size, "callers": callers}
                ours.send({**task, "seconds": closed_seconds})
                r = ours.recv()
                r.update(_batches(before, batch_stats(ports["metrics"])))
                phases[name] = r
                say(
                    f"(c) {callers} callers x {size} samples, closed loop, "
                    f"{closed_seconds:g} s: {r['samples_per_s']:,.0f} samples/s "
                    f"({r['requests_per_s']:,.0f} requests/s, {r['errors']} errors); "
                    f"micro-batches of {r['mean_batch_samples']:.1f} samples on average"
                )
        finally:
            with suppress(OSError):
                ours.send(None)
            load.join(30)
            if load.is_alive():
                load.kill()
    return phases


def _batches(before: tuple[float, float], after: tuple[float, float]) -> dict[str, float]:
    count, total = after[0] - before[0], after[1] - before[1]
    return {"batches": count, "mean_batch_samples": total / count if count else 0.0}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    say(
        f"serve benchmark ({'quick' if args.quick else 'full'}, "
        f"{'HTTP' if args.http else 'gRPC'}), {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="embeddb-serve-bench-") as tmp:
        measured = run(args, Path(tmp))
    phases, base = measured["phases"], measured["baseline"]
    p1, p1k, p256 = phases["predict1"], phases["predict1_1000"], phases["predict256"]
    met = p1["p99_ms"] <= TARGET_P99_MS
    local, local_base = measured["local"], measured["baseline_local"]
    local_met = local["p99_ms"] <= TARGET_P99_MS
    result: dict[str, Any] = {
        "bench": "serve",
        "quick": args.quick,
        "transport": "http" if args.http else "grpc",
        "predict1_p50_ms": p1["p50_ms"],
        "predict1_p99_ms": p1["p99_ms"],
        "predict1_1000_p50_ms": p1k["p50_ms"],
        "predict1_1000_p99_ms": p1k["p99_ms"],
        "predict1_1000_achieved_rate": p1k["achieved_rate"],
        "predict256_p50_ms": p256["p50_ms"],
        "predict256_p99_ms": p256["p99_ms"],
        "max_samples_per_s": max(phases[name]["samples_per_s"] for name, _, _ in SATURATION),
        "baseline_infer_p50_ms": base["p50_ms"],
        "baseline_infer_p99_ms": base["p99_ms"],
        "predict1_local_p50_ms": local["p50_ms"],
        "predict1_local_p99_ms": local["p99_ms"],
        "baseline_local_infer_p50_ms": local_base["p50_ms"],
        "baseline_local_infer_p99_ms": local_base["p99_ms"],
        "targets": {"predict1_p99_ms": TARGET_P99_MS, "predict1_local_p99_ms": TARGET_P99_MS},
        "targets_met": {"predict1_p99_ms": met, "predict1_local_p99_ms": local_met},
        "phases": {**phases, "predict1_local": local},
        "trained": measured["trained"],
        "profile": measured["profile"],
        "settings": {
            "open_loop": [list(p) for p in OPEN_LOOP],
            "saturation": [list(p) for p in SATURATION],
            "server_workers": SERVER_WORKERS,
            "max_batch": 256,
            "max_delay_ms": 2.0,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "seed": args.seed,
        },
    }
    summary = [
        f"1 sample at 100/s: p50 {p1['p50_ms']:.2f} ms, p99 {p1['p99_ms']:.2f} ms "
        f"(target p99 <= {TARGET_P99_MS:g} ms: {verdict(met)}); baseline InferCtx.predict "
        f"p50 {base['p50_ms']:.2f} ms, p99 {base['p99_ms']:.2f} ms",
        f"1 sample at 100/s, shards in-process (--from-checkpoint): p50 {local['p50_ms']:.2f} "
        f"ms, p99 {local['p99_ms']:.2f} ms ({verdict(local_met)}); baseline "
        f"p50 {local_base['p50_ms']:.2f} ms, p99 {local_base['p99_ms']:.2f} ms",
        f"1 sample at 1000/s: p50 {p1k['p50_ms']:.2f} ms, p99 {p1k['p99_ms']:.2f} ms",
        f"256 samples at 20/s: p50 {p256['p50_ms']:.2f} ms, p99 {p256['p99_ms']:.2f} ms",
        f"saturation: {result['max_samples_per_s']:,.0f} samples/s",
    ]
    return finish(draw(result, args.out_dir), started, summary, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
