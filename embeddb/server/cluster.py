"""A local cluster: N ``embeddb serve`` processes, started, health-checked and supervised.

``embeddb cluster`` is a thin CLI over :class:`Cluster`; tests drive the class in-process::

    cluster = Cluster(ClusterConfig(num_shards=2, ephemeral=True))
    cluster.start()
    addresses = cluster.wait_healthy()   # ["127.0.0.1:41231", "127.0.0.1:38915"], shard order
    code = cluster.supervise()           # until request_stop(); restarts shards that die
    cluster.stop()                       # SIGTERM each, wait, SIGKILL stragglers

Each shard process writes its bound port to a port file in a private run directory; the
supervisor reads it and then polls the gRPC health service until the shard is SERVING. The
address file holds one ``host:port`` per line in shard order (the client SDK reads this format).
A restarted shard is given the port it had before, so the address file stays valid.

Restart policy. A shard that exits while serving is restarted and logged
(``shard 2 exited with code -9; restarting``): at once the first time, then after
``restart_backoff`` seconds, doubling with each further restart within ``restart_window`` seconds.
A restart that fails (the process exits before it is healthy, or is not healthy within
``start_timeout``) is logged with the shard's own last output lines and retried with the same
backoff. The supervisor gives up on a shard (state ``FAILED``; with ``fail_fast`` the whole
cluster stops and :meth:`Cluster.supervise` returns 1) when it would need more than
``max_restarts`` restarts within ``restart_window`` seconds (a crash loop), or after
``max_restarts`` consecutive restarts that never became healthy, however long they took.

A persistent shard killed with SIGKILL restarts in its own directory and recovers every
acknowledged update from its newest snapshot and update log (:class:`embeddb.engine.shard.Shard`); a
shard whose directory cannot be recovered (a corrupt snapshot, say) refuses to start, the
supervisor logs the shard's reason and gives up after ``max_restarts`` attempts. It never moves
a shard to a fresh directory behind the user's back.

Shards die with the supervisor. Each shard is started with ``--parent-pid`` (the supervisor's
process id) and checks every half second that it is still its parent; once it is not (the
supervisor died, even by SIGKILL, and the shard was re-parented) the shard shuts down exactly as
on SIGTERM: drain, write rows back, record a clean shutdown. This works on every POSIX system.
(``PR_SET_PDEATHSIG`` is not used: Linux sends it when the *thread* that forked the child ends,
and :meth:`Cluster.supervise` may run in any thread.) Every shard's process id is logged when
it becomes healthy: ``shard 0 serving on 127.0.0.1:41231 (pid 12345)``.

TLS and metrics. With ``tls_cert``/``tls_key`` every shard serves TLS only, and the health
probe uses a TLS channel that trusts the certificate file itself as its root (right for a
self-signed certificate, and for a CA-issued one too: gRPC accepts the trusted leaf), checking
the name ``tls_server_name``, or ``host`` when it is unset. Health checks need no bearer token
(the server leaves the health service open), so shards that require tokens are probed alike. With
``metrics_base_port`` shard ``i`` serves Prometheus text at
``http://host:(metrics_base_port + i)/metrics`` (``metrics_host`` in place of ``host`` when set).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embeddb.errors import ConfigError, UnavailableError
from embeddb.transport.rpc.lifecycle import write_atomically
from embeddb.transport.wire import SERVICE_NAME

__all__ = ["Cluster", "ClusterConfig", "ShardState"]

logger = logging.getLogger(__name__)

_TAIL_LINES = 20  # a shard's last output lines, quoted when it fails
_POLL_S = 0.1
_KILL_MARGIN_S = 10.0  # beyond the grace: time for shard.close() to flush before SIGKILL


@dataclass(frozen=True)
class ClusterConfig:
    """How to run a local cluster of shard processes.

    Attributes:
        num_shards: number of shard processes.
        config_path: embedding config YAML passed to every shard (``None``: the packaged default).
        data_dir: root data directory; shard ``i`` uses ``data_dir/shard-i``.
        ephemeral: shards keep rows in temporary directories removed at exit (``data_dir`` unused).
        host: address every shard binds.
        base_port: shard ``i`` binds ``base_port + i``; 0 lets each pick a free port (kept across
            restarts).
        address_file: where to write ``host:port`` lines once all shards are healthy.
        grace: seconds each shard gives in-flight calls at shutdown.
        start_timeout: seconds a shard may take from spawn to SERVING.
        max_restarts: restarts a shard may need within ``restart_window``, and consecutive
            failed restarts it may have at all, before it is given up (see the restart policy).
        restart_window: seconds over which restarts are counted against ``max_restarts``.
        restart_backoff: delay before a restart that follows another within ``restart_window``
            (or a failed one), doubling with each further one.
        fail_fast: stop supervising (exit code 1) as soon as one shard is given up.
        tls_cert, tls_key: PEM certificate chain and private key files passed to every shard,
            which then serves TLS only; the health probe trusts ``tls_cert`` as its root.
        tls_server_name: the name the health probe expects the certificate to carry, when it
            does not name ``host`` (``grpc.ssl_target_name_override``); clients need the same.
        metrics_base_port: shard ``i`` serves Prometheus metrics on port
            ``metrics_base_port + i`` (kept across restarts); 0: no metrics endpoint.
        metrics_host: the address every shard's metrics endpoint binds (``--metrics-host``);
            None binds ``host``. Only with ``metrics_base_port``.
        log_level: ``--log-level`` of every shard.
        serve_args: extra ``embeddb serve`` options for every shard (``--workers 4``, ...).
        python: interpreter that runs ``-m embeddb.cli serve``; a wrapper script must ``exec``
            it, since a shard shuts down when the supervisor is no longer its parent process.
    """

    num_shards: int
    config_path: Path | None = None
    data_dir: Path = Path("embeddb-data")
    ephemeral: bool = False
    host: str = "127.0.0.1"
    base_port: int = 0
    address_file: Path | None = None
    grace: float = 5.0
    start_timeout: float = 120.0
    max_restarts: int = 3
    restart_window: float = 60.0
    restart_backoff: float = 0.5
    fail_fast: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None
    metrics_base_port: int = 0
    metrics_host: str | None = None
    log_level: str = "info"
    serve_args: tuple[str, ...] = ()
    python: str = field(default=sys.executable)

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ConfigError("num_shards", f"must be >= 1, got {self.num_shards}")
        if self.base_port and not 0 < self.base_port <= 65536 - self.num_shards:
            raise ConfigError(
                "base_port", f"ports {self.base_port}..+{self.num_shards - 1} are not all valid"
            )
        if self.max_restarts < 1:
            raise ConfigError("max_restarts", f"must be >= 1, got {self.max_restarts}")
        if not self.restart_window > 0:
            raise ConfigError("restart_window", f"must be > 0, got {self.restart_window}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert", "set both tls_cert and tls_key, or neither")
        if self.tls_server_name is not None and self.tls_cert is None:
            raise ConfigError("tls_server_name", "only meaningful with tls_cert and tls_key")
        n = self.num_shards
        if self.metrics_base_port and not 0 < self.metrics_base_port <= 65536 - n:
            raise ConfigError(
                "metrics_base_port", f"ports {self.metrics_base_port}..+{n - 1} are not all valid"
            )
        if self.metrics_host is not None and not self.metrics_base_port:
            raise ConfigError("metrics_host", "only meaningful with metrics_base_port")
        if (
            self.base_port
            and self.metrics_base_port
            and abs(self.base_port - self.metrics_base_port) < n
        ):
            raise ConfigError(
                "metrics_base_port",
                f"ports {self.metrics_base_port}..+{n - 1} overlap the gRPC ports "
                f"{self.base_port}..+{n - 1}",
            )


class ShardState(Enum):
    """Where a supervised shard process stands."""

    STARTING = "starting"  # spawned, not yet healthy
    SERVING = "serving"  # healthy
    WAITING = "waiting"  # exited; a restart is scheduled
    FAILED = "failed"  # given up: too many restarts (see the restart policy)
    STOPPED = "stopped"  # stopped by Cluster.stop()


@dataclass
class _Member:
    index: int
    port: int  # the port to bind next time; the bound one once serving
    port_file: Path
    state: ShardState = ShardState.STOPPED
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    started_at: float = 0.0
    next_start: float = 0.0
    failures: int = 0  # consecutive failed starts
    restarts: int = 0
    restart_times: deque[float] = field(default_factory=deque)  # within restart_window
    last_probe: str = "no port file yet"  # why the last health check was not SERVING
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    def last_words(self) -> str:
        lines = [line for line in self.tail if line.strip()]
        return "\n".join(f"    {line}" for line in lines[-5:]) or "    (no output)"


class Cluster:
    """Start, health-check, supervise and stop ``num_shards`` local shard processes.

    Args:
        config: the cluster's settings.
        output: receives every line a shard prints, prefixed ``[shard i]`` (default: stderr).

    Raises:
        ConfigError: ``config.tls_cert`` cannot be read.
    """

    def __init__(self, config: ClusterConfig, output: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._output = output if output is not None else _to_stderr
        self._probe_credentials: grpc.ChannelCredentials | None = None
        if config.tls_cert is not None:
            try:
                root = config.tls_cert.read_bytes()
            except OSError as exc:
                raise ConfigError("tls_cert", f"cannot read {config.tls_cert}: {exc}") from exc
            self._probe_credentials = grpc.ssl_channel_credentials(root_certificates=root)
        self._lock = threading.RLock()
        self._stop_requested = threading.Event()
        self._run_dir: Path | None = None
        self._members: list[_Member] = []

    # ------------------------------------------------------------------ queries
    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every shard, in shard order."""
        return [f"{self.config.host}:{m.port}" for m in self._members]

    def states(self) -> list[ShardState]:
        """The state of every shard, in shard order."""
        with self._lock:
            return [m.state for m in self._members]

    def pids(self) -> list[int | None]:
        """The process id of every shard (``None`` when it has none), in shard order."""
        with self._lock:
            return [m.process.pid if m.process else None for m in self._members]

    def restarts(self) -> list[int]:
        """How many times each shard has been restarted, in shard order."""
        with self._lock:
            return [m.restarts for m in self._members]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Spawn every shard process (returns at once; see :meth:`wait_healthy`)."""
        with self._lock:
            if self._members:
                raise RuntimeError("cluster already started")
            self._run_dir = Path(tempfile.mkdtemp(prefix="embeddb-cluster-"))
            cfg = self.config
            self._members = [
                _Member(
                    index=i,
                    port=cfg.base_port + i if cfg.base_port else 0,
                    port_file=self._run_dir / f"shard-{i}.port",
                )
                for i in range(cfg.num_shards)
            ]
            for member in self._members:
                self._spawn(member)

    def wait_healthy(self, timeout: float | None = None) -> list[str]:
        """Wait until every shard is SERVING; write the address file.

        Args:
            timeout: seconds to wait in all (default: ``start_timeout``).

        Returns:
            The shards' addresses in shard order.

        Raises:
            UnavailableError: a shard exited or was not healthy in time (the message names it
                and quotes its last output), or :meth:`request_stop` was called meanwhile.
        """
        limit = self.config.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            if self._stop_requested.is_set():
                raise UnavailableError("cluster start interrupted")
            with self._lock:
                pending = [m for m in self._members if m.state is not ShardState.SERVING]
                for member in pending:
                    code = self._check_starting(member)
                    if code is not None:
                        raise UnavailableError(
                            f"shard {member.index} failed to start (exit code {code}):\n"
                            f"{member.last_words()}"
                        )
                pending = [m for m in pending if m.state is not ShardState.SERVING]
            if not pending:
                break
            if time.monotonic() > deadline:
                first = pending[0]
                raise UnavailableError(
                    f"shard {first.index} was not healthy within {limit:g}s (last health check: "
                    f"{first.last_probe}); its last output:\n{first.last_words()}"
                )
            time.sleep(_POLL_S)
        addresses = self.addresses
        if self.config.address_file is not None:
            write_atomically(self.config.address_file, "".join(f"{a}\n" for a in addresses))
        return addresses

    def supervise(self) -> int:
        """Restart shards that die until :meth:`request_stop` is called (or a shard fails fast).

        Returns:
            0 if every shard was up at the end, 1 if one was given up.
        """
        while not self._stop_requested.wait(_POLL_S):
            with self._lock:
                if self._stop_requested.is_set():
                    break
                for member in self._members:
                    self._supervise_one(member)
                failed = [m.index for m in self._members if m.state is ShardState.FAILED]
            if failed and self.config.fail_fast:
                logger.error("shard %d failed; stopping the cluster (--fail-fast)", failed[0])
                return 1
        with self._lock:
            return 1 if any(m.state is ShardState.FAILED for m in self._members) else 0

    def request_stop(self) -> None:
        """Make :meth:`supervise` and :meth:`wait_healthy` return. Safe in a signal handler."""
        self._stop_requested.set()

    def stop(self) -> None:
        """SIGTERM every shard, wait ``grace`` + a margin for each, SIGKILL the stragglers.

        Idempotent. Also ends :meth:`supervise` in another thread.
        """
        self.request_stop()
        with self._lock:
            running = [m for m in self._members if m.process is not None]
            for member in running:
                assert member.process is not None
                if member.process.poll() is None:
                    member.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.config.grace + _KILL_MARGIN_S
            for member in running:
                assert member.process is not None
                try:
                    code = member.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("shard %d did not stop in time; sending SIGKILL", member.index)
                    member.process.kill()
                    code = member.process.wait()
                if code != 0 and member.state is ShardState.SERVING:
                    logger.warning("shard %d exited with code %d on shutdown", member.index, code)
                self._reap(member)
                member.state = ShardState.STOPPED
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)
                self._run_dir = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals
    def _command(self, member: _Member) -> list[str]:
        cfg = self.config
        cmd = [cfg.python, "-m", "embeddb.cli", "serve",
               "--shard-index", str(member.index), "--num-shards", str(cfg.num_shards),
               "--host", cfg.host, "--port", str(member.port),
               "--port-file", str(member.port_file), "--grace", str(cfg.grace),
               "--log-level", cfg.log_level, "--parent-pid", str(os.getpid())]  # fmt: skip
        if cfg.config_path is not None:
            cmd += ["--config", str(cfg.config_path)]
        if cfg.ephemeral:
            cmd.append("--ephemeral")
        else:
            cmd += ["--data-dir", str(cfg.data_dir / f"shard-{member.index}")]
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            cmd += ["--tls-cert", str(cfg.tls_cert), "--tls-key", str(cfg.tls_key)]
        if cfg.metrics_base_port:
            cmd += ["--metrics-port", str(cfg.metrics_base_port + member.index)]
            if cfg.metrics_host is not None:
                cmd += ["--metrics-host", cfg.metrics_host]
        return [*cmd, *cfg.serve_args]

    def _spawn(self, member: _Member) -> None:
        member.port_file.unlink(missing_ok=True)  # a stale file would name a dead server
        member.tail.clear()
        member.last_probe = "no port file yet"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which then
        # stops the shards in order instead of racing them.
        process = subprocess.Popen(
            self._command(member),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        member.process = process
        member.state = ShardState.STARTING
        member.started_at = time.monotonic()
        member.reader = threading.Thread(
            target=self._forward,
            args=(member.index, process, member.tail),
            name=f"embeddb-shard-{member.index}-output",
            daemon=True,
        )
        member.reader.start()

    def _forward(self, index: int, process: subprocess.Popen[str], tail: deque[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip("\n"))
            self._output(f"[shard {index}] {line}")
        process.stdout.close()

    def _reap(self, member: _Member) -> None:
        if member.reader is not None:
            member.reader.join(timeout=5.0)
            member.reader = None

    def _check_starting(self, member: _Member) -> int | None:
        """Advance a STARTING shard to SERVING if healthy; its exit code if it has died."""
        assert member.process is not None
        code = member.process.poll()
        if code is not None:
            self._reap(member)
            return code
        try:
            port = int(member.port_file.read_text())
        except (OSError, ValueError):
            return None  # not bound yet (the file is written atomically once serving)
        why_not = self._probe(f"{self.config.host}:{port}")
        if why_not is not None:
            member.last_probe = why_not
            return None
        member.port = port
        member.state = ShardState.SERVING
        member.failures = 0
        logger.info(
            "shard %d serving on %s:%d (pid %d)",
            member.index,
            self.config.host,
            port,
            member.process.pid,
        )
        return None

    def _probe(self, address: str) -> str | None:
        """None if the shard at ``address`` answers its health check with SERVING; else why not."""
        cfg = self.config
        if self._probe_credentials is None:
            channel = grpc.insecure_channel(address)
        else:
            options = []
            if cfg.tls_server_name is not None:
                options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
            channel = grpc.secure_channel(address, self._probe_credentials, options=options)
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1.0)
            except grpc.RpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def _supervise_one(self, member: _Member) -> None:
        now = time.monotonic()
        if member.state is ShardState.SERVING:
            assert member.process is not None
            code = member.process.poll()
            if code is not None:
                self._reap(member)
                self._schedule_restart(member, code)
        elif member.state is ShardState.STARTING:
            code = self._check_starting(member)
            if code is not None:
                self._failed_start(member, f"exited with code {code}")
            elif (
                member.state is ShardState.STARTING
                and now - member.started_at > self.config.start_timeout
            ):
                assert member.process is not None
                member.process.kill()
                member.process.wait()
                self._reap(member)
                self._failed_start(
                    member,
                    f"was not healthy within {self.config.start_timeout:g}s; last health check: "
                    f"{member.last_probe}",
                )
        elif member.state is ShardState.WAITING and now >= member.next_start:
            self._restart(member)

    def _restart(self, member: _Member) -> None:
        member.restarts += 1
        member.restart_times.append(time.monotonic())
        self._spawn(member)

    def _failed_start(self, member: _Member, why: str) -> None:
        member.failures += 1
        logger.error(
            "shard %d failed to restart (%s); its last output:\n%s",
            member.index,
            why,
            member.last_words(),
        )
        self._schedule_restart(member, None)

    def _schedule_restart(self, member: _Member, code: int | None) -> None:
        """Restart ``member``, whose process has exited, now, later or never (the restart policy).

        Args:
            code: the exit code of a shard that was serving; None after a failed start.
        """
        cfg = self.config
        now = time.monotonic()
        recent = member.restart_times
        while recent and recent[0] <= now - cfg.restart_window:
            recent.popleft()
        head = f"shard {member.index}" + (":" if code is None else f" exited with code {code};")
        down = f"{cfg.host}:{member.port} stays down"
        if member.failures >= cfg.max_restarts:
            member.state = ShardState.FAILED
            logger.error("%s giving up after %d failed restarts; %s", head, member.failures, down)
            return
        if len(recent) >= cfg.max_restarts:
            member.state = ShardState.FAILED
            logger.error(
                "%s giving up after %d restarts in the last %.1fs (at most %d within a "
                "restart window of %gs); %s",
                head,
                len(recent),
                now - recent[0],
                cfg.max_restarts,
                cfg.restart_window,
                down,
            )
            return
        attempts = max(len(recent), member.failures)
        if attempts == 0:
            logger.warning("%s restarting", head)
            self._restart(member)
            return
        delay = cfg.restart_backoff * 2 ** (attempts - 1)
        member.state = ShardState.WAITING
        member.next_start = now + delay
        if code is None:
            logger.warning("%s restart attempt %d in %.1fs", head, member.failures + 1, delay)
        else:
            logger.warning(
                "%s restarting in %.1fs (restart %d within %gs; at most %d)",
                head,
                delay,
                len(recent) + 1,
                cfg.restart_window,
                cfg.max_restarts,
            )


def _to_stderr(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()
