"""Cold start of one shard: how long a fresh ``embeddb serve`` process takes to report SERVING,
and what its first training lookup and first gradient push cost after that.

Arrangement: each repeat starts a fresh ``python -m embeddb.cli serve`` process (port 0, port
file, a new data directory in tmp) serving one table ``t`` from an embedding config YAML
written like any user's (dim 16, Adagrad, 100k RAM rows, 4 stripes). The measuring process
(this one) keeps a warmed-up client (:func:`embeddb.client.warm_up_client` before the first
repeat, so none of the client's own compilation is counted) and, for each repeat:

* ``t0``: just before ``subprocess.Popen``;
* SERVING: the port file is polled every 2 ms, then the gRPC health service is asked until it
  answers SERVING (the server sets SERVING before it writes the port file);
* the first lookup: a new ``Client`` sends one training lookup of a batch shaped like the
  issue's benchmark (512 samples x 26 ids = 13,312 ids, new rows: created, initialised and
  logged); its answer time is recorded;
* the first push: ``apply_gradients`` of the same ids, sent as soon as the lookup answered;
* steady state: 5 more lookup + push pairs with new ids (the same work as the first pair), whose
  medians are the baseline the first pair is compared with.

``cold_first_lookup_ms`` = first lookup answer - SERVING (target <= 100 ms);
``cold_first_push_ms`` = the first push's own latency. The server logs how long its warm-up
(:func:`embeddb.engine.warmup.warm_up_core`, run before SERVING) took: ``server_warm_up_ms``.

Two numba caches are measured:

* **warm cache** (the normal case after an install, or a Docker image built with the kernels
  compiled): the process's usual cache (``NUMBA_CACHE_DIR`` if set, else ``__pycache__`` next
  to the sources), filled first by one untimed ``warm_up_core()`` run; every repeat;
* **empty cache** (``empty_cache_*`` keys, one run): ``NUMBA_CACHE_DIR`` set to a new empty
  directory, so the server compiles every kernel before SERVING.

Every figure is wall time on a shared machine: indicative, compare figures of one run.

Usage::

    PYTHONPATH=. python benchmarks/cold_start.py                 # 3 repeats + 1 empty cache
    PYTHONPATH=. python benchmarks/cold_start.py --repeats 1 --no-empty-cache

The last line printed is one JSON object (keys in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, say, verdict

from embeddb.client import Client, warm_up_client

TARGET_MS = 100.0
IDS_PER_BATCH = 512 * 26
STEADY_CALLS = 5
START_TIMEOUT_S = 300.0  # an empty numba cache on a busy 2-core machine compiles for ~30 s
SERVICE = "embeddb.v1.EmbeddingStoreService"
CONFIG = """\
slots_config:
  t: {dim: 16}
defaults:
  optimizer: {type: adagrad, lr: 0.01}
  capacity: 100000
store: {stripes: 4}
"""


@dataclass(frozen=True)
class Start:
    """The times of one fresh server, in ms from ``t0`` (just before the process started)."""

    serving: float
    lookup_answer: float
    push_answer: float
    warm_lookup: float  # median of the steady-state lookups' latencies
    warm_push: float
    server_warm_up: float  # what the server logged for warm_up_core()

    @property
    def first_lookup(self) -> float:
        return self.lookup_answer - self.serving

    @property
    def first_push(self) -> float:
        return self.push_answer - self.lookup_answer


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


def _wait_serving(process: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    """Poll the port file, then the health service, until SERVING; the address."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not port_file.exists():
        if process.poll() is not None:
            raise RuntimeError(f"embeddb serve exited with {process.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"embeddb serve wrote no port file in {START_TIMEOUT_S:g}s")
        time.sleep(0.002)
    address = f"127.0.0.1:{int(port_file.read_text())}"
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        while health.Check(health_pb2.HealthCheckRequest(service=SERVICE)).status != serving:
            time.sleep(0.002)
    return address


def _server_warm_up_ms(log: str) -> float:
    found = re.search(r"numba kernels compiled or loaded from cache in ([0-9.]+)s", log)
    return float(found.group(1)) * 1e3 if found else float("nan")


def _one_start(root: Path, env: dict[str, str], seed: int) -> Start:
    """Start one server in ``root``, time its first calls, stop it."""
    config = root / "embedding.yaml"
    config.write_text(CONFIG)
    port_file, log = root / "port", root / "serve.log"
    rng = np.random.default_rng(seed)
    batches = [
        rng.choice(1 << 40, IDS_PER_BATCH, replace=False).astype(np.uint64)
        for _ in range(1 + STEADY_CALLS)
    ]
    grads = np.full((IDS_PER_BATCH, 16), 0.01, dtype=np.float32)
    command = [sys.executable, "-m", "embeddb.cli", "serve", "--config", str(config)]
    command += ["--data-dir", str(root / "shard"), "--port", "0", "--port-file", str(port_file)]
    with log.open("wb") as err:
        t0 = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        address = _wait_serving(process, port_file, log)
        serving = _ms(t0)
        with Client([address]) as client:
            client.lookup("t", batches[0])
            lookup_answer = _ms(t0)
            client.apply_gradients("t", batches[0], grads)
            push_answer = _ms(t0)
            lookups, pushes = [], []
            for ids in batches[1:]:
                sent = time.perf_counter()
                client.lookup("t", ids)
                lookups.append(_ms(sent))
                sent = time.perf_counter()
                client.apply_gradients("t", ids, grads)
                pushes.append(_ms(sent))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return Start(
        serving,
        lookup_answer,
        push_answer,
        statistics.median(lookups),
        statistics.median(pushes),
        _server_warm_up_ms(log.read_text(errors="replace")),
    )


def _server_env(numba_cache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDB_")}
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache)
    return env


def _fill_cache(env: dict[str, str]) -> None:
    """Compile the server's kernels into the cache ``env`` selects (untimed)."""
    subprocess.run(
        [sys.executable, "-c", "from embeddb.engine.warmup import warm_up_core; warm_up_core()"],
        env=env,
        check=True,
        timeout=START_TIMEOUT_S,
    )


def _line(label: str, s: Start) -> str:
    return (
        f"  {label:<12} SERVING {s.serving:8.0f} ms (warm-up {s.server_warm_up:6.0f} ms)   "
        f"first lookup {s.first_lookup:7.1f} ms (steady {s.warm_lookup:5.1f})   "
        f"first push {s.first_push:7.1f} ms (steady {s.warm_push:5.1f})"
    )


def measure_cold_first_lookup(repeats: int = 3, *, empty_cache: bool = True) -> dict[str, float]:
    """Start ``repeats`` fresh ``embeddb serve`` processes (warm numba cache) and, with
    ``empty_cache``, one more with an empty cache; time SERVING and the first calls.

    Returns:
        Medians over the warm-cache repeats (``cold_first_lookup_ms``, ``cold_serving_ms``,
        ...) and the ``empty_cache_*`` figures of the empty-cache start; see
        ``benchmarks/README.md``.
    """
    warm_up_client()  # the measuring client's own kernels are not the server's cold start
    env = _server_env(None)
    _fill_cache(env)
    starts: list[Start] = []
    with tempfile.TemporaryDirectory(prefix="embeddb-cold-") as tmp:
        for i in range(repeats):
            root = Path(tmp) / f"warm-{i}"
            root.mkdir()
            starts.append(_one_start(root, env, seed=i))
            say(_line(f"warm cache {i + 1}", starts[-1]))
        empty = None
        if empty_cache:
            root = Path(tmp) / "empty"
            (root / "numba").mkdir(parents=True)
            empty = _one_start(root, _server_env(root / "numba"), seed=repeats)
            say(_line("empty cache", empty))

    def median(field: str) -> float:
        return float(statistics.median(getattr(s, field) for s in starts))

    result = {
        "cold_first_lookup_ms": median("first_lookup"),
        "cold_serving_ms": median("serving"),
        "cold_lookup_answer_ms": median("lookup_answer"),
        "cold_push_answer_ms": median("push_answer"),
        "cold_first_push_ms": median("first_push"),
        "steady_lookup_ms": median("warm_lookup"),
        "steady_push_ms": median("warm_push"),
        "server_warm_up_ms": median("server_warm_up"),
    }
    if empty is not None:
        result.update(
            {
                "empty_cache_serving_ms": empty.serving,
                "empty_cache_first_lookup_ms": empty.first_lookup,
                "empty_cache_first_push_ms": empty.first_push,
                "empty_cache_server_warm_up_ms": empty.server_warm_up,
            }
        )
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh servers, warm cache")
    parser.add_argument(
        "--no-empty-cache",
        dest="empty_cache",
        action="store_false",
        help="skip the start with an empty numba cache (it compiles every kernel)",
    )
    add_out_dir_argument(parser, "cold_start")
    parser.add_argument("--json-out", type=Path, help="also write the JSON line here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    say(f"cold start: {args.repeats} fresh `embeddb serve` processes, {IDS_PER_BATCH} ids/batch")
    figures = measure_cold_first_lookup(args.repeats, empty_cache=args.empty_cache)
    first = figures["cold_first_lookup_ms"]
    summary = [
        f"cold_first_lookup_ms {first:.1f} (target <= {TARGET_MS:g}: {verdict(first <= TARGET_MS)})"
        f"; {first / figures['steady_lookup_ms']:.2f}x a steady-state lookup",
        f"cold_first_push_ms {figures['cold_first_push_ms']:.1f}; "
        f"{figures['cold_first_push_ms'] / figures['steady_push_ms']:.2f}x a steady-state push",
    ]
    if "empty_cache_first_lookup_ms" in figures:
        summary.append(
            f"empty numba cache: SERVING after {figures['empty_cache_serving_ms']:.0f} ms, "
            f"first lookup {figures['empty_cache_first_lookup_ms']:.1f} ms"
        )
    result: dict[str, object] = {"bench": "cold_start", "repeats": args.repeats, **figures}
    return finish(draw(result, args.out_dir), started, summary, args.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
