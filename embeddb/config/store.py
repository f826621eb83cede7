"""Settings of every table's store on a shard, and of its durability (YAML ``store:``).

In code the settings are grouped by what they tune; in YAML they stay one flat mapping
(:data:`embeddb.config.schema.STORE_KEYS` maps each key to its group and field)::

    StoreConfig              YAML ``store:`` keys
      ram: RamTierConfig       stripes, eviction_chunk, min_stripe_rows, ram_budget
      disk: DiskTierConfig     disk_cache_mb
      parallel: ParallelConfig threads, parallel_min_ids
      log: UpdateLogConfig     update_log, fsync, fsync_interval_ms, log_segment_mb,
                               log_lz4_min_bytes, log_recovery
      snapshots: SnapshotConfig  snapshot_retention
      export: ExportConfig     export_dir, export_interval_s

Every group validates itself, and its errors name the flat YAML key (``log_segment_mb``, not
``segment_mb``), so a YAML file and code get the same messages.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

from embeddb.config._checks import as_bytes, as_float, as_int, as_kind, describe, set_field
from embeddb.errors import ConfigError

__all__ = [
    "DiskTierConfig",
    "ExportConfig",
    "FsyncPolicy",
    "LogRecovery",
    "ParallelConfig",
    "RamTierConfig",
    "SnapshotConfig",
    "StoreConfig",
    "UpdateLogConfig",
    "check_fsync",
    "check_fsync_interval_ms",
    "check_log_lz4_min_bytes",
    "check_log_recovery",
    "check_log_segment_bytes",
    "check_ram_budget",
]

_MAX_STRIPES = 64


class FsyncPolicy(str, enum.Enum):
    """When the update log fsyncs an appended record (YAML ``store.fsync``; the loss windows
    are in :mod:`embeddb.engine.durability.log`)."""

    ALWAYS = "always"  # before each acknowledgement (group commit)
    INTERVAL = "interval"  # every fsync_interval_ms, in the background
    NEVER = "never"  # left to the OS


class LogRecovery(str, enum.Enum):
    """What opening the update log does with a corrupt tail (YAML ``store.log_recovery``).

    A *torn* tail (a write a crash interrupted, never acknowledged) is always cut; a *corrupt*
    one (complete bytes that fail their checks) may hold acknowledged updates. Named after
    RocksDB's WAL recovery modes.
    """

    AUTO = "auto"  # ABSOLUTE_CONSISTENCY with fsync: always, else POINT_IN_TIME
    ABSOLUTE_CONSISTENCY = "absolute_consistency"  # refuse to start unless told to cut
    POINT_IN_TIME = "point_in_time"  # cut, logged at ERROR, counted and recorded


@dataclass(frozen=True)
class RamTierConfig:
    """The RAM tier's lock stripes and eviction.

    Attributes:
        stripes: lock stripes per table, a power of two in [1, 64].
        eviction_chunk: least fraction of a table's capacity evicted per eviction, in (0, 0.5]
            (``eviction: lru`` tables; a full ``tinylfu`` table evicts a row only for a row it
            admits).
        min_stripe_rows: a table gets fewer stripes rather than stripes smaller than this (a
            small table is not worth striping, and a tiny stripe fills up on a few unlucky ids).
        budget: YAML ``ram_budget``: bytes the RAM tiers of all the shard's tables may take
            together (vectors, optimizer state, index and per-slot bookkeeping:
            :mod:`embeddb.config.ram_budget`); an integer or a string such as ``"4GiB"``.
            Tables without an explicit ``capacity`` share what the others leave; ``None``
            (default): no budget, each table has its ``capacity``.
    """

    stripes: int = 4
    eviction_chunk: float = 1 / 64
    min_stripe_rows: int = 1024
    budget: int | None = None

    def __post_init__(self) -> None:
        stripes = as_int(self.stripes, "stripes", minimum=1, maximum=_MAX_STRIPES)
        if stripes & (stripes - 1):
            raise ConfigError("stripes", f"must be a power of two, got {stripes}")
        set_field(self, "stripes", stripes)
        chunk = as_float(self.eviction_chunk, "eviction_chunk", low=0.0, high=0.5, low_open=True)
        set_field(self, "eviction_chunk", chunk)
        set_field(
            self, "min_stripe_rows", as_int(self.min_stripe_rows, "min_stripe_rows", minimum=1)
        )
        if self.budget is not None:
            set_field(self, "budget", check_ram_budget(self.budget))


@dataclass(frozen=True)
class DiskTierConfig:
    """The disk tier (RocksDB).

    Attributes:
        cache_mb: RocksDB block cache of the shard's disk tier, in MiB (shared by tables).
    """

    cache_mb: int = 256

    def __post_init__(self) -> None:
        set_field(self, "cache_mb", as_int(self.cache_mb, "disk_cache_mb", minimum=1))


@dataclass(frozen=True)
class ParallelConfig:
    """How one large call spreads over a table's stripes.

    Attributes:
        threads: threads that may serve the stripes of one large lookup or gradient push at
            once, the calling one included; 0 (default) means the CPUs this process may use,
            1 keeps every call on its calling thread.
        min_ids: calls with fewer ids than this stay on their calling thread.
    """

    threads: int = 0
    min_ids: int = 16384

    def __post_init__(self) -> None:
        set_field(self, "threads", as_int(self.threads, "threads", minimum=0, maximum=256))
        set_field(self, "min_ids", as_int(self.min_ids, "parallel_min_ids", minimum=1))


@dataclass(frozen=True)
class UpdateLogConfig:
    """The shard's update log.

    Attributes:
        enabled: log every acknowledged mutation (needed for crash recovery, snapshots'
            point-in-time restore and followers); ``False`` only for throwaway shards.
        fsync: when the update log is fsynced: ``always`` (before each acknowledgement, group
            commit), ``interval`` (default: every ``fsync_interval_ms``; a power loss can lose
            the acknowledged updates of that window, a process crash loses none) or ``never``
            (left to the OS).
        fsync_interval_ms: the ``interval`` policy's period.
        segment_mb: size at which an update log segment is sealed and a new one begun.
        lz4_min_bytes: log records at least this large are LZ4-compressed when that shrinks
            them (0: never).
        recovery: what opening the update log does when its last segment ends in a
            corrupt record (complete on disk, failing its checksum; a torn write is always cut):
            ``absolute_consistency`` refuses to start (``embeddb serve --cut-corrupt-log-tail``
            cuts it), ``point_in_time`` cuts it, logged at ERROR, counted and recorded in
            ``log-cuts.jsonl``; ``auto`` (default) is the first with ``fsync: always`` and the
            second otherwise.
    """

    enabled: bool = True
    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_ms: float = 5.0
    segment_mb: int = 64
    lz4_min_bytes: int = 4096
    recovery: LogRecovery = LogRecovery.AUTO

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("update_log", f"must be true or false, got {self.enabled!r}")
        set_field(self, "fsync", check_fsync(self.fsync))
        set_field(self, "fsync_interval_ms", check_fsync_interval_ms(self.fsync_interval_ms))
        set_field(self, "segment_mb", as_int(self.segment_mb, "log_segment_mb", minimum=1))
        set_field(self, "lz4_min_bytes", check_log_lz4_min_bytes(self.lz4_min_bytes))
        set_field(self, "recovery", check_log_recovery(self.recovery))


def check_ram_budget(value: object) -> int:
    """``store.ram_budget`` (also ``embeddb serve --ram-budget``): a byte count >= 1 MiB, an
    integer or a string such as ``4GiB`` (:func:`~embeddb.config._checks.as_bytes`)."""
    return as_bytes(value, "ram_budget", minimum=1 << 20)


# The one validator of each update-log setting, named by its YAML key: UpdateLogConfig (the
# store: section, the CLI) and the engine's LogConfig (embeddb.engine.durability.log_config)
# both call these.
def check_fsync(value: object) -> FsyncPolicy:
    """``store.fsync``: ``always``, ``interval`` or ``never``."""
    return as_kind(FsyncPolicy, value, "fsync", "fsync policy")


def check_fsync_interval_ms(value: object) -> float:
    """``store.fsync_interval_ms``: in (0, 60000]."""
    return as_float(value, "fsync_interval_ms", low=0.0, high=60_000.0, low_open=True)


def check_log_segment_bytes(value: object) -> int:
    """``store.log_segment_mb`` in bytes (the engine's unit): at least 1."""
    return as_int(value, "log_segment_mb", minimum=1)


def check_log_lz4_min_bytes(value: object) -> int:
    """``store.log_lz4_min_bytes``: at least 0."""
    return as_int(value, "log_lz4_min_bytes", minimum=0)


def check_log_recovery(value: object) -> LogRecovery:
    """``store.log_recovery``: a :class:`LogRecovery` mode."""
    return as_kind(LogRecovery, value, "log_recovery", "log recovery mode")


@dataclass(frozen=True)
class SnapshotConfig:
    """The shard's snapshots.

    Attributes:
        retention: complete snapshots kept per shard; older ones (and the log segments
            only they needed) are deleted when a new snapshot lands.
    """

    retention: int = 3

    def __post_init__(self) -> None:
        set_field(self, "retention", as_int(self.retention, "snapshot_retention", minimum=1))


@dataclass(frozen=True)
class ExportConfig:
    """The incremental export of changed rows (:mod:`embeddb.engine.durability.export`).

    Attributes:
        directory: write the rows the shard changes, every ``export_interval_s``, as numpy
            files into this directory (``embeddb.engine.durability.export``); ``None`` (default): no
            export. ``{index}`` is replaced by the shard index; a relative path is taken
            inside the shard's data directory (so each shard of a cluster gets its own). Needs
            the update log; followers do not export.
        interval_s: seconds between two exports (the tail is always written when the
            shard closes).
    """

    directory: str | None = None
    interval_s: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.directory, os.PathLike):
            set_field(self, "directory", os.fspath(self.directory))
        if self.directory is not None and (
            not isinstance(self.directory, str) or not self.directory.strip()
        ):
            raise ConfigError(
                "export_dir", f"must be a directory path or null, got {describe(self.directory)}"
            )
        set_field(
            self,
            "interval_s",
            as_float(self.interval_s, "export_interval_s", low=0.0, high=86_400.0, low_open=True),
        )


_GROUPS: dict[str, type] = {
    "ram": RamTierConfig,
    "disk": DiskTierConfig,
    "parallel": ParallelConfig,
    "log": UpdateLogConfig,
    "snapshots": SnapshotConfig,
    "export": ExportConfig,
}


@dataclass(frozen=True)
class StoreConfig:
    """Settings of every table's store on a shard, grouped (see the module docstring).

    Attributes:
        ram: the RAM tier's stripes and eviction.
        disk: the disk tier.
        parallel: how one large call spreads over threads.
        log: the update log.
        snapshots: snapshot retention.
        export: the incremental export.

    Raises:
        ConfigError: a group of the wrong type.
    """

    ram: RamTierConfig = field(default_factory=RamTierConfig)
    disk: DiskTierConfig = field(default_factory=DiskTierConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    log: UpdateLogConfig = field(default_factory=UpdateLogConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def __post_init__(self) -> None:
        for name, group in _GROUPS.items():
            value = getattr(self, name)
            if not isinstance(value, group):
                raise ConfigError(name, f"must be a {group.__name__}, got {describe(value)}")
