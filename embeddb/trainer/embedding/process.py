"""The embedding worker in its own process, and the NN worker's handle on it.

Processes and threads (one embedding worker per NN worker rank)::

    NN worker process                                 embedding worker process (spawned)
    ─────────────────                                 ──────────────────────────────────
    training thread ── Lookup / Gradients / ... ──▶  reader thread ─▶ asyncio loop:
      (EmbeddingWorkerProcess.lookup, push, ...)          EmbeddingWorker (lookups, pooling,
    receiver thread ◀── PooledEmbeddings / Reply ──       pushes, expiry) + AsyncClient ─▶ shards
      (resolves futures; EOF = the worker died)      writer thread ◀─ answers of the loop

The transport is one duplex :func:`multiprocessing.Pipe` carrying pickled messages
(:mod:`embeddb.trainer.embedding.protocol`), their large array buffers (pooled embeddings,
gradients: 0.85
MB each at batch 512 x 26 features x dim 16) through two shared-memory rings
(:mod:`embeddb.trainer.embedding.channel`): the pipe then carries a few hundred bytes per message,
so
a sender never blocks waiting for the other process's reader thread to get a core and drain
the socket, which is what pickled arrays cost on a busy machine (2.3 ms per gradient message
on 2 cores before). The process is started with ``spawn`` (no fork of a process holding CUDA
or gRPC state) and never imports torch.

Failures are never silent: the receiver thread sees EOF as soon as the worker process exits and
fails every pending call with :class:`EmbeddingWorkerError` (naming its exit code); the worker
sees EOF as soon as the NN process exits, drains its pending pushes and exits. Waiting calls
are bounded by timeouts. A worker that dies while starting (before ``Ready``) leaves its
one-line cause in a start report the NN worker raises, e.g. the fix for a main script without
an ``if __name__ == "__main__":`` guard; the worker ignores SIGINT (Ctrl-C reaches only the
NN worker, whose context stops it): see :mod:`.spawn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from embeddb.client import AsyncClient, warm_up_client
from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig
from embeddb.errors import EmbeddbError
from embeddb.trainer.embedding import protocol as msg
from embeddb.trainer.embedding.channel import RingChannel, RingFiles
from embeddb.trainer.embedding.front import StageFront
from embeddb.trainer.embedding.metrics import WorkerMetrics
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.embedding.spawn import (
    StartReport,
    check_main_guard,
    ignore_sigint,
    report_failure,
)
from embeddb.trainer.embedding.worker import EmbeddingWorker, EmbeddingWorkerConfig
from embeddb.trainer.errors import EmbeddingWorkerError, TrainerError
from embeddb.transport.rpc.metrics_http import serve_metrics

__all__ = ["EmbeddingWorkerProcess", "serve"]

logger = logging.getLogger(__name__)

_JOIN_S = 10.0
_EXIT_WATCHDOG_S = 5.0
_SOCKET_BUFFER = 4 << 20  # bytes a message may queue in the pipe before its sender blocks


class EmbeddingWorkerProcess(StageFront):
    """Start an embedding worker process and talk to it (the NN worker's side).

    Thread-safe. Returns once the worker has checked the cluster (every table served with its
    ``dim``, the shards in address order).

    Args:
        embedding_config: tables and features.
        addresses: ``host:port`` of every shard, in shard order.
        config: the worker's settings.
        start_timeout: seconds to wait for the worker to be ready.

    Raises:
        ConfigError: the cluster does not serve the config's tables.
        EmbeddingWorkerError: the process could not start or reach the shards in time.
    """

    def __init__(
        self,
        embedding_config: EmbeddingConfig,
        addresses: Sequence[str],
        config: EmbeddingWorkerConfig,
        *,
        start_timeout: float = 120.0,
    ) -> None:
        check_main_guard()
        super().__init__()
        self.config = config
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        for end in (self._conn, child):
            _enlarge_buffers(end)
        self._rings = RingFiles()  # large arrays through shared memory (.shm_channel)
        self._channel = RingChannel.open(self._conn, self._rings.paths, worker_side=False)
        self._process = ctx.Process(
            target=serve,
            args=(child, embedding_config, tuple(addresses), config, self._rings.paths),
            name="embeddb-embedding-worker",
            daemon=True,
        )
        self._report = StartReport()
        try:
            with self._report.starting():
                self._process.start()
        except BaseException:
            self._report.close()
            self._rings.unlink()
            raise
        child.close()
        self._send_lock = threading.Lock()
        self._join_lock = threading.Lock()  # one reaper at a time (waitpid races otherwise)
        self._requests: dict[int, Future[dict[str, float]]] = {}  # under _lock
        self._request_ids = itertools.count()
        self._torn = False  # a send was interrupted (Ctrl-C): the pipe may hold half a message
        try:
            self.pid = self._await_ready(start_timeout)
        except BaseException:
            self._kill()
            raise
        finally:
            self._report.close()
            self._rings.unlink()  # mapped by the worker by now (or it failed): files not needed
        self._receiver = threading.Thread(
            target=self._receive, name="embeddb-embedding-worker-receiver", daemon=True
        )
        self._receiver.start()

    def _await_ready(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.05):
            if self._exited(0):
                raise self._start_failure()
            if time.monotonic() > deadline:
                raise EmbeddingWorkerError(
                    f"the embedding worker was not ready within {timeout:.0f} s"
                )
        try:
            answer: msg.FromWorker = self._channel.recv()
        except (EOFError, OSError):
            raise self._start_failure() from None
        if isinstance(answer, msg.StartFailed):
            raise msg.error_from(
                answer.error, f"the embedding worker could not start: {answer.message}"
            )
        if not isinstance(answer, msg.Ready):
            raise EmbeddingWorkerError(f"the embedding worker started with {answer!r}")
        return answer.pid

    def _start_failure(self) -> EmbeddingWorkerError:
        """The worker died before Ready: its start report's line, else its exit code."""
        self._exited(_JOIN_S)
        reported = self._report.read()
        if reported is not None:
            return EmbeddingWorkerError(reported)
        return EmbeddingWorkerError(
            f"the embedding worker exited with code {self._process.exitcode} while starting "
            "(its error is printed above)"
        )

    # ------------------------------------------------------------------ calls
    def _submit_lookup(self, batch_ref: int, features: tuple[IdFeature, ...], train: bool) -> None:
        self._send(msg.Lookup(batch_ref, train, features))

    def push_gradients(
        self, batch_ref: int, grads: Sequence[F32 | None], nonfinite: int = 0
    ) -> None:
        """Send a batch's embedding gradients (one float32 array or ``None`` per feature)."""
        self._send(msg.Gradients(batch_ref, tuple(grads), int(nonfinite)))

    def discard(self, batch_ref: int) -> None:
        """Tell the worker no gradients will come for ``batch_ref``."""
        self._send(msg.Discard(batch_ref))

    def flush(self, timeout: float) -> None:
        """Wait until every gradient push sent so far has been answered by the shards."""
        self._request(msg.Flush, timeout)

    def stats(self, timeout: float = 30.0) -> dict[str, float]:
        """The worker's metrics (see :mod:`embeddb.trainer.embedding.metrics`)."""
        return self._request(msg.Stats, timeout)

    def close(self, timeout: float = 60.0) -> dict[str, float] | None:
        """Drain pending pushes, stop the worker, wait for its exit; returns its final metrics
        (``None`` if it was already gone). After a send cut short by Ctrl-C the pipe cannot
        carry a request: the worker is terminated instead. Idempotent."""
        with self._lock:
            if self._closing:
                return None
            self._closing = True
            dead = self._dead is not None
        final: dict[str, float] | None = None
        if self._torn and not dead:
            self._process.terminate()  # quiet: SIGTERM's default action, no traceback
        elif not dead:
            try:
                final = self._request(msg.Close, timeout)
            except EmbeddbError as exc:
                logger.warning("the embedding worker did not close cleanly: %s", exc)
        if not self._exited(_JOIN_S):
            logger.warning("the embedding worker (pid %d) did not exit; terminating it", self.pid)
            self._kill()
        self._conn.close()
        return final

    @property
    def alive(self) -> bool:
        return self._dead is None and not self._exited(0)

    def _exited(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the process to exit; whether it has. Joins (reaps)
        happen under one lock: two threads reaping at once can see a dead child as alive."""
        with self._join_lock:
            self._process.join(timeout)
            return self._process.exitcode is not None

    # ------------------------------------------------------------------ plumbing
    def _request(self, kind: type[msg.Request], timeout: float) -> dict[str, float]:
        """Send a request of ``kind`` and wait for its :class:`~.protocol.Reply`'s payload."""
        request = next(self._request_ids)
        future: Future[dict[str, float]] = Future()
        with self._lock:
            self._check_alive()
            self._requests[request] = future
        self._send(kind(request))
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise EmbeddingWorkerError(
                f"the embedding worker did not answer {kind.__name__.lower()} within "
                f"{timeout:.0f} s"
            ) from None

    def _send(self, message: msg.ToWorker) -> None:
        with self._send_lock:
            if self._torn:
                raise EmbeddingWorkerError(
                    "a message to the embedding worker was interrupted; the context must be closed"
                )
            try:
                self._channel.send(message)
            except (OSError, ValueError) as exc:  # broken pipe, or closed connection
                self._mark_dead()
                raise self._dead or EmbeddingWorkerError("the embedding worker is gone") from exc
            except BaseException:  # KeyboardInterrupt between two writes of one message
                self._torn = True
                raise

    def _receive(self) -> None:
        try:
            while True:
                self._dispatch(self._channel.recv())
        except (EOFError, OSError):
            pass
        except Exception:  # a bug in dispatch: never die silently
            logger.exception("the embedding worker receiver failed")
        self._mark_dead()

    def _dispatch(self, message: msg.FromWorker) -> None:
        if isinstance(message, msg.PooledEmbeddings):
            future = self._take_lookup(message.batch_ref)
            if future is not None:
                future.set_result(message.pooled)
        elif isinstance(message, msg.LookupFailed):
            future = self._take_lookup(message.batch_ref)
            if future is not None:
                future.set_exception(msg.error_from(message.error, message.message, message.cause))
        elif isinstance(message, msg.Reply):
            with self._lock:
                request = self._requests.pop(message.request, None)
            if request is not None:
                request.set_result(message.payload)
        elif isinstance(message, msg.AsyncFailure):
            self._add_failure(msg.error_from(message.error, message.message, message.cause))
        else:
            logger.error("unexpected message from the embedding worker: %r", message)

    def _mark_dead(self) -> None:
        self._exited(1.0 if self._closing else 5.0)
        code = self._process.exitcode
        how = "exited" if code is not None else "stopped answering"
        cause = f"the embedding worker (pid {self._process.pid}) {how}" + (
            f" with code {code}" if code is not None else ""
        )
        marked = self._fail_pending(lambda: EmbeddingWorkerError(cause), self._requests)
        if marked and not self._closing:
            logger.error("%s", self._dead)

    def _kill(self) -> None:
        if not self._exited(0):
            self._process.kill()
            self._exited(_JOIN_S)


# ---------------------------------------------------------------------- the worker process
def serve(
    conn: multiprocessing.connection.Connection,
    embedding_config: EmbeddingConfig,
    addresses: tuple[str, ...],
    config: EmbeddingWorkerConfig,
    rings: tuple[str, str] | None = None,
) -> None:
    """The embedding worker process's main: serve the NN worker over ``conn`` until it closes
    the worker or goes away. Ignores SIGINT (the NN worker stops it); a failure before it is
    ready goes to its start report as one line."""
    ignore_sigint()
    _configure_logging(config.log_level)
    channel = RingChannel.open(conn, rings, worker_side=True)
    server = _Server(channel, embedding_config, addresses, config)
    try:
        asyncio.run(server.run())
        logger.debug("the event loop is closed")
    except Exception as exc:
        if not server.answered:
            report_failure(f"the embedding worker could not start: {type(exc).__name__}: {exc}")
        raise
    finally:
        channel.close()
        # Served and drained: should the interpreter's exit hang (a library thread), print
        # every thread's stack and exit anyway rather than linger.
        faulthandler.dump_traceback_later(_EXIT_WATCHDOG_S, exit=True)


def _configure_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            format=f"[embedding worker {os.getpid()}] %(levelname)s %(name)s: %(message)s"
        )
    logging.getLogger("embeddb").setLevel(level.upper())


class _Server:
    """Pipe facade of :class:`EmbeddingWorker`: a reader and a writer thread around its loop."""

    def __init__(
        self,
        conn: RingChannel,
        embedding_config: EmbeddingConfig,
        addresses: tuple[str, ...],
        config: EmbeddingWorkerConfig,
    ) -> None:
        self._conn = conn
        self._embedding_config = embedding_config
        self._addresses = addresses
        self._config = config
        self._outbox: queue.SimpleQueue[msg.FromWorker | None] = queue.SimpleQueue()
        self._tasks: set[asyncio.Task[None]] = set()
        self.answered = False  # Ready or StartFailed sent: the NN worker knows how it went

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        threads = self._config.threads or 1
        loop.set_default_executor(
            ThreadPoolExecutor(threads, thread_name_prefix="embeddb-worker-executor")
        )
        inbox: asyncio.Queue[msg.ToWorker | None] = asyncio.Queue()
        writer = threading.Thread(target=self._write, name="embeddb-worker-writer", daemon=True)
        writer.start()
        threading.Thread(
            target=self._read, args=(loop, inbox), name="embeddb-worker-reader", daemon=True
        ).start()
        cfg = self._config
        client = AsyncClient(self._addresses, cfg.client_options())
        metrics = WorkerMetrics(cfg.max_staleness)
        worker = EmbeddingWorker(
            client, self._embedding_config, cfg, metrics=metrics, on_failure=self._report
        )
        try:
            # Compile (or load) the client's numba kernels now: the first batch pays nothing.
            logger.debug("client kernels warmed up in %.3f s", warm_up_client())
            await worker.start()
            if cfg.metrics_port is not None:
                _serve_metrics(metrics, cfg.metrics_port)
        except Exception as exc:
            logger.error("cannot start: %s: %s", type(exc).__name__, exc)
            self.answered = True
            self._outbox.put(msg.StartFailed(type(exc).__name__, str(exc)))
            await client.close()
            self._stop_writer(writer)
            return
        self.answered = True
        self._outbox.put(msg.Ready(os.getpid()))
        expiry = loop.create_task(worker.run_expiry())
        close_request = await self._dispatch(worker, inbox)
        logger.debug("closing: draining pushes")
        await worker.close()
        logger.debug("closing: waiting for %d lookups", len(self._tasks))
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        expiry.cancel()
        if close_request is not None:
            self._outbox.put(msg.Reply(close_request, worker.stats()))
        logger.debug("closing: stopping the writer")
        self._stop_writer(writer)
        logger.debug("closed")

    async def _dispatch(
        self, worker: EmbeddingWorker, inbox: asyncio.Queue[msg.ToWorker | None]
    ) -> int | None:
        """Serve messages until :class:`~.protocol.Close` (returns its request id) or EOF
        (returns None)."""
        loop = asyncio.get_running_loop()
        while True:
            message = await inbox.get()
            if message is None:
                logger.warning("the NN worker went away; draining pending pushes and exiting")
                return None
            if isinstance(message, msg.Lookup):
                self._spawn(loop, self._lookup(worker, message))
            elif isinstance(message, msg.Gradients):
                worker.push_gradients(message.batch_ref, message.grads, message.nonfinite)
            elif isinstance(message, msg.Discard):
                worker.discard(message.batch_ref)
            elif isinstance(message, msg.Flush):
                self._spawn(loop, self._flush(worker, message.request))
            elif isinstance(message, msg.Stats):
                self._outbox.put(msg.Reply(message.request, worker.stats()))
            elif isinstance(message, msg.Close):
                return message.request
            else:
                logger.error("unexpected message from the NN worker: %r", message)

    def _spawn(self, loop: asyncio.AbstractEventLoop, coro: Any) -> None:
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _lookup(self, worker: EmbeddingWorker, request: msg.Lookup) -> None:
        batch_ref = request.batch_ref
        try:
            pooled = await worker.lookup(batch_ref, request.features, request.train)
        except TrainerError as exc:
            self._outbox.put(msg.LookupFailed(batch_ref, type(exc).__name__, str(exc), exc.cause))
        except Exception as exc:  # a bug: report it rather than leave the NN worker waiting
            logger.exception("lookup of batch %d failed", batch_ref)
            self._outbox.put(
                msg.LookupFailed(batch_ref, "LookupFailedError", str(exc), type(exc).__name__)
            )
        else:
            self._outbox.put(msg.PooledEmbeddings(batch_ref, pooled))

    async def _flush(self, worker: EmbeddingWorker, request: int) -> None:
        await worker.flush()
        self._outbox.put(msg.Reply(request, {}))

    def _report(self, error: TrainerError) -> None:
        self._outbox.put(msg.AsyncFailure(type(error).__name__, str(error), error.cause))

    def _read(
        self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[msg.ToWorker | None]
    ) -> None:
        message: msg.ToWorker | None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                message = None
            except Exception as exc:  # half a message (the NN worker interrupted mid-send)
                logger.warning("unreadable message from the NN worker (%s); stopping", exc)
                message = None
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, message)
            except RuntimeError:  # the loop is closed: the worker is exiting
                return
            if message is None or isinstance(message, msg.Close):
                return

    def _write(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                logger.warning("the NN worker went away; dropping answers")
                return

    def _stop_writer(self, writer: threading.Thread) -> None:
        self._outbox.put(None)
        writer.join(_JOIN_S)


def _enlarge_buffers(conn: multiprocessing.connection.Connection) -> None:
    """Let a whole message (a batch's pooled embeddings or gradients: 0.85 MB at batch 512 x
    26 features x dim 16) queue in the pipe's socket, so that its sender returns at once
    instead of blocking until the other process's reader thread is scheduled and drains it
    in 200 kB pieces (the kernel caps the size at ``net.core.wmem_max``)."""
    with (
        contextlib.suppress(OSError),
        socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)


def _serve_metrics(metrics: WorkerMetrics, port: int, host: str = "127.0.0.1") -> None:
    """Serve the worker's metrics at ``http://host:port/metrics`` (404 elsewhere), on loopback
    by default like the servers' endpoints; the thread ends with the process."""
    endpoint = serve_metrics(metrics.registry, host, port)
    logger.info("metrics on http://%s:%d/metrics", host, endpoint.port)
