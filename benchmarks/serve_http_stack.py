"""The model server's HTTP stack alone: its ``HttpFrontend`` around a predictor that scores
instantly, in a process of its own; this process is the client.

Two phases: (1) 3000 one-record ``POST /v1/predict`` requests back to back on one keep-alive
connection (latency p50/p90/p99); (2) ``--clients`` connections opened at once, each keeping
one request in flight for 3 s (requests/s, and how many connections failed: reset or refused).

``--root DIR`` serves the code of another checkout (its ``embeddb`` on the server's path; the
frontend of before issue 24 took the model server's config, after it ``HttpSettings``), so
two versions can be compared back to back::

    PYTHONPATH=. python benchmarks/serve_http_stack.py
    PYTHONPATH=. python benchmarks/serve_http_stack.py --root /path/to/old/checkout

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BODY = json.dumps({"hashed_records": [{"ids": {"a": [1]}, "non_id": {"x": [1.0]}}]}).encode()

SERVER = """
import sys
import numpy as np
from prometheus_client import CollectorRegistry
import embeddb.serving.batcher as batcher_module
from embeddb.serving import http
from embeddb.serving.batcher import MicroBatcher
from embeddb.serving.metrics import ModelMetrics
from embeddb.serving.server import ModelServerConfig

class Rows:
    def __init__(self, n): self.batch_size = n

class Instant:
    spec = None
    def batch_from_hashed_records(self, records): return Rows(len(records))

batcher_module.merge_batches = lambda batches: Rows(sum(b.batch_size for b in batches))
batcher = MicroBatcher(lambda b: np.zeros(b.batch_size, np.float32), max_batch=256,
                       max_delay=0.002)
config = ModelServerConfig(workers=int(sys.argv[1]))
settings = config.http_settings() if hasattr(http, "HttpSettings") else config
front = http.HttpFrontend(Instant(), batcher, ModelMetrics(CollectorRegistry()), settings)
print(front.port, flush=True)
sys.stdin.read()
front.stop(1)
batcher.close()
"""


def _post(conn: http.client.HTTPConnection) -> None:
    conn.request("POST", "/v1/predict", BODY)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(300):
            _post(conn)
        times = []
        for _ in range(3000):
            started = time.perf_counter()
            _post(conn)
            times.append(time.perf_counter() - started)
        conn.close()
        ms = np.array(times) * 1e3
        counts: list[int] = []
        failed: list[str] = []
        barrier = threading.Barrier(args.clients)

        def client() -> None:
            barrier.wait()
            stop = time.perf_counter() + 3.0
            n = 0
            try:
                own = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                while time.perf_counter() < stop:
                    _post(own)
                    n += 1
                own.close()
            except (OSError, http.client.HTTPException, RuntimeError) as exc:
                failed.append(type(exc).__name__)
            counts.append(n)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        server.stdin.close()
        server.wait(30)
    result = {
        "bench": "serve_http_stack",
        "root": str(args.root),
        "sequential_p50_ms": float(np.percentile(ms, 50)),
        "sequential_p90_ms": float(np.percentile(ms, 90)),
        "sequential_p99_ms": float(np.percentile(ms, 99)),
        "clients": args.clients,
        "concurrent_requests_per_s": sum(counts) / 3.0,
        "connections_failed": len(failed),
        "load_average": os.getloadavg()[0],
    }
    print(
        f"one connection, back to back: p50 {result['sequential_p50_ms']:.2f} ms, p99 "
        f"{result['sequential_p99_ms']:.2f} ms; {args.clients} connections at once: "
        f"{result['concurrent_requests_per_s']:,.0f} requests/s, {len(failed)} failed"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
