"""A follower: a read-only replica of one primary shard, fed over gRPC (docs/architecture.md §5).

The life of a follower (one thread; :meth:`Follower.start`, :meth:`Follower.stop`)::

    bootstrap     FetchSnapshot: the primary's newest snapshot (it takes one if it has none)
                  → DATA_DIR/replica-<n>/snapshots/<id>, verified (snapshot.verify) before use
                  → Shard(config, DATA_DIR/replica-<n>, restore=<id>, follower=True)
                  → swapped into the server's ServedShard; health SERVING (``on_ready``)
    follow        Subscribe(from_seq = shard.seq) → shard.apply_record(seq, payload) per record
    reconnect     the stream broke (primary restarting, network) or went silent for
                  ``dead_after`` seconds (an idle primary sends a heartbeat every second):
                  wait (exponential backoff, jittered) and Subscribe again from the last
                  applied seq
    re-bootstrap  the primary answers OUT_OF_RANGE (the records after our seq were truncated
                  away, or it is behind us: restored from an older snapshot), or a record does
                  not follow the last applied one: bootstrap a fresh shard into replica-<n+1>
                  while the old one keeps serving, swap it in, close and delete the old one;
                  each re-bootstrap is logged and waits first, twice as long as the one
                  before (from ``backoff`` up to ``max_bootstrap_backoff``, jittered) until
                  records flow again, so a primary that keeps refusing the feed is not
                  copied from in a tight loop

A snapshot the follower receives is bounded (``limits``,
:class:`~embeddb.server.follower_config.SnapshotLimits`: file count, bytes per file, bytes in
all); a primary sending more is treated like one sending a corrupt snapshot.

The follower's shard refuses every mutation, training lookups included, with
``FailedPreconditionError`` (FAILED_PRECONDITION); it serves evaluation lookups, ``Stats``,
``ListTables`` and ``DescribeTable``. Its directory holds nothing worth keeping: a restarted
follower bootstraps again, and ``replica-*`` directories of an earlier run are removed at start.

What it serves comes from the primary (:mod:`embeddb.server.follower_config`): before each
bootstrap the follower asks it which shard of how many it is (``DescribeShard``) and which
tables it serves (``ListTables``), and serves those, unless it was given a config and a place
of its own, which must then agree.

Errors that retrying cannot fix stop the follower (:attr:`Follower.error`; ``embeddb serve``
then exits 1): the primary serves another shard index or count than the follower was given,
other tables than the follower's config names (or a verified snapshot that config cannot
open), or the primary refuses the follower's token (UNAUTHENTICATED, or PERMISSION_DENIED:
``Subscribe`` and ``FetchSnapshot`` need a ``replica`` or ``rw`` token; an ``ro`` token may not
stream the log).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from embeddb.client.options import ClientOptions, check_address
from embeddb.client.plans import TableDescription
from embeddb.client.retry import RetryPolicy
from embeddb.config import EmbeddingConfig, StoreConfig
from embeddb.engine.durability.dirlock import DirectoryLock
from embeddb.engine.durability.snapshot import Chunk, SnapshotReceiver, read_manifest
from embeddb.engine.shard import Shard
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    EmbeddbError,
    OutOfRangeError,
    PermissionDeniedError,
    StorageError,
    UnauthenticatedError,
    UnavailableError,
)
from embeddb.server.follower_config import (
    PrimaryLayout,
    SnapshotLimits,
    adopted_config,
    disagreement,
    topology_disagreement,
)
from embeddb.server.served_shard import ServedShard
from embeddb.server.servicer import HEARTBEAT_S
from embeddb.transport.status import error_from_rpc
from embeddb.v1 import embeddb_pb2 as pb
from embeddb.v1 import embeddb_pb2_grpc as pb_grpc

__all__ = ["Follower", "FollowerOptions"]

logger = logging.getLogger(__name__)

_PRIMARY_MARKERS = ("disk", "log", "clean-shutdown.json", "base.json")


@dataclass(frozen=True)
class FollowerOptions:
    """How a follower reaches its primary.

    Attributes:
        primary: the primary shard's ``host:port``.
        client: the channel settings a client of the primary uses, of which the follower reads
            ``token`` (a ``replica`` token; ``rw`` works too; ``ro`` may not read the update log
            or snapshots), ``credentials`` (TLS; None: plaintext) and ``max_message_bytes``
            (the largest log record or snapshot chunk accepted).
        server_name: the name to expect in the primary's certificate when ``primary`` does not
            name it.
        backoff: the first reconnect waits about this many seconds, each further one twice as
            long up to ``max_backoff`` (jittered); reset once records flow again.
        max_backoff: cap of one reconnect delay, in seconds.
        max_bootstrap_backoff: cap of the wait before a re-bootstrap, in seconds (the waits
            start at ``backoff`` and double while re-bootstraps follow each other without
            records applied in between).
        limits: bounds on a snapshot received from the primary.
        dead_after: seconds without any message (the primary sends a heartbeat every second
            when idle) after which the feed is considered dead and reopened.
        store: the store settings of a follower that serves the primary's tables (no config of
            its own); None: the defaults.

    Raises:
        ConfigError: an invalid value.
    """

    primary: str
    client: ClientOptions = field(default_factory=ClientOptions)
    server_name: str | None = None
    backoff: float = 0.1
    max_backoff: float = 5.0
    dead_after: float = 5.0
    store: StoreConfig | None = None
    max_bootstrap_backoff: float = 60.0
    limits: SnapshotLimits = field(default_factory=SnapshotLimits)

    @property
    def reconnect_policy(self) -> RetryPolicy:
        """The waits between reconnects (only the backoff is used: the follower never stops)."""
        return RetryPolicy(initial_backoff=self.backoff, max_backoff=self.max_backoff)

    @property
    def bootstrap_policy(self) -> RetryPolicy:
        """The waits before re-bootstraps that follow each other (at least a reconnect's)."""
        return RetryPolicy(initial_backoff=self.backoff, max_backoff=self.max_bootstrap_backoff)

    def __post_init__(self) -> None:
        check_address(self.primary, "primary")
        if not 0 < self.backoff <= self.max_backoff:
            raise ConfigError(
                "backoff",
                f"need 0 < backoff <= max_backoff, got {self.backoff}, {self.max_backoff}",
            )
        if not self.backoff <= self.max_bootstrap_backoff:
            raise ConfigError(
                "max_bootstrap_backoff",
                f"must be at least backoff {self.backoff}, got {self.max_bootstrap_backoff}",
            )
        if not self.dead_after > HEARTBEAT_S:
            raise ConfigError(
                "dead_after",
                f"must exceed the heartbeat interval {HEARTBEAT_S}s, got {self.dead_after}",
            )

    @property
    def channel_options(self) -> list[tuple[str, Any]]:
        # gRPC's own reconnect backoff (up to 2 minutes by default) would delay resuming after a
        # primary restart; keep it within ours.
        options: list[tuple[str, Any]] = [
            *(o for o in self.client.channel_options if not o[0].endswith("reconnect_backoff_ms")),
            ("grpc.initial_reconnect_backoff_ms", int(self.backoff * 1000)),
            ("grpc.min_reconnect_backoff_ms", int(self.backoff * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(self.max_backoff * 1000)),
        ]
        if self.server_name is not None:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options


class _Fatal(Exception):
    """An error retrying cannot fix; ends the follower."""

    def __init__(self, error: EmbeddbError) -> None:
        super().__init__(str(error))
        self.error = error


class Follower:
    """Keeps a read-only replica of one primary shard up to date (see the module docstring).

    Args:
        config: the embedding config of the primary's tables; None: the tables the primary
            describes (:func:`~embeddb.server.follower_config.adopted_config`).
        data_dir: a directory of the follower's own (never a primary's data directory).
        options: how to reach the primary.
        shard_index, num_shards: the primary's place in its cluster; None: the place the
            primary reports. Its snapshots must agree.
        served: where to install the shard (the server's); a new one when None.

    Raises:
        StorageError: (from :meth:`start`) ``data_dir`` is a shard's data directory or unusable.
        DirectoryInUseError: (from :meth:`start`) another process uses ``data_dir``.
    """

    def __init__(
        self,
        config: EmbeddingConfig | None,
        data_dir: str | Path,
        options: FollowerOptions,
        *,
        shard_index: int | None = None,
        num_shards: int | None = None,
        served: ServedShard | None = None,
    ) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        self.options = options
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.layout: PrimaryLayout | None = None  # the primary, as last described
        self.served = served or ServedShard(
            empty_reason=f"this follower has not bootstrapped from its primary "
            f"{options.primary} yet",
            follower=True,
        )
        self.applied_records = 0
        self.reconnects = 0
        self.bootstraps = 0
        self.error: EmbeddbError | None = None
        self._primary_seq = 0
        self._applied_at: float | None = None  # the primary's time of the newest applied record
        self._progress = False
        self._replica = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.done = threading.Event()  # set when the follow loop has ended (stop or error)
        self._lock = threading.Lock()  # guards the call in progress
        self._call: Any = None
        self._watched = False
        self._last_message = 0.0
        self._on_ready: Callable[[], None] | None = None
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._threads: list[threading.Thread] = []
        self._dir_lock: DirectoryLock | None = None

    # ------------------------------------------------------------------ observed state
    @property
    def bootstrapped(self) -> bool:
        """Whether a shard has been bootstrapped and is served."""
        return self._ready.is_set()

    @property
    def applied_seq(self) -> int:
        """The last primary seq applied (0 before the first bootstrap)."""
        shard = self.served.current
        return shard.seq if shard is not None else 0

    @property
    def primary_seq(self) -> int:
        """The primary's last seq, as last heard (each message carries it)."""
        return self._primary_seq

    @property
    def lag_seq(self) -> int:
        """How many records the follower is behind the primary, as last heard."""
        return max(0, self._primary_seq - self.applied_seq)

    def lag_seconds(self) -> float:
        """0 when caught up, else seconds since the primary logged the newest applied record
        (primary and follower clocks; approximate when the primary does not know that time,
        e.g. for records logged before it restarted)."""
        if self.applied_seq >= self._primary_seq or self._applied_at is None:
            return 0.0
        return max(0.0, time.time() - self._applied_at)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the first bootstrap is done; returns whether it is."""
        return self._ready.wait(timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self, on_ready: Callable[[], None] | None = None) -> None:
        """Prepare the directory and start following in the background.

        Args:
            on_ready: called (from the follower's thread) after the first bootstrap.

        Raises:
            StorageError: ``data_dir`` holds a shard's data or cannot be created.
        """
        for marker in _PRIMARY_MARKERS:
            if (self.data_dir / marker).exists():
                raise StorageError(
                    f"{self.data_dir} holds a shard's data ({marker}); give the follower a "
                    f"directory of its own"
                )
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot use follower directory {self.data_dir}: {exc}") from exc
        self._dir_lock = DirectoryLock.acquire(self.data_dir, "follower directory")
        try:
            for stale in self.data_dir.glob("replica-*"):
                shutil.rmtree(stale)
        except OSError as exc:
            self._dir_lock.release()
            raise StorageError(f"cannot use follower directory {self.data_dir}: {exc}") from exc
        self._on_ready = on_ready
        opts = self.options
        if opts.client.credentials is not None:
            self._channel = grpc.secure_channel(
                opts.primary, opts.client.credentials, options=opts.channel_options
            )
        else:
            self._channel = grpc.insecure_channel(opts.primary, options=opts.channel_options)
        self._stub = pb_grpc.EmbeddingStoreServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._threads = [
            threading.Thread(target=self._run, name="embeddb-follower", daemon=True),
            threading.Thread(target=self._watch, name="embeddb-follower-watch", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop following, close the shard and delete the replica. Idempotent.

        Stop serving it first (the server's ``stop``): calls still using the shard are waited
        for.
        """
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        for thread in self._threads:
            thread.join(timeout)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        old = self.served.swap(None)
        if old is not None:
            self._discard(old)
        if self._dir_lock is not None:
            self._dir_lock.release()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        feed, boot = self.options.reconnect_policy, self.options.bootstrap_policy
        reconnects = boots = 0  # since records last flowed / since rows were last applied
        bootstrap, take_new = True, False
        failures = 0  # in a row, without progress: only some are logged as warnings
        try:
            while not self._stop.is_set():
                self._progress = False
                applied = self.applied_records
                try:
                    if bootstrap:
                        try:
                            self._bootstrap(take_new)
                        except CorruptDataError:
                            take_new = True  # the primary's newest snapshot did not verify
                            raise
                        bootstrap = take_new = False
                    self._follow()
                except (PermissionDeniedError, UnauthenticatedError) as exc:
                    raise _Fatal(
                        type(exc)(
                            f"{exc} (the follower needs a replica token for the primary: "
                            f"--primary-token-file holding 'replica TOKEN' or the token alone)"
                        )
                    ) from exc
                except OutOfRangeError as exc:
                    logger.warning("%s; bootstrapping again from a snapshot", exc)
                    bootstrap = True
                except CorruptDataError as exc:
                    logger.error("following %s: %s; bootstrapping again", self.options.primary, exc)
                    bootstrap = True
                except EmbeddbError as exc:
                    if self._stop.is_set():
                        break
                    failures = 0 if self._progress else failures + 1
                    level = logging.WARNING if failures % 50 <= 1 else logging.DEBUG
                    logger.log(level, "feed from %s broken: %s", self.options.primary, exc)
                if self._stop.is_set():
                    break
                if self._progress:
                    reconnects = 0
                if self.applied_records > applied:
                    boots = 0
                reconnects += 1
                wait = feed.backoff(reconnects)
                if bootstrap and self.bootstraps:  # a re-bootstrap: back off between copies
                    boots += 1
                    wait = max(wait, boot.backoff(boots))
                    logger.warning(
                        "bootstrapping again from %s in %.2fs (%d bootstraps so far)",
                        self.options.primary, wait, self.bootstraps,
                    )  # fmt: skip
                self.reconnects += 1
                self._stop.wait(feed.jittered(wait))
        except _Fatal as exc:
            self.error = exc.error
            logger.error("follower of %s stopped: %s", self.options.primary, exc.error)
        except Exception:
            logger.exception("follower of %s failed", self.options.primary)
            self.error = UnavailableError("the follower failed unexpectedly; see its log")
        finally:
            self.done.set()

    def _follow(self) -> None:
        """Apply the primary's records from the current shard's seq on, until the stream ends."""
        shard = self.served.current  # only this thread swaps the shard
        assert shard is not None
        request = pb.SubscribeRequest(from_seq=shard.seq)
        call = self._stub.Subscribe(request, metadata=self.options.client.metadata)
        self._started(call, watched=True)
        try:
            for message in call:
                self._last_message = time.monotonic()
                self._primary_seq = message.primary_seq
                if message.seq == 0:
                    continue  # a heartbeat
                if shard.apply_record(message.seq, message.payload):
                    self.applied_records += 1
                    self._progress = True
                    if message.appended_at:
                        self._applied_at = message.appended_at
        except grpc.RpcError as exc:
            raise self._translate(exc, "Subscribe") from exc
        finally:
            self._started(None)
        raise UnavailableError(f"primary {self.options.primary} ended the feed")

    def _describe_primary(self) -> tuple[EmbeddingConfig, int | None, int | None]:
        """Ask the primary its place and tables; the config and place to serve them with (a
        place None: the snapshot's, from a primary that does not describe itself).

        Raises:
            _Fatal: the follower's own config or place disagrees with the primary's, or it has
                no config and the primary does not describe its tables.
            EmbeddbError: the primary cannot be asked (retried).
        """
        metadata = self.options.client.metadata
        try:
            shard = self._stub.DescribeShard(pb.DescribeShardRequest(), metadata=metadata)
            listed = self._stub.ListTables(pb.ListTablesRequest(), metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise self._translate(exc, "DescribeShard/ListTables") from exc
            if self.config is None:  # a server that only streams snapshots and the log
                raise _Fatal(
                    ConfigError(
                        "config",
                        f"primary {self.options.primary} does not describe its tables "
                        f"(DescribeShard/ListTables unimplemented): give the follower --config",
                    )
                ) from exc
            return self.config, self.shard_index, self.num_shards
        layout = PrimaryLayout(
            self.options.primary,
            int(shard.shard_index),
            int(shard.num_shards),
            tuple(TableDescription.from_proto(t) for t in listed.tables),
        )
        self.layout = layout
        problem = topology_disagreement(layout, self.shard_index, self.num_shards)
        if problem is not None:
            raise _Fatal(ConfigError("shard_index", problem))
        if self.config is None:
            try:
                config = adopted_config(layout, self.options.store)
            except ConfigError as exc:
                raise _Fatal(exc) from exc
        else:
            config = self.config
            problem = disagreement(config, layout)
            if problem is not None:
                raise _Fatal(ConfigError("tables", problem))
        return config, layout.shard_index, layout.num_shards

    def _bootstrap(self, take_new: bool) -> None:
        """Fetch a snapshot into a fresh replica directory, open it, swap it in."""
        config, shard_index, num_shards = self._describe_primary()
        self._replica += 1
        directory = self.data_dir / f"replica-{self._replica}"
        shutil.rmtree(directory, ignore_errors=True)
        receiver: SnapshotReceiver | None = None
        budget = self.options.limits.budget(self.data_dir)
        began = time.perf_counter()
        try:
            call = self._stub.FetchSnapshot(
                pb.FetchSnapshotRequest(take_new=take_new), metadata=self.options.client.metadata
            )
            self._started(call, watched=False)
            try:
                for chunk in call:
                    budget.take(chunk.path, chunk.offset, len(chunk.data))
                    if receiver is None:
                        receiver = SnapshotReceiver(directory / "snapshots", chunk.snapshot_id)
                    receiver.write(Chunk(chunk.path, chunk.offset, chunk.data))
            except grpc.RpcError as exc:
                raise self._translate(exc, "FetchSnapshot") from exc
            except CorruptDataError:
                call.cancel()  # over a limit: stop the primary's stream too
                raise
            finally:
                self._started(None)
            if receiver is None:
                raise CorruptDataError(f"primary {self.options.primary} sent an empty snapshot")
            info = receiver.commit()  # verified against its manifest before anything uses it
            receiver = None
            manifest = read_manifest(info.path)
            where = (manifest.get("shard_index", 0), manifest.get("num_shards", 1))
            shard_index = where[0] if shard_index is None else shard_index
            num_shards = where[1] if num_shards is None else num_shards
            if where != (shard_index, num_shards):
                raise _Fatal(
                    ConfigError(
                        "shard_index",
                        f"primary {self.options.primary} serves shard {where[0]} of {where[1]}; "
                        f"this follower was started as shard {shard_index} of {num_shards}",
                    )
                )
            try:
                shard = Shard(
                    config,
                    directory,
                    restore=info.snapshot_id,
                    follower=True,
                    shard_index=shard_index,
                    num_shards=num_shards,
                )
            except CorruptDataError as exc:  # verified, so it contradicts our config
                raise _Fatal(exc) from exc
            shutil.rmtree(info.path, ignore_errors=True)  # rows loaded, SST files linked
        except BaseException:
            if receiver is not None:
                receiver.abort()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        old = self.served.swap(shard)
        if old is not None:
            self._discard(old)
        self._primary_seq = max(self._primary_seq, shard.seq)
        self._applied_at = info.created
        self.bootstraps += 1
        self._progress = True
        logger.info(
            "follower bootstrapped from snapshot %s of %s (seq %d, %d bytes, %.2fs)",
            info.snapshot_id,
            self.options.primary,
            shard.seq,
            info.bytes,
            time.perf_counter() - began,
        )
        if not self._ready.is_set():
            self._ready.set()
            if self._on_ready is not None:
                self._on_ready()

    # ------------------------------------------------------------------ helpers
    def _started(self, call: Any, watched: bool = False) -> None:
        """Record the call in progress (None: none), so that stop and the watchdog can cancel
        it; ``watched`` calls are cancelled after ``dead_after`` seconds of silence."""
        with self._lock:
            self._call, self._watched = call, watched
            self._last_message = time.monotonic()
        if call is not None and self._stop.is_set():
            call.cancel()

    def _watch(self) -> None:
        limit = self.options.dead_after
        while not self._stop.wait(min(0.25, limit / 4)):
            with self._lock:
                call, watched = self._call, self._watched
                silent = time.monotonic() - self._last_message
            if call is not None and watched and silent > limit:
                logger.warning(
                    "no message from %s for %.1fs; reconnecting", self.options.primary, silent
                )
                call.cancel()

    def _translate(self, exc: grpc.RpcError, method: str) -> EmbeddbError:
        return error_from_rpc(exc, f"primary {self.options.primary} {method}")

    @staticmethod
    def _discard(shard: Shard) -> None:
        try:
            shard.close()
        finally:
            shutil.rmtree(shard.data_dir, ignore_errors=True)
