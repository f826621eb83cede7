"""Per-batch profile of the hybrid training step: where every millisecond of a batch goes in the
NN worker, the embedding worker and the shard.

Runs :class:`~embeddb.trainer.TrainCtx` (``hybrid``, ``max_staleness`` 4, one local shard
process, one embedding worker process, the NN worker in this process) for two models on
:class:`~embeddb.features.SyntheticCriteo` batches:

* ``criteo``: the training benchmark's model, 26 ids x dim 16 + 13 numeric -> 256-128-1,
  batch 512;
* ``small``: 10 ids x dim 16, no numeric column -> 64-32-1, batch 256 (a public app-usage
  dataset's shape).

``--stage`` picks the design of the lookup path (issue 25, "a shorter lookup path"):

* ``process`` (default, the library's default): the embedding worker in its own process, behind
  a pipe and shared-memory rings, a gRPC client to the shard process;
* ``thread``: the embedding stage in a thread of the NN worker process
  (``TrainerConfig(embedding_stage="thread")``): no process crossing, no serialization of
  the batch's ids, embeddings and gradients; still gRPC to the shard process;
* ``embedded`` (this script only, a measurement of the embedded-shard design): the ``thread``
  stage whose client's channel calls a :class:`~embeddb.server.servicer.StoreServicer` of a
  :class:`~embeddb.engine.shard.Shard` opened in this process with its update log (as
  ``embeddb serve`` opens it), the requests passed by reference: no gRPC, no socket, no shard
  process (the shard's handling shows in the NN process's CPU, not in ``shard_ms``).

Three measurements per model, each on a fresh cluster after ``--warmup`` untimed batches:

1. **Timers** (pass 1): the NN worker's phases, timed with ``time.perf_counter`` by wrapping
   the context's own methods (this script only; nothing in the library changes): preparing a
   batch (``prepare``'s next: id features collected, the ``Lookup`` pickled and written to the
   pipe), waiting for its pooled embeddings, building tensors, the model's forward, the loss,
   ``loss.backward``, extracting the embedding gradients, sending them, the dense step. The
   embedding worker's own histograms (``embeddb_trainer_*_seconds``) give its plan + pooling,
   its lookup call and its un-pooling + push, and the shard's ``embeddb_request_seconds``
   (scraped from its metrics endpoint) its handling time per method. Every process's CPU
   seconds per batch come from ``/proc/<pid>/stat`` (and the NN worker's per thread, which
   shows torch's OpenMP threads).
2. **Pickling** (offline, same process): ``ForkingPickler`` dumps + loads of the three big
   messages of a batch (``Lookup``, ``PooledEmbeddings``, ``Gradients``), as the pipe does.
3. **Sampling** (pass 2, ``--py-spy``): ``py-spy record --nonblocking`` on the three processes
   while they train (a separate pass: py-spy's own CPU would disturb pass 1's timers on two
   cores); the samples of each process are grouped into categories (``CATEGORIES``) by the
   innermost frame that matches, and scaled by that process's CPU seconds per batch.

Usage::

    PYTHONPATH=. python benchmarks/profile_step.py                 # both models, timers only
    PYTHONPATH=. python benchmarks/profile_step.py --py-spy        # + sampled breakdown
    PYTHONPATH=. python benchmarks/profile_step.py --model small --batches 400

Ends with one JSON line (per model: ``samples_per_s``, ``nn_ms`` per phase, ``worker_ms``,
``shard_ms``, ``cpu_ms`` per process, ``pickle_ms``, ``spy`` categories).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _embedded_shard import embedded_shard
from _figures import draw
from _plots import add_out_dir_argument
from _report import finish, say
from _train_models import DenseNet
from torch import nn

import embeddb.trainer.ctx as ctx_module
from embeddb.config import EmbeddingConfig
from embeddb.features import SyntheticCriteo, SyntheticCriteoConfig
from embeddb.server.cluster import Cluster, ClusterConfig
from embeddb.trainer import Batch, EmbeddingWorkerConfig, Mode, TrainCtx, TrainerConfig
from embeddb.trainer.embedding import protocol as msg


@dataclass(frozen=True)
class Shape:
    """A model of the profile: ID features, numeric columns, dim, MLP, batch size."""

    num_id: int
    num_dense: int
    dim: int
    hidden: tuple[int, ...]
    batch: int


MODELS = {
    "criteo": Shape(26, 13, 16, (256, 128), 512),
    "small": Shape(10, 0, 16, (64, 32), 256),
}

# py-spy categories per process: the innermost frame matching a pattern (function name or
# file) names the category; first match in this order wins at the same frame.
CATEGORIES: dict[str, list[tuple[str, str]]] = {
    "nn": [
        ("send/recv (pickle, pipe)", r"connection\.py|reduction\.py|_send_bytes|_recv"),
        ("wait for embeddings", r"\bresult \(concurrent|_embedding_tensors.*\bwait\b|wait \(thr"),
        ("embedding grads -> numpy", r"embedding_gradients"),
        ("loss.backward", r"\bbackward \(torch|_engine_run_backward|run_backward"),
        ("dense optimizer step", r"\bstep \(.*optim|_single_tensor_sgd|sgd\.py"),
        ("model forward", r"\bforward \(|_call_impl|linear|relu"),
        ("tensors from numpy", r"_tensor \(|_inputs \("),
        ("batch prep (submit)", r"_submit|_prefetch"),
        ("loss", r"binary_cross_entropy"),
    ],
    "worker": [
        ("pickle/pipe", r"connection\.py|reduction\.py|_ForkingPickler|\bsend \(|\brecv \("),
        ("plan + dedup", r"plan_lookup|IdBatch|\bencode \(|dedup"),
        ("pooling", r"pool_lookup|\bpool \(|expand \("),
        ("unpool + sum", r"_unpool|unpool \(|sum_rows"),
        ("grpc client (encode, call, decode)", r"embeddb/client/|embeddb/wire|grpc"),
        ("asyncio loop", r"asyncio/|selectors\.py"),
        ("queue / thread hand-off", r"queue\.py|threading\.py"),
    ],
    "shard": [
        ("decode request", r"decode|FromString|ParseFrom|frombuffer"),
        ("encode response", r"encode|SerializeToString|tobytes"),
        ("optimizer (apply_gradients)", r"apply_gradients|optim/|adagrad"),
        ("lookup (hash index, rows)", r"\blookup|hash_index|gather|storage/"),
        ("grpc server + servicer", r"grpc|servicer|interceptor|rpc/"),
        ("asyncio loop", r"asyncio/|selectors\.py"),
    ],
}


# ------------------------------------------------------------------------------------ helpers
def embedding_yaml(shape: Shape, capacity: int) -> str:
    names = [f"C{i}" for i in range(1, shape.num_id + 1)]
    lines = ["feature_index_prefix_bit: 8", "seed: 0", "slots_config:"]
    lines += [f"  {n}: {{dim: {shape.dim}}}" for n in names]
    lines += ["feature_groups:", f"  all: [{', '.join(names)}]", "defaults:"]
    lines += [
        "  optimizer: {type: adagrad, lr: 0.05, initial_accumulator: 0.01, eps: 1e-10}",
        "  initializer: {type: normal, mean: 0.0, std: 0.05}",
        f"  capacity: {capacity * shape.num_id}",
        "store: {stripes: 4}",
    ]
    return "\n".join(lines) + "\n"


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of a process (threads of one name summed)."""
    out: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[name] += (int(fields[11]) + int(fields[12])) / _TICK
    return dict(out)


def scrape(port: int) -> dict[str, float]:
    """``embeddb_request_seconds`` sums and counts of a shard, keyed ``method:sum|count``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = defaultdict(float)
    for m in re.finditer(r"^embeddb_request_seconds_(sum|count)\{([^}]*)\} (\S+)$", text, re.M):
        method = re.search(r'method="([^"]+)"', m.group(2))
        out[f"{method.group(1) if method else '?'}:{m.group(1)}"] += float(m.group(3))
    return dict(out)


class Timers:
    """Named wall-clock accumulators; :meth:`wrap` times an attribute's calls."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.on = False

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            if self.on:
                self.total[name] += time.perf_counter() - began

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.time(name):
                return inner(*args, **kwargs)

        setattr(owner, attr, timed)


@contextlib.contextmanager
def cluster_of(yaml_text: str, workdir: Path, metrics_port: int) -> Iterator[Cluster]:
    path = workdir / f"embedding-{time.monotonic_ns()}.yaml"
    path.write_text(yaml_text)
    cluster = Cluster(
        ClusterConfig(
            num_shards=1,
            config_path=path,
            ephemeral=True,
            log_level="warning",
            metrics_base_port=metrics_port,
        ),
        output=lambda line: None,
    )
    try:
        cluster.start()
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_hist(stats: dict[str, float], name: str) -> tuple[float, float]:
    return stats.get(f"embeddb_trainer_{name}_seconds_sum", 0.0), stats.get(
        f"embeddb_trainer_{name}_seconds_count", 0.0
    )


# ------------------------------------------------------------------------------------ passes
def timed_pass(
    shape: Shape,
    yaml_text: str,
    batches: Sequence[Batch],
    warmup: int,
    workdir: Path,
    spy_seconds: float | None,
    threads: int | None,
    stage: str = "process",
) -> dict[str, Any]:
    """Train on ``batches``; time the last ``len(batches) - warmup`` of them."""
    port = free_port()
    timers = Timers()
    out: dict[str, Any] = {}
    remote = stage != "embedded"
    with contextlib.ExitStack() as stack:
        if remote:
            cluster = stack.enter_context(cluster_of(yaml_text, workdir, port))
            addresses = list(cluster.addresses)
            pid = cluster.pids()[0]
            assert pid is not None
            shard_pid = pid
        else:
            stack.enter_context(embedded_shard(yaml_text, workdir))
            addresses = ["127.0.0.1:1"]  # never dialled: the channel is in-process
            shard_pid = os.getpid()
        torch.manual_seed(0)
        model = DenseNet(shape.num_dense, shape.num_id, shape.dim, shape.hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = nn.BCEWithLogitsLoss()
        config = TrainerConfig(
            mode=Mode.HYBRID,
            device="cpu",
            worker=EmbeddingWorkerConfig(max_staleness=4),
            torch_threads=threads,
            embedding_stage="process" if stage == "process" else "thread",
        )
        emb = EmbeddingConfig.from_yaml_text(yaml_text)
        with TrainCtx(model, opt, emb, addresses, config) as ctx:
            worker_pid = ctx._worker.pid
            timers.wrap(ctx._worker, "lookup", "send Lookup (pickle + pipe)")
            timers.wrap(ctx._worker, "push_gradients", "send Gradients (pickle + pipe)")
            timers.wrap(ctx, "_embedding_tensors", "embeddings -> leaf tensors")
            timers.wrap(ctx, "_inputs", "numeric + labels -> tensors")
            timers.wrap(ctx.dense, "backward", "loss.backward")
            timers.wrap(ctx.dense, "step", "dense optimizer step")
            original_grads = getattr(ctx_module, "embedding_gradients")  # noqa: B009
            setattr(  # noqa: B010
                ctx_module,
                "embedding_gradients",
                functools.partial(_timed_call, timers, "embedding grads -> numpy", original_grads),
            )
            try:
                pids = {"nn": os.getpid(), "worker": worker_pid, "shard": shard_pid}
                pids = {k: p for k, p in pids.items() if k == "nn" or p != os.getpid()}
                spy: subprocess.Popen[bytes] | None = None
                stream = ctx.prepare(batches)
                step = 0
                began = time.perf_counter()
                cpu0: dict[str, float] = {}
                threads0: dict[str, float] = {}
                shard0: dict[str, float] = {}
                stats0: dict[str, float] = {}
                while True:
                    if step == warmup:
                        ctx.flush()
                        timers.on = True
                        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
                        threads0 = thread_cpu(os.getpid())
                        shard0 = scrape(port) if remote else {}
                        stats0 = ctx.worker_stats()
                        if spy_seconds is not None:
                            spy = _start_spy(pids, workdir, spy_seconds)
                        began = time.perf_counter()
                    with timers.time("prepare (next batch: ids, Lookup sent)"):
                        prepared = next(stream, None)
                    if prepared is None:
                        break
                    with timers.time("wait for pooled embeddings"):
                        prepared.embeddings.result()
                    with timers.time("forward (total)"):
                        output, labels = ctx.forward(prepared)
                    with timers.time("loss"):
                        loss = loss_fn(output, labels[0])
                    with timers.time("backward (total)"):
                        ctx.backward(loss)
                    step += 1
                wall = time.perf_counter() - began
                timers.on = False
                cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
                threads1 = thread_cpu(os.getpid())
                shard1 = scrape(port) if remote else {}
                stats1 = ctx.worker_stats()
                if spy is not None:
                    out["spy"] = _finish_spy(spy, pids, workdir)
            finally:
                setattr(ctx_module, "embedding_gradients", original_grads)  # noqa: B010
            out["torch_threads"] = torch.get_num_threads()
    n = len(batches) - warmup
    per = 1000.0 / n
    nn_ms = {k: v * per for k, v in timers.total.items()}
    nn_ms["model forward (rest of forward)"] = nn_ms.pop("forward (total)") - (
        nn_ms["embeddings -> leaf tensors"] + nn_ms["numeric + labels -> tensors"]
    )
    nn_ms["backward: rest (bookkeeping)"] = nn_ms.pop("backward (total)") - (
        nn_ms["loss.backward"]
        + nn_ms["dense optimizer step"]
        + nn_ms["embedding grads -> numpy"]
        + nn_ms["send Gradients (pickle + pipe)"]
    )
    nn_ms["prepare: rest (generator, checks)"] = (
        nn_ms.pop("prepare (next batch: ids, Lookup sent)") - nn_ms["send Lookup (pickle + pipe)"]
    )
    nn_ms["wall per batch"] = wall * per
    worker_ms: dict[str, float] = {}
    for name, label in (
        ("pooling", "plan + dedup + pooling"),
        ("lookup", "lookup call (gRPC, awaited)"),
        ("gradient_push", "unpool + push call (awaited)"),
    ):
        s1, c1 = worker_hist(stats1, name)
        s0, c0 = worker_hist(stats0, name)
        worker_ms[label] = 1000.0 * (s1 - s0) / max(c1 - c0, 1)
    shard_ms = {
        key.split(":")[0]: 1000.0 * (shard1[key] - shard0.get(key, 0.0)) / n
        for key in shard1
        if key.endswith(":sum") and shard1[key] > shard0.get(key, 0.0)
    }
    out.update(
        samples_per_s=n * shape.batch / wall,
        nn_ms=nn_ms,
        worker_ms=worker_ms,
        shard_ms=shard_ms,
        cpu_ms={k: 1000.0 * (cpu1[k] - cpu0[k]) / n for k in pids},
        nn_threads_ms={
            k: 1000.0 * (v - threads0.get(k, 0.0)) / n
            for k, v in threads1.items()
            if v - threads0.get(k, 0.0) > 0.0
        },
    )
    return out


def _timed_call(timers: Timers, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    with timers.time(name):
        return fn(*args)


def _start_spy(pids: dict[str, int], workdir: Path, seconds: float) -> subprocess.Popen[bytes]:
    """One py-spy per process, in the background (a shell runs them and waits for all)."""
    cmds = [
        f"py-spy record --nonblocking --rate 250 --format raw --duration {int(seconds)} "
        f"--pid {pid} --output {workdir / (role + '.txt')} >/dev/null 2>&1"
        for role, pid in pids.items()
    ]
    return subprocess.Popen(["bash", "-c", " & ".join(cmds) + " & wait"])


def _finish_spy(
    spy: subprocess.Popen[bytes], pids: dict[str, int], workdir: Path
) -> dict[str, dict[str, float]]:
    spy.wait()
    shares: dict[str, dict[str, float]] = {}
    for role in pids:
        path = workdir / f"{role}.txt"
        if path.exists():
            shares[role] = categorise(path.read_text(), CATEGORIES[role])
    return shares


def categorise(raw: str, categories: list[tuple[str, str]]) -> dict[str, float]:
    """Share of py-spy ``raw`` samples per category (innermost matching frame wins)."""
    counts: Counter[str] = Counter()
    compiled = [(name, re.compile(pattern)) for name, pattern in categories]
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        label = "other"
        for frame in reversed(frames):
            hit = next((name for name, rx in compiled if rx.search(frame)), None)
            if hit is not None:
                label = hit
                break
        counts[label] += int(count)
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in counts.most_common()}


def pickle_costs(batch: Batch, shape: Shape, reps: int = 200) -> dict[str, float]:
    """Milliseconds of ForkingPickler dumps + loads per message of one batch."""
    features = tuple(
        (f.name, f.values, None if f.single_id else f.offsets) for f in batch.id_type_features
    )
    pooled = [np.zeros((batch.batch_size, shape.dim), np.float32) for _ in features]
    messages = {
        "Lookup": msg.Lookup(0, True, features),
        "PooledEmbeddings": msg.PooledEmbeddings(0, pooled),  # type: ignore[arg-type]
        "Gradients": msg.Gradients(0, tuple(pooled), 0),
    }
    out: dict[str, float] = {}
    for name, message in messages.items():
        began = time.perf_counter()
        for _ in range(reps):
            data = bytes(ForkingPickler.dumps(message))
            pickle.loads(data)
        out[name] = 1000.0 * (time.perf_counter() - began) / reps
        out[f"{name}_kB"] = len(data) / 1000.0
    return out


# ------------------------------------------------------------------------------------ report
def show(name: str, shape: Shape, result: dict[str, Any]) -> None:
    stage = result.get("stage", "process")
    say(f"\n== {name} ({stage}): {shape} -- {result['samples_per_s']:,.0f} samples/s ==")
    say(f"torch threads {result['torch_threads']}")
    say("NN worker, ms per batch (wall):")
    for k, v in sorted(result["nn_ms"].items(), key=lambda kv: -kv[1]):
        say(f"  {k:<44}{v:8.3f}")
    say("embedding worker, ms per batch (its histograms; overlapping training):")
    for k, v in result["worker_ms"].items():
        say(f"  {k:<44}{v:8.3f}")
    say("shard, handling ms per batch (deserialized request to response):")
    for k, v in result["shard_ms"].items():
        say(f"  {k:<44}{v:8.3f}")
    say("CPU ms per batch per process:")
    for k, v in result["cpu_ms"].items():
        say(f"  {k:<44}{v:8.3f}")
    say("NN worker CPU ms per batch per thread:")
    for k, v in sorted(result["nn_threads_ms"].items(), key=lambda kv: -kv[1]):
        say(f"  {k:<44}{v:8.3f}")
    say("pickling (dumps + loads) ms per message, and size:")
    pk = result["pickle_ms"]
    for k in ("Lookup", "PooledEmbeddings", "Gradients"):
        say(f"  {k:<44}{pk[k]:8.3f}  ({pk[k + '_kB']:.0f} kB)")
    for role, shares in result.get("spy", {}).items():
        cpu = result["cpu_ms"][role]
        say(f"py-spy {role} ({cpu:.2f} CPU ms/batch in pass 1):")
        for k, v in shares.items():
            say(f"  {k:<44}{100 * v:6.1f} %  ~{v * cpu:6.2f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("criteo", "small", "both"), default="both")
    parser.add_argument("--batches", type=int, default=240, help="timed batches per model")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--cardinality", type=int, default=200_000)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: the core budget's")
    parser.add_argument(
        "--stage",
        choices=("process", "thread", "embedded"),
        default="process",
        help="the lookup path's design (see the module docstring)",
    )
    parser.add_argument("--py-spy", action="store_true", help="also a sampled pass (py-spy)")
    parser.add_argument("--spy-dir", type=Path, default=None, help="keep py-spy's raw files")
    add_out_dir_argument(parser, "profile_step")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.py_spy and shutil.which("py-spy") is None:
        parser.error("--py-spy needs py-spy on PATH (pip install py-spy)")
    names = ["criteo", "small"] if args.model == "both" else [args.model]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="embeddb-profile-") as tmp:
        workdir = Path(tmp)
        for name in names:
            spy_dir = workdir
            if args.spy_dir is not None:
                spy_dir = args.spy_dir / name
                spy_dir.mkdir(parents=True, exist_ok=True)
            shape = MODELS[name]
            data = SyntheticCriteo(
                SyntheticCriteoConfig(
                    num_id_features=shape.num_id,
                    num_dense=shape.num_dense,
                    cardinality=args.cardinality,
                )
            )
            total = (args.warmup + args.batches) * shape.batch
            batches = list(data.batches(total, shape.batch, "train"))
            yaml_text = embedding_yaml(shape, args.cardinality)
            threads = args.torch_threads or None
            result = timed_pass(
                shape, yaml_text, batches, args.warmup, workdir, None, threads, args.stage
            )
            result["stage"] = args.stage
            result["pickle_ms"] = pickle_costs(batches[0], shape)
            if args.py_spy:
                seconds = 0.8 * args.batches * result["nn_ms"]["wall per batch"] / 1000.0
                sampled = timed_pass(
                    shape,
                    yaml_text,
                    batches,
                    args.warmup,
                    spy_dir,
                    max(seconds, 1.0),
                    threads,
                    args.stage,
                )
                result["spy"] = sampled.get("spy", {})
                result["spy_pass_samples_per_s"] = sampled["samples_per_s"]
            show(name, shape, result)
            results[name] = result
    summary = [
        f"{name}: {r['samples_per_s']:,.0f} samples/s, "
        f"{r['nn_ms']['wall per batch']:.2f} ms per batch"
        for name, r in results.items()
    ]
    result = draw({"bench": "profile_step", "models": results}, args.out_dir)
    return finish(result, started, summary, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
