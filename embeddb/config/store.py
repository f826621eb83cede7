"""Settings of every table's store on a shard, and of its durability (YAML ``store:``)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from embeddb.config._checks import as_float, as_int, as_kind, describe, set_field
from embeddb.errors import ConfigError

__all__ = ["LogRecovery", "StoreConfig"]

_MAX_STRIPES = 64
_FSYNC_POLICIES = ("always", "interval", "never")


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
class StoreConfig:
    """Settings of every table's store on a shard.

    Attributes:
        stripes: lock stripes per table, a power of two in [1, 64].
        eviction_chunk: least fraction of a table's capacity evicted per eviction, in (0, 0.5].
        min_stripe_rows: a table gets fewer stripes rather than stripes smaller than this (a
            small table is not worth striping, and a tiny stripe fills up on a few unlucky ids).
        disk_cache_mb: RocksDB block cache of the shard's disk tier, in MiB (shared by tables).
        threads: threads that may serve the stripes of one large lookup or gradient push at
            once, the calling one included; 0 (default) means the CPUs this process may use,
            1 keeps every call on its calling thread.
        parallel_min_ids: calls with fewer ids than this stay on their calling thread.
        update_log: log every acknowledged mutation (needed for crash recovery, snapshots'
            point-in-time restore and followers); ``False`` only for throwaway shards.
        fsync: when the update log is fsynced: ``always`` (before each acknowledgement, group
            commit), ``interval`` (default: every ``fsync_interval_ms``; a power loss can lose
            the acknowledged updates of that window, a process crash loses none) or ``never``
            (left to the OS).
        fsync_interval_ms: the ``interval`` policy's period.
        log_segment_mb: size at which an update log segment is sealed and a new one begun.
        log_lz4_min_bytes: log records at least this large are LZ4-compressed when that shrinks
            them (0: never).
        log_recovery: what opening the update log does when its last segment ends in a
            corrupt record (complete on disk, failing its checksum; a torn write is always cut):
            ``absolute_consistency`` refuses to start (``embeddb serve --cut-corrupt-log-tail``
            cuts it), ``point_in_time`` cuts it, logged at ERROR, counted and recorded in
            ``log-cuts.jsonl``; ``auto`` (default) is the first with ``fsync: always`` and the
            second otherwise.
        snapshot_retention: complete snapshots kept per shard; older ones (and the log segments
            only they needed) are deleted when a new snapshot lands.
        export_dir: write the rows the shard changes, every ``export_interval_s``, as numpy
            files into this directory (``embeddb.durability.export``); ``None`` (default): no
            export. ``{index}`` is replaced by the shard index; a relative path is taken
            inside the shard's data directory (so each shard of a cluster gets its own). Needs
            the update log; followers do not export.
        export_interval_s: seconds between two exports (the tail is always written when the
            shard closes).
    """

    stripes: int = 4
    eviction_chunk: float = 1 / 64
    min_stripe_rows: int = 1024
    disk_cache_mb: int = 256
    threads: int = 0
    parallel_min_ids: int = 16384
    update_log: bool = True
    fsync: str = "interval"
    fsync_interval_ms: float = 5.0
    log_segment_mb: int = 64
    log_lz4_min_bytes: int = 4096
    log_recovery: LogRecovery = LogRecovery.AUTO
    snapshot_retention: int = 3
    export_dir: str | None = None
    export_interval_s: float = 10.0

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
        set_field(self, "disk_cache_mb", as_int(self.disk_cache_mb, "disk_cache_mb", minimum=1))
        set_field(self, "threads", as_int(self.threads, "threads", minimum=0, maximum=256))
        set_field(
            self,
            "parallel_min_ids",
            as_int(self.parallel_min_ids, "parallel_min_ids", minimum=1),
        )
        if not isinstance(self.update_log, bool):
            raise ConfigError("update_log", f"must be true or false, got {self.update_log!r}")
        if self.fsync not in _FSYNC_POLICIES:
            raise ConfigError(
                "fsync", f"must be one of {', '.join(_FSYNC_POLICIES)}, got {self.fsync!r}"
            )
        interval = as_float(self.fsync_interval_ms, "fsync_interval_ms", low=0.0, high=60_000.0,
                            low_open=True)  # fmt: skip
        set_field(self, "fsync_interval_ms", interval)
        set_field(self, "log_segment_mb", as_int(self.log_segment_mb, "log_segment_mb", minimum=1))
        set_field(
            self,
            "log_lz4_min_bytes",
            as_int(self.log_lz4_min_bytes, "log_lz4_min_bytes", minimum=0),
        )
        recovery = as_kind(LogRecovery, self.log_recovery, "log_recovery", "log recovery mode")
        set_field(self, "log_recovery", recovery)
        set_field(
            self,
            "snapshot_retention",
            as_int(self.snapshot_retention, "snapshot_retention", minimum=1),
        )
        if isinstance(self.export_dir, os.PathLike):
            set_field(self, "export_dir", os.fspath(self.export_dir))
        if self.export_dir is not None and (
            not isinstance(self.export_dir, str) or not self.export_dir.strip()
        ):
            raise ConfigError(
                "export_dir", f"must be a directory path or null, got {describe(self.export_dir)}"
            )
        set_field(
            self,
            "export_interval_s",
            as_float(self.export_interval_s, "export_interval_s", low=0.0, high=86_400.0,
                     low_open=True),
        )  # fmt: skip
