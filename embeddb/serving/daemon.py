"""The lifecycle of one ``embeddb serve-model`` process, like ``embeddb serve``'s (its generic
steps: :mod:`embeddb.transport.rpc.lifecycle`)::

    umask 0o077                   every file the process creates is 0600 (restored at return)
    InferCtx(model_dir, shards)   load model.json, dense.pt, embedding.yaml (and the feature
                                  pipeline); reach the shards and check they serve the
                                  model's tables, or (--from-checkpoint) open the shards of
                                  the job checkpoint in-process, read-only
    build_model_server            warm up first (numba kernels compiled, one dummy record
                                  scored: no call pays for a compilation), then gRPC (+ HTTP,
                                  metrics); health SERVING
    gc.collect(); gc.freeze()     what start-up allocated (torch, grpc, the model: ~10^6
                                  objects) leaves the collector's generations, so a full
                                  collection no longer walks it in the middle of a request
    write the port file           JSON {"grpc": port, "http": port|null, "metrics": port|null}
                                  (temp file + rename) so a supervisor finds port-0 servers
    ... wait for SIGTERM / SIGINT (or the ``stop`` event) ...
    health NOT_SERVING, stop accepting, in-flight calls finish (grace), queued ones scored
    InferCtx.close(); remove the port file; return 0
"""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from embeddb.serving.infer import InferCtx
from embeddb.serving.server import ModelServerConfig, build_model_server
from embeddb.transport.rpc.lifecycle import server_process, wait_for_stop, write_atomically

__all__ = ["ModelDaemonOptions", "run_model_server"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDaemonOptions:
    """Process-level settings of ``embeddb serve-model``.

    Attributes:
        model_dir: the exported model directory.
        shards: the shards' ``host:port`` in shard order (followers in production), or the
            path of an address file; ``None`` with ``checkpoint_dir``.
        shard_token: bearer token for the shards (read-only is enough).
        shard_tls_ca: PEM CA file; the shards are reached over TLS.
        port_file: where to write the bound ports once serving; removed at shutdown.
        grace: seconds in-flight calls may run after SIGTERM.
        handle_signals: route SIGTERM/SIGINT to the shutdown (main thread only).
        checkpoint_dir: instead of shards: a job's checkpoint directory, whose latest
            checkpoint's shards are opened in-process, read-only
            (:meth:`InferCtx.from_checkpoint`).
        threads: torch intra-op threads (``torch.set_num_threads``); ``None`` leaves torch's
            default (``OMP_NUM_THREADS``, else one per core). Default 1: a model server's
            calls are small (1 to ``max_batch`` samples), its concurrency comes from the gRPC
            threads and micro-batching, and on a shared machine a second OpenMP thread makes
            every forward wait for a descheduled thread at its barrier (measured on 2 cores:
            the servicer's p99 was lower with 1 thread in 8 of 8 paired runs; see
            benchmarks/README.md, ``serve.py``).
    """

    model_dir: Path
    shards: Sequence[str] | Path | None
    shard_token: str | None = None
    shard_tls_ca: Path | None = None
    port_file: Path | None = None
    grace: float = 5.0
    handle_signals: bool = True
    checkpoint_dir: Path | None = None
    threads: int | None = 1


def run_model_server(
    config: ModelServerConfig,
    options: ModelDaemonOptions,
    stop: threading.Event | None = None,
) -> int:
    """Serve the model until ``stop`` is set (SIGTERM/SIGINT or the caller); shut down.

    Returns:
        0 after a clean shutdown.

    Raises:
        NotFoundError, CorruptDataError: the model directory is missing or malformed; no
            checkpoint (or snapshot) in ``checkpoint_dir``.
        ConfigError: the shards do not serve the model's tables.
        OSError: a port cannot be bound or the port file cannot be written.
        embeddb errors of the client: the shards cannot be reached.
    """
    stop = stop if stop is not None else threading.Event()
    # every file the process creates (the port file) is 0600, as embeddb serve's
    with server_process(stop, options.handle_signals), ExitStack() as shutdown:
        if options.port_file is not None:  # the callbacks run last-registered first
            shutdown.callback(options.port_file.unlink, missing_ok=True)
        if options.checkpoint_dir is not None:
            infer = InferCtx.from_checkpoint(
                options.model_dir, options.checkpoint_dir, threads=options.threads
            )
        else:
            infer = InferCtx(
                options.model_dir,
                options.shards,
                token=options.shard_token,
                tls_ca=options.shard_tls_ca,
                threads=options.threads,
            )
        shutdown.callback(infer.close)
        served = build_model_server(infer, config)
        shutdown.callback(served.stop, options.grace)
        gc.collect()
        gc.freeze()  # start-up's objects are never collected: keep them out of every pass
        shutdown.callback(gc.unfreeze)
        ports = served.ports()
        if options.port_file is not None:
            write_atomically(options.port_file, json.dumps(ports) + "\n")
        logger.info(
            "serving model %s on %s: gRPC %d, HTTP %s, metrics %s (shards %s; %s; "
            "max batch %d, max delay %g ms)",
            options.model_dir,
            config.listen.host,
            ports["grpc"],
            ports["http"] if ports["http"] is not None else "off",
            ports["metrics"] if ports["metrics"] is not None else "off",
            ", ".join(infer.addresses),
            "raw records" if infer.pipeline is not None else "pre-hashed records",
            config.max_batch,
            config.max_delay * 1e3,
        )
        wait_for_stop(stop, where="model server")
        logger.info("health NOT_SERVING, draining calls (grace %gs)", options.grace)
    logger.info("model server stopped cleanly")
    return 0
