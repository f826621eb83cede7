"""The lifecycle of one shard process: open the shard, serve it, shut down in a fixed order.

``embeddb serve`` parses argv and files into config objects and calls :func:`run_daemon`, which
reads nothing else. The life of the process (its generic steps:
:mod:`embeddb.transport.rpc.lifecycle`)::

    warm_up_core()                compile the numba kernels, or load them from the cache
    umask 0o077                   every file the process creates is 0600, every directory
                                  0700 (restored when run_daemon returns)
    open Shard(data_dir)          makes data_dir 0700; reopens after a clean shutdown,
                                  recovers after a crash (newest verified snapshot + update
                                  log), or restores the snapshot ``restore`` names
    build_server(shard)           health SERVING on every service
    write the port file           (temp file + rename) so a supervisor can find a port-0 server
    log "serving shard i/n on host:port (data dir ...)"
    ... wait for SIGTERM / SIGINT (or the ``stop`` event, or the parent process to die) ...
    health NOT_SERVING            load balancers and the cluster supervisor stop routing here
    stop accepting, grace         in-flight calls get ``grace`` seconds to finish
    shard.close()                 write dirty rows back, record clean-shutdown.json
    remove the port file; return 0

A signal that arrives while the shard is still opening is honoured as soon as it is open, so the
directory is always left with its clean-shutdown record.

With ``DaemonOptions.follow`` (``embeddb serve --follow ADDRESS``) the process serves a
read-only follower of that primary instead (:mod:`embeddb.server.follower`; it serves the
primary's tables and place unless given them): the server starts NOT_SERVING with no shard,
turns SERVING once the follower has bootstrapped from the primary's snapshot, and at shutdown
the follower stops after the server (its replica is deleted: a follower bootstraps again when
it restarts). A follower that cannot go on (its primary serves
another shard, or other tables than its config) ends the process with exit code 1.

With ``DaemonOptions.parent_pid`` (``embeddb serve --parent-pid``, set by the cluster supervisor)
the daemon checks every half second that ``os.getppid()`` is still that process, and shuts down
as on SIGTERM once it is not: a parent that died, even by SIGKILL and even before the check
first ran, leaves no orphan serving. This relies on POSIX re-parenting of orphans (Linux, macOS,
the BSDs); where a process keeps its dead parent's id (Windows) the check never fires.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from embeddb.common.allocator import limit_arenas
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.engine.warmup import warm_up_core
from embeddb.errors import ConfigError
from embeddb.server.app import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.server.metrics import FollowerCollector
from embeddb.transport.rpc.assembly import RpcServer
from embeddb.transport.rpc.lifecycle import server_process, wait_for_stop, write_atomically

__all__ = ["DaemonOptions", "run_daemon"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    """Process-level settings of one shard server.

    Attributes:
        data_dir: the shard's data directory; ``None`` keeps rows in a temporary directory that
            is removed at exit (nothing persists).
        grace: seconds in-flight calls may run after the server stops accepting new ones.
        port_file: where to write the bound port (one line) once serving; removed at shutdown.
        handle_signals: install SIGTERM/SIGINT handlers that begin the shutdown. Only possible
            in the main thread; elsewhere (tests driving the daemon in a thread) pass ``stop``.
        parent_pid: shut down (as on SIGTERM) once this process is no longer the parent.
        restore: start from this snapshot of ``data_dir`` (``Shard(restore=...)``): the state
            and update log after it are set aside.
        fallback: if the newest snapshot fails verification during crash recovery, recover
            from the next older one (``Shard(fallback=True)``) instead of refusing to start.
        cut_corrupt_log_tail: cut a corrupt update log tail (recorded in ``log-cuts.jsonl``)
            instead of refusing to start (``Shard(cut_corrupt_log_tail=True)``).
        follow: serve a read-only follower of this primary instead of a shard of our own;
            ``data_dir`` (a temporary directory when None) then holds its replica.
    """

    data_dir: Path | None = None
    grace: float = 5.0
    port_file: Path | None = None
    handle_signals: bool = True
    parent_pid: int | None = None
    restore: str | None = None
    fallback: bool = False
    cut_corrupt_log_tail: bool = False
    follow: FollowerOptions | None = None


def run_daemon(
    config: EmbeddingConfig | None,
    server_config: ServerConfig,
    options: DaemonOptions,
    stop: threading.Event | None = None,
) -> int:
    """Serve one shard until ``stop`` is set (by SIGTERM/SIGINT or by the caller); shut down.

    Meanwhile the process umask is ``0o077``
    (:func:`~embeddb.transport.rpc.lifecycle.private_umask`):
    the umask is process-wide, so in-process callers (tests) see it too until this returns.

    Args:
        config: the embedding config of the shard's tables; None only with
            ``options.follow``: the follower serves its primary's tables.
        server_config: how to serve it (host, port, shard index/count, limits).
        options: data directory, grace period, port file, signal handling, parent process.
        stop: the event that ends serving; a fresh one when ``None``.

    Returns:
        0 after a clean shutdown (the shard's clean-shutdown record is written); 1 when a
        follower stopped on an error retrying cannot fix.

    Raises:
        StorageError: the data directory is unusable or cannot be recovered.
        CorruptDataError: the data directory contradicts ``config``, or a snapshot failed
            verification (without ``fallback``).
        InvalidArgumentError: ``restore`` names no complete snapshot.
        OSError: the address cannot be bound or the port file cannot be written.
    """
    if server_config.tune_allocator:
        limit_arenas(1)  # before the shard's threads start (embeddb.common.allocator)
    stop = stop if stop is not None else threading.Event()
    # Before health reports SERVING, so that no call pays for compiling a kernel; before the
    # private umask, so that the files numba adds to its cache stay readable like the rest.
    logger.info("numba kernels compiled or loaded from cache in %.2fs", warm_up_core())
    # every file this process creates is 0600, every directory 0700; signals set `stop`
    with server_process(stop, options.handle_signals):
        if options.follow is not None:
            return _run_follower(config, server_config, options, options.follow, stop)
        if config is None:
            raise ConfigError("config", "a shard that is not a follower needs its config")
        return _run_shard(config, server_config, options, stop)


def _run_shard(
    config: EmbeddingConfig,
    server_config: ServerConfig,
    options: DaemonOptions,
    stop: threading.Event,
) -> int:
    """:func:`run_daemon` for a shard of our own."""
    index, count = server_config.shard_index or 0, server_config.num_shards or 1
    where = f"shard {index}/{count}"
    with ExitStack() as shutdown:  # runs the callbacks last-registered first
        if options.port_file is not None:
            shutdown.callback(options.port_file.unlink, missing_ok=True)
        shard = Shard(
            config,
            options.data_dir,
            shard_index=index,
            num_shards=count,
            restore=options.restore,
            fallback=options.fallback,
            cut_corrupt_log_tail=options.cut_corrupt_log_tail,
        )
        shutdown.callback(shard.close)
        recovery = shard.recovery
        if recovery.source not in ("new", "clean"):
            logger.warning(
                "%s: opened from %s%s at seq %d, %d log records replayed (seq %d, %.2fs)",
                where,
                recovery.source,
                f" {recovery.snapshot_id}" if recovery.snapshot_id else "",
                recovery.from_seq,
                recovery.replayed,
                recovery.seq,
                recovery.seconds,
            )
        served = build_server(shard, server_config)
        shutdown.callback(served.stop, options.grace)
        if options.port_file is not None:
            write_atomically(options.port_file, f"{served.port}\n")
        data = (
            os.path.abspath(options.data_dir)
            if options.data_dir is not None
            else "temporary, removed at exit"
        )
        logger.info(
            "serving %s on %s:%d (data dir %s)", where, server_config.listen.host, served.port, data
        )
        _log_extras(where, server_config, served)
        wait_for_stop(stop, parent_pid=options.parent_pid, where=where)
        logger.info("%s: health NOT_SERVING, draining calls (grace %gs)", where, options.grace)
    logger.info("%s stopped cleanly", where)
    return 0


def _run_follower(
    config: EmbeddingConfig | None,
    server_config: ServerConfig,
    options: DaemonOptions,
    follow: FollowerOptions,
    stop: threading.Event,
) -> int:
    """:func:`run_daemon` for a follower of ``follow.primary``."""
    index, count = server_config.shard_index, server_config.num_shards
    where = f"follower of {follow.primary}" + (
        f" (shard {index}/{count})" if index is not None and count is not None else ""
    )
    with ExitStack() as shutdown:  # runs the callbacks last-registered first
        if options.data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix="embeddb-follower-"))
            shutdown.callback(shutil.rmtree, data_dir, ignore_errors=True)
        else:
            data_dir = options.data_dir
        if options.port_file is not None:
            shutdown.callback(options.port_file.unlink, missing_ok=True)
        follower = Follower(
            config,
            data_dir,
            follow,
            shard_index=server_config.shard_index,
            num_shards=server_config.num_shards,
        )
        shutdown.callback(follower.stop)
        served = build_server(follower.served, server_config, serving=False)
        shutdown.callback(served.stop, options.grace)
        if served.metrics_registry is not None:
            served.metrics_registry.register(FollowerCollector(follower))
        follower.start(on_ready=lambda: served.set_serving(True))
        if options.port_file is not None:
            write_atomically(options.port_file, f"{served.port}\n")
        logger.info(
            "serving %s on %s:%d (data dir %s); NOT_SERVING until bootstrapped",
            where,
            server_config.listen.host,
            served.port,
            os.path.abspath(data_dir),
        )
        _log_extras(where, server_config, served)
        wait_for_stop(stop, parent_pid=options.parent_pid, failed=follower.done, where=where)
        logger.info("%s: health NOT_SERVING, draining calls (grace %gs)", where, options.grace)
    if follower.error is not None:
        logger.error("%s stopped: %s", where, follower.error)
        return 1
    logger.info("%s stopped cleanly", where)
    return 0


def _log_extras(where: str, server_config: ServerConfig, served: RpcServer) -> None:
    listen = server_config.listen
    if served.metrics_port is not None:
        logger.info(
            "%s metrics on http://%s:%d/metrics", where, listen.metrics_address, served.metrics_port
        )
    if listen.tls or listen.tokens is not None:
        logger.info(
            "%s: TLS %s, bearer tokens %s",
            where,
            "on" if listen.tls else "off",
            "required" if listen.tokens is not None else "not required",
        )
